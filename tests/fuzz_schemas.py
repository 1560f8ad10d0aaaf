"""Random JSON schemas and their valid instances, for fuzzing the JSON schema compiler.

Shared by tests/test_grammars_fuzz.py (short, derandomized CI runs) and benchmarks/fuzz_constraints.py
(the long campaign), with fuzz_oracle.py (what is valid, and how the compiler lays it out) and
fuzz_checks.py (the checks and the Fuzzer).  Only leapgen's public API is used.

- `schemas()`: schemas drawn from the keywords the compiler supports (README, "JSON schema support"),
  with `$defs`/`$ref` hoisting and a recursive template;
- `valid_instances(schema)`: hypothesis-jsonschema instances of a draft-7 translation of the schema
  (it knows neither `prefixItems` nor recursive `$ref`).
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any, Callable

from hypothesis import strategies as st
from hypothesis.errors import HypothesisWarning
from hypothesis_jsonschema import from_schema


WHITESPACES = ("flexible", "dumps", "compact")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"
_SHORT_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
# leapgen's email format is a documented subset of what jsonschema checks (a "@" somewhere): a dot-atom
# local part and a host name of up to 4 labels of up to 62 characters or up to 8 of up to 30
# (grammars/json_strings.py keeps it within 253 characters).
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL}){{0,3}}|{_SHORT_LABEL}(?:\.{_SHORT_LABEL}){{4,7}})"
EMAIL = re.compile(rf"{_ATEXT}(?:\.{_ATEXT})*@{_HOST}")
CUSTOM_FORMATS = {"uuid": st.uuids().map(str),
                  "email": st.one_of(st.emails(), st.from_regex(EMAIL, fullmatch=True))}

# Compiler bugs this fuzzer found, all fixed (tests/test_grammars_fuzz.py keeps each as a regression test): a
# leading star in a regex branch looped into the other branches; emptiness only the automata see (a pattern and
# lengths that do not intersect, endless recursion) raised GrammarError, not SchemaError; under a budget the
# matcher could refuse the next token of the completion it had promised; keys not declared in properties could
# repeat, each repeat counted towards minProperties (tests/test_grammars_distinct.py).


# ---- schemas ---------------------------------------------------------------------------------------

# Keys that need escaping in JSON, and non-ASCII ones, next to plain names.
NAMES = ["a", "b", "id", "name", "x y", "é", 'q"t', "tab\t"]
PATTERNS = ["^[a-z]+$", "^[A-Z]{2}-[0-9]{3,}$", "ab", "^x", "z$", "[0-9]", "^(foo|bar)$", "^[a-f0-9]{2,6}$",
            r"^\d{3}$", "^[^a-z]*$", r"^a\.b", "^$", "^(ab)*$", "q|^w", "^(a*b|c)$", "^([a-z]+(,|$))+$", "x(y$|z)"]
FORMATS = ["date", "email", "ipv4", "uuid"]
SCALARS = [None, True, False, 0, 1, -7, 2.5, -0.125, 10 ** 12, "", "a", "b c", "é", 'q"', "\n", "null", "1"]
CONSTS = SCALARS + [{"k": [1, "x"]}, [1, 2], {}, []]
TYPE_CLASSES = ["string", "integer", "boolean", "null", "object", "array"]   # pairwise disjoint


def maybe(strategy: st.SearchStrategy, absent_weight: int = 1) -> st.SearchStrategy:
    """`strategy` or None (absent), None weighted `absent_weight` to 1."""
    return st.one_of(*[st.none()] * absent_weight, strategy)


@st.composite
def string_schemas(draw) -> dict:
    schema: dict[str, Any] = {"type": "string"}
    kind = draw(st.sampled_from(["plain", "lengths", "lengths", "pattern", "pattern+lengths", "format"]))
    if "lengths" in kind:
        lo, hi = draw(maybe(st.integers(0, 4))), draw(maybe(st.integers(0, 8)))
        if lo is not None:
            schema["minLength"] = lo
        if hi is not None:
            schema["maxLength"] = hi      # sometimes below minLength: an unsatisfiable schema, refused
    if "pattern" in kind:
        schema["pattern"] = draw(st.sampled_from(PATTERNS))
    if kind == "format":
        schema["format"] = draw(st.sampled_from(FORMATS))
    return schema


def _bounds(draw, values: st.SearchStrategy) -> dict:
    """minimum/exclusiveMinimum and maximum/exclusiveMaximum, each present or not, usually ordered."""
    schema: dict[str, Any] = {}
    lower = draw(st.sampled_from([None, "minimum", "exclusiveMinimum"]))
    upper = draw(st.sampled_from([None, "maximum", "exclusiveMaximum"]))
    lo = draw(values)
    if lower:
        schema[lower] = lo
    if upper:
        schema[upper] = draw(st.one_of(values, st.integers(0, 120).map(lambda span: lo + span)))
    return schema


@st.composite
def integer_schemas(draw) -> dict:
    values = st.one_of(st.integers(-60, 60), st.sampled_from([-10 ** 6, 10 ** 9, 2.5, -0.5]))
    schema = {"type": "integer", **_bounds(draw, values)}
    multiple = draw(st.sampled_from([None, None, None, 2, 3, 5, 7, 10]))
    if multiple:
        schema["multipleOf"] = multiple
    refused = draw(st.sampled_from([None] * 5 + [2, 3, 4]))
    if refused:
        schema["not"] = {"multipleOf": refused}
    return schema


@st.composite
def number_schemas(draw) -> dict:
    values = st.one_of(st.integers(-60, 60), st.sampled_from([-2.5, -0.125, 0.5, 3.75, 99.99, 1000]))
    schema = {"type": "number", **_bounds(draw, values)}
    multiple = draw(st.sampled_from([None] * 6 + [0.5, 0.25, 2, 1.5, 0.3]))
    if multiple:
        schema["multipleOf"] = multiple
    refused = draw(st.sampled_from([None] * 6 + [1, 0.75]))
    if refused:
        schema["not"] = {"multipleOf": refused}
    return schema


def enum_schemas() -> st.SearchStrategy:
    values = st.lists(st.sampled_from(range(len(SCALARS))), min_size=1, max_size=4, unique=True)
    return st.one_of(
        values.map(lambda picks: {"enum": [SCALARS[i] for i in picks]}),
        st.sampled_from(CONSTS).map(lambda value: {"const": value}),
        st.tuples(values, st.sampled_from(["string", "integer", "number"]))   # a type filters the values
        .map(lambda pair: {"type": pair[1], "enum": [SCALARS[i] for i in pair[0]]}),
    )


def typed_leaf(type_name: str) -> st.SearchStrategy:
    """A leaf schema whose instances all have JSON type `type_name` (a TYPE_CLASSES entry or number)."""
    return {"string": string_schemas(), "integer": integer_schemas(),
            "number": number_schemas()}.get(type_name, st.just({"type": type_name}))


def leaf_schemas() -> st.SearchStrategy:
    # test_constraint_budget's leaves (bounded strings, formats, wide integer ranges, enums) come along too
    from test_constraint_budget import leaf_schemas as budget_leaves

    return st.one_of(
        string_schemas(), integer_schemas(), number_schemas(), enum_schemas(),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {}, {"type": ["string", "null"], "maxLength": 3},
                         {"type": ["integer", "boolean"], "minimum": 0}]),
        budget_leaves(),
    )


@st.composite
def object_schemas(draw, inner: st.SearchStrategy) -> dict:
    names = draw(st.lists(st.sampled_from(NAMES), max_size=4, unique=True))
    # without "type" the keywords only constrain objects and every other type is allowed as well
    schema: dict[str, Any] = {"type": "object"} if draw(st.integers(0, 4)) else {}
    schema["properties"] = {name: draw(inner) for name in names}
    if draw(st.booleans()):
        schema["required"] = draw(st.lists(st.sampled_from(names + ["r"]), unique=True, max_size=len(names) + 1))
    if draw(st.integers(0, 3)) == 0:     # keys by pattern: a schema or false (keys that must not exist)
        patterns = draw(st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=2, unique=True))
        schema["patternProperties"] = {p: draw(st.one_of(inner, st.just(False))) for p in patterns}
    if draw(st.integers(0, 5)) == 0:
        pattern = draw(st.sampled_from(PATTERNS))
        schema["propertyNames"] = draw(st.sampled_from([{"pattern": pattern}, {"not": {"pattern": pattern}},
                                                        {"maxLength": 3}]))
    additional = draw(st.sampled_from(["absent", "absent", "false", "false", "true", "schema"]))
    if additional != "absent":
        schema["additionalProperties"] = {"false": False, "true": True}.get(additional) \
            if additional != "schema" else draw(inner)
    for key in ("minProperties", "maxProperties"):
        count = draw(maybe(st.integers(0, 3), absent_weight=4))
        if count is not None:
            schema[key] = count
    return schema


@st.composite
def array_schemas(draw, inner: st.SearchStrategy) -> dict:
    schema: dict[str, Any] = {"type": "array"} if draw(st.integers(0, 4)) else {}
    if draw(st.integers(0, 2)) == 0:
        schema["prefixItems"] = draw(st.lists(inner, min_size=1, max_size=2))
    items = draw(st.sampled_from(["absent", "schema", "schema", "false"]))
    if items == "schema" or (items == "false" and "prefixItems" in schema):
        schema["items"] = draw(inner) if items == "schema" else False
    low = draw(maybe(st.integers(0, 3)))
    if low is not None:
        schema["minItems"] = low
    high = draw(maybe(st.integers(0, 3).map(lambda extra: (low or 0) + extra)))
    if high is not None and draw(st.integers(0, 3)) == 0:
        high += 33      # past 32 optional items: counted, not written out (json_schema_arrays._tail_items)
    if high is not None:
        schema["maxItems"] = high
    if draw(st.integers(0, 4)) == 0:      # mostly over strings, the items it is enforced on besides enums
        schema["uniqueItems"] = True
        if items != "false" and draw(st.integers(0, 2)):
            schema["items"] = draw(string_schemas())
    elif draw(st.integers(0, 4)) == 0:
        schema["contains"] = draw(inner)
        least = draw(maybe(st.integers(0, 2), absent_weight=2))
        if least is not None:
            schema["minContains"] = least
        most = draw(maybe(st.integers(0, 2).map(lambda extra: (least or 0) + extra), absent_weight=3))
        if most is not None:
            schema["maxContains"] = most
        if draw(st.integers(0, 2)) == 0:   # a second one, counted together with the first
            schema["allOf"] = [{"contains": draw(inner)}]
    return schema


@st.composite
def one_of_schemas(draw, inner: st.SearchStrategy) -> dict:
    """Mostly branches of distinct JSON types (disjoint, so compiled exactly); now and then arbitrary
    branches, which the compiler must either prove disjoint or refuse cleanly."""
    if draw(st.integers(0, 5)) == 0:
        return {"oneOf": draw(st.lists(inner, min_size=2, max_size=3))}
    types = draw(st.lists(st.sampled_from(TYPE_CLASSES), min_size=2, max_size=3, unique=True))
    branches = []
    for type_name in types:
        if type_name == "object":
            branches.append({**draw(object_schemas(inner)), "type": "object"})
        elif type_name == "array":
            branches.append({**draw(array_schemas(inner)), "type": "array"})
        else:
            branches.append(draw(typed_leaf(type_name)))
    return {"oneOf": branches}


# Tag values: strings, and numbers and booleans that JSON equality tells apart or not (1 and 1.0 are one value)
TAGS = ["a", "b", "c", 1, 1.0, True, 2]


@st.composite
def tagged_union_schemas(draw, inner: st.SearchStrategy) -> dict:
    """Objects told apart by a tag (a key each requires, held to constants the others do not share), now and then
    with a tag shared or optional, as a oneOf or anyOf, bare, negated, or one branch of a oneOf whose exclusions
    negate it: the compiler proves such branches apart and negates the union as a sum over its tags."""
    tag = draw(st.sampled_from(NAMES))
    count = draw(st.integers(2, 3))
    tags = draw(st.lists(st.lists(st.sampled_from(TAGS), min_size=1, max_size=2, unique_by=repr), min_size=count,
                         max_size=count))
    branches = []
    shape = object_schemas(leaf_schemas())      # leaves beside the tag: most such branches negate exactly
    for values in tags:
        branch = {**draw(shape), "type": "object"} if draw(st.integers(0, 5)) else draw(shape)
        branch["properties"] = {**branch.get("properties", {}),
                                tag: {"const": values[0]} if len(values) == 1 else {"enum": values}}
        if draw(st.integers(0, 5)):
            branch["required"] = [tag] + [k for k in branch.get("required", []) if k != tag]
        branches.append(branch)
    union = {draw(st.sampled_from(["oneOf", "anyOf"])): branches}
    form = draw(st.sampled_from(["bare", "not", "not", "beside", "excluded"]))
    if form == "not":
        return {"not": union}
    if form == "beside":
        return {**draw(object_schemas(inner)), "not": union}
    if form == "excluded":      # another branch that may overlap it: negated, with the union, in its exclusions
        return {"oneOf": [union, draw(st.one_of(inner, object_schemas(inner)))]}
    return union


@st.composite
def all_of_schemas(draw, inner: st.SearchStrategy) -> dict:
    objects = object_schemas(inner)
    kind = draw(st.sampled_from(["split", "split", "objects", "sibling", "any"]))
    if kind == "split":       # one leaf's keywords spread over conjuncts: bounds and lengths must intersect
        leaf = draw(st.one_of(integer_schemas(), number_schemas(), string_schemas()))
        keys = list(leaf)
        cut = draw(st.integers(0, len(keys)))
        return {"allOf": [{k: leaf[k] for k in keys[:cut]}, {k: leaf[k] for k in keys[cut:]}]}
    if kind == "objects":     # properties merge across conjuncts, in conjunct order
        return {"allOf": [draw(objects), draw(objects)]}
    if kind == "sibling":
        return {**draw(objects), "allOf": [draw(objects)]}
    return {"allOf": draw(st.lists(inner, min_size=2, max_size=2))}


@st.composite
def negated_schemas(draw, inner: st.SearchStrategy) -> dict:
    """A schema with a `not` beside it: the compiler must negate the inner one exactly (within what the outer
    one admits) or refuse cleanly."""
    if draw(st.integers(0, 2)):
        return {**draw(inner), "not": draw(inner)}
    # a key that must exist, by pattern, whatever its value or with a value failing a schema (the object's shape
    # decides where it may go)
    pattern = draw(st.sampled_from(PATTERNS))
    negated = draw(st.sampled_from([{"patternProperties": {pattern: False}}, {"propertyNames": {"pattern": pattern}},
                                    {"patternProperties": {pattern: draw(inner)}},
                                    {"patternProperties": {pattern: draw(inner)}, "additionalProperties": draw(inner)},
                                    {"propertyNames": {"not": {"pattern": pattern}}},
                                    {"properties": {name: draw(inner) for name in draw(st.lists(
                                        st.sampled_from(NAMES), max_size=2, unique=True))},
                                     "additionalProperties": False}]))
    return {**draw(object_schemas(inner)), "not": negated}


@st.composite
def conditional_schemas(draw, inner: st.SearchStrategy) -> dict:
    """if/then/else, a branch sometimes left out (under `not`, in a oneOf, the compiler negates them too)."""
    schema = {"if": draw(inner)}
    for key in draw(st.sampled_from([("then",), ("else",), ("then", "else")])):
        schema[key] = draw(inner)
    return schema


def composite_schemas(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        object_schemas(inner), object_schemas(inner), array_schemas(inner),
        st.lists(inner, min_size=2, max_size=3).map(lambda options: {"anyOf": options}),
        one_of_schemas(inner), all_of_schemas(inner), negated_schemas(inner), conditional_schemas(inner),
        tagged_union_schemas(inner),
    )


@st.composite
def recursive_schemas(draw) -> dict:
    """A tree or a linked list through `$defs`: instances of any depth, finite grammars."""
    value = draw(st.one_of(string_schemas(), integer_schemas(), enum_schemas()))
    if draw(st.booleans()):
        node = {"type": "object", "additionalProperties": False, "required": ["v"],
                "properties": {"v": value, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                   "maxItems": draw(st.integers(1, 3))}}}
    else:
        node = {"anyOf": [{"type": "null"},
                          {"type": "object", "properties": {"v": value, "next": {"$ref": "#/$defs/node"}},
                           "required": ["v", "next"]}]}
    return {"$defs": {"node": node}, "$ref": "#/$defs/node"}


def schemas(max_leaves: int = 6) -> st.SearchStrategy:
    """Random schemas over the supported keywords, some subschemas moved to `$defs` behind a `$ref`."""
    tree = st.recursive(leaf_schemas(), composite_schemas, max_leaves=max_leaves)
    return st.one_of(tree, tree, tree, tree, recursive_schemas()).flatmap(with_refs)


# ---- walking subschemas ----------------------------------------------------------------------------

_MAPS = ("properties", "patternProperties", "$defs")
_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SINGLES = ("items", "additionalProperties", "not")


def map_subschemas(schema: Any, fn: Callable[[Any], Any]) -> Any:
    """A copy of `schema` with `fn` applied to each immediate subschema."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: fn(sub) for name, sub in out[key].items()}
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [fn(sub) for sub in out[key]]
    for key in _SINGLES:
        if key in out:
            out[key] = fn(out[key])
    return out


def resolve(root: dict, ref: str) -> Any:
    """The subschema a local `$ref` ("#/a/b") names."""
    target: Any = root
    for token in ref.lstrip("#").split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        target = target[int(token)] if isinstance(target, list) else target[token]
    return target


def with_refs(schema: dict) -> st.SearchStrategy:
    """Move some subschemas (about one in four) into root `$defs`, each replaced by its `$ref`."""

    @st.composite
    def hoisted(draw) -> dict:
        defs = dict(schema.get("$defs", {}))

        def visit(sub: Any) -> Any:
            sub = map_subschemas(sub, visit)
            if isinstance(sub, dict) and "$ref" not in sub and draw(st.integers(0, 3)) == 0:
                name = f"d{len(defs)}"
                defs[name] = sub
                return {"$ref": f"#/$defs/{name}"}
            return sub

        root = map_subschemas({k: v for k, v in schema.items() if k != "$defs"}, visit)
        return {**root, "$defs": defs} if defs else root

    return hoisted()


# ---- valid instances -------------------------------------------------------------------------------

UNROLL = 3   # recursive $refs are unrolled this deep for hypothesis-jsonschema, then closed with `false`


def generation_schema(schema: dict) -> Any:
    """`schema` for hypothesis-jsonschema: refs inlined (recursion unrolled, which only narrows the
    instances) and 2020-12 `prefixItems`/`items` spelled as draft-7 `items`/`additionalItems`."""

    def convert(sub: Any, seen: tuple[str, ...]) -> Any:
        if not isinstance(sub, dict):
            return sub
        sub = map_subschemas({k: v for k, v in sub.items() if k != "$defs"}, lambda s: convert(s, seen))
        if "prefixItems" in sub:
            sub["items"], rest = sub.pop("prefixItems"), sub.pop("items", None)
            if rest is not None:
                sub["additionalItems"] = rest
        if "$ref" in sub:
            ref = sub.pop("$ref")
            target = False if seen.count(ref) >= UNROLL else convert(resolve(schema, ref), seen + (ref,))
            sub = {"allOf": [target, sub]} if sub else target
        return sub

    return convert(schema, ())


def valid_instances(schema: dict) -> st.SearchStrategy:
    """Instances hypothesis-jsonschema believes valid (still to be confirmed by the Oracle).  It writes
    any text for "uuid", and hypothesis' emails often have more host labels than leapgen's subset: both
    get a strategy of their own."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HypothesisWarning)     # "Overriding standard format 'email'"
        # a deep copy: hypothesis-jsonschema may rewrite the schema it is given, which is also ours
        return from_schema(json.loads(json.dumps(generation_schema(schema))), custom_formats=CUSTOM_FORMATS)


