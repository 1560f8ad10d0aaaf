"""Cutting a compiled CPU kernel's work across Python threads (the kernels release the GIL)."""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch


class Threads:
    """Whether a kernel's large calls are cut across torch's thread count: timed on the first ones, then kept.

    A second thread pays only while torch's OpenMP workers sleep: libgomp spins for GOMP_SPINCOUNT
    iterations after each parallel region (by default long enough to cover the whole kernel), and a
    spinning worker takes half the core the second part runs on.  leapgen shortens the spin when it is
    imported before torch (leapgen/__init__.py); otherwise one thread stays faster.  So the first large
    calls alternate one thread and all of them, and the faster per unit of work is kept.
    """

    TRIALS = 8

    def __init__(self, kernel: Callable[..., None], min_part_work: int) -> None:
        """`kernel` runs on argument tuples (one per part); a part is worth a thread hand-off (tens of
        microseconds) from `min_part_work` units of work."""
        self.kernel, self.min_part_work = kernel, min_part_work
        self.pool: ThreadPoolExecutor | None = None
        self.trials: dict[bool, list[float]] = {False: [], True: []}    # split? -> seconds per unit of work
        self.split: bool | None = None
        # A forked child inherits the pool but not its threads: work handed to it would never run.
        os.register_at_fork(after_in_child=self._forget_pool)

    def _forget_pool(self) -> None:
        self.pool = None

    def count(self, work: int) -> int:
        """Threads for a call with `work` units of work."""
        most = min(torch.get_num_threads(), work // self.min_part_work)
        if most <= 1:
            return 1
        split = self.split if self.split is not None else len(self.trials[True]) < len(self.trials[False])
        return most if split else 1

    def observe(self, threads: int, work: int, seconds: float) -> None:
        """Record a trial; once both ways have enough, keep the faster."""
        if self.split is not None or work < 2 * self.min_part_work:
            return
        self.trials[threads > 1].append(seconds / work)
        if min(len(t) for t in self.trials.values()) >= self.TRIALS:
            self.split = statistics.median(self.trials[True]) < statistics.median(self.trials[False])

    def run(self, work: int, parts: Callable[[int], list[tuple]]) -> None:
        """The kernel over `parts(count)`'s argument tuples: the first on this thread, the others on the pool."""
        count = self.count(work)
        start = time.perf_counter()
        self._run(parts(count))
        self.observe(count, work, time.perf_counter() - start)

    def _run(self, parts: list[tuple]) -> None:
        if self.pool is None and len(parts) > 1:
            self.pool = ThreadPoolExecutor(torch.get_num_threads() - 1, thread_name_prefix="leapgen-kernel")
        others = [self.pool.submit(self.kernel, *args) for args in parts[1:]]
        self.kernel(*parts[0])
        for other in others:
            other.result()


def cuts(sizes: np.ndarray, count: int) -> list[slice]:
    """`count` consecutive slices of about equal total size (fewer where `sizes` is short)."""
    if count == 1:
        return [slice(None)]
    cumulative = np.cumsum(sizes, dtype=np.int64)
    bounds = [0, *np.searchsorted(cumulative, cumulative[-1] * np.arange(1, count) / count).tolist(), len(sizes)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
