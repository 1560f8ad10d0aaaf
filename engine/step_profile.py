"""Where an engine step's time goes: wall time per phase, summed over the steps run while profiling.

    profile = StepProfile()
    with profile.active():
        llm.generate(...)
    print(profile.table())

Phases nest: `forward` contains `inputs` (packing ids and attention metadata), `attention` (for a decode step
replayed from a CUDA graph, `graph replay` instead: the whole pass up to the head), `lm_head`, and
`masks ahead`, the constrained rows' masks computed on a worker thread during the pass.  Outside `profile.active()` a phase costs
one global lookup, so the markers stay in the step loop.  On CUDA each phase synchronises the device
when it ends, so the times are the device's, not the launch queue's.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import ContextManager, Iterator

import torch

# (phase, the phase it is part of): the table lists them in this order.
PHASES = (
    ("step", None),
    ("schedule", "step"),
    ("forward", "step"),
    ("inputs", "forward"),
    ("attention", "forward"),
    ("graph replay", "forward"),
    ("lm_head", "forward"),
    ("masks ahead", "forward"),
    ("masks", "step"),
    ("sampling", "step"),
    ("accept", "step"),
    ("propose", "step"),
)
_PARENT = dict(PHASES)
_ACTIVE: list["StepProfile"] = []


class StepProfile:
    """Seconds per phase and the number of steps, collected while `active()`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def active(self) -> Iterator["StepProfile"]:
        """Collect the phases of every step run inside the block."""
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.remove(self)

    @contextmanager
    def _timed(self, name: str, device: torch.device | None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            self.seconds[name] += time.perf_counter() - start
            if name == "step":
                self.steps += 1

    def rows(self) -> list[tuple[str, float, float]]:
        """(phase, ms per step, share of the step) for every phase seen, plus 'other' (the step's Python
        work outside the named phases)."""
        steps, total = max(self.steps, 1), self.seconds.get("step", 0.0)
        rows = []
        for name, parent in PHASES:
            if name in self.seconds:
                label = name if parent in (None, "step") else f"  {name} (in {parent})"
                rows.append((label, 1e3 * self.seconds[name] / steps, self.seconds[name] / total if total else 0.0))
        named = sum(seconds for name, seconds in self.seconds.items() if _PARENT.get(name) == "step")
        other = max(total - named, 0.0)
        rows.append(("other", 1e3 * other / steps, other / total if total else 0.0))
        return rows

    def table(self) -> str:
        """A markdown table of `rows()`."""
        lines = [f"| phase ({self.steps} steps) | ms/step | share |", "|---|---:|---:|"]
        lines += [f"| {name} | {ms:.2f} | {100 * share:.1f}% |" for name, ms, share in self.rows()]
        return "\n".join(lines)


def phase(name: str, device: torch.device | None = None) -> ContextManager[None]:
    """Time the block as `name` in the active profile (a no-op when none is active)."""
    if not _ACTIVE or (device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return nullcontext()    # a CUDA graph being recorded must not synchronise
    if name not in _PARENT:
        raise ValueError(f"unknown profile phase {name!r}; known: {', '.join(_PARENT)}")
    return _ACTIVE[-1]._timed(name, device)
