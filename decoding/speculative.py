"""Speculative decoding: what to draft, and how a draft is checked against the target model.

A proposer guesses up to k next tokens of a sequence; the engine appends them, computes all of
them in the next forward pass (k + 1 logit rows: the row before each draft token, and one more), and
samples every row exactly as plain decoding would, each with the right prefix.  A draft token is
accepted while it equals what was sampled at its row; the first mismatch's sample is kept instead,
and after a fully accepted draft the last row gives one more token.

Drafts here are deterministic (n-gram lookup, or the draft model's argmax), so q is one-hot and the
lossless rule "accept d with probability min(1, p(d) / q(d)), else sample norm(max(0, p - q))"
becomes: accept d with probability p(d), else sample p without d.  Drawing x ~ p and accepting
iff x == d does exactly that, with x itself as the replacement: every emitted token is a draw
from the target's distribution given the tokens before it, so outputs are distributed as without
speculation (and greedy outputs are identical).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, Protocol, Sequence

import numpy as np

from leapgen.decoding.constraint import TokenMatcher

Method = Literal["ngram", "draft"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """How an engine speculates; the dict form uses vLLM's key names so configs carry over.

    `{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 1}`
    `{"method": "draft", "model": PATH, "num_speculative_tokens": 4}` (PATH shares the target's tokenizer)
    """

    method: Method
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"speculative.method must be 'ngram' or 'draft', got {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative.{name} must be an int >= 1, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                             f"prompt_lookup_max ({self.prompt_lookup_max})")
        if self.method == "draft" and not self.model:
            raise ValueError("speculative.model is required with method 'draft' (an HF checkpoint dir or .gguf)")
        if self.method == "ngram" and self.model is not None:
            raise ValueError("speculative.model only goes with method 'draft'")

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
        """A config from the dict users pass (unknown keys are an error naming them), or as given."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"speculative must be a dict or leapgen.SpeculativeConfig, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative: unknown key(s) {unknown}; known: {sorted(known)}")
        missing = [key for key in ("method", "num_speculative_tokens") if key not in value]
        if missing:
            raise ValueError(f"speculative needs 'method' and 'num_speculative_tokens': {' and '.join(missing)} "
                             "missing")
        lookup = sorted({"prompt_lookup_max", "prompt_lookup_min"} & set(value))
        if value["method"] == "draft" and lookup:     # (they would be ignored: a draft model guesses by itself)
            raise ValueError(f"speculative: {' and '.join(lookup)} only go with method 'ngram'")
        return cls(**{**value, "model": str(value["model"]) if value.get("model") is not None else None})


class Proposer(Protocol):
    """Guesses the next tokens of several sequences at once."""

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """Up to `request.k` draft tokens per request, in order ([] when it has no guess)."""

    def release(self, seq_id: int) -> None:
        """Forget a sequence that finished (frees whatever the proposer kept for it)."""


@dataclass(frozen=True)
class DraftRequest:
    """One sequence to draft for: its id, every token so far (prompt + accepted output), how many to guess,
    and its constraint's matcher (a proposer that scores tokens may keep its guesses inside the constraint;
    it must leave the matcher where it found it)."""

    seq_id: int
    token_ids: Sequence[int]
    k: int
    matcher: TokenMatcher | None = None


class NgramProposer:
    """Prompt lookup: the tokens that followed the most recent earlier occurrence of the sequence's last n
    tokens, for n from `max_n` down to `min_n` (the longest match wins)."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        """See `Proposer.propose`."""
        return [ngram_draft(np.asarray(r.token_ids, dtype=np.int64), r.k, self.min_n, self.max_n) for r in requests]

    def release(self, seq_id: int) -> None:
        """Nothing is kept per sequence."""


def ngram_draft(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens following the latest earlier match of the longest suffix of `tokens` (n in
    [min_n, max_n]); [] when no suffix of that length occurred before."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # windows starting at 0 .. length - n - 1: every earlier position, not the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []


def constrain_draft(matcher: TokenMatcher, draft: list[int], words: int, eos_ids: Sequence[int],
                    stop_at_forced: bool = False) -> tuple[list[int], np.ndarray]:
    """Cut `draft` at its first token the constraint rejects (and after an eos), and return with it the
    allowed-token bitmask of every verification row: row i is the mask after the first i draft tokens.

    With `stop_at_forced` (forced-token jumps on) the draft also ends where the constraint forces the
    continuation (or only eos is left): decoding without a draft appends it there instead of sampling, so a
    draft running through them could accept another tokenization of the same text.  The matcher is
    walked along the draft and rolled back, so it ends where it started.
    """
    masks = np.zeros((len(draft) + 1, words), dtype=np.int32)
    eos = set(eos_ids)
    advanced = 0
    try:
        for token in draft:
            matcher.fill_bitmask(masks[advanced])
            if not matcher.is_token_allowed(token):
                return draft[:advanced], masks[:advanced + 1]
            matcher.advance(token)
            advanced += 1
            if token in eos:             # the sequence ends at it if it is taken: the row after is open, never
                masks[advanced] = -1     # read (a matcher past its eos allows nothing, which reads as an error)
                return draft[:advanced], masks[:advanced + 1]
            if stop_at_forced and (matcher.is_finished() or matcher.forced_tokens()):
                break
        matcher.fill_bitmask(masks[advanced])
    finally:
        matcher.rollback(advanced)
    return draft[:advanced], masks[:advanced + 1]


def accepted_length(draft: Sequence[int], sampled: Sequence[int]) -> int:
    """How many leading draft tokens equal the tokens sampled at their rows."""
    for i, token in enumerate(draft):
        if sampled[i] != token:
            return i
    return len(draft)
