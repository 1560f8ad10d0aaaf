"""Shortest completions: the fewest bytes that take a parser state to the end of the text.

A token budget needs to know, from any state, how little output still closes the structure.
Per global automaton state, `distance` is the fewest bytes to the end of its own rule: inside a
terminal DFA by breadth-first search backwards from its accepting states (memoised per shared
DFA), in a structural rule through its calls (a call costs its callee's distance plus the
distance from where it returns), relaxed to a fixed point since rules may recurse.  A
configuration's completion then costs its state's distance plus, for every frame on its stack,
the distance from the frame's return state; the bytes follow the same minima down.
"""

from __future__ import annotations

import weakref

import numpy as np

from .automaton import Automaton
from .fsm import DFA
from .token_masks import StackArena

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

    def cost(self, config: tuple[int, int]) -> int:
        """Fewest bytes that complete the text from one configuration (UNREACHABLE if none do)."""
        state, stack = config
        return min(int(self.distance[state]) + self._stack_cost(stack), UNREACHABLE)

    def _stack_cost(self, stack: int) -> int:
        hit = self._stack_costs.get(stack)
        if hit is None:
            chain = []
            while stack not in self._stack_costs:
                chain.append(stack)
                stack = self.stacks.parent[stack]
            total = self._stack_costs[stack]
            for frame in reversed(chain):
                total = min(total + int(self.distance[self.stacks.ret[frame]]), UNREACHABLE)
                self._stack_costs[frame] = total
            hit = total
        return hit

    def shortest(self, state: frozenset) -> bytes | None:
        """The bytes of one shortest completion of `state` (b"" when the text is complete), None if none."""
        best = min(state, key=self.cost, default=None)
        if best is None or self.cost(best) >= UNREACHABLE:
            return None
        a, dist = self.automaton, self.distance
        g, frames = best[0], self._frames(best[1])
        out = bytearray()
        while True:
            if a.accept[g] and dist[g] == 0:       # end this rule here: the rest is the callers'
                if not frames:
                    return bytes(out)
                g = frames.pop()
                continue
            calls = range(a.call_ptr[g], a.call_ptr[g + 1])
            if len(calls):
                c = next(c for c in calls if dist[a.call_callee[c]] + dist[a.call_ret[c]] == dist[g])
                frames.append(int(a.call_ret[c]))
                g = int(a.call_callee[c])
            else:
                targets = a.trans[g]
                ok = np.flatnonzero((targets >= 0) & (dist[np.maximum(targets, 0)] == dist[g] - 1))
                byte = int(ok[np.argmin(_BYTE_ORDER[ok])])
                out.append(byte)
                g = int(targets[byte])

    def _frames(self, stack: int) -> list[int]:
        """The return states of a stack id, outermost first."""
        frames = []
        while stack:
            frames.append(self.stacks.ret[stack])
            stack = self.stacks.parent[stack]
        return frames[::-1]


def _distances(a: Automaton) -> np.ndarray:
    """Per global state, the fewest bytes to the end of its rule."""
    dist = np.full(a.num_states, UNREACHABLE, np.int64)
    for first, dfa in a.terminals:
        dist[first:first + dfa.num_states] = terminal_distances(dfa)
    structural = np.flatnonzero(np.diff(a.call_ptr) > 0)
    dist[a.accept & ~a.has_out] = np.minimum(dist[a.accept & ~a.has_out], 0)
    if not len(a.call_callee):
        return dist
    owner = np.repeat(np.arange(a.num_states), np.diff(a.call_ptr))
    while True:                                # Bellman-Ford over call edges; terminals are fixed already
        cost = np.minimum(dist[a.call_callee] + dist[a.call_ret], UNREACHABLE)
        best = np.full(a.num_states, UNREACHABLE, np.int64)
        np.minimum.at(best, owner, cost)
        improved = best[structural] < dist[structural]
        if not improved.any():
            return dist
        dist[structural[improved]] = best[structural[improved]]
