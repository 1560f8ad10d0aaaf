"""Beam search bookkeeping for one request, independent of the engine (transformers' semantics).

The engine runs the live beams as ordinary sequences, passes their next-token log-probs to
`BeamSearch.step`, and forks each new beam's KV blocks from the parent beam it reports.

Semantics follow transformers' `generate(num_beams=...)`: each step keeps the best
`(1 + #eos ids, at least 2) * num_beams` candidates over all beams; candidates among the best
`num_beams` that end (an eos id, or max_tokens reached) become finished hypotheses scored
`sum logprob / generated_len ** length_penalty` (eos counted); the best `num_beams` other
candidates continue.  A request is done when `early_stopping=True` and `num_beams` hypotheses are
finished, or when no running beam can beat the worst kept hypothesis: with `early_stopping=False`
its best possible score is taken at the current length, with `"never"` (and length_penalty > 0)
at max_tokens.

Under a constraint (`complete_only`), a candidate cut by max_tokens is not a finished instance:
it is kept apart and returned only when too few hypotheses ended with eos.  Candidates the
constraint forbids (log-prob -inf) are never taken, so beams may be fewer than `num_beams`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class Hypothesis:
    """A beam's generated tokens and score (finished: length-normalised; running: summed log-probs)."""

    token_ids: list[int]
    score: float


@dataclass
class BeamStep:
    """The running beams after a step: beam j continues `parents[j]` (an index into the previous beams) with `token_ids[j]`."""

    parents: list[int]
    token_ids: list[int]
    newly_finished: list[Hypothesis] = field(default_factory=list)


class BeamSearch:
    """Beam state of one request; `step` until `done`, then `best()`."""

    def __init__(self, num_beams: int, max_tokens: int, eos_token_ids: Sequence[int] = (),
                 length_penalty: float = 1.0, early_stopping: bool | str = False, complete_only: bool = False):
        if num_beams < 1 or max_tokens < 1:
            raise ValueError(f"num_beams ({num_beams}) and max_tokens ({max_tokens}) must be >= 1")
        if early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
        self.num_beams = num_beams
        self.max_tokens = max_tokens
        self.eos_token_ids = frozenset(eos_token_ids)
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.complete_only = complete_only
        self.candidates_per_step = max(2, 1 + len(self.eos_token_ids)) * num_beams
        self.running: list[Hypothesis] = [Hypothesis([], 0.0)]
        self.finished: list[Hypothesis] = []      # best first, at most num_beams
        self.truncated: list[Hypothesis] = []     # complete_only: cut by max_tokens, best first
        self.num_generated = 0
        self.done = False

    def step(self, log_probs: torch.Tensor) -> BeamStep:
        """Advance with `log_probs` [len(running), V] (the next-token log-probs of each running beam, in order)."""
        if self.done:
            raise RuntimeError("BeamSearch.step called after the search finished")
        if log_probs.dim() != 2 or log_probs.shape[0] != len(self.running):
            raise ValueError(f"log_probs must be [{len(self.running)} running beams, vocab], got {tuple(log_probs.shape)}")
        vocab = log_probs.shape[1]
        scores = torch.tensor([b.score for b in self.running], dtype=torch.float32, device=log_probs.device)
        total = (log_probs.float() + scores[:, None]).flatten()
        values, flat_ids = total.topk(min(self.candidates_per_step, total.numel()))
        length = self.num_generated + 1
        at_limit = length >= self.max_tokens
        # Normalise in float32, like transformers, so near-ties between hypotheses resolve the same way.
        normalised = (values / length ** self.length_penalty).tolist()
        parents, tokens, running, new_finished, new_truncated = [], [], [], [], []
        for rank, (value, flat) in enumerate(zip(values.tolist(), flat_ids.tolist())):
            if value == float("-inf"):
                break                                # forbidden, and so is every candidate after it
            parent, token = divmod(flat, vocab)
            ids = self.running[parent].token_ids + [token]
            if at_limit and self.complete_only and token not in self.eos_token_ids:
                if rank < self.num_beams:
                    new_truncated.append(Hypothesis(ids, normalised[rank]))
            elif at_limit or token in self.eos_token_ids:
                # Only the best num_beams candidates may finish; lower ones are just dropped.
                if rank < self.num_beams:
                    new_finished.append(Hypothesis(ids, normalised[rank]))
            elif len(running) < self.num_beams:
                running.append(Hypothesis(ids, value))
                parents.append(parent)
                tokens.append(token)
        self.finished = _best(self.finished + new_finished, self.num_beams)
        self.truncated = _best(self.truncated + new_truncated, self.num_beams)
        self.running = running
        self.num_generated = length
        self.done = not running or self._cannot_improve()
        return BeamStep(parents, tokens, new_finished)

    def _cannot_improve(self) -> bool:
        if len(self.finished) < self.num_beams:
            return False
        if self.early_stopping is True:
            return True
        if self.early_stopping == "never" and self.length_penalty > 0:
            best_length = self.max_tokens
        else:
            best_length = self.num_generated
        best_possible = torch.tensor(self.running[0].score, dtype=torch.float32) / best_length ** self.length_penalty
        return bool(best_possible <= self.finished[-1].score)

    def best(self, n: int = 1) -> list[Hypothesis]:
        """The n best finished hypotheses, best first (fewer where fewer finished, as under a constraint)."""
        if not self.done:
            raise RuntimeError("BeamSearch.best called before the search finished")
        if not 1 <= n <= self.num_beams:
            raise ValueError(f"n must be in [1, num_beams={self.num_beams}], got {n}")
        return (self.finished + self.truncated)[:n]


def _best(hypotheses: list[Hypothesis], k: int) -> list[Hypothesis]:
    # Stable sort: on equal scores the hypothesis finished earlier stays ahead.
    return sorted(hypotheses, key=lambda h: -h.score)[:k]
