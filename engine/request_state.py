"""Engine-side state of a request and of each of its sequences, with outputs updated in place.

A request's `RequestOutput` is created once; every token appends to its completion's ids and
text, and `delta` holds the text the latest step released (after stop-string hold-back), so a
stream of deltas always joins to the final text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from leapgen.decoding.beam_search import BeamSearch
from leapgen.decoding.constraint import TokenConstraint
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.stop import StopChecker
from leapgen.engine.constraint_state import ConstraintState
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from leapgen.engine.sequence import Sequence


@dataclass
class SequenceState:
    """One sequence of a request: a sample (n > 1 gives several) or a live beam."""

    seq: Sequence
    completion: CompletionOutput
    stop: StopChecker | None                     # None for a running beam: beams decide their own end
    generator: torch.Generator | None
    constraint: ConstraintState | None = None
    draft: list[int] = field(default_factory=list)              # speculative tokens at the end of `seq`, unverified
    draft_masks: np.ndarray | None = None                       # [len(draft) + 1, words] allowed tokens per row
    pending_rows: list[torch.Tensor] = field(default_factory=list)   # logits of a draft computed over several steps

    def append(self, token: int) -> None:
        """One more output token: the sequence, its constraint state, its stop checks and its output."""
        self.seq.append_token(token)
        self.accept(token)

    def accept(self, token: int) -> None:
        """Account for a token already at the end of the sequence (a verified draft token): constraint,
        stop checks and output."""
        if self.constraint is not None:
            self.constraint.advance(token)
        self.record(token)

    def set_draft(self, draft: list[int], masks: np.ndarray | None) -> None:
        """Append speculative tokens for the next step to verify."""
        self.seq.append_tokens(draft)
        self.draft, self.draft_masks = draft, masks

    def drop_draft(self) -> None:
        """Forget the draft (the sequence was preempted: its tokens will be recomputed without it)."""
        if self.draft:
            self.seq.truncate_tokens(self.seq.num_tokens - len(self.draft))
        self.draft, self.draft_masks, self.pending_rows = [], None, []

    def record(self, token: int) -> None:
        """Account for a token already in the sequence in the stop checks and the output (forks replay
        their parent's tokens this way)."""
        if self.stop is None:
            return
        self.completion.token_ids.append(token)
        released = self.stop.append(token)
        if released:
            self.completion.text += released
            self.completion.delta += released
        if self.stop.finished:
            self.completion.finish_reason = self.stop.finish_reason
            self.completion.stop_reason = self.stop.stop_reason

    @property
    def finished(self) -> bool:
        """True once the stop checks ended this sample."""
        return self.stop is not None and self.stop.finished

    def record_logprob(self, logprob: TokenLogprob) -> None:
        """Keep the chosen token's logprob (requests that asked for logprobs)."""
        self.completion.logprobs.append(logprob)
        self.completion.cumulative_logprob += logprob.logprob


@dataclass
class EngineRequest:
    """A request as the step loop tracks it: its sequences (samples or beams) and its output."""

    request_id: int
    params: SamplingParams
    output: RequestOutput
    constraint: TokenConstraint | None = None    # compiled once, shared by the request's sequences
    samples: list[SequenceState] = field(default_factory=list)
    beams: BeamSearch | None = None
    beam_rows: dict[int, torch.Tensor] = field(default_factory=dict)   # log-probs of beams waiting for siblings
    prompt_rows: list[torch.Tensor] = field(default_factory=list)       # prompt logits gathered chunk by chunk
    arrival: float = field(default_factory=time.perf_counter)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.output.prompt_token_ids

    @property
    def finished(self) -> bool:
        return self.output.finished

    @property
    def forked(self) -> bool:
        """True once the request's samples or beams exist beyond the first sequence."""
        return len(self.samples) > 1 or self.beams is not None

    def clear_deltas(self) -> None:
        """Start a new step: nothing released yet."""
        for completion in self.output.outputs:
            completion.delta = ""

    def fail(self, message: str) -> None:
        """End the request with finish_reason "error" (the caller frees its sequences)."""
        self.output.error = message
        for completion in self.output.outputs:
            if completion.finish_reason is None:
                completion.finish_reason = "error"
        if not self.output.outputs:     # beams: their completions come at the end, which this one never reaches
            self.output.outputs.append(CompletionOutput(0, "", [], "error"))
        self.finish()

    def finish(self) -> None:
        """Mark the output finished and stamp its total time."""
        self.output.finished = True
        self.output.metrics.total_time = time.perf_counter() - self.arrival
