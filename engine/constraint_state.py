"""Per-sequence constraint state: the matcher, its row of the step's bitmask, forced-token jumps."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch

from leapgen.decoding.bitmask import bitmask_words
from leapgen.decoding.constraint import TokenConstraint, TokenMatcher
from leapgen.engine.step_profile import phase


class ConstraintState:
    """One sequence's position inside its request's constraint."""

    def __init__(self, constraint: TokenConstraint, output_ids: Iterable[int] = (),
                 max_tokens: int | None = None) -> None:
        self.constraint = constraint
        self.max_tokens = max_tokens
        self.matcher: TokenMatcher = constraint.matcher(max_tokens)
        for token in output_ids:             # a fork starts where its parent's text is
            self.matcher.advance(token)

    def fork(self, output_ids: Iterable[int]) -> "ConstraintState":
        """A state for a sequence forked with `output_ids` already generated."""
        return ConstraintState(self.constraint, output_ids, self.max_tokens)

    def advance(self, token_id: int) -> None:
        """Consume a generated token (ValueError when the constraint does not allow it)."""
        self.matcher.advance(token_id)

    def admissible(self, token_id: int, eos_token_ids: Sequence[int]) -> int:
        """`token_id` if the constraint takes it; else (a sampled token after which the output could not
        close within its budget) the first token of a shortest completion, which always can, or eos where
        the text is already complete."""
        if self.matcher.is_token_allowed(token_id):
            return token_id
        closing = self.matcher.completion_tokens()
        if closing:
            return closing[0]
        return next((t for t in eos_token_ids if self.matcher.is_token_allowed(t)), token_id)

    def is_forced(self) -> bool:
        """Whether a forced-token jump would append something here (eos, or the forced continuation)."""
        return self.matcher.is_finished() or bool(self.matcher.forced_tokens())

    def jump(self, eos_token_ids: Sequence[int], room: int) -> list[int]:
        """Tokens to append without sampling: eos when the text is complete, else the forced continuation
        (at most `room` tokens); [] when the next token is a real choice."""
        if self.matcher.is_finished():
            eos = set(eos_token_ids)
            return [t for t in self.matcher.allowed_token_ids().tolist() if t in eos][:1]
        return self.matcher.forced_tokens()[:room]


def step_bitmask(rows: Sequence[ConstraintState | np.ndarray | None], vocab_size: int
                 ) -> tuple[torch.Tensor | None, dict[int, Exception]]:
    """The step's `[rows, ceil(vocab/32)]` int32 allowed-token words: all ones on unconstrained rows, the
    matcher's mask on constrained ones, a precomputed mask (a speculative draft's row) as given; ids past the
    matcher's vocabulary stay disallowed; None when no row is constrained.  A matcher that fails, or allows
    nothing, leaves its row open and is reported by row."""
    errors: dict[int, Exception] = {}
    if all(row is None for row in rows):
        return None, errors
    buffer = np.full((len(rows), bitmask_words(vocab_size)), -1, dtype=np.int32)
    for index, row in enumerate(rows):
        if row is None:
            continue
        buffer[index] = 0
        try:
            if isinstance(row, np.ndarray):
                buffer[index, :len(row)] = row
            else:
                row.matcher.fill_bitmask(buffer[index])
            if not buffer[index].any():
                raise ValueError("the constraint allows no token here: no token of this vocabulary "
                                 "continues the text so far")
        except Exception as exc:
            buffer[index] = -1
            errors[index] = exc
    return torch.from_numpy(buffer), errors


class MasksAhead:
    """Computes the next masks of a step's constrained rows on a worker thread while the forward pass runs.

    The pass does not touch the matchers, and both sides spend most of their time without the GIL (torch
    inside its kernels, the compiled trie walks inside theirs), so the masks come nearly free.  A matcher that
    fails here is left out: the step computes its mask again and reports the error on its row.
    """

    def __init__(self) -> None:
        self._worker: ThreadPoolExecutor | None = None
        self._pid = 0                            # the process the worker runs in: a forked child has no worker thread

    def start(self, states: Mapping[int, ConstraintState], words: int) -> "Future[dict[int, np.ndarray]]":
        """Begin the masks of `states` (by key); the future's result maps each key that succeeded to its
        int32 words.  Wait for it before anything else moves these matchers."""
        if states:
            if self._worker is None or self._pid != os.getpid():
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leapgen-masks")
                self._pid = os.getpid()
            try:
                return self._worker.submit(_masks, dict(states), words)
            except RuntimeError:                 # no thread to be had (interpreter exit, a thread limit)
                self._worker = None
        none: Future[dict[int, np.ndarray]] = Future()     # the step computes every mask itself
        none.set_result({})
        return none


def _masks(states: dict[int, ConstraintState], words: int) -> dict[int, np.ndarray]:
    masks = {}
    with phase("masks ahead"):
        for key, state in states.items():
            row = np.zeros(words, dtype=np.int32)
            try:
                state.matcher.fill_bitmask(row)
            except Exception:
                continue
            masks[key] = row
    return masks
