"""The token walks every grammar over one vocabulary shares, least recently used first, in two tiers.

Walks from wide states (inside a JSON string, the first token of any value) take milliseconds and serve every
grammar; walks of keys, enum values and punctuation take microseconds, and most serve the one schema that
names them.  In one tier bounded by count, a few hundred schemas' keys pushed out the walks inside long
strings that `warm_up` took (Github_hard: a mask of 7 ms walking two string chunks again after 200 schemas),
so the wide walks are kept apart, bounded by their size in bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

# One walk's result, a plain tuple (words, values, pops, pops_key): the allowed tokens as a bitmask (`words`
# the indices of its non-zero words, or None when `values` is the whole bitmask), the trie nodes where it
# stopped that some token goes on below (what follows a leaf adds no token) and their bytes.  Tens of thousands
# stay cached for the life of the process, and a tuple of arrays and bytes drops out of the garbage collector's
# scans, where a class instance (a NamedTuple too) is visited by every full collection: that made collections
# of 250 ms stall a mask in long runs.
Walk = tuple


def make_room(cache: dict, kept: int) -> None:
    """Drop the oldest entries of `cache` (in insertion order) until one more fits within `kept`.  Safe beside
    another thread's compile doing the same: where it changed the dict meanwhile, this stops early."""
    while len(cache) >= kept:
        try:
            del cache[next(iter(cache))]
        except (KeyError, RuntimeError, StopIteration):
            break


def walk_bytes(walk: Walk) -> int:
    """The memory a walk holds (its arrays and pop points' bytes)."""
    words, values, pops, pops_key = walk
    return (0 if words is None else words.nbytes) + values.nbytes + pops.nbytes + len(pops_key)


class SharedWalks:
    """Walks by key: at most `narrow_limit` walks of narrow states, and wide states' walks of at most
    `wide_bytes` in all (a walk kept under two keys, its state's and its signature's, counts twice).  Safe to
    share between threads: a racing eviction only drops a walk sooner.  (Frame answers shared between grammars,
    tuples of walks, are kept in one too, as narrow.)"""

    def __init__(self, narrow_limit: int, wide_bytes: int):
        self.narrow_limit, self.wide_limit = narrow_limit, wide_bytes
        self._narrow: OrderedDict[tuple, Walk] = OrderedDict()
        self._wide: OrderedDict[tuple, Walk] = OrderedDict()
        self.wide_bytes = 0
        self._lock = threading.Lock()    # wide puts only: they are rare, and their byte count must stay exact

    def __len__(self) -> int:
        return len(self._narrow) + len(self._wide)

    def get(self, key: tuple) -> Walk | None:
        tier = self._narrow
        hit = tier.get(key)
        if hit is None:
            tier = self._wide
            hit = tier.get(key)
            if hit is None:
                return None
        try:
            tier.move_to_end(key)
        except KeyError:    # another thread's put evicted it since
            pass
        return hit

    def put(self, key: tuple, walk: Walk, wide: bool) -> None:
        if not wide:
            tier = self._narrow
            while len(tier) >= self.narrow_limit:
                try:
                    tier.popitem(last=False)
                except KeyError:    # another thread emptied it
                    break
            tier[key] = walk
            return
        size = walk_bytes(walk)
        with self._lock:
            old = self._wide.pop(key, None)
            if old is not None:
                self.wide_bytes -= walk_bytes(old)
            while self._wide and self.wide_bytes + size > self.wide_limit:
                self.wide_bytes -= walk_bytes(self._wide.popitem(last=False)[1])
            self._wide[key] = walk
            self.wide_bytes += size
