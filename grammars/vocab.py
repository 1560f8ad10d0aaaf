"""The vocabulary a model decodes over: the bytes of every token id, its eos ids, a byte trie.

One `Vocabulary` is shared by the grammars (masks, forced tokens), the detokenizer and the engine.
Tokens are bytes, not strings: byte-level BPE tokens map through GPT-2's bytes<->unicode table (and
may be partial UTF-8), SentencePiece tokens spell spaces as `▁` and raw bytes as `<0xNN>`.  Special
tokens get no bytes (a constraint never allows them; the matcher handles eos apart) but keep their
text for `skip_special_tokens=False`.  `size` is the model's logit width, which may exceed the
tokenizer (embeddings padded to a multiple of 64): padding ids have no bytes either.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Sequence

import numba
import numpy as np

_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_table() -> dict[int, int]:
    """GPT-2's printable stand-in character for each byte, as {ord(char): byte}."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = b
        else:
            chars[b] = 256 + extra
            extra += 1
    return {c: b for b, c in chars.items()}


_BYTE_LEVEL_TABLE = {c: chr(b) for c, b in _gpt2_byte_table().items()}


@dataclass(eq=False)
class Trie:
    """A byte trie in preorder: node i is entered by `byte[i]` at `depth[i]`; its subtree is
    nodes i..end[i]-1; tokens spelled by the path to node i are `tok_ids[tok_ptr[i]:tok_ptr[i+1]]`."""

    byte: np.ndarray
    depth: np.ndarray
    end: np.ndarray
    tok_ptr: np.ndarray
    tok_ids: np.ndarray

    @property
    def num_nodes(self) -> int:
        return len(self.byte)


class UnspellableError(ValueError):
    """Bytes that no sequence of whole tokens of the vocabulary spells."""


@dataclass(eq=False)
class Vocabulary:
    """Token bytes, special-token text, eos ids and the byte trie of the tokens that have bytes.

    Build one with `vocabulary_for(tokenizer, size, eos_ids)`; `trie` must index `token_bytes`.
    """

    size: int                          # logit columns of the model (>= the tokenizer's tokens when padded)
    token_bytes: Sequence[bytes | None]  # len == size; None for special tokens, eos and ids the tokenizer lacks
    special_bytes: dict[int, bytes]    # the text of special tokens, shown when skip_special_tokens=False
    eos_ids: tuple[int, ...]           # the ids that end generation
    trie: Trie
    tokenizer_ref: Any = field(default=None, repr=False)  # weakref.ref to the HF tokenizer: canonical encodings

    def __post_init__(self):
        # A tuple of bytes drops out of the garbage collector's scans; a list of 100k+ entries would be
        # visited by every full collection for as long as the vocabulary lives.
        self.token_bytes = tuple(self.token_bytes)
        if len(self.token_bytes) != self.size:
            raise ValueError(f"token_bytes has {len(self.token_bytes)} entries for a vocabulary of {self.size}")
        bad = [e for e in self.eos_ids if not 0 <= e < self.size]
        if bad:
            raise ValueError(f"eos ids {bad} are outside the vocabulary of {self.size}")

    @property
    def mask_words(self) -> int:
        """int32 words of a bitmask over this vocabulary."""
        return (self.size + 31) // 32

    @cached_property
    def max_depth(self) -> int:
        """Length in bytes of the longest token."""
        return max(int(self.trie.depth.max(initial=0)), 1)

    @cached_property
    def _by_bytes(self) -> dict[bytes, int]:
        by_bytes: dict[bytes, int] = {}
        for tid, b in enumerate(self.token_bytes):
            if b:
                by_bytes.setdefault(b, tid)
        return by_bytes

    def text_bytes(self, token_id: int, skip_special_tokens: bool = True) -> bytes:
        """The bytes `token_id` shows in decoded text: b"" for padding ids and for skipped special tokens."""
        if not 0 <= token_id < self.size:
            return b""
        data = self.token_bytes[token_id]
        if data is None:
            return b"" if skip_special_tokens else self.special_bytes.get(token_id, b"")
        return data

    def encode(self, data: bytes) -> list[int]:
        """Canonical token ids spelling exactly `data` (the tokenizer's own encoding when it
        spells `data`, else greedy longest match over the vocabulary)."""
        tokenizer = self.tokenizer_ref() if self.tokenizer_ref is not None else None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if tokenizer is not None and text is not None:
            ids = tokenizer.encode(text, add_special_tokens=False)
            spelled = b"".join(self.text_bytes(i) or b"\xff\xff" for i in ids)
            if spelled == data:
                return list(ids)
            # SentencePiece prepends a `▁` at the start of a text; drop it when it stands alone
            if spelled == b" " + data and ids and self.text_bytes(ids[0]) == b" ":
                return list(ids[1:])
        return self._greedy(data)

    def spell(self, data: bytes) -> list[int] | None:
        """Like `encode`, but None when no sequence of whole tokens spells `data` (e.g. forced text that
        is only the start of every token that could continue it)."""
        try:
            return self.encode(data)
        except UnspellableError:
            return None

    def _greedy(self, data: bytes) -> list[int]:
        out, pos = [], 0
        while pos < len(data):
            for n in range(min(self.max_depth, len(data) - pos), 0, -1):
                tid = self._by_bytes.get(data[pos : pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                raise UnspellableError(f"byte {data[pos]:#x} at offset {pos} has no token in this vocabulary")
        return out



def _decoder_kind(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return "unknown"
    state = json.loads(decoder.__getstate__())
    types = [d.get("type") for d in state.get("decoders", [state])]
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types or "Metaspace" in types or any(
        d.get("type") == "Replace" and d.get("content") == " " for d in state.get("decoders", [state])
    ):
        return "sentencepiece"
    return "unknown"


def _special_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for tid, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            ids.add(int(tid))
    return ids


def _token_bytes(tokenizer) -> tuple[list[bytes | None], dict[int, bytes]]:
    """The bytes of every token of `tokenizer` (None for specials and holes), and the specials' text."""
    kind = _decoder_kind(tokenizer)
    specials = _special_ids(tokenizer)
    added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out: list[bytes | None] = []
    special_bytes: dict[int, bytes] = {}
    for tid, piece in enumerate(pieces):
        if piece is None:
            out.append(None)
        elif tid in specials:
            out.append(None)
            special_bytes[tid] = added.get(tid, piece).encode("utf-8")
        elif tid in added:
            out.append(added[tid].encode("utf-8") or None)
        elif kind == "byte_level":
            try:
                out.append(piece.translate(_BYTE_LEVEL_TABLE).encode("latin-1"))
            except UnicodeEncodeError:
                out.append(piece.encode("utf-8"))
        elif kind == "sentencepiece":
            m = _SP_BYTE.fullmatch(piece)
            out.append(bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode("utf-8"))
        else:
            # no byte-exact decoder known: fall back to the tokenizer's own decoding of the token
            out.append(tokenizer.decode([tid]).encode("utf-8") or None)
    return out, special_bytes


@numba.njit(cache=True)
def _build_trie(buf, offsets):  # pragma: no cover - compiled
    """Preorder trie nodes from byte strings sorted lexicographically (unique)."""
    n = len(offsets) - 1
    total = offsets[-1] + 1
    byte = np.zeros(total, np.uint8)
    depth = np.zeros(total, np.int32)
    end = np.zeros(total, np.int32)
    node_of = np.zeros(n, np.int32)
    count = 1
    prev_start, prev_len = 0, 0
    for k in range(n):
        start, ln = offsets[k], offsets[k + 1] - offsets[k]
        lcp = 0
        while lcp < ln and lcp < prev_len and buf[start + lcp] == buf[prev_start + lcp]:
            lcp += 1
        for d in range(lcp, ln):
            byte[count] = buf[start + d]
            depth[count] = d + 1
            count += 1
        node_of[k] = count - 1
        prev_start, prev_len = start, ln
    # subtree ends: a node's subtree stops at the next node that is no deeper
    stack = np.zeros(total, np.int32)
    sp = 0
    for i in range(count):
        while sp > 0 and depth[stack[sp - 1]] >= depth[i]:
            sp -= 1
            end[stack[sp]] = i
        stack[sp] = i
        sp += 1
    while sp > 0:
        sp -= 1
        end[stack[sp]] = count
    return byte[:count], depth[:count], end[:count], node_of


def build_trie(token_bytes: list[bytes | None]) -> Trie:
    """The preorder byte trie of all tokens that have bytes."""
    groups: dict[bytes, list[int]] = {}
    for tid, b in enumerate(token_bytes):
        if b:
            groups.setdefault(b, []).append(tid)
    keys = sorted(groups)
    lengths = np.fromiter((len(k) for k in keys), np.int64, len(keys))
    offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.frombuffer(b"".join(keys), np.uint8) if keys else np.zeros(0, np.uint8)
    byte, depth, end, node_of = _build_trie(buf, offsets)
    counts = np.zeros(len(byte), np.int64)
    ids_per_key = [groups[k] for k in keys]
    np.add.at(counts, node_of, [len(g) for g in ids_per_key])
    tok_ptr = np.zeros(len(byte) + 1, np.int64)
    np.cumsum(counts, out=tok_ptr[1:])
    # node_of is increasing (preorder), so concatenating the groups in key order fills the CSR
    tok_ids = np.fromiter((t for g in ids_per_key for t in g), np.int32)
    return Trie(byte, depth, end, tok_ptr, tok_ids)


@dataclass(frozen=True, eq=False)
class _TokenizerTables:
    """What every Vocabulary of one tokenizer shares: the expensive part (~1.4 s for 100k tokens)."""

    token_bytes: tuple[bytes | None, ...]   # a tuple, untracked by the garbage collector (see Vocabulary)
    special_bytes: dict[int, bytes]
    trie: Trie


_TABLES: "weakref.WeakKeyDictionary[Any, _TokenizerTables]" = weakref.WeakKeyDictionary()
_VOCABULARIES: "weakref.WeakKeyDictionary[Any, dict[tuple, Vocabulary]]" = weakref.WeakKeyDictionary()


def _tables(tokenizer) -> _TokenizerTables:
    hit = _TABLES.get(tokenizer)
    if hit is None:
        token_bytes, special_bytes = _token_bytes(tokenizer)
        hit = _TABLES[tokenizer] = _TokenizerTables(tuple(token_bytes), special_bytes, build_trie(token_bytes))
    return hit


def vocabulary_for(tokenizer, size: int | None = None, eos_ids: Sequence[int] | None = None) -> Vocabulary:
    """The Vocabulary of an HF tokenizer for a model with `size` logit columns (default: the
    tokenizer's length) that stops on `eos_ids` (default: the tokenizer's eos); cached per
    (tokenizer, size, eos_ids), token bytes and trie built once per tokenizer."""
    tables = _tables(tokenizer)
    size = len(tables.token_bytes) if size is None else int(size)
    if eos_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        eos_ids = (eos,) if isinstance(eos, int) and 0 <= eos < size else ()
    eos_ids = tuple(int(e) for e in eos_ids)
    per_tokenizer = _VOCABULARIES.setdefault(tokenizer, {})
    hit = per_tokenizer.get((size, eos_ids))
    if hit is not None:
        return hit
    known = len(tables.token_bytes)
    token_bytes = [*tables.token_bytes[:size], *[None] * (size - known)]
    special_bytes = dict(tables.special_bytes)
    plain_eos = [e for e in eos_ids if 0 <= e < size and token_bytes[e] is not None]
    for e in plain_eos:
        # eos ends generation wherever the grammar is complete: it is never text to match
        special_bytes[e] = token_bytes[e]
        token_bytes[e] = None
    narrower = any(b is not None for b in tables.token_bytes[size:])
    trie = build_trie(token_bytes) if plain_eos or narrower else tables.trie
    hit = per_tokenizer[(size, eos_ids)] = Vocabulary(size, token_bytes, special_bytes, eos_ids, trie,
                                                      weakref.ref(tokenizer))
    return hit


def as_vocabulary(tokenizer_or_vocabulary) -> Vocabulary:
    """A Vocabulary as given, or the default one of an HF tokenizer (what the compile functions accept)."""
    if isinstance(tokenizer_or_vocabulary, Vocabulary):
        return tokenizer_or_vocabulary
    if not callable(getattr(tokenizer_or_vocabulary, "convert_ids_to_tokens", None)):
        raise TypeError(f"expected a transformers tokenizer or a leapgen Vocabulary, not "
                        f"{type(tokenizer_or_vocabulary).__name__}")
    return vocabulary_for(tokenizer_or_vocabulary)
