"""Byte automata: an NFA builder, subset construction, trimming, minimisation, products.

A DFA here is a dense table `trans[state, byte]` (-1: no transition) with an
`accept` flag per state, start state 0.  Rule automata of the grammar runtime
also carry call edges (`calls[state]`: (label, target) pairs), which subset
construction treats as extra alphabet symbols.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np


class BudgetExceeded(Exception):
    """An automaton grew past its state budget."""


@dataclass(eq=False)
class DFA:
    """A deterministic automaton over bytes (plus optional call edges); start state 0."""

    trans: np.ndarray  # int32 [n, 256]
    accept: np.ndarray  # bool [n]
    calls: list[tuple[tuple[object, int], ...]] = field(default_factory=list)

    @property
    def num_states(self) -> int:
        return len(self.accept)

    def ranges(self) -> list[list[tuple[int, int, int]]]:
        """Per state, the maximal byte ranges (lo, hi, target) of its transitions (cached)."""
        cached = self.__dict__.get("_ranges")
        if cached is None:
            cached = self.__dict__["_ranges"] = [_row_ranges(row) for row in self.trans]
        return cached


class NFA:
    """A Thompson-style NFA under construction: byte-range, epsilon and call edges."""

    def __init__(self, budget: int = 200_000):
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []
        self.calls: list[list[tuple[object, int]]] = []
        self.budget = budget

    def node(self) -> int:
        """A fresh node."""
        if len(self.edges) >= self.budget:
            raise BudgetExceeded(f"more than {self.budget} automaton nodes")
        self.edges.append([])
        self.eps.append([])
        self.calls.append([])
        return len(self.edges) - 1

    def byte_range(self, src: int, lo: int, hi: int, dst: int) -> None:
        self.edges[src].append((lo, hi, dst))

    def epsilon(self, src: int, dst: int) -> None:
        self.eps[src].append(dst)

    def call(self, src: int, label: object, dst: int) -> None:
        self.calls[src].append((label, dst))

    def embed(self, dfa: DFA, src: int, dst: int) -> None:
        """Splice a copy of `dfa` between nodes src and dst (calls are not copied)."""
        n = dfa.num_states
        first = len(self.edges)
        if first + n > self.budget:
            raise BudgetExceeded(f"more than {self.budget} automaton nodes")
        self.edges.extend([(lo, hi, first + t) for lo, hi, t in ranges] for ranges in dfa.ranges())
        self.eps.extend([dst] if acc else [] for acc in dfa.accept.tolist())
        self.calls.extend([] for _ in range(n))
        self.epsilon(src, first)


def _row_ranges(row: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal byte ranges of one transition row with the same live target."""
    out = []
    change = np.flatnonzero(np.diff(row)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [256]))
    for lo, hi in zip(starts.tolist(), ends.tolist()):
        t = int(row[lo])
        if t >= 0:
            out.append((lo, hi - 1, t))
    return out


def determinize(nfa: NFA, start: int, final: int, max_states: int) -> DFA:
    """Subset construction from `start`; DFA states containing `final` accept."""
    closures: dict[frozenset, frozenset] = {}

    def closure(nodes) -> frozenset:
        key = frozenset(nodes)
        hit = closures.get(key)
        if hit is not None:
            return hit
        seen, todo = set(key), list(key)
        while todo:
            for t in nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        closures[key] = result = frozenset(seen)
        return result

    first = closure([start])
    index = {first: 0}
    sets = [first]
    rows: list[np.ndarray] = []
    calls: list[tuple[tuple[object, int], ...]] = []
    i = 0
    while i < len(sets):
        current = sets[i]
        i += 1
        edges = [e for n in current for e in nfa.edges[n]]
        by_label: dict[object, set[int]] = {}
        for n in current:
            for label, t in nfa.calls[n]:
                by_label.setdefault(label, set()).add(t)
        row = np.full(256, -1, np.int32)
        # split the byte range at every edge boundary; each piece has one target set
        points = sorted({p for lo, hi, _ in edges for p in (lo, hi + 1)})
        for a, b in zip(points, points[1:]):
            targets = frozenset(t for lo, hi, t in edges if lo <= a <= hi)
            if targets:
                row[a:b] = _intern(closure(targets), index, sets, max_states)
        rows.append(row)
        calls.append(tuple((lab, _intern(closure(ts), index, sets, max_states)) for lab, ts in by_label.items()))
    trans = np.stack(rows) if rows else np.zeros((0, 256), np.int32)
    accept = np.array([final in s for s in sets], bool)
    return DFA(trans, accept, calls if any(calls) else [])


def _intern(state: frozenset, index: dict, sets: list, max_states: int) -> int:
    sid = index.get(state)
    if sid is None:
        if len(sets) >= max_states:
            raise BudgetExceeded(f"more than {max_states} automaton states")
        sid = index[state] = len(sets)
        sets.append(state)
    return sid


def live_states(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """States from which an accepting state is reachable."""
    src, _ = np.nonzero(trans >= 0)
    dst = trans[trans >= 0]
    order = np.argsort(dst, kind="stable")
    ptr = np.zeros(len(accept) + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=len(accept)), out=ptr[1:])
    return _reverse_reach(ptr, src[order].astype(np.int32), accept.copy())


@numba.njit(cache=True)
def _reverse_reach(ptr, preds, live):  # pragma: no cover - compiled
    todo = np.flatnonzero(live).astype(np.int32)
    stack = np.empty(len(live), np.int32)
    n = len(todo)
    stack[:n] = todo
    while n:
        n -= 1
        t = stack[n]
        for k in range(ptr[t], ptr[t + 1]):
            p = preds[k]
            if not live[p]:
                live[p] = True
                stack[n] = p
                n += 1
    return live


def minimize(dfa: DFA) -> DFA:
    """The trimmed DFA (no calls): dead and unreachable states removed, states with identical
    rows merged until none are left (sound, and minimal for the acyclic parts)."""
    if dfa.num_states == 0 or not dfa.accept.any():
        return DFA(np.full((1, 256), -1, np.int32), np.zeros(1, bool))
    live = live_states(dfa.trans, dfa.accept)
    trans = np.where((dfa.trans >= 0) & np.append(live, False)[dfa.trans], dfa.trans, -1).astype(np.int32)
    accept = dfa.accept
    while True:
        rows = np.concatenate([trans, accept[:, None].astype(np.int32)], axis=1)
        ids: dict[bytes, int] = {}
        cls = np.fromiter((ids.setdefault(r.tobytes(), len(ids)) for r in rows), np.int32, len(rows))
        if len(ids) == len(rows):
            break
        reps = np.zeros(len(ids), np.int64)
        reps[cls[::-1]] = np.arange(len(rows))[::-1]  # first member of each class
        merged = trans[reps]
        trans = np.where(merged >= 0, cls[merged], -1).astype(np.int32)
        accept = accept[reps]
        # keep the start state first: class ids follow first appearance, so state 0 stays 0
    return _reachable(DFA(trans, accept))


def _reachable(dfa: DFA) -> DFA:
    """Renumber the states reachable from 0 in breadth-first order."""
    order = {0: 0}
    queue = [0]
    for s in queue:
        for t in np.unique(dfa.trans[s]).tolist():
            if t >= 0 and t not in order:
                order[t] = len(order)
                queue.append(t)
    old = np.array(list(order), np.int64)
    remap = np.full(dfa.num_states + 1, -1, np.int32)
    remap[old] = np.arange(len(old), dtype=np.int32)
    trans = dfa.trans[old]
    return DFA(remap[trans], dfa.accept[old])


def product(a: DFA, b: DFA, keep_b: bool, max_states: int) -> DFA:
    """Intersection (keep_b=True) or difference a minus b (keep_b=False) of two call-free DFAs."""
    index = {(0, 0): 0}
    pairs = [(0, 0)]
    rows = []
    i = 0
    while i < len(pairs):
        sa, sb = pairs[i]
        i += 1
        row = np.full(256, -1, np.int32)
        ta = a.trans[sa]
        tb = b.trans[sb] if sb >= 0 else np.full(256, -1, np.int32)
        for byte in np.flatnonzero(ta >= 0).tolist():
            nb = int(tb[byte])
            if keep_b and nb < 0:
                continue
            key = (int(ta[byte]), nb)
            sid = index.get(key)
            if sid is None:
                if len(pairs) >= max_states:
                    raise BudgetExceeded(f"more than {max_states} automaton states")
                sid = index[key] = len(pairs)
                pairs.append(key)
            row[byte] = sid
        rows.append(row)
    acc_b = np.array([sb >= 0 and bool(b.accept[sb]) for _, sb in pairs])
    acc_a = a.accept[[sa for sa, _ in pairs]]
    accept = acc_a & (acc_b if keep_b else ~acc_b)
    return minimize(DFA(np.stack(rows), accept))
