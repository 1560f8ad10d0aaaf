"""Automata: an NFA builder, subset construction, trimming, minimisation, products.

A DFA here is a dense table `trans[state, byte]` (-1: no transition) with an
`accept` flag per state, start state 0.  The structure of grammar rules is an
automaton over *call edges* only ((label, target) pairs, see `CallDFA`), built
with the same NFA builder and its own subset construction.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numba
import numpy as np


Ranges = tuple[tuple[int, int, int], ...]   # a state's transitions: (lo byte, hi byte, target)


class BudgetExceeded(Exception):
    """An automaton grew past its state budget."""


_DFA_UIDS = itertools.count()


@dataclass(eq=False)
class DFA:
    """A deterministic automaton over bytes (plus optional call edges); start state 0."""

    trans: np.ndarray  # int32 [n, 256]
    accept: np.ndarray  # bool [n]
    # Never reused: caches key on it instead of the DFA, so their keys are tuples of ints that the garbage
    # collector stops scanning (a key holding the DFA object stays tracked).
    uid: int = field(default_factory=lambda: next(_DFA_UIDS), init=False, repr=False)

    @property
    def num_states(self) -> int:
        return len(self.accept)

    @property
    def has_out(self) -> np.ndarray:
        """Per state, whether some byte transition leaves it (cached)."""
        cached = self.__dict__.get("_has_out")
        if cached is None:
            cached = self.__dict__["_has_out"] = (self.trans >= 0).any(axis=1)
        return cached

    def signature(self, state: int, limit: int = 256) -> bytes | None:
        """The automaton reachable from `state`, canonically numbered, as bytes (cached): equal
        signatures mean equal languages from there on, whatever DFA they sit in.  None when more
        than `limit` states are reachable."""
        cache = self.__dict__.setdefault("_signatures", {})
        if state not in cache:
            old = _reachable_in_order(self.trans, state, limit)
            if len(old) > limit:
                cache[state] = None
                return None
            remap = np.full(self.num_states + 1, -1, np.int32)
            remap[old] = np.arange(len(old), dtype=np.int32)
            cache[state] = remap[self.trans[old]].tobytes() + self.accept[old].tobytes()
        return cache[state]

    def ranges(self) -> tuple[Ranges, ...]:
        """Per state, the maximal byte ranges (lo, hi, target) of its transitions (cached)."""
        cached = self.__dict__.get("_ranges")
        if cached is None:
            cached = self.__dict__["_ranges"] = _row_ranges(self.trans)
        return cached


@dataclass(eq=False)
class CallDFA:
    """A deterministic automaton whose only transitions are call edges; start state 0."""

    accept: list[bool]
    calls: list[tuple[tuple[object, int], ...]]  # per state: (label, target) pairs, labels distinct

    @property
    def num_states(self) -> int:
        return len(self.accept)


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
        """Splice a copy of `dfa` between nodes src and dst."""
        n = dfa.num_states
        first = len(self.edges)
        if first + n > self.budget:
            raise BudgetExceeded(f"more than {self.budget} automaton nodes")
        self.edges.extend([(lo, hi, first + t) for lo, hi, t in ranges] for ranges in dfa.ranges())
        self.eps.extend([dst] if acc else [] for acc in dfa.accept.tolist())
        self.calls.extend([] for _ in range(n))
        self.epsilon(src, first)


@numba.njit(cache=True)
def _reachable_in_order(trans, start, limit):  # pragma: no cover - compiled
    """States reachable from `start` in canonical order (breadth first, each state's targets by first byte);
    stops after `limit` + 1 of them (the caller then knows there are more than `limit`)."""
    seen = np.zeros(trans.shape[0], np.bool_)
    order = np.empty(min(trans.shape[0], limit + 1), np.int64)
    order[0], seen[start], count, head = start, True, 1, 0
    while head < count:
        s = order[head]
        head += 1
        for b in range(256):
            t = trans[s, b]
            if t >= 0 and not seen[t]:
                if count > limit:
                    return order
                seen[t] = True
                order[count] = t
                count += 1
    return order[:count]


def _row_ranges(trans: np.ndarray) -> tuple[Ranges, ...]:
    """Per row of `trans [n, 256]`, its maximal byte ranges with the same live target, found for all rows
    at once (per-row numpy calls cost more than the work on the DFAs of large enums).

    Tuples, not lists: the ranges of cached DFAs live as long as the process, and tuples of ints drop out
    of the garbage collector's scans where lists would add to every full collection.
    """
    starts = np.ones(trans.shape, bool)
    starts[:, 1:] = trans[:, 1:] != trans[:, :-1]
    rows, los = np.nonzero(starts)              # row-major: each row's runs in byte order
    his = np.empty_like(los)
    his[:-1] = los[1:] - 1
    ends_row = np.ones(len(rows), bool)
    ends_row[:-1] = rows[1:] != rows[:-1]
    his[ends_row] = 255
    targets = trans[rows, los]
    live = targets >= 0
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(len(trans))]
    for row, lo, hi, t in zip(rows[live].tolist(), los[live].tolist(), his[live].tolist(), targets[live].tolist()):
        out[row].append((lo, hi, t))
    return tuple(map(tuple, out))


class _Closures:
    """Epsilon closures of node sets, memoised."""

    def __init__(self, nfa: NFA):
        self.eps = nfa.eps
        self.memo: dict[frozenset, frozenset] = {}

    def __call__(self, nodes) -> frozenset:
        key = frozenset(nodes)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        seen, todo = set(key), list(key)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        self.memo[key] = result = frozenset(seen)
        return result


def determinize(nfa: NFA, start: int, final: int, max_states: int) -> DFA:
    """Subset construction over bytes from `start`; DFA states containing `final` accept."""
    closure = _Closures(nfa)
    first = closure([start])
    index = {first: 0}
    sets = [first]
    rows: list[np.ndarray] = []
    i = 0
    while i < len(sets):
        current = sets[i]
        i += 1
        row = np.full(256, -1, np.int32)
        # sweep the byte range: the edges live between two boundaries give that piece its target set
        events: dict[int, list[tuple[int, int]]] = {}
        for n in current:
            for lo, hi, t in nfa.edges[n]:
                events.setdefault(lo, []).append((t, 1))
                events.setdefault(hi + 1, []).append((t, -1))
        live: dict[int, int] = {}
        points = sorted(events)
        for a, b in zip(points, points[1:]):
            for t, delta in events[a]:
                count = live.get(t, 0) + delta
                if count:
                    live[t] = count
                else:
                    del live[t]
            if live:
                row[a:b] = _intern(closure(live), index, sets, max_states)
        rows.append(row)
    trans = np.stack(rows) if rows else np.zeros((0, 256), np.int32)
    accept = np.array([final in s for s in sets], bool)
    return DFA(trans, accept)


def determinize_calls(nfa: NFA, start: int, final: int, max_states: int) -> CallDFA:
    """Subset construction over the call labels of an NFA without byte edges."""
    closure = _Closures(nfa)
    first = closure([start])
    index = {first: 0}
    sets = [first]
    calls: list[tuple[tuple[object, int], ...]] = []
    i = 0
    while i < len(sets):
        current = sets[i]
        i += 1
        by_label: dict[object, set[int]] = {}
        for n in current:
            for label, t in nfa.calls[n]:
                by_label.setdefault(label, set()).add(t)
        calls.append(tuple((lab, _intern(closure(ts), index, sets, max_states)) for lab, ts in by_label.items()))
    return CallDFA([final in s for s in sets], calls)


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
    """The minimal trimmed DFA (no calls): dead and unreachable states removed, equivalent states merged
    (Hopcroft's partition refinement over the byte classes the DFA distinguishes)."""
    if dfa.num_states == 0 or not dfa.accept.any():
        return DFA(np.full((1, 256), -1, np.int32), np.zeros(1, bool))
    live = live_states(dfa.trans, dfa.accept)
    n = dfa.num_states
    # complete over a sink state n (dead and missing transitions), bytes grouped into the classes of equal columns
    full = np.where((dfa.trans >= 0) & np.append(live, False)[dfa.trans], dfa.trans, n).astype(np.int32)
    full = np.concatenate([full, np.full((1, 256), n, np.int32)])
    accept = np.append(dfa.accept & live, False)
    block, count = _hopcroft(np.ascontiguousarray(full[:, _byte_classes(full)]), accept)
    reps = np.zeros(count, np.int64)
    reps[block[::-1]] = np.arange(n + 1)[::-1]  # the first member of each block
    quotient = block[full[reps]]                # [block, byte]
    sink = block[n]
    trans = np.where(quotient == sink, -1, quotient).astype(np.int32)
    return _reachable(DFA(trans, accept[reps]), start=int(block[0]))


_WEIGHTS = np.random.default_rng(0).integers(1, 1 << 31, 1 << 16)


def _byte_classes(trans: np.ndarray) -> np.ndarray:
    """One byte of each class of bytes that every state treats alike (equal columns of `trans`): a column
    hash groups them, an exact comparison confirms the groups."""
    weights = _WEIGHTS[:len(trans)] if len(trans) <= len(_WEIGHTS) else np.arange(1, len(trans) + 1)
    _, firsts, group = np.unique(weights @ trans.astype(np.int64), return_index=True, return_inverse=True)
    if (trans == trans[:, firsts[group.reshape(-1)]]).all():
        return np.sort(firsts)
    return np.array(sorted({trans[:, b].tobytes(): b for b in range(255, -1, -1)}.values()))  # a hash collision


@numba.njit(cache=True)
def _hopcroft(trans, accept):  # pragma: no cover - compiled
    """Hopcroft's algorithm on a complete DFA `trans [n, k]`: the block of each state, and the block count."""
    n, k = trans.shape
    ptr = np.zeros(k * n + 1, np.int64)  # sources of t under symbol c: src[ptr[c*n+t]:ptr[c*n+t+1]]
    for s in range(n):
        for c in range(k):
            ptr[c * n + trans[s, c] + 1] += 1
    for i in range(k * n):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    src = np.empty(n * k, np.int32)
    for s in range(n):
        for c in range(k):
            j = c * n + trans[s, c]
            src[fill[j]] = s
            fill[j] += 1
    block = np.zeros(n, np.int32)
    elems = np.empty(n, np.int32)
    pos = np.empty(n, np.int32)
    bstart = np.zeros(n + 1, np.int64)
    bend = np.zeros(n + 1, np.int64)
    nacc = 0
    for s in range(n):
        if accept[s]:
            nacc += 1
    a, r = 0, nacc
    for s in range(n):
        if accept[s]:
            elems[a] = s
            pos[s] = a
            a += 1
        else:
            elems[r] = s
            pos[s] = r
            r += 1
    blocks = 0
    if nacc > 0:
        bstart[0], bend[0] = 0, nacc
        blocks = 1
    if nacc < n:
        bstart[blocks], bend[blocks] = nacc, n
        for i in range(nacc, n):
            block[elems[i]] = blocks
        blocks += 1
    in_work = np.zeros((n + 1, k), np.bool_)
    work_b = np.empty((n + 1) * k, np.int32)
    work_c = np.empty((n + 1) * k, np.int32)
    top = 0
    for b in range(blocks):
        for c in range(k):
            work_b[top], work_c[top] = b, c
            in_work[b, c] = True
            top += 1
    marked = np.zeros(n, np.bool_)
    mcount = np.zeros(n + 1, np.int64)
    touched = np.empty(n + 1, np.int32)
    splitter = np.empty(n, np.int32)
    while top:
        top -= 1
        b, c = work_b[top], work_c[top]
        in_work[b, c] = False
        size = bend[b] - bstart[b]
        splitter[:size] = elems[bstart[b]:bend[b]]
        ntouched = 0
        for i in range(size):
            t = splitter[i]
            for j in range(ptr[c * n + t], ptr[c * n + t + 1]):
                s = src[j]
                if marked[s]:
                    continue
                marked[s] = True
                y = block[s]
                if mcount[y] == 0:
                    touched[ntouched] = y
                    ntouched += 1
                p, q = pos[s], bstart[y] + mcount[y]
                u = elems[q]
                elems[q], elems[p] = s, u
                pos[s], pos[u] = q, p
                mcount[y] += 1
        for i in range(ntouched):
            y = touched[i]
            m = mcount[y]
            lo = bstart[y]
            for j in range(lo, lo + m):
                marked[elems[j]] = False
            mcount[y] = 0
            if m == bend[y] - lo:
                continue
            z = blocks
            blocks += 1
            bstart[z], bend[z] = lo, lo + m
            bstart[y] = lo + m
            for j in range(lo, lo + m):
                block[elems[j]] = z
            small = z if m <= bend[y] - bstart[y] else y
            for d in range(k):
                if in_work[y, d]:
                    work_b[top], work_c[top] = z, d
                    in_work[z, d] = True
                else:
                    work_b[top], work_c[top] = small, d
                    in_work[small, d] = True
                top += 1
    return block, blocks


def _reachable(dfa: DFA, start: int = 0) -> DFA:
    """Renumber the states reachable from `start` in breadth-first order (targets by byte), `start` as 0."""
    old = _breadth_first(dfa.trans, start)
    remap = np.full(dfa.num_states + 1, -1, np.int32)
    remap[old] = np.arange(len(old), dtype=np.int32)
    return DFA(remap[dfa.trans[old]], dfa.accept[old])


@numba.njit(cache=True)
def _breadth_first(trans, start):  # pragma: no cover - compiled
    """The states reachable from `start`, in breadth-first order."""
    seen = np.zeros(trans.shape[0], np.bool_)
    queue = np.empty(trans.shape[0], np.int64)
    seen[start] = True
    queue[0] = start
    n, i = 1, 0
    while i < n:
        row = trans[queue[i]]
        i += 1
        for b in range(256):
            t = row[b]
            if t >= 0 and not seen[t]:
                seen[t] = True
                queue[n] = t
                n += 1
    return queue[:n]


_DENSE_PAIRS = 1 << 23  # products with at most this many state pairs index them in a flat table (32 MiB)


def product(a: DFA, b: DFA, keep_b: bool, max_states: int) -> DFA:
    """Intersection (keep_b=True) or difference a minus b (keep_b=False) of two DFAs."""
    if a.num_states * (b.num_states + 1) <= _DENSE_PAIRS:
        return _dense_product(a, b, keep_b, max_states)
    index = {(0, 0): 0}
    pairs = [(0, 0)]
    rows = []
    width = b.num_states + 1
    dead = np.full(256, -1, np.int32)
    i = 0
    while i < len(pairs):
        sa, sb = pairs[i]
        i += 1
        ta = a.trans[sa]
        tb = b.trans[sb] if sb >= 0 else dead
        live = (ta >= 0) & (tb >= 0) if keep_b else ta >= 0
        # one code per target pair; a row has few distinct ones, so intern those, not each byte
        codes = np.where(live, ta.astype(np.int64) * width + tb + 1, -1)
        uniq, inverse = np.unique(codes, return_inverse=True)
        ids = np.empty(len(uniq), np.int32)
        for k, code in enumerate(uniq.tolist()):
            if code < 0:
                ids[k] = -1
                continue
            ids[k] = _intern((code // width, code % width - 1), index, pairs, max_states)
        rows.append(ids[inverse.reshape(-1)])
    acc_b = np.array([sb >= 0 and bool(b.accept[sb]) for _, sb in pairs])
    acc_a = a.accept[[sa for sa, _ in pairs]]
    accept = acc_a & (acc_b if keep_b else ~acc_b)
    return minimize(DFA(np.stack(rows), accept))


@numba.njit(cache=True)
def _product_pairs(ta, tb, keep_b, max_states):  # pragma: no cover - compiled
    """Breadth-first numbering of the state pairs reachable in a product; pair (x, y) sits at
    index[x * (nb + 1) + y + 1] (y = -1: b is dead, a difference goes on in a alone).  Returns the
    pair count, or -1 past max_states."""
    nb1 = tb.shape[0] + 1
    index = np.full(ta.shape[0] * nb1, -1, np.int32)
    cap = min(ta.shape[0] * nb1, max_states + 1)
    qa = np.empty(cap, np.int32)
    qb = np.empty(cap, np.int32)
    index[1] = 0
    qa[0] = 0
    qb[0] = 0
    n, i = 1, 0
    while i < n:
        sa, sb = qa[i], qb[i]
        i += 1
        for c in range(256):
            x = ta[sa, c]
            if x < 0:
                continue
            y = tb[sb, c] if sb >= 0 else -1
            if keep_b and y < 0:
                continue
            k = x * nb1 + y + 1
            if index[k] < 0:
                if n >= max_states:
                    return index, qa, qb, -1
                index[k] = n
                qa[n] = x
                qb[n] = y
                n += 1
    return index, qa, qb, n


def _dense_product(a: DFA, b: DFA, keep_b: bool, max_states: int) -> DFA:
    index, qa, qb, n = _product_pairs(a.trans, b.trans, keep_b, max_states)
    if n < 0:
        raise BudgetExceeded(f"more than {max_states} automaton states")
    qa, qb = qa[:n], qb[:n]
    tb = np.concatenate([b.trans, np.full((1, 256), -1, np.int32)])  # row -1: b is dead
    x, y = a.trans[qa], tb[qb]
    live = (x >= 0) & (y >= 0) if keep_b else x >= 0
    codes = np.where(live, x.astype(np.int64) * (b.num_states + 1) + y + 1, 0)
    trans = np.where(live, index[codes], -1).astype(np.int32)
    acc_b = np.append(b.accept, False)[qb]
    accept = a.accept[qa] & (acc_b if keep_b else ~acc_b)
    return minimize(DFA(trans, accept))


def union(dfas: list[DFA], max_states: int) -> DFA:
    """The minimal DFA of the union of `dfas`."""
    nfa = NFA(max_states * 4)
    src, dst = nfa.node(), nfa.node()
    for dfa in dfas:
        nfa.embed(dfa, src, dst)
    return minimize(determinize(nfa, src, dst, max_states))
