"""JSON objects as one rule that keeps on its stack frame which members it wrote.

A finite automaton for n keys in any order, each at most once, needs a state per subset of keys.  The
`ir.Members` rule instead keeps a tag on its stack frame: which members it has written (a bit each) and how
many extra keys.  Its call edges are guarded: a member may be claimed once, and only where the object can
still be completed after it (its required members, dependencies and counts); a separator only where another
member can follow; the closing brace only where the object is complete.  Every guard and every shortest
completion comes from one plan: the cheapest set of members and extras that completes the object from a tag.
In schema order (`ordered`) a member may only follow the members before it, and extras only follow them all (loose
members, keys no `properties` declares, go among the extras in any order).
"""

from __future__ import annotations

from itertools import combinations
from typing import Callable, Iterator, Sequence

from . import ir

CLAIM, EXTRA, SEPARATOR, CLOSE = range(4)
FIRST, AFTER = 0, 1  # where the rule is: a member must come next (after `{` or a separator), or one just ended

# (bit per member written, extras written clipped where counting stops mattering, the texts of the extras' keys
# where they must differ, sorted (see `ir.Capture`): a tuple of bytes, unlike a frozenset, leaves the garbage
# collector's view, and a grammar keeps thousands of tags)
Tag = tuple[int, int, tuple[bytes, ...]]
EMPTY_TAG: Tag = (0, 0, ())


def _bits(indices) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


class MemberSet:
    """The rules of one `ir.Members` object over tags."""

    def __init__(self, spec: ir.Members, live: int | None = None, extra_live: bool = True):
        """`live`: bits of the members that can be written at all (default all); `extra_live`: whether an extra
        can (a member whose value admits no text, known only once the automaton is built, must not count
        towards `min` or `required`)."""
        self.size = len(spec.members)
        self.all = (1 << self.size) - 1 if live is None else live
        self.required = _bits(spec.required)
        self.needs = {t: _bits(d) for t, d in spec.dependents}
        self.triggers = _bits(self.needs)
        self.optional_triggers = [t for t in self.needs if not self.required >> t & 1]
        self.extra = spec.extra is not None and extra_live
        self.ordered = spec.ordered
        self.loose = self.all & ~((1 << (self.size - spec.loose)) - 1)
        self.min, self.max = spec.min, spec.max
        self.max_extras = spec.max_extras
        # beyond this many extras the count no longer changes what may follow
        self.cap = max(spec.max if spec.max is not None else spec.min, spec.max_extras or 0)
        self.most_needed = max(spec.min, 1)  # the most members and extras a completion can need
        self._feasible: dict[tuple[int, int, int], bool] = {}
        # the last tag's claimable members: a closure or a mask search asks for every member's claim from one tag in
        # turn
        self._last_claimable: tuple[Tag | None, int] = (None, 0)
        self._claimables: dict[tuple[int, int], int] = {}   # by (members written, extras)

    def guard(self, kind: int, member: int, tag: Tag) -> Tag | None:
        """The tag after taking a guarded edge, or None when the edge is closed for this tag."""
        seen, extras, written = tag
        if kind == CLAIM:
            return (seen | 1 << member, extras, written) if self.claimable(tag) >> member & 1 else None
        if kind == EXTRA:
            if not self._extras_left(extras):
                return None
            tag = (seen, min(extras + 1, self.cap + 1), written)
            return tag if self.extra and self.feasible(tag, AFTER) else None
        if kind == SEPARATOR:
            return tag if self.feasible(tag, FIRST) else None
        return tag if self.complete(tag) else None

    def claimable(self, tag: Tag) -> int:
        """The members whose CLAIM guard is open for this tag (bits)."""
        last = self._last_claimable
        if last[0] is not tag:
            key = (tag[0], tag[1])      # the texts written do not matter (see `feasible`)
            bits = self._claimables.get(key)
            if bits is None:
                bits = self._claimables[key] = self._claimable_of(tag)
            last = self._last_claimable = (tag, bits)
        return last[1]

    def _claimable_of(self, tag: Tag) -> int:
        # the open members after which the object can still be completed
        if not self.optional_triggers:
            return self._claimable_fixed(tag[0], tag[1])
        seen, extras, written = tag
        open_ = self._open(tag)
        out = 0
        while open_:
            low = open_ & -open_
            open_ ^= low
            if self.feasible((seen | low, extras, written), AFTER):
                out |= low
        return out

    def _claimable_fixed(self, seen: int, extras: int) -> int:
        """`_claimable_of` where no optional trigger is left to choose, so that one set of members, `must`, completes
        the object whatever is claimed (`_completion` with nothing chosen): a claim then depends only on whether the
        member is among them, how many members free to fill a count stay open after it and, in schema order,
        whether a member it must write would be passed over; counted with bit operations instead of a completion
        per member (each new tag of an object of a thousand members asked a thousand)."""
        must = self._closed(seen | self.required)
        count, left = must.bit_count() + extras, self._extras_left(extras)

        def fits(count: int, spare: int) -> bool:
            need = max(self.min - count, 0)
            return (self.max is None or count + need <= self.max) and need <= spare + left

        unwritten = must & ~seen
        if unwritten & ~self.all:    # a member it must write cannot be
            return 0
        if not self.ordered:
            open_ = self.all & ~seen
            free = open_ & ~must
            n = free.bit_count()
            return (open_ & must if fits(count, n) else 0) | (free if fits(count + 1, n - 1) else 0)
        # in schema order a loose member passes over every member not loose, and one not loose every one before it
        out, loose = 0, self.loose & ~seen
        if not unwritten & ~self.loose:
            free = loose & ~must
            n = free.bit_count()
            out = (loose & must if fits(count, n) else 0) | (free if fits(count + 1, n - 1) else 0)
        if extras:
            return out
        candidates = self.all & ~self.loose & ~((1 << seen.bit_length()) - 1)
        first = unwritten & -unwritten
        if first:
            candidates &= (first << 1) - 1
        if self.min <= count and (self.max is None or count < self.max):
            return out | candidates     # no count left to fill, none to pass: each of them fits
        free, least = self.all & ~must, max(self.min - count - 1, 0)
        while candidates:
            low = candidates & -candidates
            candidates ^= low
            spare = (free & ~((low << 1) - 1)).bit_count()     # the free members after it
            if fits(count if must & low else count + 1, spare):
                out |= low
            elif spare + left < least:      # (the members after it leave fewer still)
                break
        return out

    def complete(self, tag: Tag) -> bool:
        """Whether the object may close with this tag."""
        seen, extras, _ = tag
        count = seen.bit_count() + extras
        return (self.required & ~seen == 0 and self._closed(seen) == seen and count >= self.min
                and (self.max is None or count <= self.max))

    def feasible(self, tag: Tag, where: int) -> bool:
        key = (tag[0], tag[1], where)   # the texts written do not matter: there is always another (`max_extras`)
        hit = self._feasible.get(key)
        if hit is None:
            hit = self._feasible[key] = any(True for _ in self._completions(tag, where))
        return hit

    def _completions(self, tag: Tag, where: int) -> Iterator[tuple[int, int, int]]:
        """Per choice of the optional triggers still unwritten, when the object can be completed with them:
        (members it must add, how many more items it needs, members that may fill those in)."""
        seen, extras, _ = tag
        available = self._open(tag)
        free = [t for t in self.optional_triggers if available >> t & 1]
        for r in range(len(free) + 1):
            for chosen in combinations(free, r):
                found = self._completion(seen, extras, _bits(chosen), available, where)
                if found is not None:
                    yield found

    def _completion(self, seen: int, extras: int, chosen: int, available: int,
                    where: int) -> tuple[int, int, int] | None:
        """`_completions`' answer for one choice of optional triggers (bits), None where it cannot complete the
        object; `available`: the open members."""
        have = self._closed(seen | self.required | chosen)
        count = have.bit_count() + extras
        added = have & ~seen
        if added & ~available:
            return None
        need = max(self.min - count, 1 - added.bit_count() if where == FIRST else 0, 0)
        if self.max is not None and count + need > self.max:
            return None
        spare = available & ~(have | self.triggers)   # writing these requires nothing more
        if need > spare.bit_count() + self._extras_left(extras):
            return None
        return added, need, spare

    def plan(self, tag: Tag, where: int, costs: Sequence[int], extra_cost: Callable[[int], int | None],
             separator_cost: int, close_cost: int) -> tuple[int, list[int], int] | None:
        """The cheapest completion from `tag` at `where`: (cost, members to write in schema order, extras to
        write), None if the object cannot be completed.  The cost counts the members (`costs`), extras (the
        next one costs `extra_cost(0)`, the one after `extra_cost(1)`..., never less, None past the last: extras
        whose keys must differ take ever longer keys), separators and the closing brace."""
        best = None
        for added, need, spare in self._completions(tag, where):
            items = [i for i in range(self.size) if added >> i & 1]
            fillers = sorted((costs[i], i) for i in range(self.size) if spare >> i & 1)[:need]
            n_extras = extras_cost = 0
            while self.extra and n_extras < need:   # extras may replace the dearer fillers, or make up a shortfall
                cost = extra_cost(n_extras)
                if cost is None or (len(fillers) + n_extras == need and cost >= fillers[-1][0]):
                    break
                if len(fillers) + n_extras == need:
                    fillers.pop()
                n_extras += 1
                extras_cost += cost
            if len(fillers) + n_extras < need:
                continue
            items += [i for _, i in fillers]
            n_items = len(items) + n_extras
            cost = (sum(costs[i] for i in items) + extras_cost + close_cost
                    + separator_cost * (n_items - (1 if where == FIRST else 0)))
            if best is None or cost < best[0]:
                best = (cost, sorted(items), n_extras)
        return best

    def _open(self, tag: Tag) -> int:
        """The members that may still be written: those not written yet; in schema order, only those after the
        last one written, and none once an extra key was, but for the loose ones (written as extra keys are)."""
        seen, extras, _ = tag
        if not self.ordered:
            return self.all & ~seen
        loose = self.loose & ~seen
        return loose if extras else loose | (self.all & ~((1 << seen.bit_length()) - 1))

    def _extras_left(self, extras: int) -> int:
        """How many more extras may be written (a large number for any number)."""
        if not self.extra:
            return 0
        return self.cap + 1 if self.max_extras is None else max(self.max_extras - extras, 0)

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
