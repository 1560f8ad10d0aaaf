"""Compiling with Python's cyclic garbage collector paused.

A compile allocates tens of thousands of small objects (schema IR, NFA nodes, DFA tables), and keeps
most of them in memoised caches.  Each burst of allocations starts a collection, and the full ones walk
the whole heap (those caches, the tokenizer, a loaded model's objects) to free almost nothing.  Over the
first 150 MaskBench schemas of Github_medium, Github_hard and JsonSchemaStore, compiling took 6.4-6.5 s
with the collector running and 5.6 s with it paused, and the slowest single compiles were the ones a full
collection landed in.  Cycles a compile leaves behind are freed by the first collection after it.
"""

from __future__ import annotations

import gc
import os
import threading

_lock = threading.Lock()
_depth = 0                  # compiles running now, in any thread
_enabled_before = False     # the collector's state when the first of them began


def _after_fork_in_child() -> None:
    # Only the forking thread lives on in the child: compiles running in other threads are gone with their
    # threads (and the lock may have been held by one of them), so start afresh with the collector as it was.
    global _lock, _depth
    _lock = threading.Lock()
    if _depth and _enabled_before:
        gc.enable()
    _depth = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Paused:
    """The block `collector_paused` returns (a class, not a generator: entered three times in every compile, a
    generator's context manager cost 2 µs a time)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _depth, _enabled_before
        with _lock:
            if _depth == 0:
                _enabled_before = gc.isenabled()
                gc.disable()
            _depth += 1

    def __exit__(self, *exc_info: object) -> None:
        global _depth
        with _lock:
            _depth -= 1
            if _depth == 0 and _enabled_before:
                gc.enable()


_PAUSED = _Paused()


def collector_paused() -> _Paused:
    """Pause the collector while the block runs (nested and concurrent blocks: until the last one ends), then
    leave it as it was, so a caller that turned it off keeps it off."""
    return _PAUSED
