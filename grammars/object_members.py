"""JSON objects as one rule that keeps on its stack frame which members it wrote.

A finite automaton for n keys in any order, each at most once, needs a state per subset of keys.  The
`ir.Members` rule instead keeps a tag on its stack frame: which members it has written (a bit each) and how
many extra keys.  Its call edges are guarded: a member may be claimed once, and only where the object can
still be completed after it (its required members, dependencies and counts); a separator only where another
member can follow; the closing brace only where the object is complete.  Every guard and every shortest
completion comes from one plan: the cheapest set of members and extras that completes the object from a tag.
In schema order (`ordered`) a member may only follow the members before it, and extras only follow them all.
"""

from __future__ import annotations

from itertools import combinations
from typing import Iterator, Sequence

from . import ir

CLAIM, EXTRA, SEPARATOR, CLOSE = range(4)
FIRST, AFTER = 0, 1  # where the rule is: a member must come next (after `{` or a separator), or one just ended

Tag = tuple[int, int]  # (bit per member written, extras written, clipped where counting stops mattering)
EMPTY_TAG: Tag = (0, 0)


def _bits(indices) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


class MemberSet:
    """The rules of one `ir.Members` object over tags."""

    def __init__(self, spec: ir.Members):
        self.size = len(spec.members)
        self.all = (1 << self.size) - 1
        self.required = _bits(spec.required)
        self.needs = {t: _bits(d) for t, d in spec.dependents}
        self.triggers = _bits(self.needs)
        self.optional_triggers = [t for t in self.needs if not self.required >> t & 1]
        self.extra = spec.extra is not None
        self.ordered = spec.ordered
        self.min, self.max = spec.min, spec.max
        # beyond this many extras the count no longer changes what may follow
        self.cap = spec.max if spec.max is not None else spec.min
        self._feasible: dict[tuple[Tag, int], bool] = {}

    def guard(self, kind: int, member: int, tag: Tag) -> Tag | None:
        """The tag after taking a guarded edge, or None when the edge is closed for this tag."""
        seen, extras = tag
        if kind == CLAIM:
            if not self._open(tag) >> member & 1:
                return None
            tag = (seen | 1 << member, extras)
            return tag if self.feasible(tag, AFTER) else None
        if kind == EXTRA:
            tag = (seen, min(extras + 1, self.cap + 1))
            return tag if self.extra and self.feasible(tag, AFTER) else None
        if kind == SEPARATOR:
            return tag if self.feasible(tag, FIRST) else None
        return tag if self.complete(tag) else None

    def complete(self, tag: Tag) -> bool:
        """Whether the object may close with this tag."""
        seen, extras = tag
        count = seen.bit_count() + extras
        return (self.required & ~seen == 0 and self._closed(seen) == seen and count >= self.min
                and (self.max is None or count <= self.max))

    def feasible(self, tag: Tag, where: int) -> bool:
        key = (tag, where)
        hit = self._feasible.get(key)
        if hit is None:
            hit = self._feasible[key] = any(True for _ in self._completions(tag, where))
        return hit

    def _completions(self, tag: Tag, where: int) -> Iterator[tuple[int, int, int]]:
        """Per choice of the optional triggers still unwritten, when the object can be completed with them:
        (members it must add, how many more items it needs, members that may fill those in)."""
        seen, extras = tag
        available = self._open(tag)
        free = [t for t in self.optional_triggers if available >> t & 1]
        for r in range(len(free) + 1):
            for chosen in combinations(free, r):
                have = self._closed(seen | self.required | _bits(chosen))
                count = have.bit_count() + extras
                added = have & ~seen
                if added & ~available:
                    continue
                need = max(self.min - count, 1 - added.bit_count() if where == FIRST else 0, 0)
                if self.max is not None and count + need > self.max:
                    continue
                spare = available & ~(have | self.triggers)   # writing these requires nothing more
                if need > spare.bit_count() and not self.extra:
                    continue
                yield added, need, spare

    def plan(self, tag: Tag, where: int, costs: Sequence[int], extra_cost: int, separator_cost: int,
             close_cost: int) -> tuple[int, list[int], int] | None:
        """The cheapest completion from `tag` at `where`: (cost, members to write in schema order, extras to
        write), None if the object cannot be completed.  The cost counts the members (`costs`), extras,
        separators and the closing brace."""
        best = None
        for added, need, spare in self._completions(tag, where):
            items = [i for i in range(self.size) if added >> i & 1]
            fillers = sorted((costs[i], i) for i in range(self.size) if spare >> i & 1)[:need]
            if self.extra:      # extras may be cheaper than the dearer fillers, and make up any shortfall
                fillers = [f for f in fillers if f[0] <= extra_cost]
            n_extras = need - len(fillers)
            items += [i for _, i in fillers]
            n_items = len(items) + n_extras
            cost = (sum(costs[i] for i in items) + n_extras * extra_cost + close_cost
                    + separator_cost * (n_items - (1 if where == FIRST else 0)))
            if best is None or cost < best[0]:
                best = (cost, sorted(items), n_extras)
        return best

    def _open(self, tag: Tag) -> int:
        """The members that may still be written: those not written yet; in schema order, only those after the
        last one written, and none once an extra key was."""
        seen, extras = tag
        if not self.ordered:
            return self.all & ~seen
        return 0 if extras else self.all & ~((1 << seen.bit_length()) - 1)

    def _closed(self, have: int) -> int:
        """`have` with the dependents of every trigger in it."""
        while True:
            more = have
            for trigger, needed in self.needs.items():
                if have >> trigger & 1:
                    more |= needed
            if more == have:
                return have
            have = more
