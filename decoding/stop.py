"""When a sequence ends (eos, stop token ids, stop strings, max_tokens) and which text it streams.

One `StopChecker` per sequence.  Stop strings are searched on the incrementally detokenized text,
so a stop string spread over several tokens (or ending inside one) is found.  Without
`include_stop_str_in_output`, the last `len(longest stop) - 1` characters are held back from the
stream until it is clear they do not begin a stop string.  Nothing stops the sequence before
`min_tokens` tokens exist (the MinTokens processor already keeps eos and stop ids out).
"""

from __future__ import annotations

from typing import Sequence

from leapgen.decoding.detokenizer import IncrementalDetokenizer
from leapgen.decoding.sampling_params import SamplingParams


class StopChecker:
    """Feed it each generated token; it says when to stop, why, and which new text may be streamed.

    `finish_reason` is "stop" (eos, a stop token id or a stop string) or "length" (max_tokens);
    `stop_reason` is the stop string or stop token id that ended it (None for eos and length).
    """

    def __init__(self, params: SamplingParams, eos_token_ids: Sequence[int] = (),
                 detokenizer: IncrementalDetokenizer | None = None):
        if params.stop and detokenizer is None:
            raise ValueError(f"stop strings {params.stop!r} need a detokenizer (the request has no tokenizer)")
        self.params = params
        self.detokenizer = detokenizer
        self._eos = frozenset(() if params.ignore_eos else eos_token_ids)
        self._stop_ids = frozenset(params.stop_token_ids or ())
        self._stops = list(params.stop or ())
        longest = max((len(s) for s in self._stops), default=0)
        self._context = max(longest - 1, 0)     # characters before the new text a stop string may start in
        self._holdback = 0 if params.include_stop_str_in_output else self._context
        self._released: list[str] = []
        self._pending = ""                       # text produced but not yet streamed
        self._tail = ""                          # the last `_context` characters of the text
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        """True once the sequence has ended."""
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        """The output text so far (final once finished: stop string removed unless included)."""
        return "".join(self._released) + self._pending

    def append(self, token_id: int) -> str:
        """Account for one generated token; returns the text that may now be streamed."""
        if self.finished:
            raise RuntimeError(f"token {token_id} appended after the sequence finished ({self.finish_reason})")
        self.num_tokens += 1
        may_stop = self.num_tokens >= self.params.min_tokens
        if may_stop and (token_id in self._eos or token_id in self._stop_ids):
            if self.params.include_stop_str_in_output:
                self._add_text(token_id)
            self._finish("stop", None if token_id in self._eos else token_id)
        else:
            delta = self._add_text(token_id)
            if self._stops and delta:
                self._scan_stop_strings(delta, may_stop)
        if not self.finished and self.num_tokens >= self.params.max_tokens:
            self._finish("length", None)
        return self._release()

    def _add_text(self, token_id: int) -> str:
        delta = self.detokenizer.add([token_id]) if self.detokenizer is not None else ""
        self._pending += delta
        return delta

    def _scan_stop_strings(self, delta: str, may_stop: bool) -> None:
        window = self._tail + delta
        found = None
        for stop in self._stops if may_stop else ():
            # Only occurrences that end in the new text: older ones were already checked (or before min_tokens).
            pos = window.find(stop, max(len(self._tail) - len(stop) + 1, 0))
            if pos >= 0 and (found is None or pos < found[0]):
                found = (pos, stop)
        if found is None:
            self._tail = window[max(len(window) - self._context, 0):]
            return
        pos, stop = found
        end = pos + len(stop) if self.params.include_stop_str_in_output else pos
        self._pending = self._pending[: len(self._pending) - (len(window) - end)]
        self._finish("stop", stop, flush=False)

    def _finish(self, reason: str, stop_reason: str | int | None, flush: bool = True) -> None:
        # A character left unfinished by the last bytes shows as U+FFFD, as in a full decode; after a
        # stop string the rest of the text is cut anyway.
        if flush and self.detokenizer is not None:
            self._pending += self.detokenizer.flush()
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def _release(self) -> str:
        cut = len(self._pending) if self.finished else max(len(self._pending) - self._holdback, 0)
        out, self._pending = self._pending[:cut], self._pending[cut:]
        if out:
            self._released.append(out)
        return out
