"""Incremental detokenization from token bytes: O(new tokens) per step, never a replacement char mid-character.

Token ids map to bytes through the shared `grammars.Vocabulary` (byte-level BPE through GPT-2's
byte↔unicode table, SentencePiece `▁`/`<0xNN>` pieces, added tokens by their content).  Bytes then go
through an incremental UTF-8 decoder, which holds back an incomplete character until its last byte
arrives — byte-level tokens may end in the middle of one.
"""

from __future__ import annotations

import codecs
from typing import Any, Sequence

from leapgen.grammars.vocab import as_vocabulary

_PRIMING_TOKENS = 4     # prompt tokens fed first, enough to finish any UTF-8 character the prompt leaves open


class IncrementalDetokenizer:
    """Turns generated token ids into text one step at a time.

    `vocabulary` is a `grammars.Vocabulary` (or an HF tokenizer, for its default one).  `prompt_ids`
    only prime the UTF-8 state (a prompt may end inside a character); their text is not part of
    `text`.  Padding ids (logit columns past the tokenizer) spell nothing.
    """

    def __init__(self, vocabulary: Any, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self.vocabulary = as_vocabulary(vocabulary)
        self.skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8.decode(self._bytes(list(prompt_ids)[-_PRIMING_TOKENS:]))
        self.text = ""

    def _bytes(self, token_ids: Sequence[int]) -> bytes:
        return b"".join(self.vocabulary.text_bytes(t, self.skip_special_tokens) for t in token_ids)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append tokens; returns the newly completed text (possibly empty while a character is pending)."""
        delta = self._utf8.decode(self._bytes(token_ids))
        self.text += delta
        return delta

    def flush(self) -> str:
        """End of output: bytes of an unfinished character become U+FFFD, as a full decode would show them."""
        delta = self._utf8.decode(b"", final=True)
        self.text += delta
        return delta
