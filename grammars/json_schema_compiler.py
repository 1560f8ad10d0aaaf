"""The dispatcher of the JSON schema front end: conjunctions of subschemas -> grammar IR.

A schema is translated as a *conjunction* of subschemas (`allOf`, `$ref`
siblings and merged keywords all just add conjuncts); each JSON type the
conjunction admits becomes one branch, built from every conjunct's keywords
for that type by the builder modules (json_schema_scalars, _arrays, _objects,
_combinators), which see this compiler only as a SchemaContext.  Referenced
subschemas become named rules, so recursive schemas stay finite.

Limits, each refused with UnsupportedSchemaError at the JSON pointer where it is hit: the
document may nest objects and arrays MAX_DOCUMENT_DEPTH deep; subschemas compiled inside each
other (properties, items, anyOf branches..., through $ref) MAX_SUBSCHEMA_DEPTH deep; and one
schema compiles at most MAX_SUBSCHEMAS subschemas, counting each conjunct of each conjunction,
which bounds compile time where branches multiply (allOf of many anyOf) to about a second.
The largest schemas of JSONSchemaBench stay well inside: depth 24, 22 levels, 4,152 subschemas.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import Any, Hashable, Iterator

from .automaton import rule_refs
from .errors import SchemaError, UnsatisfiableSchemaError, UnsupportedSchemaError
from .ir import Choice, Expr, Grammar, Lit, Ref, Seq, Terminal
from .json_schema_arrays import build_array, item_cap, sequence
from .json_schema_combinators import (NEGATED_CONJUNCT, conditional, dependent_schemas, distribute, negate,
                                      negates_types_only, rewritten_negation)
from .json_schema_context import (DERIVED_KEYWORDS, ONE_KEY_OF, SOME_KEY, TYPES, UNSUPPORTED, VALIDATION, Branches,
                                  JsonSchemaOptions, NotMatching, Part, expect, narrow_types, witness_admits)
from .json_schema_ir import NEVER, choice, punctuation, repeat, seq
from .json_schema_objects import build_object
from .json_schema_refs import Path, RefResolver, pointer_of, without_keywords
from .json_schema_scalars import enumerated, number, string_terminal
from .json_schema_string_logic import string_formula
from .json_validation import check_metaschema, dialect_class, draft_of, in_root_dialect, reading_class

MAX_SUBSCHEMA_DEPTH = 192  # the limits: see the module docstring
MAX_DOCUMENT_DEPTH = 129
MAX_SUBSCHEMAS = 20_000
# A negation nests several subschemas per JSON level (a `not` over a `const` 29 objects deep takes 150), and the
# builders between one subschema and the next take up to 16 Python frames: past _DEEP levels the interpreter's
# recursion limit is raised to fit MAX_SUBSCHEMA_DEPTH (never lowered, as another thread may be compiling too).
_DEEP = 48
_FRAMES_PER_LEVEL = 16


_UNSUPPORTED = frozenset(UNSUPPORTED)
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_]+")    # what a rule name replaces (see rule_name)
_CONSTRAINTS = VALIDATION - {"allOf"}   # what a conjunct constrains once its allOf and $ref are expanded
_EXPANDED = frozenset({"allOf", "$ref"})
_ENUMERATED = frozenset({"enum", "const"})
_REWRITTEN = frozenset({"not", "dependentSchemas", "dependencies"})
_TYPED = frozenset({"type", "not"})
_NO_TYPE = "no type is allowed by all of the conjuncts"
_SCALARS = frozenset({int, bool, type(None)})   # JSON values whose equality, with their type, is their text's
# keywords no instance can fail (`_ContentIds.schema` reads past them)
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly"})
# keywords holding subschemas: one or a list of them, or (_NAMED_SCHEMAS) an object of them by name
_NAMED_SCHEMAS = "named"
_SUBSCHEMAS = {**dict.fromkeys(("items", "prefixItems", "additionalItems", "additionalProperties", "propertyNames",
                                "contains", "not", "if", "then", "else", "allOf", "anyOf", "oneOf",
                                "unevaluatedItems", "unevaluatedProperties"), "schemas"),
               **dict.fromkeys(("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                                "dependencies"), _NAMED_SCHEMAS)}
# The any_value rule's body per set of options (a handful in a process: each whitespace style and cap a caller uses),
# and the rules it made
_ANY_VALUE: dict[JsonSchemaOptions, tuple[Expr, dict[str, Expr]]] = {}
_ANY_VALUE_KEPT = 16
# Validation keywords later drafts added, and the older drafts that do not define them.
_LATER_KEYWORDS = (     # (the last draft without them, the keywords)
    (4, frozenset({"const", "contains", "propertyNames"})),
    (6, frozenset({"if", "then", "else"})),
    (7, frozenset({"dependentRequired", "dependentSchemas", "prefixItems", "minContains", "maxContains",
                   "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})),
)


class SchemaCompiler:
    """Translates one schema document into a Grammar (see module docstring); a SchemaContext."""

    def __init__(self, schema: Any, options: JsonSchemaOptions):
        expect(isinstance(schema, (dict, bool)), f"a schema must be an object or a boolean, not "
               f"{type(schema).__name__}", "")
        check_document_depth(schema)  # first: the resolver, jsonschema and enum values recurse through it
        self.options = options
        dialect = schema.get("$schema", "") if isinstance(schema, dict) else ""
        dialect = dialect if isinstance(dialect, str) else ""
        self.legacy, self.draft4, undefined = _dialect(dialect)
        self.root = without_keywords(schema, undefined) if undefined else schema
        self.refs = RefResolver(self.root, "id" if self.draft4 else "$id")
        self._id_only = frozenset({self.refs.id_keyword})   # the skip sets of most parts (see expand)
        self._id_expanded = self._id_only | _EXPANDED
        self.punct = punctuation(options.whitespace, options.max_indent)
        self.rules: dict[str, Expr] = {}
        self._content = _ContentIds()
        self._memo: dict[Hashable, str] = {}      # conjunctions through a $ref: their rules' names
        # or their expressions where those need no rule: a literal, a terminal or NEVER (the branches a oneOf's
        # exclusions proved empty, met again under every negation of the same $ref: Github_hard's o40454 compiled
        # half its conjunctions again)
        self._unnamed: dict[Hashable, Expr] = {}
        self._conjunctions: dict[Hashable, Expr] = {}  # the others: their expressions
        # the conjunctions that came out NEVER, as sets of conjunct keys, each filed under one of its conjuncts: a
        # conjunction holding one of them admits nothing either.  The negations a oneOf distributes over recursive
        # branches meet the same empty pair again beside other conjuncts (Github_hard's o44959: 604 of its 957
        # conjunctions NEVER, 325 of them around an empty one known before).  Not where additional_properties=False
        # closes objects to the keys their conjuncts declare together: there a conjunct may admit objects that one
        # of its parts alone leaves empty (`minProperties: 1` with no key of its own, beside one declaring `id`)
        self._empty: dict[Hashable, list[frozenset]] | None = {} if options.additional_properties else None
        self._active: dict[Hashable, int] = {}
        self._depth = 0
        self._nesting = 0
        self._compiled = 0
        self._names: dict[str, int] = {}
        # every name handed out, and the fixed ones: a hint's name may be another's numbered one (`a_1` after `a`)
        self._issued = {"start", "any_value"}
        self.sizes: dict[str, int] = {}  # inlined_size of each rule
        self.chained: dict[str, bool] = {}
        self._shared: dict[Hashable, tuple[str, Expr]] = {}
        self._validator = None
        self.why_never: list[tuple[str, str]] = []     # (reason, pointer) of each NEVER met

    # ---- entry -------------------------------------------------------------------------------------

    def grammar(self) -> Grammar:
        """The grammar for the whole document; SchemaError if nothing can satisfy it."""
        if self.options.check_schema:
            self._check_metaschema()
        start = self.compile([Part(self.root, "", self.refs.root_base, frozenset({self.refs.id_keyword}))])
        if start == NEVER:
            reason, pointer = self.why_never[0] if self.why_never else ("no JSON value satisfies it", "")
            raise UnsatisfiableSchemaError(f"schema is unsatisfiable: {reason}", pointer)
        self.rules["start"] = start
        return Grammar(rules=self.rules, start="start")

    def _check_metaschema(self) -> None:
        import jsonschema

        # (the metaschema of the draft named: 2019-09's, whose documents are otherwise read as 2020-12's)
        named = draft_of(self.root.get("$schema") if isinstance(self.root, dict) else None)
        check_metaschema(self.root, jsonschema.Draft201909Validator if named == 2019 else dialect_class(self.root))

    def never(self, reason: str, pointer: str) -> Expr:
        self.why_never.append((reason, pointer))
        return NEVER

    def share(self, expr: Expr, pointer: str, own: bool = False) -> Expr:
        """Name an expression the layout mentions several times, so the IR stays a small DAG
        (walking it as a tree would double the work at every nesting level).  Equal expressions get one rule
        (the variants of an object that negations and if/else build hold mostly the same members: each a rule
        of its own doubled the automaton's rules), unless `own`: the extras of one object must differ."""
        kind = type(expr)   # (by exact type: comparing with NEVER and EMPTY ran dataclass comparisons, 1 µs a member)
        if kind is Lit or kind is Terminal or kind is Ref or (kind is Seq or kind is Choice) and not expr.items:
            return expr
        # keyed by the parts' identities, not the expression's hash, which walks all of it (a member's value): the
        # variants take their members' values from the compile memos, as the same objects (kept alive beside the
        # name, so that their ids stay theirs)
        key = None if own else tuple(map(_identity, expr.items)) if type(expr) is Seq else _identity(expr)
        known = None if key is None else self._shared.get(key)
        if known is not None:
            return Ref(known[0])
        name = self.rule_name(pointer + "_member")
        self.rules[name] = expr
        if key is not None:
            self._shared[key] = (name, expr)
        return Ref(name)

    def rule_name(self, hint: str) -> str:
        base = _NOT_IN_NAMES.sub("_", hint).strip("_")[:40] or "root"
        n = self._names.get(base, 0)
        name = f"{base}_{n}" if n else base
        while name in self._issued:
            n += 1
            name = f"{base}_{n}"
        self._names[base] = n + 1
        self._issued.add(name)
        return name

    # ---- conjunctions ------------------------------------------------------------------------------

    def expand(self, parts: list[Part]) -> tuple[list[Part], bool] | None:
        """Flatten allOf and $ref into plain conjuncts; None if a conjunct is `false`."""
        out: list[Part] = []
        # each conjunct met, by its key, with the conjunct whose $ref or allOf brought it (None for `parts`): met
        # again below itself it is a cycle that reads nothing, which no instance can ever get to the end of
        seen: dict[Hashable, Hashable] = {}
        via_ref = False
        ident, expanded = self.refs.id_keyword, self._id_expanded
        stack = [(part, None) for part in reversed(parts)]
        while stack:
            part, source = stack.pop()
            key = part.key
            if key in seen:
                if source is not None and _brought_by(seen, source, key):
                    raise SchemaError("$ref cycle that consumes no input", part.pointer)
                continue
            seen[key] = source
            schema = part.schema
            if schema is True:
                continue
            if schema is False:
                self.never("the schema is false", part.pointer)
                return None
            if not isinstance(schema, dict):   # (the messages of this loop are only written on failure: a hot path)
                raise SchemaError(f"a schema must be an object or a boolean, not {type(schema).__name__}",
                                  part.pointer)
            base, skip, pointer = part.base, part.skip, part.pointer
            if skip is expanded or (_EXPANDED <= skip and ident in skip):
                # expanded before (the rest of a conjunction a combinator distributes): checked then, so only
                # whether it still constrains anything counts
                if not _CONSTRAINTS.isdisjoint(schema.keys() - skip):
                    out.append(part)
                continue
            # A part's base is its parent's until its own id is applied, once: a relative id applied twice
            # would nest its path in itself
            if ident not in skip:
                base = self.refs.base_for(schema, base)
                skip = self._id_only if not skip else skip | {ident}   # (most parts are a subschema's, skip empty)
            present = schema.keys() - skip
            pending: list[Part] = []
            if "$ref" in present:
                target = self.refs.resolve(schema["$ref"], base, pointer)
                pending.append(Part(target.schema, target.pointer, target.base, frozenset({ident})))
                via_ref = True
                if self.legacy:  # before 2019-09 a $ref replaces its siblings
                    stack.extend((p, key) for p in reversed(pending))
                    continue
            if "allOf" in present:
                subs = schema["allOf"]
                if not (isinstance(subs, list) and subs):
                    raise SchemaError("allOf must be a non-empty array", part.at("allOf"))
                based = Part(schema, pointer, base, skip, part.variant)     # its subschemas start from its base
                pending += [based.sub(s, "allOf", i) for i, s in enumerate(subs)]
            if not _UNSUPPORTED.isdisjoint(present):
                keyword = next(k for k in UNSUPPORTED if k in present)
                raise UnsupportedSchemaError(f"keyword {keyword!r} cannot be enforced", part.at(keyword))
            if not _CONSTRAINTS.isdisjoint(present):   # the part with its allOf and $ref expanded, once
                out.append(Part(schema, pointer, base, self._id_expanded if skip is self._id_only else
                                skip | _EXPANDED, part.variant))
            stack.extend((p, key) for p in reversed(pending))
        return out, via_ref

    def compile(self, parts: list[Part]) -> Expr:
        """The IR for instances valid against every part."""
        pointer = parts[0].pointer if parts else ""
        self._compiled += max(len(parts), 1)  # each conjunct is a subschema compiled
        if self._compiled > MAX_SUBSCHEMAS:
            raise UnsupportedSchemaError(f"schema needs more than {MAX_SUBSCHEMAS} subschemas compiled", pointer)
        if self._nesting == MAX_SUBSCHEMA_DEPTH:
            raise UnsupportedSchemaError(f"subschemas nested deeper than {MAX_SUBSCHEMA_DEPTH}", pointer)
        self._nesting += 1
        if self._nesting == _DEEP:
            sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000 + _FRAMES_PER_LEVEL * MAX_SUBSCHEMA_DEPTH))
        try:
            return self._compile(parts)
        finally:
            self._nesting -= 1

    def _compile(self, parts: list[Part]) -> Expr:
        if len(parts) == 1:     # a subschema compiled before, by its content (a third of all): nothing to expand
            part = parts[0]
            schema = part.schema
            if type(schema) is dict and (not part.skip or part.skip is self._id_only) and "$ref" not in schema \
                    and "allOf" not in schema and self.refs.id_keyword not in schema:
                known = self._conjunctions.get((self._content.schema(schema), part.base, self._id_expanded,
                                                part.variant))
                if known is not None:
                    return known
        expanded = self.expand(parts)
        if expanded is None:
            return NEVER
        parts, via_ref = expanded
        if not parts:
            return self._any_value()
        # Conjunctions are named by their content, not their place: a subschema written out at several places
        # (a definition pasted into each resource, the negations a oneOf distributes over its branches) compiles
        # once (its annotations aside).  Its base (relative $refs), skipped keywords and rewrite are part of what it
        # means.
        content = self._content.schema
        if len(parts) == 1:     # (most conjunctions)
            only = parts[0]
            key: Hashable = (content(only.schema), only.base, only.skip, only.variant)
        else:
            # equal conjuncts are one (A and A is A): a rewrite that drops one of two would otherwise come back to
            # the same conjunction at the same depth, which reads as a cycle (two `$ref`s whose negations both
            # became `not: {type: object}` beside an array were refused as "$ref cycle that consumes no input")
            unique: dict[Hashable, Part] = {}
            for p in parts:
                unique.setdefault((content(p.schema), p.base, p.skip, p.variant), p)
            if len(unique) < len(parts):
                parts = list(unique.values())
            key = frozenset(unique) if len(parts) > 1 else next(iter(unique))
            if len(parts) > 1 and self._holds_empty(key):
                return self.never("a conjunction it holds admits nothing", parts[0].pointer)
        if not via_ref and not any(p.variant.startswith(NEGATED_CONJUNCT) for p in parts):
            expr = self._conjunctions.get(key)
            if expr is None:
                expr = self._conjunctions[key] = self._compile_parts(parts)
                if expr == NEVER:
                    self._file_empty(key)
            return expr
        # through a $ref (or a negated $ref's conjunct, which recurs like the $ref itself): a named rule, which
        # the conjunction may reach again inside itself
        if key in self._memo:
            return Ref(self._memo[key])
        unnamed = self._unnamed.get(key)
        if unnamed is not None:
            return unnamed
        if key in self._active:
            if self._active[key] == self._depth:
                raise SchemaError("$ref cycle that consumes no input", parts[0].pointer if parts else "")
            name = self.rule_name(parts[0].pointer if parts else "any")
            self._memo[key] = name
            return Ref(name)
        self._active[key] = self._depth
        body = self._compile_parts(parts)
        del self._active[key]
        if key in self._memo:  # referenced recursively while compiling
            self.rules[self._memo[key]] = body
            return Ref(self._memo[key])
        if isinstance(body, (Lit, Terminal)) or body == NEVER:
            self._unnamed[key] = body
            if body == NEVER:
                self._file_empty(key)
            return body
        name = self.rule_name(parts[0].pointer if parts else "any")
        self._memo[key] = name
        self.rules[name] = body
        return Ref(name)

    def _holds_empty(self, key: frozenset) -> bool:
        """Whether the conjunction of the conjuncts `key` holds one known to admit nothing."""
        empty = self._empty
        return empty is not None and any(known <= key for conjunct in key for known in empty.get(conjunct, ()))

    def _file_empty(self, key: Hashable) -> None:
        if self._empty is not None:
            known = key if type(key) is frozenset else frozenset((key,))
            self._empty.setdefault(next(iter(known)), []).append(known)

    def _any_value(self) -> Expr:
        """Any JSON value (one shared recursive rule)."""
        if "any_value" not in self.rules:
            # Its body follows from the options alone, and most schemas have one (an object's extras): built once
            # per process, it is also one object for the automaton's memo of rule automata.  Not with an item
            # cap, which sizes the body against this schema's other rules.
            if self.options.max_items is not None:
                body = self._any_value_body()
            else:
                kept = _ANY_VALUE.get(self.options)
                if kept is None:
                    if len(_ANY_VALUE) >= _ANY_VALUE_KEPT:
                        _ANY_VALUE.clear()
                    body = self._any_value_body()
                    # with the rules it refers to (a capped string's count), which the next schema may lack
                    made: dict[str, Expr] = {}
                    todo = [body]
                    while todo:
                        for name in rule_refs(todo.pop(), set()) - made.keys() - {"any_value"}:
                            made[name] = self.rules[name]
                            todo.append(made[name])
                    kept = _ANY_VALUE[self.options] = body, made
                body, made = kept
                for name, rule in made.items():
                    self.rules.setdefault(name, rule)
            self.rules["any_value"] = body
        return Ref("any_value")

    def _any_value_body(self) -> Expr:
        pu = self.punct
        value = Ref("any_value")
        string = string_terminal(self, [], [])
        member = seq(string, pu.colon, value)
        return choice([
            Lit("null"), Lit("true"), Lit("false"), number(self, [], False, []), string,
            choice([pu.obj_empty, seq(pu.obj_open, member, repeat(seq(pu.comma, member)), pu.obj_close)]),
            sequence(self, [], value, 0, item_cap(self, 0, [], value), "any_value"),
        ])

    def nested(self, parts: list[Part]) -> Expr:
        """Compile a subschema one structural level down (inside an object or array)."""
        self._depth += 1
        try:
            return self.compile(parts)
        finally:
            self._depth -= 1

    def _compile_parts(self, parts: list[Part]) -> Expr:
        # the keywords of all parts at once: most conjunctions have none of those read one part at a time below
        present = set().union(*(p.schema.keys() - p.skip for p in parts))
        if len(parts) > 1 and not _TYPED.isdisjoint(present) and _disjoint_types(parts):
            # before the combinators distribute: conjuncts whose `type`s and `not: {type}`s leave no type admit
            # nothing, whatever their branches
            return self.never(_NO_TYPE, parts[0].pointer)
        if not _ENUMERATED.isdisjoint(present):
            return enumerated(self, parts)
        formula = string_formula(self, parts)
        if formula is not None:
            return formula
        if not _REWRITTEN.isdisjoint(present):
            for part in parts:
                rewritten = rewritten_negation(self, parts, part) if part.has("not") else None
                if rewritten is None and (part.has("dependentSchemas") or part.has("dependencies")):
                    rewritten = dependent_schemas(self, parts, part)
                if rewritten is not None:
                    return rewritten
        if "anyOf" in present or "oneOf" in present:
            for part in parts:
                for keyword in ("anyOf", "oneOf"):
                    if part.has(keyword):
                        return distribute(self, parts, part, keyword)
        if "if" in present:
            for part in parts:
                if part.has("if"):
                    return conditional(self, parts, part)
        branches = Branches()
        for part in parts:
            narrow_types(part, branches)
        excluded: list[Any] = []
        for part in parts:
            if part.has("not"):
                negate(part, branches, excluded)
        alternatives = []
        for t in TYPES:
            if t in branches.types:
                alternatives.append(self._type_branch(t, parts, branches, excluded))
        if not any(a != NEVER for a in alternatives):
            if not branches.types:
                return self.never(_NO_TYPE, parts[0].pointer if parts else "")
        return choice(alternatives)

    def _type_branch(self, t: str, parts: list[Part], branches: Branches, excluded: list[Any]) -> Expr:
        if t == "null":
            return NEVER if any(v is None for v in excluded) else Lit("null")
        if t == "boolean":
            return choice(Lit(json.dumps(b)) for b in (True, False) if not any(v is b for v in excluded))
        if t == "number":
            return number(self, parts, branches.integer_only, excluded)
        if t == "string":
            return string_terminal(self, parts, [v for v in excluded if isinstance(v, str)], (),
                                   tuple((v.pattern, v.pointer) for v in excluded if isinstance(v, NotMatching)))
        if any(isinstance(v, list if t == "array" else dict) for v in excluded):
            raise UnsupportedSchemaError(f"not with {t} values cannot be negated exactly", parts[0].pointer)
        return build_array(self, parts) if t == "array" else build_object(self, parts)

    def validator(self, parts: list[Part]) -> Any:
        """A jsonschema validator for the conjunction of `parts` (refs resolve in this document)."""
        if self._validator is None:
            cls = _reading_derived(dialect_class(self.root))
            self._validator = cls(in_root_dialect(self.root), format_checker=cls.FORMAT_CHECKER)
        return self._validator.evolve(schema={"allOf": [p.schema for p in parts]})


def _brought_by(sources: dict[Hashable, Hashable], source: Hashable, key: Hashable) -> bool:
    """Whether the conjunct `key` is `source` or brought it, through the conjuncts that brought each (`sources`)."""
    while source is not None:
        if source == key:
            return True
        source = sources[source]
    return False


def _disjoint_types(parts: list[Part]) -> bool:
    """Whether no JSON type is allowed by all of `parts`' `type` keywords and negated ones (`not: {type}`, which
    the negations of objects distribute: `not: {type: object}` beside an object holding a failing member)."""
    branches = Branches()
    for part in parts:
        narrow_types(part, branches)
        if part.has("not") and negates_types_only(part):
            negate(part, branches, [])
    return not branches.types


class _ContentIds:
    """One id per distinct JSON value (with its objects' key order, which orders generated properties), or Part
    (which derived schemas hold)."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._known: dict[int, tuple[Hashable, Any]] = {}   # id(value) -> its id, the value kept so id() stays its
        self._schemas: dict[int, tuple[Hashable, Any]] = {}     # the same, for values read as schemas

    def of(self, value: Any) -> Hashable:
        """Equal for equal values (1 and 1.0, or true and 1, are not equal: the text they admit differs)."""
        kind = type(value)
        if kind is str:
            return value        # never equal to another kind's id, all of which are ints or tuples
        if kind in _SCALARS:
            return kind, value
        known = self._known.get(id(value))
        if known is None:
            shape: list = [kind]
            if kind is dict:    # (strings inline: most values of a schema are)
                for k, v in value.items():
                    shape += (k, v if type(v) is str else self.of(v))
            elif kind is list:
                shape += [v if type(v) is str else self.of(v) for v in value]
            elif kind is Part:  # (a witness's values, in a derived schema)
                shape += (self.of(value.schema), value.pointer, value.base, value.skip, value.variant)
            else:
                shape.append(repr(value) if kind is float else id(value))
            known = self._known[id(value)] = self._ids.setdefault(tuple(shape), len(self._ids)), value
        return known[0]

    def schema(self, value: Any) -> Hashable:
        """`of` for a schema, blind to its annotations and its subschemas' (`_ANNOTATIONS`): every instance satisfies
        two schemas that differ only in those alike (members that differ in their descriptions alone compile once).
        The values it holds (enum, const, keywords it does not know) are read as `of` reads them."""
        if type(value) is not dict:
            return self.of(value)
        known = self._schemas.get(id(value))
        if known is None:
            shape: list = ["schema"]    # (a string: never equal to the type opening a value's shape)
            for k, v in value.items():
                if k in _ANNOTATIONS:
                    continue
                kind = _SUBSCHEMAS.get(k)
                if kind is None or type(v) is str:
                    shape += (k, v if type(v) is str else self.of(v))
                elif kind is _NAMED_SCHEMAS and type(v) is dict:
                    shape += (k, (_NAMED_SCHEMAS, *(x for name, sub in v.items() for x in (name, self.schema(sub)))))
                elif type(v) is list:
                    shape += (k, ("list", *map(self.schema, v)))
                else:
                    shape += (k, self.schema(v))
            known = self._schemas[id(value)] = self._ids.setdefault(tuple(shape), len(self._ids)), value
        return known[0]


@functools.cache
def _reading_derived(cls: Any) -> Any:
    """The jsonschema validator class `cls` that also reads what derived schemas write, whatever its draft (one
    class per draft: making one takes longer than compiling a small schema)."""
    import jsonschema

    latest = jsonschema.Draft202012Validator.VALIDATORS
    return reading_class(cls, {**{k: latest[k] for k in DERIVED_KEYWORDS}, SOME_KEY: _holds_keys,
                               ONE_KEY_OF: _holds_one_key})


def _holds_keys(validator: Any, witnesses: list[dict], instance: Any, schema: dict) -> Iterator[Any]:
    """The SOME_KEY keyword for jsonschema: an object holds a key each witness admits, with a value it admits."""
    from jsonschema import ValidationError

    if isinstance(instance, dict):
        for witness in witnesses:
            if not _holds(validator, witness, instance):
                yield ValidationError(f"no key that {witness['at']} asks for")


def _holds_one_key(validator: Any, witnesses: list[dict], instance: Any, schema: dict) -> Iterator[Any]:
    """The ONE_KEY_OF keyword for jsonschema: an object holds a key one of the witnesses admits, with a value it
    admits."""
    from jsonschema import ValidationError

    if isinstance(instance, dict) and not any(_holds(validator, witness, instance) for witness in witnesses):
        yield ValidationError(f"no key that {witnesses[0]['at']} or its siblings ask for")


def _holds(validator: Any, witness: dict, instance: dict) -> bool:
    """Whether object `instance` holds a key `witness` admits, with a value it admits."""
    values = [validator.evolve(schema=part.schema) for part in witness.get("values", ())]
    return any(witness_admits(witness, name) and all(v.is_valid(value) for v in values)
               for name, value in instance.items())


@functools.lru_cache(maxsize=64)    # (asked by every compile, of a handful of dialects)
def _dialect(dialect: str) -> tuple[bool, bool, frozenset[str]]:
    """What a `$schema` URI says (`draft_of`): a draft-07 or older document (its `$ref` replaces the keywords beside
    it), a draft-04 or -03 one, and the keywords later drafts added, which it does not define."""
    draft = draft_of(dialect)
    # JSON Schema ignores keywords its dialect does not define (a draft-04 document's `if` is an annotation): they
    # leave the document once, so that no reader of it, `not` and the oneOf proofs included, sees them.
    undefined = frozenset().union(*(later for last, later in _LATER_KEYWORDS if draft <= last))
    return draft <= 7, draft <= 4, undefined


def check_document_depth(document: Any) -> None:
    """Refuse a document nested deeper than MAX_DOCUMENT_DEPTH (without recursing itself)."""
    # level by level, paths only for the error: every compile walks the whole document here
    level = [document] if isinstance(document, (dict, list)) else []
    for _ in range(MAX_DOCUMENT_DEPTH):
        level = [v for value in level for v in (value.values() if isinstance(value, dict) else value)
                 if isinstance(v, (dict, list))]
        if not level:
            return
    raise UnsupportedSchemaError(f"schema nested deeper than {MAX_DOCUMENT_DEPTH} objects and arrays",
                                 pointer_of(_deepest_path(document)))


def _deepest_path(document: Any) -> Path:
    """The path to a value nested deeper than MAX_DOCUMENT_DEPTH."""
    stack: list[tuple[Any, Path, int]] = [(document, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DOCUMENT_DEPTH:
            return path
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack += [(v, (path, k), depth + 1) for k, v in items if isinstance(v, (dict, list))]
    raise AssertionError("no value is nested that deep")


def _identity(expr: Expr) -> Hashable:
    """What tells `expr` apart cheaply: a reference's name, a literal's text, a terminal itself (its hash reads its
    patterns, whose strings keep theirs: equal formats under different descriptions compile to equal terminals),
    else the object's id."""
    kind = type(expr)
    if kind is Ref:
        return ("ref", expr.name, expr.call)
    if kind is Lit:
        return expr.text
    return expr if kind is Terminal else id(expr)
