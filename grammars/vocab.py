"""The bytes of every token of an HF tokenizer, and a byte trie over them in flat arrays.

Tokens are bytes, not strings: byte-level BPE tokens map through GPT-2's
bytes<->unicode table (and may be partial UTF-8), SentencePiece tokens spell
spaces as `▁` and raw bytes as `<0xNN>`.  Special tokens get no bytes (they are
never allowed by a constraint, except EOS which the matcher handles apart).
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass

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


@dataclass(eq=False)
class Vocab:
    """Token bytes, EOS ids and the trie of one tokenizer."""

    token_bytes: list[bytes | None]
    eos_ids: tuple[int, ...]
    size: int
    trie: Trie
    _tokenizer_ref: object
    _by_bytes: dict[bytes, int]
    _max_len: int

    @property
    def max_depth(self) -> int:
        """Length in bytes of the longest token."""
        return self._max_len

    @property
    def mask_words(self) -> int:
        """int32 words of a bitmask over this vocabulary."""
        return (self.size + 31) // 32

    def encode(self, data: bytes) -> list[int]:
        """Canonical token ids spelling exactly `data` (the tokenizer's own encoding when it
        spells `data`, else greedy longest match over the vocabulary)."""
        tokenizer = self._tokenizer_ref()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if tokenizer is not None and text is not None:
            ids = tokenizer.encode(text, add_special_tokens=False)
            spelled = b"".join(self.token_bytes[i] or b"\xff\xff" for i in ids)
            if spelled == data:
                return list(ids)
            # SentencePiece prepends a `▁` at the start of a text; drop it when it stands alone
            if spelled == b" " + data and ids and self.token_bytes[ids[0]] == b" ":
                return list(ids[1:])
        return self._greedy(data)

    def _greedy(self, data: bytes) -> list[int]:
        out, pos = [], 0
        while pos < len(data):
            for n in range(min(self._max_len, len(data) - pos), 0, -1):
                tid = self._by_bytes.get(data[pos : pos + n])
                if tid is not None:
                    out.append(tid)
                    pos += n
                    break
            else:
                raise ValueError(f"byte {data[pos]:#x} at offset {pos} has no token in this vocabulary")
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


def _token_bytes(tokenizer, size: int) -> list[bytes | None]:
    kind = _decoder_kind(tokenizer)
    specials = _special_ids(tokenizer)
    added = {int(i): t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    out: list[bytes | None] = []
    for tid, piece in enumerate(pieces):
        if tid in specials or piece is None:
            out.append(None)
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
    return out


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


_CACHE: "weakref.WeakKeyDictionary[object, Vocab]" = weakref.WeakKeyDictionary()


def vocab_for(tokenizer) -> Vocab:
    """The Vocab of an HF tokenizer, built once per tokenizer object and process."""
    cached = _CACHE.get(tokenizer)
    if cached is not None:
        return cached
    size = len(tokenizer)
    token_bytes = _token_bytes(tokenizer, size)
    eos = getattr(tokenizer, "eos_token_id", None)
    eos_ids = (eos,) if isinstance(eos, int) and 0 <= eos < size else ()
    by_bytes: dict[bytes, int] = {}
    for tid, b in enumerate(token_bytes):
        if b:
            by_bytes.setdefault(b, tid)
    vocab = Vocab(
        token_bytes=token_bytes,
        eos_ids=eos_ids,
        size=size,
        trie=build_trie(token_bytes),
        _tokenizer_ref=weakref.ref(tokenizer),
        _by_bytes=by_bytes,
        _max_len=max((len(b) for b in by_bytes), default=1),
    )
    _CACHE[tokenizer] = vocab
    return vocab
