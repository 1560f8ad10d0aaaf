"""Combinators: anyOf/oneOf distributed over the rest of the conjunction, if/then/else, and `not` on the
shapes that negate exactly.  (allOf needs nothing here: the compiler flattens it into more conjuncts.)

oneOf is compiled as anyOf where the branches provably exclude each other (`_disjoint`); otherwise, where
every branch is a shape `not` negates exactly, branch i becomes branch i and the negation of every other
branch, which is exactly "matches one branch only"; other overlapping oneOfs are refused, since a grammar
cannot count how many branches an instance matches.
"""

from __future__ import annotations

import math
from decimal import Decimal
from itertools import product
from typing import Any, Callable, Iterator

from .errors import SchemaError, UnsupportedSchemaError
from .ir import Expr
from .json_numbers import multiples_of
from .json_schema_context import (ONE_KEY_OF, SOME_KEY, VALIDATION, Branches, NotMatching, Part, SchemaContext,
                                  enum_values, expect, is_number, key_matches, narrow_types)
from .json_schema_ir import NEVER, choice, json_key

# a oneOf's branches are compared pairwise for overlap: 1,024 tool-call objects take about 1.4 s, 4,096 took 18
_MAX_DISTRIBUTED_BRANCHES = 1024
_MAX_DISTRIBUTED_VARIANTS = 256
_MAX_NEGATED_PAIRS = 6   # a negated oneOf's branches that may match together, pairwise (all of 4 branches)


def distribute(ctx: SchemaContext, parts: list[Part], owner: Part, keyword: str) -> Expr:
    """anyOf/oneOf of `owner` as a choice, each branch compiled together with the other conjuncts."""
    branches = owner.get(keyword)
    expect(isinstance(branches, list) and branches, f"{keyword} must be a non-empty array", owner.at(keyword))
    if len(branches) > _MAX_DISTRIBUTED_BRANCHES:
        raise UnsupportedSchemaError(f"{keyword} has {len(branches)} branches: more than {_MAX_DISTRIBUTED_BRANCHES}, "
                                     "the most leapgen compiles", owner.at(keyword))
    rest = [p.skipping(keyword) if p is owner else p for p in parts]
    subs = [owner.sub(b, keyword, i) for i, b in enumerate(branches)]
    if keyword == "oneOf" and len(subs) > 1:
        pairs = list(_overlapping_pairs(ctx, [_signature(ctx, rest + [s]) for s in subs]))
        if pairs:
            return _exactly_one(ctx, rest, owner, pairs)
    return choice(ctx.compile(rest + [s]) for s in subs)


def _overlapping_pairs(ctx: SchemaContext, sigs: list[dict | None]) -> Iterator[tuple[int, int]]:
    """Every two oneOf branches that may both match one instance (those not proved apart; `sigs`: each branch's
    signature together with the rest of the conjunction)."""
    for i in range(len(sigs)):
        for j in range(i + 1, len(sigs)):
            if not _apart(ctx, sigs[i], sigs[j]):
                yield i, j


def _exactly_one(ctx: SchemaContext, rest: list[Part], owner: Part, pairs: list[tuple[int, int]]) -> Expr:
    """oneOf as the union over i of (branch i and not branch j, for every branch j that may match together with
    it: the others exclude it already), where those branches negate exactly; refused otherwise, or where the
    negations would multiply into too many variants."""
    branches = owner.get("oneOf")
    overlaps: list[list[int]] = [[] for _ in branches]
    sizes: dict[int, int | None] = {}
    for i, j in pairs:
        overlaps[i].append(j)
        overlaps[j].append(i)
        for k in (i, j):
            if k not in sizes:
                sizes[k] = _negation_size(branches[k], _resolver(ctx, owner.sub(branches[k], "oneOf", k)))
            if sizes[k] is None:
                raise UnsupportedSchemaError(f"oneOf branches {i} and {j} may both match one instance; exclusivity "
                                             "cannot be enforced", owner.at("oneOf"))
    # branch i with its overlapping ones negated: the product of their negations' alternatives, summed over i
    variants = sum(math.prod(sizes[j] for j in others) for others in overlaps)
    if variants > _MAX_DISTRIBUTED_VARIANTS:
        raise UnsupportedSchemaError("oneOf with overlapping branches has too many variants to enforce",
                                     owner.at("oneOf"))
    alternatives = []
    for i, branch in enumerate(branches):
        others = [owner.derived({"not": branches[j]}, "not", "oneOf", j) for j in sorted(overlaps[i])]
        alternatives.append(ctx.compile(rest + [owner.sub(branch, "oneOf", i)] + others))
    return choice(alternatives)


# Keywords that only mean something together: a schema's negation may split between these groups, never
# inside one (`additionalProperties` alone forbids every key, beside `properties` only the undeclared ones).
_TOGETHER = ({"properties", "patternProperties", "additionalProperties"}, {"prefixItems", "items", "additionalItems"},
             {"contains", "minContains", "maxContains"}, {"if", "then", "else"}, {"minimum", "exclusiveMinimum"},
             {"maximum", "exclusiveMaximum"})
# Keywords whose meaning depends on every other keyword of their schema (a draft-07 `$ref` replaces them all).
_WHOLE = {"$ref", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"}


def _negation_groups(keys: set[str]) -> list[set[str]] | None:
    """The groups of a schema's keywords that hold independently of each other, so that the schema fails
    exactly where one group fails; None where a keyword depends on all the others."""
    if keys & _WHOLE:
        return None
    groups, left = [], set(keys)
    for together in _TOGETHER:
        if left & together:
            groups.append(left & together)
            left -= together
    return groups + [{k} for k in sorted(left)]


def _negation_size(schema: Any, resolve: Resolver, memo: dict | None = None) -> int | None:
    """How many alternatives `not schema` compiles to (see `negate` and `rewritten_negation`), None when it
    is not one of the shapes negated exactly; `resolve` gives the conjuncts a $ref stands for.  Each schema is
    sized once: a recursive schema's $refs lead back to the same subschemas many times over (200,000 calls for
    one oneOf of Github_hard's o39210).  A schema met again while it is being sized counts one: its negation is
    one rule, which the recursion calls."""
    memo = {} if memo is None else memo
    key = id(schema)
    if key not in memo:   # the schema is kept with its size, so that its id stays its own
        memo[key] = (schema, 1)
        memo[key] = (schema, _size_of_negation(schema, resolve, memo))
    return memo[key][1]


def _size_of_negation(schema: Any, resolve: Resolver, memo: dict) -> int | None:
    if not isinstance(schema, dict):
        return 1 if isinstance(schema, bool) else None
    keys = _constraining(schema)
    if not keys:    # annotations only (`{"description": ...}`, a misspelt keyword): nothing fails it
        return 1
    if "$ref" in keys:
        conjuncts = resolve(schema)
        if conjuncts is None:
            return None
        sizes = [_negation_size(conjunct, resolve, memo) for conjunct in conjuncts]
        return None if None in sizes else max(sum(sizes), 1)
    bounds = _negated_bounds(schema)
    if bounds is not None:
        return max(len(bounds), 1)
    if keys in ({"enum"}, {"const"}):
        values = _listed(schema)
        containers = [v for v in values if isinstance(v, (dict, list))] if isinstance(values, list) else []
        if len(containers) > _MAX_NEGATED_CONTAINERS:
            return None
        # one way per object or array value, counted low: beside an enum of its own, the conjunction filters
        # values and nothing multiplies, and elsewhere the subschema budget bounds the rest
        return max(len(containers), 1)
    if keys == {"prefixItems"} and isinstance(schema["prefixItems"], list):
        sizes = [_negation_size(item, resolve, memo) for item in schema["prefixItems"]]
        return None if None in sizes else max(sum(sizes), 1)
    if keys in ({"type"}, {"pattern"}, {"multipleOf"}, {"not"}):
        return 1
    if keys == {"items"} and not isinstance(schema["items"], list):
        return None if _negation_size(schema["items"], resolve, memo) is None else 1
    if keys in ({"dependencies"}, {"dependentSchemas"}, {"dependentRequired"}):
        triggers = schema[next(iter(keys))]
        if not isinstance(triggers, dict):
            return None
        sizes = [len(needs) if isinstance(needs, list) else _negation_size(needs, resolve, memo)
                 for needs in triggers.values()]
        return None if None in sizes else max(sum(sizes), 1)
    if keys and keys <= {"if", "then", "else"}:
        sizes = [_negation_size(schema[k], resolve, memo) for k in ("then", "if", "else") if k in schema]
        return None if None in sizes else max(sum(sizes), 1)
    if "contains" in keys and keys <= _CONTAINS:
        counts = _negated_counts(schema)
        if counts is None:
            return None
        # fewer matches than minContains needs the other items to fail contains
        if any(most is not None for _, most in counts) and _negation_size(schema["contains"], resolve,
                                                                          memo) is None:
            return None
        return max(len(counts), 1)
    # (a oneOf counts as an anyOf: where two of its branches may match together it adds up to
    # _MAX_NEGATED_PAIRS conjunctions, which depend on the conjunction it sits in; see rewritten_negation)
    combined = schema[next(iter(keys))] if keys in ({"anyOf"}, {"allOf"}, {"oneOf"}) else None
    if isinstance(combined, list) and combined:
        sizes = [_negation_size(branch, resolve, memo) for branch in combined]
        if None in sizes:
            return None
        if keys == {"allOf"}:
            return sum(sizes)
        if _tagged(combined, resolve):
            return 3 + sum(sizes)   # no object, no tag, an unknown tag, and each tag's branch negated
        return math.prod(sizes)   # every branch negated, together: their alternatives multiply
    if keys == {"required"} and isinstance(schema["required"], list) and schema["required"]:
        return len(schema["required"])
    if keys <= {"properties", "patternProperties", "additionalProperties"} and all(
            isinstance(schema.get(k, {}), dict) for k in ("properties", "patternProperties")):
        # a pattern's key failing it, or an extra key failing additionalProperties, counts one: which keys
        # those are depends on the conjunction (see `_negated_members`)
        failing = [sub for sub in [*schema.get("properties", {}).values(), *schema.get("patternProperties", {}).values(),
                                   schema.get("additionalProperties", True)] if sub is not True and sub != {}]
        if not failing or any(_negation_size(sub, resolve, memo) is None for sub in failing):
            return None
        return len(failing)
    if keys == {"propertyNames"}:
        refused = _refused_names(schema["propertyNames"])
        if refused is None:
            return None if _refused_pattern(schema["propertyNames"], "") is None else 1
        return max(len(refused), 1) if refused is not True else 1
    groups = _negation_groups(keys) if len(keys) > 1 else None
    if not groups or len(groups) < 2:
        return None
    sizes = [_negation_size({k: schema[k] for k in group}, resolve, memo) for group in groups]
    return None if None in sizes else sum(sizes)


def rewritten_negation(ctx: SchemaContext, parts: list[Part], part: Part) -> Expr | None:
    """The `not` shapes that become other keywords: `not: {required: [k1, ...]}` is an object missing some ki
    (everything else satisfies `required`), a choice of objects each forbidding one key; `not: {properties}`
    is an object with a declared key whose value fails its schema (everything else satisfies `properties`),
    a choice over the keys; `not: {anyOf}` is every branch negated, `not: {allOf}` a choice of one branch
    negated, `not: {not: X}` is X; a schema of several independent keyword groups fails where one of them
    fails, a choice of each group negated.  None for the other shapes (`negate` handles those it can)."""
    inner = part.get("not")
    if not isinstance(inner, dict):
        return None
    keys = _constraining(inner)
    rest = [p.skipping("not") if p is part else p for p in parts]
    signature = _signature(ctx, rest)
    if _apart(ctx, signature, _signature(ctx, [part.sub(inner, "not")])):
        return ctx.compile(rest)
    bounds = _negated_bounds(inner)
    if bounds is not None:
        if not bounds:
            return ctx.never("the negated bounds hold for every instance", part.at("not"))
        return choice(ctx.compile(rest + [part.derived(bound, "failing " + " ".join(sorted(bound)), "not")])
                      for bound in bounds)
    if keys in ({"enum"}, {"const"}):
        values = _listed(inner)
        expect(isinstance(values, list), "enum must be an array", part.at("not", "enum"))
        containers = [v for v in values if isinstance(v, (dict, list))]
        if not containers:
            return None     # `negate` excludes scalars from their terminals
        if len(containers) > _MAX_NEGATED_CONTAINERS:
            raise UnsupportedSchemaError(f"not over more than {_MAX_NEGATED_CONTAINERS} object or array values",
                                         part.at("not"))
        # an object or array differs from a value where it fails the shape that pins it down
        scalars = [v for v in values if not isinstance(v, (dict, list))]
        negations = [part.derived({"not": {"enum": scalars}}, "not scalars", "not")] if scalars else []
        negations += [part.derived({"not": _shape_of(v)}, f"not value {i}", "not") for i, v in enumerate(containers)]
        return ctx.compile(rest + negations)
    if keys == {"prefixItems"}:
        # an array with an item failing the schema at its position
        items = inner["prefixItems"]
        expect(isinstance(items, list), "prefixItems must be an array", part.at("not", "prefixItems"))
        return choice(ctx.compile(rest + [part.derived(
            {"type": "array", "minItems": i + 1, "prefixItems": [True] * i + [{"not": item}]}, f"failing item {i}",
            "not")]) for i, item in enumerate(items))
    if "$ref" in keys:
        expanded = ctx.expand([part.sub(inner, "not")])
        if expanded is None:    # the negated schema is false
            return ctx.compile(rest)
        return choice(ctx.compile(rest + [negated_conjunct(conjunct)]) for conjunct in expanded[0])
    if keys and keys <= {"properties", "patternProperties", "additionalProperties"}:
        return _negated_members(ctx, rest, signature, part, inner)
    if keys in ({"dependencies"}, {"dependentSchemas"}, {"dependentRequired"}):
        # an object holding a trigger and failing what it asks for: a key it lists, or its schema
        [keyword] = keys
        triggers = inner[keyword]
        expect(isinstance(triggers, dict), f"{keyword} must be an object", part.at("not", keyword))
        ways = []
        for trigger, needs in triggers.items():
            if isinstance(needs, list):
                ways += [[part.derived({"type": "object", "required": [trigger], "properties": {name: False}},
                                       f"{trigger} without {name}", "not", keyword)] for name in needs]
            else:
                ways.append([part.derived({"type": "object", "required": [trigger]}, f"holding {trigger}", "not",
                                          keyword),
                             part.derived({"not": needs}, f"failing {trigger}", "not", keyword, trigger)])
        return choice(ctx.compile(rest + way) for way in ways)
    if keys and keys <= {"if", "then", "else"}:
        # if/then/else fails where `if` holds and `then` fails, or `if` fails and `else` does (without `if`, or
        # without both branches, it holds everywhere)
        if "if" not in keys:
            return ctx.never("then and else without if hold for every instance", part.at("not"))
        cond = part.sub(inner["if"], "not", "if")
        ways = [[cond, part.derived({"not": inner["then"]}, "failing then", "not", "then")]] if "then" in keys else []
        if "else" in keys:
            ways.append([part.derived({"not": inner["if"]}, "failing if", "not", "if"),
                         part.derived({"not": inner["else"]}, "failing else", "not", "else")])
        return choice(ctx.compile(rest + way) for way in ways)
    if "contains" in keys and keys <= _CONTAINS:
        counts = _negated_counts(inner)
        expect(counts is not None, "minContains and maxContains must be non-negative integers", part.at("not"))
        if not counts:
            return ctx.never("minContains 0 holds for every array", part.at("not"))
        return choice(ctx.compile(rest + [part.derived(
            {"type": "array", "contains": inner["contains"], "minContains": least,
             **({} if most is None else {"maxContains": most})},
            f"contains {least} to {most}", "not")]) for least, most in counts)
    if len(keys) > 1:
        groups = _negation_groups(keys)
        if groups is None or len(groups) < 2:
            return None
        return choice(ctx.compile(rest + [part.derived({"not": {k: inner[k] for k in group}},
                                                       "not " + " ".join(sorted(group)))]) for group in groups)
    if not keys:
        return None
    [keyword] = keys
    value = inner[keyword]
    if keyword == "required":
        expect(isinstance(value, list) and all(isinstance(n, str) for n in value), "required must be an array of "
               "strings", part.at("not", "required"))
        return choice(ctx.compile(rest + [part.derived({"type": "object", "properties": {name: False}},
                                                       f"without {name}", "not")]) for name in value)
    if keyword == "propertyNames":
        # an object with a key the names' schema refuses; for `not: {const}`/`{enum}` those keys are its
        # strings, so an object holding one of them (and for `false` any key: a non-empty object)
        refused = _refused_names(value)
        if refused is None:
            witness = _refused_pattern(value, part.at("not", "propertyNames"))
            return None if witness is None else _holding(ctx, rest, part, [witness])
        if refused is True:
            return ctx.compile(rest + [part.derived({"type": "object", "minProperties": 1}, "some key", "not")])
        return choice(ctx.compile(rest + [part.derived({"type": "object", "required": [name]}, f"with {name}", "not")])
                      for name in refused)
    if keyword == "items" and not isinstance(value, list):
        # every item holds it, so its negation is an array with an item that does not
        return ctx.compile(rest + [part.derived({"type": "array", "contains": {"not": value}}, "an item failing",
                                                "not")])
    if keyword in ("anyOf", "allOf", "oneOf"):
        expect(isinstance(value, list) and value, f"{keyword} must be a non-empty array", part.at("not", keyword))
        negations = [part.derived({"not": branch}, f"not {keyword} {i}", "not", keyword, i)
                     for i, branch in enumerate(value)]
        if keyword == "allOf":
            return choice(ctx.compile(rest + [negation]) for negation in negations)
        # anyOf, and a oneOf where no two branches match together, fail where every branch fails; a oneOf also
        # fails where two branches match (a conjunction, not a count)
        branches = [part.sub(b, "not", keyword, i) for i, b in enumerate(value)]
        sigs = [_signature(ctx, rest + [branch]) for branch in branches] if len(branches) > 1 else []
        pairs = list(_overlapping_pairs(ctx, sigs)) if keyword == "oneOf" else []
        if len(pairs) > _MAX_NEGATED_PAIRS:
            raise UnsupportedSchemaError(f"not over a oneOf whose branches overlap in more than {_MAX_NEGATED_PAIRS} "
                                         "pairs (it fails where any two match)", part.at("not", "oneOf"))
        tag = None if pairs else _discriminator(sigs)
        if tag is not None:
            return _failing_tagged(ctx, rest, part, negations, *tag)
        return choice([ctx.compile(rest + negations)]
                      + [ctx.compile(rest + [branches[i], branches[j]]) for i, j in pairs])
    if keyword == "not":
        return ctx.compile(rest + [part.sub(value, "not", "not")])
    return None


def _discriminator(sigs: list[dict | None]) -> tuple[str, list[list]] | None:
    """A key every branch (`sigs`: their signatures with the rest of the conjunction) holds only in objects, and
    requires, with a constant or enum that no two branches share (`{"kind": "a", ...} | {"kind": "b", ...}`), and
    each branch's values for it; None if none."""
    if len(sigs) < 2:
        return None
    if any(sig is None or not sig["types"] <= {"object"} for sig in sigs):
        return None
    name = _tag([(sig["required"], sig["consts"]) for sig in sigs])
    return None if name is None else (name, [sig["consts"][name] for sig in sigs])


def _tag(pins: list[tuple[set, dict[str, list]]]) -> str | None:
    """The key every branch requires (`pins`: each branch's required keys and the keys it pins to constants, see
    `_pin`), pinned by each to values no other branch's admits; the first by name, None if none."""
    for name in sorted(k for k in set.intersection(*(required for required, _ in pins)) if isinstance(k, str)):
        if all(name in consts for _, consts in pins):
            keys = [_keys(consts[name]) for _, consts in pins]
            if sum(map(len, keys)) == len(set().union(*keys)):
                return name
    return None


def _pin(required: set, consts: dict[str, list], req: Any, props: Any, legacy: bool) -> None:
    """Add what one schema's `required` and `properties` pin down: the keys it requires, and the values of those
    properties that are a const or an enum (not beside a $ref where the draft, `legacy`, lets the $ref replace them)."""
    if isinstance(req, list):
        required.update(k for k in req if isinstance(k, str))
    if isinstance(props, dict):
        for name, sub in props.items():
            if not isinstance(sub, dict) or (legacy and "$ref" in sub):
                continue
            if "const" in sub:
                consts[name] = [sub["const"]]
            elif isinstance(sub.get("enum"), list):
                consts[name] = list(sub["enum"])


def _tagged(branches: list[Any], resolve: Resolver) -> bool:
    """Whether `branches` (schemas as written, $refs resolved by `resolve`) are objects told apart by a tag (see
    `_tag`), so that their negation is a sum, not a product (see `_failing_tagged`)."""
    pins = []
    for branch in branches:
        conjuncts = resolve(branch) if isinstance(branch, dict) and "$ref" in branch else [branch]
        if conjuncts is None or not all(isinstance(c, dict) for c in conjuncts):
            return False
        if not any(c.get("type") in ("object", ["object"]) for c in conjuncts):
            return False
        required: set = set()
        consts: dict[str, list] = {}
        for c in conjuncts:     # (the draft unknown here: a constant beside a $ref is never counted)
            _pin(required, consts, c.get("required"), c.get("properties"), legacy=True)
        pins.append((required, consts))
    return len(pins) > 1 and _tag(pins) is not None


def _failing_tagged(ctx: SchemaContext, rest: list[Part], part: Part, negations: list[Part], name: str,
                    tags: list[list]) -> Expr:
    """Every branch failing, where each branch is an object requiring key `name` with a value among its own `tags`:
    a value of branch k's fails the other branches already, so only branch k is negated there.  A sum of the
    branches' negations where negating them all together would multiply them (a recursive tagged union inside a
    oneOf's exclusions, Github_hard's o91595, built 600 objects)."""
    tagged = {"type": "object", "required": [name]}
    ways = [[part.derived({"not": {"type": "object"}}, "no object", "not")],
            [part.derived({"type": "object", "properties": {name: False}}, f"without {name}", "not")],
            [part.derived({**tagged, "properties": {name: {"not": {"enum": [v for vs in tags for v in vs]}}}},
                          f"{name} untagged", "not")]]
    ways += [[part.derived({**tagged, "properties": {name: {"enum": vs}}}, f"{name} tagged {k}", "not"), negation]
             for k, (vs, negation) in enumerate(zip(tags, negations))]
    return choice(ctx.compile(rest + way) for way in ways)


# Counts: `not: {minLength: n}` is a string of at most n - 1 characters (other types satisfy minLength).
_COUNT_NEGATIONS = {"minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
                    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
                    "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1)}
# Numeric bounds: `not: {minimum: x}` is a number below x (draft-04's `exclusiveMinimum: true` makes it at most x).
_BOUND_NEGATIONS = {"minimum": ("exclusiveMaximum", "maximum", "exclusiveMinimum"),
                    "maximum": ("exclusiveMinimum", "minimum", "exclusiveMaximum"),
                    "exclusiveMinimum": ("maximum", None, None), "exclusiveMaximum": ("minimum", None, None)}


def _negated_bounds(schema: Any) -> list[dict] | None:
    """`not` of a schema holding only count and numeric bounds: one schema per bound, each where that bound
    fails (a value fails the conjunction where one of them fails); None for other schemas or malformed
    bounds (the compiler reports those)."""
    if not isinstance(schema, dict):
        return None
    keys = _constraining(schema)
    if not keys or not keys <= _COUNT_NEGATIONS.keys() | _BOUND_NEGATIONS.keys():
        return None
    out = []
    for key in sorted(keys):
        value = schema[key]
        if key in _COUNT_NEGATIONS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return None
            kind, opposite, step = _COUNT_NEGATIONS[key]
            if value + step >= 0:   # minLength 0 fails nowhere
                out.append({"type": kind, opposite: value + step})
            continue
        if isinstance(value, bool) and key.startswith("exclusive"):
            continue                # draft-04's flag: read with its bound (alone it bounds nothing)
        if not is_number(value):
            return None
        opposite, flagged_opposite, flag = _BOUND_NEGATIONS[key]
        if flag is not None and schema.get(flag) is True:
            opposite = flagged_opposite
        out.append({"type": "number", opposite: value})
    return out


_CONTAINS = {"contains", "minContains", "maxContains"}


_MAX_NEGATED_CONTAINERS = 8   # object and array values of a negated enum: their negations multiply


def _listed(schema: dict) -> Any:
    """The values of a schema's `const` (one) or `enum` (as written: the caller checks it is a list)."""
    return [schema["const"]] if "const" in schema else schema["enum"]


def _shape_of(value: dict | list) -> dict:
    """The schema only `value` (an object or array) satisfies: its keys or length, and each member's value."""
    if isinstance(value, dict):
        shape: dict[str, Any] = {"type": "object", "additionalProperties": False}
        if value:
            shape.update(required=list(value), properties={k: {"const": v} for k, v in value.items()})
        return shape
    shape = {"type": "array", "minItems": len(value), "maxItems": len(value)}
    if value:
        shape["prefixItems"] = [{"const": v} for v in value]
    return shape


def _negated_counts(schema: dict) -> list[tuple[int, int | None]] | None:
    """`not: {contains, minContains, maxContains}`: an array whose matches are fewer than minContains (default
    1) or more than maxContains, as (minContains, maxContains) of each way; None for malformed counts."""
    for key in ("minContains", "maxContains"):
        value = schema.get(key)
        if value is not None and not (is_number(value) and value >= 0 and value == int(value)):
            return None
    least, most = int(schema.get("minContains", 1)), schema.get("maxContains")
    counts = []
    if least:
        counts.append((0, least - 1))
    if most is not None:
        counts.append((int(most) + 1, None))
    return counts


def _negated_members(ctx: SchemaContext, rest: list[Part], signature: dict | None, part: Part,
                     inner: dict) -> Expr | None:
    """`not: {properties, patternProperties, additionalProperties}`: an object with a member failing the
    schemas it holds that member's value to (a declared key's own and those of the patterns it matches, a
    pattern's for the other keys matching it, `additionalProperties` for the rest).  Which keys those may be
    is known where the rest of the conjunction closes the object (its own `additionalProperties: false` and no
    patterns): its declared keys.  Where it stays open, the object must hold a key matching a pattern whose value
    fails that pattern's schema, or a key matching none whose value fails `additionalProperties` (`SOME_KEY`,
    with the value's schema where it is not `false`).  Two conjunctions settle it at once: one that admits no
    object (every other type satisfies the negated keywords), and one that requires a key the negated schema
    closes out, which every object of it holds.  `signature`: the rest's (see `_signature`)."""
    declared = inner.get("properties", {})
    expect(isinstance(declared, dict), "properties must be an object", part.at("not", "properties"))
    patterns = inner.get("patternProperties", {})
    expect(isinstance(patterns, dict), "patternProperties must be an object", part.at("not", "patternProperties"))
    other = inner.get("additionalProperties", True)
    if signature is not None and not _shared_types(signature["types"], {"object"}):
        return ctx.never("only an object fails properties", part.at("not"))
    if other is False and not patterns and signature is not None and signature["required"] - declared.keys():
        return ctx.compile(rest + [part.derived({"type": "object"}, "a key closed out", "not")])

    def held_to(name: str) -> list[Any]:
        """The schemas the negated object holds the value of key `name` to (none: any value passes)."""
        hits = [sub for pattern, sub in patterns.items()
                if key_matches(pattern, name, part.at("not", "patternProperties", pattern))]
        subs = ([declared[name]] if name in declared else []) + hits + ([other] if name not in declared and not hits
                                                                         else [])
        return [sub for sub in subs if sub is not True and sub != {}]

    failing = [(name, held_to(name)) for name in declared]
    witnesses = []
    keys = _closed_keys(rest)
    if keys is not None:
        failing += [(name, held_to(name)) for name in keys if name not in declared]
    else:
        for pattern, sub in patterns.items():
            if sub is not True and sub != {}:
                witnesses.append({"match": [pattern], "avoid": [], "outside": list(declared),
                                  "at": part.at("not", "patternProperties", pattern),
                                  "values": _failing(part, sub, "not", "patternProperties", pattern)})
        if other is not True and other != {}:
            witnesses.append({"match": [], "avoid": list(patterns), "outside": list(declared),
                              "at": part.at("not", "additionalProperties"),
                              "values": _failing(part, other, "not", "additionalProperties")})
    # a declared key failing its schemas is held by name: written once, among the extras in schema order, where the
    # rest of the conjunction does not declare it
    named = [{"name": name, "values": [part.derived({"not": subs[0] if len(subs) == 1 else {"allOf": subs}},
                                                    f"failing {name}", "not")],
              "at": part.at("not", "properties", name)} for name, subs in failing if subs]
    # a key whose value the rest holds to what the negated schema asks of it too fails nowhere: its object, built in
    # full, would be NEVER (two overlapping `oneOf` branches declaring one key alike: 178 of Github_hard's o40454)
    named = [w for w in named if _can_fail(ctx, rest, w)]
    # the declared keys' objects share all but one member each: the rest is compiled once for them all
    return choice(([_holding(ctx, rest, part, named, ONE_KEY_OF)] if named else [])
                  + [_holding(ctx, rest, part, [witness]) for witness in witnesses])


def _can_fail(ctx: SchemaContext, rest: list[Part], witness: dict) -> bool:
    """Whether a declared key's value can be what `witness` asks beside what the rest's `properties` hold it to (a
    subset of what its object's member would be held to: where this admits nothing, neither does that)."""
    held = _property_parts(rest, witness["name"])
    return not held or ctx.nested(held + witness["values"]) != NEVER


def _failing(part: Part, sub: Any, *tokens: Any) -> list[Part]:
    """What a witness's value must satisfy to fail `sub` (at `tokens` below `part`): nothing more for `false`."""
    return [] if sub is False else [part.derived({"not": sub}, "failing value", *tokens)]


def _holding(ctx: SchemaContext, rest: list[Part], part: Part, witnesses: list[dict],
             keyword: str = SOME_KEY) -> Expr:
    """The conjunction with an object holding a key each of `witnesses` admits (see `SOME_KEY`), or with
    `ONE_KEY_OF` a key one of them admits."""
    return ctx.compile(rest + [part.derived({"type": "object", keyword: witnesses}, f"holding {witnesses[0]['at']}",
                                            "not")])


def _closed_keys(parts: list[Part]) -> list[str] | None:
    """The keys an object may hold under `parts`, in schema order, where one of them closes it
    (`additionalProperties: false`, no `patternProperties`); None where none does."""
    keys = None
    for part in parts:
        if part.get("additionalProperties") is False and not part.has("patternProperties"):
            names = part.get("properties", {})
            if not isinstance(names, dict):
                return None
            keys = list(names) if keys is None else [name for name in keys if name in names]
    return keys


def _refused_names(names: Any) -> list[str] | bool | None:
    """The keys a `propertyNames` schema refuses, where it lists them: True for `false` (every key), the
    strings of a `not: {const}` or `not: {enum}` (keys are strings, other values refuse none); else None."""
    if names is False:
        return True
    if not isinstance(names, dict) or set(names) != {"not"} or not isinstance(names["not"], dict):
        return None
    inner = names["not"]
    keys = _constraining(inner)
    if keys == {"const"}:
        values = [inner["const"]]
    elif keys == {"enum"} and isinstance(inner["enum"], list):
        values = inner["enum"]
    else:
        return None
    return list(dict.fromkeys(v for v in values if isinstance(v, str)))


def _refused_pattern(names: Any, pointer: str) -> dict | None:
    """The key a `propertyNames` pattern refuses, as a witness (`SOME_KEY`): `{pattern: P}` refuses the keys
    that do not match P, `{not: {pattern: P}}` those that do; None for other schemas."""
    negated = isinstance(names, dict) and set(names) == {"not"}
    inner = names["not"] if negated else names
    if not isinstance(inner, dict) or _constraining(inner) != {"pattern"} or not isinstance(inner["pattern"], str):
        return None
    return {"match": [inner["pattern"]] if negated else [], "avoid": [] if negated else [inner["pattern"]],
            "outside": [], "at": pointer}


def _signature(ctx: SchemaContext, parts: list[Part]) -> dict | None:
    """What a conjunction pins down cheaply: types, enum values, required keys with their constants."""
    expanded = ctx.expand(parts)
    if expanded is None:
        return None
    parts = expanded[0]
    branches = Branches()
    values = enum_values(parts)
    required: set = set()
    consts: dict[str, list] = {}
    for p in parts:
        narrow_types(p, branches)
        _pin(required, consts, p.get("required"), p.get("properties"), ctx.legacy)
    keys = _closed_keys(parts)
    closed = None if keys is None else set(keys)
    types = {"integer" if t == "number" and branches.integer_only else t for t in branches.types}
    if values is not None:
        types = {_type_of(v) for v in values}
    # (the parts themselves, for `_apart`'s closer look at their anyOf/oneOf branches and property values)
    return {"types": types, "values": values, "required": required, "consts": consts, "closed": closed,
            "parts": parts}


def conditional(ctx: SchemaContext, parts: list[Part], owner: Part) -> Expr:
    """if/then/else as (if ∧ then) ∪ (¬if ∧ else), where ¬if is one of the shapes `not` handles."""
    rest = [p.skipping("if", "then", "else") if p is owner else p for p in parts]
    cond = owner.sub(owner.get("if"), "if")
    then = [owner.sub(owner.get("then"), "then")] if owner.has("then") else []
    other = [owner.sub(owner.get("else"), "else")] if owner.has("else") else []
    negated = owner.derived({"not": owner.get("if")}, "not", "if")
    return choice([ctx.compile(rest + [cond] + then), ctx.compile(rest + [negated] + other)])


# Each trigger doubles the object's variants: any object takes 3 triggers (8 variants); more, up to 6, only while
# variants x declared properties stays within the budget (objects keyed by patterns alone, say), since every
# variant compiles the object's members again (6 triggers on 12 properties took 1.3 s).
_ALWAYS_TRIGGERS = 3
_MAX_SCHEMA_TRIGGERS = 6
_VARIANT_PROPERTY_BUDGET = 128


def _check_trigger_count(count: int, parts: list[Part], pointer: str) -> None:
    if count <= _ALWAYS_TRIGGERS:
        return
    if count > _MAX_SCHEMA_TRIGGERS:
        raise UnsupportedSchemaError(f"more than {_MAX_SCHEMA_TRIGGERS} triggers with schemas in dependentSchemas/"
                                     "dependencies", pointer)
    declared = set()
    for p in parts:
        props = p.get("properties")
        declared |= set(props) if isinstance(props, dict) else set()
    if 2 ** count * max(1, len(declared)) > _VARIANT_PROPERTY_BUDGET:
        raise UnsupportedSchemaError(f"{count} triggers with schemas in dependentSchemas/dependencies on an object "
                                     f"declaring {len(declared)} properties: its {2 ** count} variants would compile "
                                     f"them all again (up to {_ALWAYS_TRIGGERS} triggers always compile, more while "
                                     f"variants x properties <= {_VARIANT_PROPERTY_BUDGET})", pointer)


def dependent_schemas(ctx: SchemaContext, parts: list[Part], owner: Part) -> Expr | None:
    """dependentSchemas (and `dependencies` with schema values) as a choice: instances that are not objects;
    objects without the trigger key; objects with it, satisfying its schema (each trigger either way, so
    2^triggers object variants).  None when `owner` has none."""
    triggers = []
    lists = {}
    for key in ("dependentSchemas", "dependencies"):
        deps = owner.get(key, {})
        expect(isinstance(deps, dict), f"{key} must be an object", owner.at(key))
        for name, dep in deps.items():
            if key == "dependencies" and isinstance(dep, list):
                lists[name] = dep
            elif dep is not True and dep != {}:
                triggers.append((name, owner.sub(dep, key, name)))
    if not triggers:
        return None
    _check_trigger_count(len(triggers), parts, owner.pointer)
    rest = [p.skipping("dependentSchemas", "dependencies") if p is owner else p for p in parts]
    if lists:
        # (spelled `dependencies`, which every dialect defines: a draft-07 document ignores `dependentRequired`)
        rest.append(owner.derived({"dependencies": lists}, "dependency lists", "dependencies"))
    alternatives = [ctx.compile(rest + [owner.derived({"not": {"type": "object"}}, "not an object")])]
    for present in product((True, False), repeat=len(triggers)):
        variant = [owner.derived({"type": "object"}, "an object")]
        for (name, schema), here in zip(triggers, present):
            variant += ([owner.derived({"required": [name]}, f"with {name}"), schema] if here
                        else [owner.derived({"properties": {name: False}}, f"without {name}")])
        alternatives.append(ctx.compile(rest + variant))
    return choice(alternatives)


def negate(part: Part, branches: Branches, excluded: list[Any]) -> None:
    """`not` on the shapes that negate exactly: types, enum/const values, pattern, multipleOf, false/true."""
    inner = part.get("not")
    pointer = part.at("not")
    if inner is False:
        return
    expect(inner is True or isinstance(inner, dict), "not must be a schema", pointer)
    keys = set() if inner is True else _constraining(inner)
    if not keys:    # `true`, `{}` or annotations only: every instance satisfies it
        branches.types.clear()
        return
    if keys == {"type"}:
        negated = Branches()
        narrow_types(Part(inner, pointer, part.base), negated)
        if "number" in negated.types and not negated.integer_only:
            branches.types -= negated.types
        elif "number" in negated.types:  # not integer: numbers stay, integers go
            branches.types -= negated.types - {"number"}
            if branches.integer_only:
                branches.types.discard("number")
            else:
                excluded.append(("non-integer",))
        else:
            branches.types -= negated.types
        return
    if keys in ({"enum"}, {"const"}):
        values = _listed(inner)
        expect(isinstance(values, list), "enum must be an array", pointer + "/enum")
        excluded.extend(values)
        return
    if keys == {"pattern"}:
        # other types satisfy `pattern`, so only strings can fail it.  (Not `format`: its regexes admit a
        # subset of each format, so their complement would admit some valid ones.)
        branches.types &= {"string"}
        expect(isinstance(inner["pattern"], str), "pattern must be a string", pointer + "/pattern")
        excluded.append(NotMatching(inner["pattern"], pointer + "/pattern"))
        return
    if keys == {"multipleOf"}:
        # only numbers can fail multipleOf: those that are not multiples of the step
        step = inner["multipleOf"]
        expect(is_number(step) and step > 0, "multipleOf must be a positive number", pointer + "/multipleOf")
        branches.types &= {"number"}
        excluded.append(multiples_of(Decimal(str(step)), pointer + "/multipleOf"))
        return
    raise UnsupportedSchemaError(f"not with keywords {sorted(keys)} cannot be negated exactly", pointer)


Resolver = Callable[[dict], "list[Any] | None"]
#: The variant of the negation of a conjunct a $ref stands for (see `negated_conjunct`).
NEGATED_CONJUNCT = "/not $ref"


def negates_types_only(part: Part) -> bool:
    """Whether the `not` of `part` constrains types alone (or nothing): what `negate` reads of it is all it says."""
    inner = part.get("not")
    return inner is True or isinstance(inner, dict) and _constraining(inner) <= {"type"}


def negated_conjunct(conjunct: Part) -> Part:
    """`not` over one conjunct of a negated $ref, named by that conjunct alone (where it is, its base and the
    keywords it skips), not by the path of rewrites that reached it: met again inside its own negation (a
    recursive schema), the same conjunction comes back under the same key, and the compiler calls its rule
    (`SchemaCompiler._compile`) where it would otherwise unroll it without end."""
    schema = {k: v for k, v in conjunct.schema.items() if k not in conjunct.skip}
    return Part({"not": schema}, conjunct.pointer, conjunct.base, frozenset(),
                f"{NEGATED_CONJUNCT} {' '.join(sorted(conjunct.skip))}")


def _resolver(ctx: SchemaContext, at: Part) -> Resolver:
    """The conjuncts a schema holding a $ref stands for (allOf and $refs flattened, each without the keywords
    that were), where every one of them reads its own $refs under the base of `at`, so that they compile as
    schemas written there; None otherwise."""
    resolved: dict[int, tuple[dict, list[Any] | None]] = {}

    def resolve(schema: dict) -> list[Any] | None:
        # the same conjunct objects each time a schema is resolved again, so that sizes memoised by id hold
        if id(schema) not in resolved:
            resolved[id(schema)] = (schema, expand(schema))
        return resolved[id(schema)][1]

    def expand(schema: dict) -> list[Any] | None:
        try:
            expanded = ctx.expand([Part(schema, at.pointer, at.base)])
        except SchemaError:
            return None
        if expanded is None:
            return [False]
        conjuncts = []
        for part in expanded[0]:
            if part.base != at.base:
                return None
            conjuncts.append({k: v for k, v in part.schema.items() if k not in part.skip})
        return conjuncts
    return resolve


def _constraining(schema: dict) -> set[str]:
    """The keywords of a subschema that constrain instances ($ref included: a shape beside a $ref is not the
    whole schema).  `additionalItems` constrains only beside an array of `items`: elsewhere it is ignored."""
    keys = {k for k in schema if k in VALIDATION or k == "$ref"}
    if "additionalItems" in keys and not isinstance(schema.get("items"), list):
        keys.discard("additionalItems")
    return keys


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value == int(value)):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _shared_types(a: set, b: set) -> set:
    """The types an instance of both may have (a number and an integer share the integers)."""
    def widen(s):
        return s | ({"integer"} if "number" in s else set())
    return widen(a) & widen(b)


def _disjoint(a: dict | None, b: dict | None) -> bool:
    """True when no instance can satisfy both signatures (sound, not complete)."""
    if a is None or b is None:
        return True
    if a["values"] is not None and b["values"] is not None:
        return not _keys(a["values"]) & _keys(b["values"])
    for x, y in ((a, b), (b, a)):
        if x["values"] is not None and not any(_type_of(v) in y["types"] or (_type_of(v) == "integer" and "number"
                                                                             in y["types"]) for v in x["values"]):
            return True
    shared = _shared_types(a["types"], b["types"])
    if not shared:
        return True
    # Both can only be objects from here on (or overlap only on objects): look for a discriminating key.
    if shared - {"object"}:
        return False
    # a key one side requires holds its constants, which the other side's (when it holds the key) must share
    for name in a["required"] | b["required"]:
        if name in a["consts"] and name in b["consts"]:
            if not _keys(a["consts"][name]) & _keys(b["consts"][name]):
                return True
    for x, y in ((a, b), (b, a)):
        if y["closed"] is not None and x["required"] - y["closed"]:
            return True
    return False


_APART_DEPTH = 2   # how deep `_apart` looks into branches and property values (each level a signature per branch)


def _apart(ctx: SchemaContext, a: dict | None, b: dict | None, depth: int = _APART_DEPTH) -> bool:
    """`_disjoint`, or else proved by a closer look: every branch of an anyOf/oneOf on one side apart from the
    other side, or (where both can only meet as objects) the values of a key one side requires apart
    (`{"kind": {"oneOf": [tag a, tag b]}}` against `{"kind": tag c}`).  Sound, not complete."""
    if _disjoint(a, b):
        return True
    if depth == 0 or a is None or b is None:
        return False
    for x, y in ((a, b), (b, a)):
        for part in x["parts"]:
            for keyword in ("anyOf", "oneOf"):
                subs = part.get(keyword)
                if isinstance(subs, list) and subs and all(
                        _apart(ctx, _signature(ctx, [part.sub(sub, keyword, i)]), y, depth - 1)
                        for i, sub in enumerate(subs)):
                    return True
    if _shared_types(a["types"], b["types"]) - {"object"}:
        return False
    for name in a["required"] | b["required"]:
        values_a, values_b = _property_parts(a["parts"], name), _property_parts(b["parts"], name)
        if values_a and values_b and _apart(ctx, _signature(ctx, values_a), _signature(ctx, values_b), depth - 1):
            return True
    return False


def _property_parts(parts: list[Part], name: str) -> list[Part]:
    """What `parts`' `properties` say of the value of key `name`."""
    out = []
    for part in parts:
        props = part.get("properties")
        if isinstance(props, dict) and name in props:
            out.append(part.sub(props[name], "properties", name))
    return out


def _keys(values: list[Any]) -> set:
    return {json_key(v) for v in values}
