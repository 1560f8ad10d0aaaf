"""Incremental detokenization from token bytes: O(new tokens) per step, never a replacement char mid-character.

Every token id maps to the bytes it spells (byte-level BPE through GPT-2's byte↔unicode table,
SentencePiece `▁`/`<0xNN>` pieces, added tokens by their content), built once per tokenizer.
Bytes then go through an incremental UTF-8 decoder, which holds back an incomplete character
until its last byte arrives — byte-level tokens may end in the middle of one.
"""

from __future__ import annotations

import codecs
import json
import re
import weakref
from typing import Any, Sequence

_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_TABLES: "weakref.WeakKeyDictionary[Any, dict[bool, list[bytes]]]" = weakref.WeakKeyDictionary()
_PRIMING_TOKENS = 4     # prompt tokens fed first, enough to finish any UTF-8 character the prompt leaves open


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes stand for themselves, the rest map above 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_UNICODE_TO_BYTE = _gpt2_unicode_to_byte()


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "generic"
    decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
    if '"ByteLevel"' in decoder:
        return "byte_level"
    if '"ByteFallback"' in decoder or '"Metaspace"' in decoder or "\\u2581" in decoder:
        return "sentencepiece"
    return "generic"


def _piece_bytes(kind: str, piece: str, tokenizer: Any, token_id: int) -> bytes:
    if kind == "byte_level" and all(c in _UNICODE_TO_BYTE for c in piece):
        return bytes(_UNICODE_TO_BYTE[c] for c in piece)
    if kind == "sentencepiece":
        match = _SP_BYTE.fullmatch(piece)
        return bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode()
    return tokenizer.decode([token_id]).encode()


def token_bytes_table(tokenizer: Any, skip_special_tokens: bool = True) -> list[bytes]:
    """The bytes of every token id of an HF tokenizer (special tokens empty when skipped); cached per tokenizer."""
    per_tokenizer = _TABLES.setdefault(tokenizer, {})
    if skip_special_tokens in per_tokenizer:
        return per_tokenizer[skip_special_tokens]
    kind = _decoder_kind(tokenizer)
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    special = set(tokenizer.all_special_ids)
    table = []
    for token_id, piece in enumerate(pieces):
        if token_id in special and skip_special_tokens:
            table.append(b"")
        elif token_id in added:
            table.append(added[token_id].encode())
        elif piece is None:
            table.append(b"")
        else:
            table.append(_piece_bytes(kind, piece, tokenizer, token_id))
    per_tokenizer[skip_special_tokens] = table
    return table


class IncrementalDetokenizer:
    """Turns generated token ids into text one step at a time.

    `prompt_ids` only prime the UTF-8 state (a prompt may end inside a character); their text is
    not part of `text`.  Ids outside the table (padded logits) spell nothing.
    """

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._table = token_bytes_table(tokenizer, skip_special_tokens)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8.decode(b"".join(self._bytes(t) for t in list(prompt_ids)[-_PRIMING_TOKENS:]))
        self.text = ""

    def _bytes(self, token_id: int) -> bytes:
        return self._table[token_id] if 0 <= token_id < len(self._table) else b""

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; returns the newly completed text (possibly empty while a character is pending)."""
        delta = self._utf8.decode(b"".join(self._bytes(t) for t in token_ids))
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of output: bytes of an unfinished character become U+FFFD, as a full decode would show them."""
        delta = self._utf8.decode(b"", final=True)
        self.text += delta
        return delta
