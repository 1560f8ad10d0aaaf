"""The seam between decoding and the constraint compiler: what a request's constraint must offer.

`grammars.CompiledGrammar` and its `Matcher` satisfy these protocols; the engine and the decoding
processors only ever see them, so another constraint backend can stand in.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


class TokenMatcher(Protocol):
    """Per-sequence constraint state."""

    def allowed_token_ids(self) -> np.ndarray:
        """Sorted ids allowed next (eos included when the text so far is complete)."""

    def fill_bitmask(self, buffer: np.ndarray) -> None:
        """Write the allowed set into an int32 row of ceil(vocab / 32) words."""

    def forced_tokens(self) -> list[int]:
        """Ids of the only possible continuation; [] when there is a choice."""

    def is_token_allowed(self, token_id: int) -> bool:
        """The exact test for one token: under a token budget the mask may still offer a token after
        which the output could no longer complete in time; this refuses it."""

    def completion_tokens(self) -> list[int] | None:
        """The fewest tokens that complete the output from here ([] when complete; None if unknown)."""

    def advance(self, token_id: int) -> None:
        """Consume one token; raises ValueError when it is not allowed."""

    def rollback(self, n: int) -> None:
        """Undo the last `n` advances."""

    def is_finished(self) -> bool:
        """True when nothing but eos can follow."""


class TokenConstraint(Protocol):
    """A constraint compiled for one vocabulary."""

    def matcher(self, max_tokens: int | None = None) -> TokenMatcher:
        """A fresh matcher at the start of the output; with `max_tokens`, one whose output always
        completes within that many tokens."""


@runtime_checkable
class ConstraintSpec(Protocol):
    """What a user puts on a request (`leapgen.JsonSchema`, `Regex`, `Grammar`): compiled once per vocabulary."""

    def key(self) -> tuple:
        """Equal keys compile to the same constraint (the compile cache's key)."""

    def compile(self, vocabulary: Any) -> TokenConstraint:
        """The constraint compiled for `vocabulary` (a `grammars.Vocabulary`)."""
