"""Shortest completions: the fewest bytes that take a parser state to the end of the text.

A token budget needs to know, from any state, how little output still closes the structure.
Per global automaton state, `distance` is the fewest bytes to the end of its own rule: inside a
terminal DFA by breadth-first search backwards from its accepting states (memoised per shared
DFA), in a structural rule through its calls (a call costs its callee's distance plus the
distance from where it returns), relaxed to a fixed point since rules may recurse.  A
configuration's completion then costs its state's distance plus, for every frame on its stack,
the distance from the frame's return state; the bytes follow the same minima down.  Inside an
object the rest depends on the members its frame's tag says were written: the object's
cheapest plan (`object_members.MemberSet.plan`) over the members' own distances.
"""

from __future__ import annotations

import weakref

import numpy as np

from .automaton import Automaton, ObjectFrame
from .fsm import DFA
from .object_members import AFTER, EMPTY_TAG, FIRST, Tag
from .stacks import StackArena

UNREACHABLE = np.iinfo(np.int64).max // 4   # large, yet sums of a few never overflow

# Among equally short completions prefer letters and digits, then other printable ASCII: the
# closing text reads like a value ("a", 0) rather than like punctuation or control bytes.
_BYTE_RANK = np.array(sorted(range(256), key=lambda b: (not chr(b).isalnum() if b < 128 else True,
                                                        not 32 <= b < 127, b)))
_BYTE_ORDER = np.argsort(_BYTE_RANK)      # rank of each byte value

_terminal_distances: "weakref.WeakKeyDictionary[DFA, np.ndarray]" = weakref.WeakKeyDictionary()


def terminal_distances(dfa: DFA) -> np.ndarray:
    """Fewest bytes from each state of a terminal DFA to one of its accepting states (memoised per DFA)."""
    hit = _terminal_distances.get(dfa)
    if hit is not None:
        return hit
    n = dfa.num_states
    src, byte = np.nonzero(dfa.trans >= 0)
    pairs = np.unique(dfa.trans[src, byte].astype(np.int64) * n + src)   # (destination, source), sorted
    dst_of, src_of = np.divmod(pairs, n)
    starts = np.searchsorted(dst_of, np.arange(n + 1))
    dist = np.full(n, UNREACHABLE, np.int64)
    frontier = np.flatnonzero(dfa.accept)
    dist[frontier] = 0
    level = 0
    while len(frontier):
        level += 1
        preds = np.concatenate([src_of[starts[s]:starts[s + 1]] for s in frontier]) if len(frontier) else frontier
        preds = np.unique(preds)
        frontier = preds[dist[preds] == UNREACHABLE]
        dist[frontier] = level
    _terminal_distances[dfa] = dist
    return dist


class Completions:
    """Shortest completions of parser states of one automaton."""

    def __init__(self, automaton: Automaton, stacks: StackArena) -> None:
        self.automaton = automaton
        self.stacks = stacks
        self.distance = _distances(automaton)
        self._stack_costs: dict[int, int] = {0: 0}
        # object members states -> (frame, where), start states -> frame, the cheapest plan per (frame, tag, where)
        self._objects = {}
        for frame in automaton.frames:
            self._objects.update({frame.first: (frame, FIRST), frame.next: (frame, FIRST), frame.after: (frame, AFTER)})
        self._object_starts = {frame.start: frame for frame in automaton.frames}
        self._plans: dict[tuple[int, Tag, int], tuple[int, list[int], int] | None] = {}
        self._rule_bytes: dict[int, bytes] = {}

    def cost(self, config: tuple[int, int]) -> int:
        """Fewest bytes that complete the text from one configuration (UNREACHABLE if none do)."""
        state, stack = config
        return min(self._local(state, stack) + self._stack_cost(stack), UNREACHABLE)

    def _local(self, state: int, stack: int) -> int:
        """Fewest bytes to the end of the rule `state` is in, on `stack`."""
        hit = self._objects.get(state)
        if hit is None:
            return int(self.distance[state])
        plan = self._plan(*hit, self.stacks.tag[stack])
        return UNREACHABLE if plan is None else plan[0]

    def _plan(self, frame: ObjectFrame, where: int, tag: Tag) -> tuple[int, list[int], int] | None:
        key = (frame.start, tag, where)
        if key not in self._plans:
            self._plans[key] = _object_plan(self.distance, frame, tag, where)
        return self._plans[key]

    def _stack_cost(self, stack: int) -> int:
        hit = self._stack_costs.get(stack)
        if hit is None:
            chain = []
            while stack not in self._stack_costs:
                chain.append(stack)
                stack = self.stacks.parent[stack]
            total = self._stack_costs[stack]
            for frame in reversed(chain):
                total = min(total + self._local(self.stacks.ret[frame], self.stacks.parent[frame]), UNREACHABLE)
                self._stack_costs[frame] = total
            hit = total
        return hit

    def shortest(self, state: tuple[tuple[int, int], ...]) -> bytes | None:
        """The bytes of one shortest completion of `state` (b"" when the text is complete), None if none."""
        best = min(state, key=self.cost, default=None)
        if best is None or self.cost(best) >= UNREACHABLE:
            return None
        a, dist, stacks = self.automaton, self.distance, self.stacks
        g, s = best
        out = bytearray()
        while True:
            obj = self._objects.get(g)
            if obj is not None:                    # the rest of an object, then its caller's
                out += self._object_bytes(*obj, stacks.tag[s])
                g, s = stacks.ret[s], stacks.parent[s]
                continue
            frame = self._object_starts.get(g)
            if frame is not None:
                out += self._bytes_of(frame.open)
                g = frame.first
                continue
            if a.accept[g] and dist[g] == 0:       # end this rule here: the rest is the callers'
                if not s:
                    return bytes(out)
                g, s = stacks.ret[s], stacks.parent[s]
                continue
            calls = range(a.call_ptr[g], a.call_ptr[g + 1])
            if len(calls):
                c = next(c for c in calls if dist[a.call_callee[c]] + dist[a.call_ret[c]] == dist[g])
                g, s = stacks.call(s, c)
            else:
                targets = a.byte_row(g)
                ok = np.flatnonzero((targets >= 0) & (dist[np.maximum(targets, 0)] == dist[g] - 1))
                byte = int(ok[np.argmin(_BYTE_ORDER[ok])])
                out.append(byte)
                g = int(targets[byte])

    def _bytes_of(self, state: int) -> bytes:
        """A shortest text of the rule starting at `state`, on its own."""
        hit = self._rule_bytes.get(state)
        if hit is None:
            hit = self._rule_bytes[state] = self.shortest(((state, 0),))
        return hit

    def _object_bytes(self, frame: ObjectFrame, where: int, tag: Tag) -> bytes:
        """The planned members, extras and separators of an object, and its closing brace."""
        _, members, extras = self._plan(frame, where, tag)
        items = [frame.items[k] for k in members] + [frame.extra] * extras
        separator = self._bytes_of(frame.separator)
        out = bytearray()
        for i, item in enumerate(items):
            if i or where == AFTER:
                out += separator
            out += self._bytes_of(item)
        return bytes(out + self._bytes_of(frame.close))


def _object_plan(dist: np.ndarray, frame: ObjectFrame, tag: Tag, where: int) -> tuple[int, list[int], int] | None:
    """The cheapest completion of an object from `tag`, at the members' current distances."""
    costs = [int(dist[item]) for item in frame.items]
    extra = int(dist[frame.extra]) if frame.extra >= 0 else UNREACHABLE
    plan = frame.members.plan(tag, where, costs, extra, int(dist[frame.separator]), int(dist[frame.close]))
    return None if plan is None or plan[0] >= UNREACHABLE else plan


def _distances(a: Automaton) -> np.ndarray:
    """Per global state, the fewest bytes to the end of its rule."""
    dist = np.full(a.num_states, UNREACHABLE, np.int64)
    for first, dfa in a.terminals:
        dist[first:first + dfa.num_states] = terminal_distances(dfa)
    calls_out = np.diff(a.call_ptr) > 0
    for frame in a.frames:                     # object rules: their starts are planned below
        calls_out[[frame.start, frame.first, frame.after, frame.next]] = False
    structural = np.flatnonzero(calls_out)
    dist[a.accept & ~a.has_out] = np.minimum(dist[a.accept & ~a.has_out], 0)
    if not len(a.call_callee):
        return dist
    owner = np.repeat(np.arange(a.num_states), np.diff(a.call_ptr))
    while True:                                # Bellman-Ford over call edges; terminals are fixed already
        cost = np.minimum(dist[a.call_callee] + dist[a.call_ret], UNREACHABLE)
        best = np.full(a.num_states, UNREACHABLE, np.int64)
        np.minimum.at(best, owner, cost)
        improved = best[structural] < dist[structural]
        changed = improved.any()
        dist[structural[improved]] = best[structural[improved]]
        for frame in a.frames:
            plan = _object_plan(dist, frame, EMPTY_TAG, FIRST)
            start = min(int(dist[frame.open]) + plan[0], UNREACHABLE) if plan is not None else UNREACHABLE
            if start < dist[frame.start]:
                dist[frame.start] = start
                changed = True
        if not changed:
            return dist
