"""Shortest completions: the fewest bytes that take a parser state to the end of the text.

A token budget needs to know, from any state, how little output still closes the structure.
Per global automaton state, `distance` is the fewest bytes to the end of its own rule: inside a
terminal DFA by breadth-first search backwards from its accepting states (memoised per shared
DFA), in a structural rule through its calls (a call costs its callee's distance plus the
distance from where it returns), relaxed to a fixed point since rules may recurse.  A
configuration's completion then costs its state's distance plus, for every frame on its stack,
the distance from the frame's return state; the bytes follow the same minima down.  Inside an
object the rest depends on the members its frame's tag says were written: the object's
cheapest plan (`object_members.MemberSet.plan`) over the members' own distances.  Where the extras'
keys must differ (`ir.Capture`), the plan prices them with the shortest keys not written yet, and a
completion inside such a key takes the shortest way to a text its object has not written.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from typing import Callable, Iterator

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


def accepted_in_order(dfa: DFA, state: int) -> Iterator[bytes]:
    """The strings `dfa` accepts from `state`, shortest first (ties in a fixed order, letters and digits
    first): a best-first search whose estimate, the distance to an accepting state, is exact."""
    dist = terminal_distances(dfa)
    if dist[state] >= UNREACHABLE:
        return
    heap: list[tuple[int, tuple[int, ...], bool, bytes, int]] = [(int(dist[state]), (), False, b"", state)]
    while heap:
        _, ranks, ended, text, q = heapq.heappop(heap)
        if ended:
            yield text
            continue
        if dfa.accept[q]:
            heapq.heappush(heap, (len(text), ranks, True, text, q))
        row = dfa.trans[q]
        for byte in np.flatnonzero(row >= 0).tolist():
            r = int(row[byte])
            if dist[r] < UNREACHABLE:
                heapq.heappush(heap, (len(text) + 1 + int(dist[r]), ranks + (int(_BYTE_ORDER[byte]),), False,
                                      text + bytes((byte,)), r))


class Completions:
    """Shortest completions of parser states of one automaton."""

    def __init__(self, automaton: Automaton, stacks: StackArena) -> None:
        self.automaton = automaton
        self.stacks = stacks
        self._fresh: dict[tuple[int, tuple[bytes, ...]], list[bytes]] = {}
        # per captured terminal: its strings listed so far, shortest first, and the search that lists more
        self._listed: dict[int, tuple[list[bytes], Iterator[bytes]]] = {}
        self._rests: dict[tuple[int, bytes, tuple[bytes, ...]], bytes | None] = {}
        self.distance = _distances(automaton, self.fresh_keys)
        self._stack_costs: dict[int, int] = {0: 0}
        # object members states -> (frame, where), start states -> frame, the cheapest plan per (frame, tag, where)
        self._objects = {}
        for frame in automaton.frames:
            self._objects.update({frame.first: (frame, FIRST), frame.next: (frame, FIRST), frame.after: (frame, AFTER)})
        self._object_starts = {frame.start: frame for frame in automaton.frames}
        self._plans: dict[tuple[int, Tag, int], tuple[int, list[int], int] | None] = {}
        self._rule_bytes: dict[int, bytes] = {}

    def fresh_keys(self, frame: ObjectFrame, written: tuple[bytes, ...]) -> list[bytes]:
        """The shortest texts of the captured terminal the object's extras begin with, but not those `written`:
        the keys of as many extras as a completion can need."""
        key = (frame.start, written)
        hit = self._fresh.get(key)
        if hit is None:
            listed, more = self._listed.setdefault(
                frame.capture, ([], accepted_in_order(self.automaton.terminal_of(frame.capture)[1], 0)))
            taken, hit = set(written), []
            for i in itertools.count():
                if len(hit) == frame.members.most_needed:
                    break
                if i == len(listed):
                    text = next(more, None)
                    if text is None:
                        break
                    listed.append(text)
                if listed[i] not in taken:
                    hit.append(listed[i])
            self._fresh[key] = hit
        return hit

    def _captured_rest(self, state: int, stack: int) -> bytes | None:
        """The shortest end of the text of a captured terminal, from `state`, to a text its object has not written."""
        text, written = self.stacks.tag[stack], self.stacks.written(stack)
        key = (state, text, written)
        if key not in self._rests:
            first, dfa = self.automaton.terminal_of(state)
            taken = set(written)
            self._rests[key] = next((rest for rest in accepted_in_order(dfa, state - first)
                                     if text + rest not in taken), None)
        return self._rests[key]

    def cost(self, config: tuple[int, int]) -> int:
        """Fewest bytes that complete the text from one configuration (UNREACHABLE if none do)."""
        state, stack = config
        if type(self.stacks.tag[stack]) is bytes:
            rest = self._captured_rest(state, stack)
            if rest is None:
                return UNREACHABLE
            return min(len(rest) + self.cost(self.stacks.pop(stack, self.stacks.tag[stack] + rest)), UNREACHABLE)
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
            keys = self.fresh_keys(frame, tag[2]) if frame.capture >= 0 else None
            self._plans[key] = _object_plan(self.distance, frame, tag, where, keys)
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
            if type(stacks.tag[s]) is bytes:       # the shortest end of a text its object has not written
                rest = self._captured_rest(g, s)
                out += rest
                g, s = stacks.pop(s, stacks.tag[s] + rest)
                continue
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
        texts = [self._bytes_of(frame.items[k]) for k in members]
        if extras and frame.capture >= 0:   # each extra with a key of its own, then the shortest extra's rest
            rest = self._bytes_of(frame.extra)[self.distance[frame.capture]:]
            texts += [key + rest for key in self.fresh_keys(frame, tag[2])[:extras]]
        elif extras:
            texts += [self._bytes_of(frame.extra)] * extras
        separator = self._bytes_of(frame.separator)
        out = bytearray()
        for i, text in enumerate(texts):
            if i or where == AFTER:
                out += separator
            out += text
        return bytes(out + self._bytes_of(frame.close))


def _object_plan(dist: np.ndarray, frame: ObjectFrame, tag: Tag, where: int,
                 keys: list[bytes] | None) -> tuple[int, list[int], int] | None:
    """The cheapest completion of an object from `tag`, at the members' current distances; `keys`: the keys
    its extras would write, where they must differ."""
    costs = [int(dist[item]) for item in frame.items]
    extra = int(dist[frame.extra]) if frame.extra >= 0 else UNREACHABLE
    if keys is None:
        def extra_cost(i: int) -> int:
            return extra
    else:   # the shortest extra with the i-th key in place of the shortest key
        def extra_cost(i: int) -> int | None:
            return extra - int(dist[frame.capture]) + len(keys[i]) if i < len(keys) else None
    plan = frame.members.plan(tag, where, costs, extra_cost, int(dist[frame.separator]), int(dist[frame.close]))
    return None if plan is None or plan[0] >= UNREACHABLE else plan


def _distances(a: Automaton, fresh_keys: Callable[[ObjectFrame, tuple[bytes, ...]], list[bytes]]) -> np.ndarray:
    """Per global state, the fewest bytes to the end of its rule (`fresh_keys`: see `Completions.fresh_keys`)."""
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
    keys = {frame.start: fresh_keys(frame, ()) for frame in a.frames if frame.capture >= 0}
    while True:                                # Bellman-Ford over call edges; terminals are fixed already
        cost = np.minimum(dist[a.call_callee] + dist[a.call_ret], UNREACHABLE)
        best = np.full(a.num_states, UNREACHABLE, np.int64)
        np.minimum.at(best, owner, cost)
        improved = best[structural] < dist[structural]
        changed = improved.any()
        dist[structural[improved]] = best[structural[improved]]
        for frame in a.frames:
            plan = _object_plan(dist, frame, EMPTY_TAG, FIRST, keys.get(frame.start))
            start = min(int(dist[frame.open]) + plan[0], UNREACHABLE) if plan is not None else UNREACHABLE
            if start < dist[frame.start]:
                dist[frame.start] = start
                changed = True
        if not changed:
            return dist
