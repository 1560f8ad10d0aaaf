"""`$ref` resolution inside one schema document: JSON pointers, `$id`/`id` bases, `$anchor`s.

Remote references (another document) are refused: compiling must never touch
the network, and a schema that needs one cannot be enforced as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable
from urllib.parse import unquote, urldefrag, urljoin

from .errors import SchemaError, UnsupportedSchemaError

# Keywords whose value is a subschema, a list of them, or a name -> subschema map.
_SINGLE = ("additionalProperties", "propertyNames", "not", "if", "then", "else", "contains",
           "additionalItems", "unevaluatedItems", "unevaluatedProperties", "items")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_SUBSCHEMA_KEYS = frozenset(_SINGLE + _LISTS + _MAPS)

_ROOT_BASE = "https://leapgen.invalid/schema.json"  # urljoin needs a hierarchical base


@dataclass(frozen=True)
class Located:
    """A subschema with its JSON pointer in the document and its base URI."""

    schema: Any
    pointer: str
    base: str


def escape_token(name: str) -> str:
    """Escape one JSON pointer reference token."""
    if "~" not in name and "/" not in name:     # nearly every key: every subschema's pointer is written here
        return name
    return name.replace("~", "~0").replace("/", "~1")


# A place in the document as a linked list of reference tokens, (parent path, token), () at the root: a walk over
# every subschema makes one tuple per step, and only the places it reports become JSON pointer text.
Path = tuple


def json_pointer(tokens: Iterable[Any]) -> str:
    """The JSON pointer of reference tokens (keys and indexes), root first."""
    return "".join("/" + escape_token(str(token)) for token in tokens)


def pointer_of(path: Path) -> str:
    """The JSON pointer of a linked path."""
    tokens = []
    while path:
        path, token = path
        tokens.append(token)
    return json_pointer(reversed(tokens))


def _children(schema: dict, path: Path):
    present = _SUBSCHEMA_KEYS.intersection(schema)
    if not present:     # most subschemas: leaves
        return
    for key in _SINGLE:
        if key in present and isinstance(schema[key], (dict, bool)):
            yield schema[key], (path, key)
    for key in _LISTS:
        if key in present and isinstance(schema[key], list):
            keyed = (path, key)
            for i, sub in enumerate(schema[key]):
                yield sub, (keyed, i)
    for key in _MAPS:
        if key in present and isinstance(schema[key], dict):
            keyed = (path, key)
            for name, sub in schema[key].items():
                if isinstance(sub, (dict, bool)):
                    yield sub, (keyed, name)


def without_keywords(schema: Any, keywords: frozenset[str]) -> Any:
    """A copy of a schema document with `keywords` removed from every (sub)schema: the document as a dialect
    that does not define them reads it (property names and enum values are left alone)."""
    return rewritten(schema, lambda sub: {k: v for k, v in sub.items() if k not in keywords})


def rewritten(schema: Any, change: Callable[[dict], dict]) -> Any:
    """A copy of a schema document with `change` (a new dict from an old one) made to every (sub)schema, the
    subschemas of its result changed in turn; property names and enum values are left alone."""
    if not isinstance(schema, dict):
        return schema
    out = change(schema)
    for key in _SUBSCHEMA_KEYS.intersection(out):   # the few a schema has, not all the keywords asked of each
        value = out[key]
        if isinstance(value, dict):
            if key in _MAPS:
                out[key] = {name: rewritten(sub, change) for name, sub in value.items()}
            elif key in _SINGLE:
                out[key] = rewritten(value, change)
        elif isinstance(value, list) and key in _LISTS:
            out[key] = [rewritten(sub, change) for sub in value]
    return out


def _join(base: str, ref: str) -> str:
    """`ref` resolved against `base`; a fragment alone stays in `base`'s document, which urljoin forgets for
    bases it does not treat as hierarchical (an id like urn:example:schema)."""
    return urldefrag(base)[0] + ref if ref.startswith("#") else urljoin(base, ref)


class RefResolver:
    """Indexes a schema document's resources and anchors; resolves `$ref` strings to subschemas."""

    def __init__(self, root: Any, id_keyword: str = "$id"):
        self.root = root
        self.id_keyword = id_keyword
        self._resources: dict[str, Located] = {}
        self._anchors: dict[str, Located] = {}
        self._resolved: dict[tuple[str, str], Located] = {}
        self.root_base = self._base_of(root, _ROOT_BASE)
        self._indexed = False   # on the first $ref: most documents have none, and indexing walks all of it

    def _base_of(self, schema: Any, parent: str) -> str:
        ident = schema.get(self.id_keyword) if isinstance(schema, dict) else None
        if isinstance(ident, str) and not ident.startswith("#"):
            return urldefrag(urljoin(parent, ident))[0]
        return parent

    def _index(self, schema: Any, path: Path, parent_base: str) -> None:
        if not isinstance(schema, dict):
            return
        base = self._base_of(schema, parent_base) if path else self.root_base
        if (not path or base != parent_base) and base not in self._resources:
            self._resources[base] = Located(schema, pointer_of(path), base)
        names = [f"{base}#{schema[key]}" for key in ("$anchor", "$dynamicAnchor") if isinstance(schema.get(key), str)]
        ident = schema.get(self.id_keyword)
        if isinstance(ident, str) and ident.startswith("#") and len(ident) > 1:  # draft-04/06/07 plain-name ids
            names.append(f"{base}{ident}")
        for name in names:
            if name not in self._anchors:
                self._anchors[name] = Located(schema, pointer_of(path), base)
        for sub, sub_path in _children(schema, path):
            self._index(sub, sub_path, base)

    def base_for(self, schema: Any, parent_base: str) -> str:
        """The base URI in effect inside `schema` when its parent's base is `parent_base`."""
        return self._base_of(schema, parent_base)

    def resolve(self, ref: str, base: str, pointer: str) -> Located:
        """The subschema `ref` (as written at `pointer`, under `base`) refers to (memoised: a large schema
        follows the same few refs thousands of times, and joining URIs is most of the work)."""
        if not isinstance(ref, str):
            raise SchemaError("$ref must be a string", pointer + "/$ref")
        hit = self._resolved.get((ref, base))
        if hit is None:
            hit = self._resolved[(ref, base)] = self._resolve(ref, base, pointer)
        return hit

    def _resolve(self, ref: str, base: str, pointer: str) -> Located:
        if not self._indexed:
            self._index(self.root, (), self.root_base)
            self._indexed = True
        uri, fragment = urldefrag(_join(base, ref))
        if f"{uri}#{fragment}" in self._anchors:
            return self._anchors[f"{uri}#{fragment}"]
        resource = self._resources.get(uri)
        if resource is None:
            raise UnsupportedSchemaError(f"$ref {ref!r} points outside this document", pointer + "/$ref")
        if fragment and not fragment.startswith("/"):
            raise SchemaError(f"$ref {ref!r}: no anchor {fragment!r}", pointer + "/$ref")
        target, target_pointer, target_base = resource.schema, resource.pointer, resource.base
        for raw in fragment.split("/")[1:] if fragment else ():
            token = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaError(f"$ref {ref!r} does not resolve: no {token!r}", pointer + "/$ref")
            target_pointer += "/" + escape_token(token)
            target_base = self._base_of(target, target_base)
        if not isinstance(target, (dict, bool)):
            raise SchemaError(f"$ref {ref!r} resolves to a {type(target).__name__}, not a schema", pointer + "/$ref")
        return Located(target, target_pointer, target_base)
