"""What generation returns for each request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprob:
    """One generated token's log-probability and the `top` alternatives (id -> logprob), best first.  A `forced`
    token is one a constraint allowed alone, appended by a forced-token jump without a forward pass of its own: its
    logprob is 0.0 (certain under the constraint) and its one alternative is itself."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    forced: bool = False


@dataclass
class CompletionOutput:
    """One generated continuation (a request has `n` of them, or the `n` best beams)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None          # "stop", "length", "error", or None while running
    stop_reason: str | int | None = None      # the stop string or stop token id that ended it
    logprobs: list[TokenLogprob] | None = None
    cumulative_logprob: float | None = None
    score: float | None = None                # beam search: the length-normalised score it was ranked by
    delta: str = ""                           # text added by the engine's latest step (streaming)
    parsed: Any = None                        # a pydantic-model constraint: the text validated into the model


@dataclass
class RequestMetrics:
    """What a request cost: forward passes it took part in, tokens drafted and accepted by speculation,
    tokens appended by forced-token jumps, and times in seconds since it was added."""

    forward_passes: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    forced_tokens: int = 0
    time_to_first_token: float | None = None
    total_time: float | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (None when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None


@dataclass
class RequestOutput:
    """A request's result.  `text`, `token_ids` and `finish_reason` are those of the first (best) completion.

    While the request runs the engine updates this object in place; `error` names what failed when a
    request ends with finish_reason "error" (the other requests are not affected).
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[TokenLogprob | None] | None = None
    error: str | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    @property
    def text(self) -> str:
        """The first completion's text."""
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        """The first completion's token ids."""
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        """Why the first completion ended ("stop", "length" or "error")."""
        return self.outputs[0].finish_reason
