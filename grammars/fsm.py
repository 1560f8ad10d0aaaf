"""Automata: an NFA builder, subset construction, trimming, minimisation, products.

A DFA here is a dense table `trans[state, byte]` (-1: no transition) with an
`accept` flag per state, start state 0.  The structure of grammar rules is an
automaton over *call edges* only ((label, target) pairs, see `CallDFA`), built
with the same NFA builder and its own subset construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import types
from numba.typed import Dict

# Automata each memo (terminals, regexes, literals, patterns) keeps.  Every one stays an object that each full
# garbage collection visits, at about half a microsecond each (the collector chases pointers through a scattered
# heap): at 8k-64k entries a memo, collections of 60-115 ms landed inside token masks after a few thousand
# MaskBench schemas.  512 keeps what recurs across schemas (strings, numbers, punctuation, common keys): against
# 2,048, time to first mask and total mask time were level on Github_medium, Github_easy, Kubernetes and Snowplow
# (in-process A/B), and the objects in the old generation fell from about 8,600 to 6,200.
MEMO_SIZE = 512


class BudgetExceeded(Exception):
    """An automaton grew past its state budget; `budget` says which ("20000 automaton states")."""

    def __init__(self, limit: int, unit: str):
        self.budget = f"{limit} {unit}"
        super().__init__(f"more than {self.budget}")


_DFA_UIDS = itertools.count()


# a run of a state in a loop on its main bytes (DFA.byte_runs): longer than any token
RUN_CAP = 1 << 16
# the bytes of plain text inside a JSON string (printable ASCII but the quote and the backslash), for the plain runs
# of `DFA.byte_runs`: as a mask per byte and as four 64-bit words
PLAIN_BYTES = np.zeros(256, np.bool_)
PLAIN_BYTES[0x20:0x7F] = True
PLAIN_BYTES[[0x22, 0x5C]] = False
PLAIN_WORDS = np.packbits(PLAIN_BYTES, bitorder="little").view(np.uint64).copy()
COUNT_CAP = 1 << 40  # string counts of an automaton stop here (DFA.counts): more than any object or array holds


@dataclass(eq=False, slots=True, weakref_slot=True)
class DFA:
    """A deterministic automaton over bytes (plus optional call edges); start state 0."""

    trans: np.ndarray  # int32 [n, 256]
    accept: np.ndarray  # bool [n]
    # Never reused: caches key on it instead of the DFA, so their keys are tuples of ints that the garbage
    # collector stops scanning (a key holding the DFA object stays tracked).
    uid: int = field(default_factory=lambda: next(_DFA_UIDS), init=False, repr=False)
    # States of the products built on the way to this automaton (its own included): what it cost to build,
    # for the compile budgets
    built_states: int = field(default=0, init=False, repr=False)
    # What the properties below compute once.  Slots, not an instance dict: a dict would be one more object per
    # memoised DFA for every full garbage collection to visit.
    _has_out: np.ndarray | None = field(default=None, init=False, repr=False)
    _matches_nothing: bool | None = field(default=None, init=False, repr=False)
    _signatures: dict[int, bytes | None] | None = field(default=None, init=False, repr=False)
    _byte_runs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)
    # The classes of bytes its columns keep apart, where minimisation found them (`byte_classes`)
    _classes: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)
    _counted_states: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)
    _edge_table: np.ndarray | None = field(default=None, init=False, repr=False)
    plain_walks: int = field(default=0, init=False, repr=False)     # wide token walks made without byte runs
    # Where it reads like another automaton for a while (a length-bounded string like any string, short of its
    # bound), so that a token walk narrows the other's walk instead of walking the trie (`token_masks`): the
    # other, and per state its state in step with this one (every byte this one reads, the other reads too, into
    # the states in step) and for how many bytes d from there they read alike: on every string of at most d bytes
    # this one reads it where the other does and accepts after it where the other does (d >= 0); -1: in step,
    # but accepting unlike the other there.
    like: DFA | None = field(default=None, init=False, repr=False)
    like_states: np.ndarray | None = field(default=None, init=False, repr=False)    # int32 [n]
    like_depths: np.ndarray | None = field(default=None, init=False, repr=False)    # int32 [n]
    # The bytes it reads from its start state, where it is a chain of them (`chain_dfa`): state i reads byte i
    chain: np.ndarray | None = field(default=None, init=False, repr=False)    # uint8 [n - 1]

    @property
    def num_states(self) -> int:
        return len(self.accept)

    @property
    def has_out(self) -> np.ndarray:
        """Per state, whether some byte transition leaves it (cached)."""
        cached = self._has_out
        if cached is None:
            cached = self._has_out = (self.trans >= 0).any(axis=1)
        return cached

    @property
    def matches_nothing(self) -> bool:
        """Whether no state accepts (cached: a grammar asks it of each terminal it calls)."""
        cached = self._matches_nothing
        if cached is None:
            cached = self._matches_nothing = not self.accept.any()
        return cached

    def signature(self, state: int, limit: int = 256) -> bytes | None:
        """The automaton reachable from `state`, canonically numbered, as bytes (cached): equal
        signatures mean equal languages from there on, whatever DFA they sit in.  None when more
        than `limit` states are reachable."""
        cache = self._signatures
        if cache is None:
            cache = self._signatures = {}
        if state not in cache:
            order = _reachable_in_order(self.trans, state, limit)
            # as byte ranges, not whole rows: a row of 256 targets per state made each signature tens of KB (29 KB
            # on average over Github_medium's masks), which every cache lookup hashed and compared whole
            cache[state] = None if len(order) > limit else _canonical_ranges(self.trans, self.accept, order).tobytes()
        return cache[state]

    def after(self, state: int, data: bytes) -> int:
        """The state `data` leads to from `state`, -1 where it leaves the automaton."""
        for byte in data:
            state = int(self.trans[state, byte])
            if state < 0:
                return -1
        return state

    @property
    def finite(self) -> np.ndarray:
        """Per state, whether it accepts finitely many strings from there: no cycle is reachable (cached)."""
        return self._counted()[0]

    @property
    def counts(self) -> np.ndarray:
        """Per state, how many strings it accepts from there, clipped to COUNT_CAP (infinitely many: COUNT_CAP)."""
        return self._counted()[1]

    @property
    def byte_runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per state, (how many bytes can follow it that all keep to a main path, at most RUN_CAP; the bytes of that
        path's first step as four 64-bit words): each step goes to the state most of its bytes lead to (more than
        half of those that lead anywhere), never an accepting one, and each next step takes at least the bytes of
        the one before; then per state its plain run, how many bytes of plain text (`PLAIN_BYTES`) can follow it in
        any order through states that neither accept nor end, at most RUN_CAP.  A token walk skips a trie subtree
        whose bytes all lie in one of the two byte sets (the plain one as `PLAIN_WORDS`) and that is no deeper than
        its run (cached).

        The plain runs serve where text is searched for words (a pattern unanchored, a key class of
        patternProperties): each of a word's letters leaves the main path, so most subtrees hold one, but plain
        text never ends a search for a word, so from every state it runs on."""
        cached = self._byte_runs
        if cached is None:
            # over one byte of each class: a large automaton's runs took two passes of 256 columns a state (4.5-7.3
            # ms at 11,892 states, inside the mask that first needed them), where its plain bytes fall in 9 classes
            firsts, class_of = self.byte_classes
            plain = np.zeros(256, np.bool_)
            plain[firsts[np.unique(class_of[PLAIN_BYTES])]] = True
            runs, bits = _byte_runs(self.trans, self.accept, RUN_CAP, firsts, class_of)
            cached = self._byte_runs = runs, bits, _plain_runs(self.trans, self.accept, plain, RUN_CAP)
        return cached

    @property
    def byte_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """(the lowest byte of each class of bytes whose columns are equal, each byte's class), as minimisation found
        them (bytes with equal columns may still sit in two classes); one class per byte where it did not run."""
        return self._classes if self._classes is not None else _EACH_BYTE

    @property
    def has_byte_runs(self) -> bool:
        """Whether `byte_runs` is computed already."""
        return self._byte_runs is not None

    def size(self, limit: int) -> int | None:
        """How many strings it accepts, None when more than `limit` (or infinitely many)."""
        count = int(self.counts[0])
        return count if self.finite[0] and count <= limit else None

    def _counted(self) -> tuple[np.ndarray, np.ndarray]:
        """(finite, counts), by Kahn's peeling over distinct successors from the states with none: a state is
        counted once all its successors are (cached)."""
        cached = self._counted_states
        if cached is None:
            n = self.num_states
            src, byte = np.nonzero(self.trans >= 0)
            pairs = np.unique(src.astype(np.int64) * n + self.trans[src, byte])
            src_of, dst_of = np.divmod(pairs, n)
            left = np.bincount(src_of, minlength=n)      # successors not counted yet
            order = np.argsort(dst_of, kind="stable")
            starts = np.searchsorted(dst_of[order], np.arange(n + 1))
            preds = src_of[order]
            finite = np.zeros(n, bool)
            counts = np.full(n, COUNT_CAP, np.int64)
            todo = np.flatnonzero(left == 0).tolist()
            while todo:
                q = todo.pop()
                row = self.trans[q]
                finite[q] = True
                counts[q] = min(int(self.accept[q]) + int(counts[row[row >= 0]].sum()), COUNT_CAP)
                for p in preds[starts[q]:starts[q + 1]].tolist():
                    left[p] -= 1
                    if left[p] == 0:
                        todo.append(p)
            cached = self._counted_states = (finite, counts)
        return cached

    def edge_table(self) -> np.ndarray:
        """Its transitions as int32 rows (state, lo byte, hi byte, target), one per maximal byte range
        (cached)."""
        cached = self._edge_table
        if cached is None:
            cached = self._edge_table = _edge_table(self.trans)
        return cached


def chain_dfa(data: bytes) -> DFA:
    """The minimal DFA of exactly `data`: a chain of its bytes.  What its properties compute is known (every state
    but the last goes on, the last accepts), and each object key of a schema is one, new in nearly every compile."""
    chain = np.frombuffer(data, np.uint8)
    trans, ends, goes_on = _chain_tables(chain)
    dfa = DFA(trans, ends)
    dfa._has_out, dfa._matches_nothing = goes_on, False
    dfa.chain = chain
    return dfa


@numba.njit(cache=True)
def _chain_tables(chain):  # pragma: no cover - compiled
    """The kernel of `chain_dfa`: its transitions, accepting states and states with a way on (compiled: numpy's
    five array operations were more than half of the 7-9 µs a new key cost)."""
    n = chain.shape[0]
    trans = np.full((n + 1, 256), -1, np.int32)
    for i in range(n):
        trans[i, chain[i]] = i + 1
    ends = np.zeros(n + 1, np.bool_)
    ends[n] = True
    goes_on = ~ends
    return trans, ends, goes_on


@dataclass(eq=False)
class CallDFA:
    """A deterministic automaton whose only transitions are call edges; start state 0."""

    accept: list[bool]
    calls: list[tuple[tuple[object, int], ...]]  # per state: (label, target) pairs, labels distinct
    # every state reaches an accepting one through its calls (a chain, an object's five states, most automata from
    # subset construction): trimming the rule can then only drop the calls of rules that match nothing
    trimmed: bool = False
    # kept across grammars (`automaton._RULE_DFAS`): every grammar with the rule's body holds this very object
    shared: bool = False
    # never reused, as DFA.uid: keys naming this very automaton hold the number, not the object (see
    # `automaton._portable_rules`)
    uid: int = field(default_factory=lambda: next(_DFA_UIDS), init=False, repr=False)

    @property
    def num_states(self) -> int:
        return len(self.accept)


@dataclass(frozen=True)
class Fragment:
    """A piece of NFA between two of its nodes, as `NFA.splice` copies it: its node count, byte edges (rows src, lo,
    hi, dst) and epsilons ([2, E]), numbered from 0."""

    nodes: int
    start: int
    final: int
    edges: np.ndarray
    epsilons: np.ndarray


class NFA:
    """A Thompson-style NFA under construction: byte-range, epsilon and call edges, kept as flat lists
    (one `extend` per edge) that the compiled subset construction reads as arrays."""

    def __init__(self, budget: int = 200_000):
        self.count = 0
        self.budget = budget
        self._edges: list[int] = []          # (src, lo, hi, dst) quadruples, flat
        self._eps: list[int] = []            # (src, dst) pairs, flat
        self._calls: list[object] = []       # (src, label, dst) triples, flat
        self._embedded: list[np.ndarray] = []      # [E, 4] edges of spliced DFAs
        self._embedded_eps: list[np.ndarray] = []  # [2, E] epsilons out of their accepting states

    def node(self) -> int:
        """A fresh node."""
        if self.count >= self.budget:
            raise BudgetExceeded(self.budget, "automaton nodes")
        self.count += 1
        return self.count - 1

    def byte_range(self, src: int, lo: int, hi: int, dst: int) -> None:
        self._edges += (src, lo, hi, dst)

    def epsilon(self, src: int, dst: int) -> None:
        self._eps += (src, dst)

    def call(self, src: int, label: object, dst: int) -> None:
        self._calls += (src, label, dst)

    def embed(self, dfa: DFA, src: int, dst: int) -> None:
        """Splice a copy of `dfa` between nodes src and dst."""
        first = self.count
        if first + dfa.num_states > self.budget:
            raise BudgetExceeded(self.budget, "automaton nodes")
        self.count += dfa.num_states
        self._embedded.append(dfa.edge_table() + np.array([first, 0, 0, first], np.int32))
        finals = np.flatnonzero(dfa.accept).astype(np.int32) + first
        self._embedded_eps.append(np.stack([finals, np.full_like(finals, dst)]))
        self.epsilon(src, first)

    def splice(self, part: Fragment, src: int, dst: int) -> None:
        """Splice a copy of fragment `part` (built in an NFA of its own) between nodes src and dst."""
        first = self.count
        if first + part.nodes > self.budget:
            raise BudgetExceeded(self.budget, "automaton nodes")
        self.count += part.nodes
        self._embedded.append(part.edges + np.array([first, 0, 0, first], np.int32))
        self._embedded_eps.append(part.epsilons + np.int32(first))
        self.epsilon(src, first + part.start)
        self.epsilon(first + part.final, dst)

    def fragment(self, start: int, final: int) -> Fragment:
        """This NFA (byte and epsilon edges only) as a fragment from `start` to `final`, to splice elsewhere."""
        if self._calls:
            raise ValueError("a fragment holds byte and epsilon edges only")
        return Fragment(self.count, start, final, self.byte_edges(), self.epsilons())

    def byte_edges(self) -> np.ndarray:
        """All byte edges as int32 [E, 4] rows (src, lo, hi, dst)."""
        return np.concatenate([np.array(self._edges, np.int32).reshape(-1, 4), *self._embedded])

    def epsilons(self) -> np.ndarray:
        """All epsilon edges as int32 [2, E] (sources, targets)."""
        return np.concatenate([np.array(self._eps, np.int32).reshape(-1, 2).T, *self._embedded_eps], axis=1)

    def call_table(self) -> tuple[list[object], np.ndarray]:
        """The call labels in order of first use, and the call edges as int32 [E, 4] rows (src, label id,
        label id, dst): a label is a one-symbol range."""
        ids: dict[object, int] = {}
        triples = iter(self._calls)
        rows = [(src, ids.setdefault(label, len(ids)), dst) for src, label, dst in zip(triples, triples, triples)]
        edges = np.array(rows, np.int32).reshape(-1, 3)
        return list(ids), edges[:, [0, 1, 1, 2]]

    def adjacency(self) -> tuple[dict[int, list[int]], dict[int, list[tuple[object, int]]]]:
        """Per node that has any: its epsilon targets and its (label, target) calls, for the call NFAs of
        rules (which splice no DFAs)."""
        eps: dict[int, list[int]] = {}
        calls: dict[int, list[tuple[object, int]]] = {}
        pairs = iter(self._eps)
        for src, dst in zip(pairs, pairs):
            eps.setdefault(src, []).append(dst)
        triples = iter(self._calls)
        for src, label, dst in zip(triples, triples, triples):
            calls.setdefault(src, []).append((label, dst))
        return eps, calls


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
        for b in range(trans.shape[1]):
            t = trans[s, b]
            if t >= 0 and not seen[t]:
                if count > limit:
                    return order
                seen[t] = True
                order[count] = t
                count += 1
    return order[:count]


@numba.njit(cache=True)
def _canonical_ranges(trans, accept, order):  # pragma: no cover - compiled
    """The automaton on the states `order` (every target among them), numbered by their place in it: per state, in
    that order, whether it accepts, how many maximal byte ranges lead on, and each range as (first byte, last
    byte, target's number)."""
    number = np.full(trans.shape[0], -1, np.int32)
    for k in range(len(order)):
        number[order[k]] = k
    runs = 0
    for s in order:
        for b in range(trans.shape[1]):
            if trans[s, b] >= 0 and (b == 0 or trans[s, b] != trans[s, b - 1]):
                runs += 1
    out = np.empty(2 * len(order) + 3 * runs, np.int32)
    at = 0
    for s in order:
        out[at] = accept[s]
        head = at + 1
        at += 2
        for b in range(trans.shape[1]):
            t = trans[s, b]
            if t >= 0 and (b == 0 or t != trans[s, b - 1]):
                out[at], out[at + 2] = b, number[t]
                at += 3
            if t >= 0 and (b == trans.shape[1] - 1 or trans[s, b + 1] != t):
                out[at - 2] = b
        out[head] = (at - head - 1) // 3
    return out


def _edge_table(trans: np.ndarray) -> np.ndarray:
    """Per row of `trans [n, 256]`, its maximal byte ranges with the same live target, as int32 rows
    (row, lo, hi, target), found for all rows at once."""
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
    return np.stack([rows[live], los[live], his[live], targets[live]], axis=1).astype(np.int32)


def determinize(nfa: NFA, start: int, final: int, max_states: int) -> DFA:
    """Subset construction over bytes from `start`; DFA states containing `final` accept."""
    return DFA(*_subsets(nfa, nfa.byte_edges(), 256, start, final, max_states))


def _subsets(nfa: NFA, edges: np.ndarray, width: int, start: int, final: int,
             max_states: int) -> tuple[np.ndarray, np.ndarray]:
    """The compiled subset construction over symbols 0..width-1 of `edges` (rows src, lo, hi, dst)."""
    eps_ptr, eps_dst = _by_source(nfa.count, nfa.epsilons())
    edge_ptr, edge_cols = _by_source(nfa.count, edges.T)
    trans, accept, count = _subset_construction(eps_ptr, eps_dst[0], edge_ptr, edge_cols[0], edge_cols[1],
                                                edge_cols[2], start, final, width, max_states)
    if count < 0:
        raise BudgetExceeded(max_states, "automaton states")
    return trans, accept


_COMPILED_CALL_NODES = 200   # call NFAs larger than this use the compiled subset construction


def determinize_calls(nfa: NFA, start: int, final: int, max_states: int) -> CallDFA:
    """Subset construction over the call labels of an NFA without byte edges.  Most rule NFAs are a few
    dozen nodes, where Python sets beat the compiled construction's set-up (9 against 25 us on a chain of
    six calls); larger ones (long unrolled repetitions) go through it with labels numbered."""
    if nfa.count > _COMPILED_CALL_NODES:
        labels, edges = nfa.call_table()
        trans, accept = _subsets(nfa, edges, len(labels), start, final, max_states)
        states, ids = np.nonzero(trans >= 0)
        rows: list[list[tuple[object, int]]] = [[] for _ in range(len(accept))]
        for s, label, t in zip(states.tolist(), ids.tolist(), trans[states, ids].tolist()):
            rows[s].append((labels[label], t))
        return CallDFA(accept.tolist(), [tuple(row) for row in rows])
    eps, calls = nfa.adjacency()
    memo: dict[frozenset, frozenset] = {}

    def closure(nodes) -> frozenset:
        key = frozenset(nodes)
        hit = memo.get(key)
        if hit is None:
            seen, todo = set(key), list(key)
            while todo:
                for t in eps.get(todo.pop(), ()):
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            hit = memo[key] = frozenset(seen)
        return hit

    first = closure((start,))
    index, sets, out = {first: 0}, [first], []
    i = 0
    while i < len(sets):
        by_label: dict[object, set[int]] = {}
        for n in sets[i]:
            for label, t in calls.get(n, ()):
                by_label.setdefault(label, set()).add(t)
        out.append(tuple((lab, _intern(closure(ts), index, sets, max_states)) for lab, ts in by_label.items()))
        i += 1
    return CallDFA([final in s for s in sets], out)


def _by_source(count: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges `[1 + k, E]` (sources, then k columns) grouped by source: offsets `[count + 1]` and the k columns
    in that order."""
    src = edges[0]
    ptr = np.zeros(count + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=count), out=ptr[1:])
    return ptr, np.ascontiguousarray(edges[1:, np.argsort(src, kind="stable")])


@numba.njit(cache=True)
def _closure(seeds, n_seeds, eps_ptr, eps_dst, mark, stamp, out):  # pragma: no cover - compiled
    """Write the epsilon closure of seeds[:n_seeds] to out, sorted; its size (nodes are marked `stamp`)."""
    count = 0
    for i in range(n_seeds):
        s = seeds[i]
        if mark[s] != stamp:
            mark[s] = stamp
            out[count] = s
            count += 1
    i = 0
    while i < count:
        node = out[i]
        i += 1
        for k in range(eps_ptr[node], eps_ptr[node + 1]):
            t = eps_dst[k]
            if mark[t] != stamp:
                mark[t] = stamp
                out[count] = t
                count += 1
    out[:count].sort()
    return count


@numba.njit(cache=True)
def _grown(array, need):  # pragma: no cover - compiled
    """`array`, or a copy at least twice as long when it holds fewer than `need` rows."""
    if len(array) >= need:
        return array
    shape = (max(need, 2 * len(array)),) + array.shape[1:]
    bigger = np.empty(shape, array.dtype)
    bigger[:len(array)] = array
    return bigger


@numba.njit(cache=True)
def _intern_set(closed, size, accepting, sets):  # pragma: no cover - compiled
    """The id of the node set closed[:size] in `sets` (pool, offsets, hashes, accept, table, count), added
    if new; returns (id, sets), the arrays grown as needed.  Set i is pool[offsets[i]:offsets[i + 1]];
    `table` is an open-addressing index by hash, kept at most half full."""
    pool, offsets, hashes, accept, table, count = sets
    h = np.uint64(14695981039346656037)
    for i in range(size):
        h = (h ^ np.uint64(closed[i])) * np.uint64(1099511628211)
    mask = np.uint64(len(table) - 1)
    slot = h & mask
    while table[slot] >= 0:
        other = table[slot]
        first = offsets[other]
        if hashes[other] == h and offsets[other + 1] - first == size:
            same = True
            for i in range(size):
                if pool[first + i] != closed[i]:
                    same = False
                    break
            if same:
                return other, sets
        slot = (slot + np.uint64(1)) & mask
    new = count
    count += 1
    table[slot] = new
    pool = _grown(pool, offsets[new] + size)
    pool[offsets[new]:offsets[new] + size] = closed[:size]
    offsets = _grown(offsets, count + 1)
    offsets[count] = offsets[new] + size
    hashes, accept = _grown(hashes, count), _grown(accept, count)
    hashes[new], accept[new] = h, accepting
    if 2 * count > len(table):
        table = np.full(2 * len(table), -1, np.int32)
        mask = np.uint64(len(table) - 1)
        for s in range(count):
            slot = hashes[s] & mask
            while table[slot] >= 0:
                slot = (slot + np.uint64(1)) & mask
            table[slot] = s
    return new, (pool, offsets, hashes, accept, table, count)


@numba.njit(cache=True)
def _subset_construction(eps_ptr, eps_dst, edge_ptr, edge_lo, edge_hi, edge_dst, start, final, width,
                         max_states):  # pragma: no cover - compiled
    """Subset construction over symbols 0..width-1.  A set's edges are swept in order of their range ends,
    so each run of symbols with the same live targets is closed and interned once.  Returns
    (trans [n, width], accept [n], n); n = -1 past max_states."""
    nodes = len(eps_ptr) - 1
    mark = np.zeros(nodes, np.int64)             # nodes in the closure being built carry the current stamp
    closed = np.empty(nodes, np.int32)
    live = np.zeros(nodes, np.int32)             # per target node: how many swept edges reach it now
    active = np.empty(nodes, np.int32)           # the targets live now, and where each sits in `active`
    where = np.empty(nodes, np.int32)
    points = np.empty(64, np.int32)
    targets = np.empty(64, np.int32)
    deltas = np.empty(64, np.int32)
    order = np.empty(64, np.int64)
    bucket = np.empty(width + 2, np.int64)
    sets = (np.empty(max(nodes, 64), np.int32), np.zeros(65, np.int64), np.empty(64, np.uint64),
            np.zeros(64, np.bool_), np.full(128, -1, np.int32), 0)
    size = _closure(np.full(1, start, np.int32), 1, eps_ptr, eps_dst, mark, 1, closed)
    _, sets = _intern_set(closed, size, mark[final] == 1, sets)
    trans = np.full((64, width), -1, np.int32)
    n_active, stamp, state = 0, 1, 0
    while state < sets[5]:
        pool, offsets = sets[0], sets[1]
        n_events = 0
        for j in range(offsets[state], offsets[state + 1]):
            node = pool[j]
            need = n_events + 2 * (edge_ptr[node + 1] - edge_ptr[node])
            points, targets, deltas = _grown(points, need), _grown(targets, need), _grown(deltas, need)
            for k in range(edge_ptr[node], edge_ptr[node + 1]):
                points[n_events], targets[n_events], deltas[n_events] = edge_lo[k], edge_dst[k], 1
                points[n_events + 1], targets[n_events + 1], deltas[n_events + 1] = edge_hi[k] + 1, edge_dst[k], -1
                n_events += 2
        # events in order of their points, counted into buckets: the points are symbols, and a comparison sort
        # of a set's few hundred events took a fifth of the construction
        order = _grown(order, n_events)
        bucket[:] = 0
        for k in range(n_events):
            bucket[points[k] + 1] += 1
        for p in range(1, width + 2):
            bucket[p] += bucket[p - 1]
        for k in range(n_events):
            order[bucket[points[k]]] = k
            bucket[points[k]] += 1
        e = 0
        while e < n_events:
            lo = points[order[e]]
            while e < n_events and points[order[e]] == lo:
                k = order[e]
                t = targets[k]
                if deltas[k] > 0:
                    if live[t] == 0:
                        where[t], active[n_active] = n_active, t
                        n_active += 1
                    live[t] += 1
                else:
                    live[t] -= 1
                    if live[t] == 0:
                        last = active[n_active - 1]
                        active[where[t]], where[last] = last, where[t]
                        n_active -= 1
                e += 1
            if n_active == 0 or lo >= width:
                continue
            stamp += 1
            size = _closure(active, n_active, eps_ptr, eps_dst, mark, stamp, closed)
            target, sets = _intern_set(closed, size, mark[final] == stamp, sets)
            if target >= max_states:
                return trans[:0], sets[3][:0], -1
            if target >= len(trans):
                trans = _grown(trans, target + 1)
                trans[target:] = -1
            trans[state, lo:points[order[e]]] = target     # a live edge ends further on: e < n_events
        state += 1
    count = sets[5]
    return trans[:count].copy(), sets[3][:count].copy(), count


def _intern(state: frozenset, index: dict, sets: list, max_states: int) -> int:
    sid = index.get(state)
    if sid is None:
        if len(sets) >= max_states:
            raise BudgetExceeded(max_states, "automaton states")
        sid = index[state] = len(sets)
        sets.append(state)
    return sid


def minimize(dfa: DFA) -> DFA:
    """The minimal trimmed DFA (no calls): dead and unreachable states removed, equivalent states merged,
    states numbered breadth first from the start (targets by byte), so equal languages give equal tables."""
    trans, accept, firsts, class_of = _minimal(dfa.trans, dfa.accept)
    out = DFA(trans, accept)
    out._classes = firsts, class_of      # the input's columns kept equal are equal in the quotient
    return out


_EACH_BYTE = (np.arange(256, dtype=np.int64), np.arange(256, dtype=np.int64))


@numba.njit(cache=True)
def _minimal(trans, accept):  # pragma: no cover - compiled
    """Hopcroft's partition refinement on the DFA completed with a sink state (dead and missing transitions);
    then the quotient's states reachable from the start.  All of it runs over the byte classes the DFA
    distinguishes (a few dozen columns where the table has 256), widened to bytes only in the result."""
    n = trans.shape[0]
    classes, class_of = _byte_classes(trans)
    k = len(classes)
    narrow = np.empty((n, k), np.int32)
    for s in range(n):
        for j in range(k):
            narrow[s, j] = trans[s, classes[j]]
    live = _live_states(narrow, accept)
    if n == 0 or not live[0]:
        return np.full((1, 256), -1, np.int32), np.zeros(1, np.bool_), classes, class_of
    full = np.empty((n + 1, k), np.int32)
    for s in range(n):
        for j in range(k):
            t = narrow[s, j]
            full[s, j] = t if t >= 0 and live[t] else n
    full[n, :] = n
    done = np.empty(n + 1, np.bool_)
    done[:n] = accept & live
    done[n] = False
    block, count = _hopcroft(full, done)
    reps = np.full(count, -1, np.int64)         # the first member of each block
    for s in range(n + 1):
        if reps[block[s]] < 0:
            reps[block[s]] = s
    sink = block[n]
    quotient = np.empty((count, k), np.int32)
    for q in range(count):
        for j in range(k):
            t = block[full[reps[q], j]]
            quotient[q, j] = -1 if t == sink else t
    # a class's targets are met first at its lowest byte, and the classes go by lowest byte: the breadth-first
    # order over classes is the one over bytes
    order = _reachable_in_order(quotient, block[0], count)
    remap = np.full(count, -1, np.int32)
    for i in range(len(order)):
        remap[order[i]] = i
    out = np.empty((len(order), 256), np.int32)
    final = np.empty(len(order), np.bool_)
    for i in range(len(order)):
        q = order[i]
        final[i] = done[reps[q]]
        for b in range(256):
            t = quotient[q, class_of[b]]
            out[i, b] = -1 if t < 0 else remap[t]
    return out, final, classes, class_of


@numba.njit(cache=True)
def _live_states(trans, accept):  # pragma: no cover - compiled
    """States from which an accepting state is reachable (backwards from the accepting ones)."""
    ptr, moves = _moves_into(trans)
    return _reaching(ptr, moves, trans.shape[1], accept)


@numba.njit(cache=True)
def _moves_into(trans):  # pragma: no cover - compiled
    """The moves into each state, by target: moves[ptr[t]:ptr[t + 1]] holds s * width + c for each trans[s, c] == t."""
    n, width = trans.shape
    ptr = np.zeros(n + 1, np.int64)
    for s in range(n):
        for c in range(width):
            if trans[s, c] >= 0:
                ptr[trans[s, c] + 1] += 1
    for t in range(n):
        ptr[t + 1] += ptr[t]
    fill = ptr[:-1].copy()
    moves = np.empty(ptr[n], np.int64)
    for s in range(n):
        for c in range(width):
            t = trans[s, c]
            if t >= 0:
                moves[fill[t]] = s * width + c
                fill[t] += 1
    return ptr, moves


@numba.njit(cache=True)
def _reaching(ptr, moves, width, accept):  # pragma: no cover - compiled
    """The states with a way to an accepting one, backwards along `_moves_into`'s moves."""
    n = len(accept)
    live = accept.copy()
    stack = np.empty(n, np.int64)
    top = 0
    for s in range(n):
        if live[s]:
            stack[top] = s
            top += 1
    while top:
        top -= 1
        t = stack[top]
        for k in range(ptr[t], ptr[t + 1]):
            p = moves[k] // width
            if not live[p]:
                live[p] = True
                stack[top] = p
                top += 1
    return live


@numba.njit(cache=True)
def _byte_classes(trans):  # pragma: no cover - compiled
    """The classes of bytes that every state treats alike (equal columns of `trans`): the lowest byte of each,
    in increasing order, and each byte's class.  Bytes with equal column hashes are taken as one class, which
    one pass along the rows confirms (columns compared one by one would read the table across its rows, a
    cache miss a state); on a hash collision, columns with equal hashes are compared exactly."""
    n = trans.shape[0]
    hashes = np.zeros(256, np.uint32)
    for s in range(n):
        for b in range(256):
            hashes[b] = hashes[b] * np.uint32(16777619) + np.uint32(trans[s, b] + 1)
    firsts, class_of, count = _grouped(trans, hashes, False)
    rep = firsts[class_of]
    for s in range(n):
        for b in range(256):
            if trans[s, b] != trans[s, rep[b]]:
                firsts, class_of, count = _grouped(trans, hashes, True)
                return firsts[:count], class_of
    return firsts[:count], class_of


@numba.njit(cache=True)
def _grouped(trans, hashes, exact):  # pragma: no cover - compiled
    """Byte b joins the first class whose lowest byte has its column hash (and, `exact`, its very column), else
    starts one.  Returns (lowest bytes, each byte's class, class count)."""
    firsts = np.empty(256, np.int64)
    class_of = np.empty(256, np.int64)
    count = 0
    for b in range(256):
        known = -1
        for c in range(count):
            r = firsts[c]
            if hashes[r] == hashes[b] and (not exact or _same_column(trans, r, b)):
                known = c
                break
        if known < 0:
            firsts[count] = b
            known = count
            count += 1
        class_of[b] = known
    return firsts, class_of, count


@numba.njit(cache=True)
def _same_column(trans, a, b):  # pragma: no cover - compiled
    """Whether columns a and b of `trans` are equal."""
    for s in range(trans.shape[0]):
        if trans[s, a] != trans[s, b]:
            return False
    return True


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
    # splitting by one block of a partition in two splits as by the other: the smaller suffices (the accepting
    # states, mostly; the other block holds the sink, whose predecessors are most of the table)
    first = 0 if blocks == 1 or nacc <= n - nacc else 1
    for c in range(k):
        work_b[top], work_c[top] = first, c
        in_work[first, c] = True
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


_DENSE_PAIRS = 1 << 23  # products with at most this many state pairs index them in a flat table (32 MiB)


def product(a: DFA, b: DFA, keep_b: bool, max_states: int) -> DFA:
    """Intersection (keep_b=True) or difference a minus b (keep_b=False) of two DFAs."""
    dense = a.num_states * (b.num_states + 1) <= _DENSE_PAIRS
    trans, qa, qb = (_dense_pairs if dense else _sparse_pairs)(a, b, keep_b, max_states)
    acc_b = np.append(b.accept, False)[qb]               # index -1: b is dead
    accept = a.accept[qa] & (acc_b if keep_b else ~acc_b)
    return minimize(DFA(trans, accept))


def _sparse_pairs(a: DFA, b: DFA, keep_b: bool, max_states: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The product's transition rows and each state's pair (qa[i], qb[i]), through `_sparse_product`."""
    trans, qa, qb, n = _sparse_product(a.trans, b.trans, keep_b, max_states)
    if n < 0:
        raise BudgetExceeded(max_states, "automaton states")
    return trans[:n].copy(), qa[:n], qb[:n]


@numba.njit(cache=True)
def _sparse_product(ta, tb, keep_b, max_states):  # pragma: no cover - compiled
    """A product with too many state pairs for `_product_pairs`' flat index: the reachable pairs numbered
    breadth-first through a hash table, their transition rows filled on the way.  Returns (trans, qa, qb, n):
    pair i is (qa[i], qb[i]) (qb -1: b is dead), n = -1 past max_states."""
    nb1 = tb.shape[0] + 1
    index = Dict.empty(key_type=types.int64, value_type=types.int64)
    qa = np.empty(256, np.int32)
    qb = np.empty(256, np.int32)
    trans = np.empty((256, 256), np.int32)
    index[1] = 0                                            # pair (0, 0)
    qa[0] = 0
    qb[0] = 0
    n, i = 1, 0
    while i < n:
        sa, sb = qa[i], qb[i]
        for c in range(256):
            x = ta[sa, c]
            y = tb[sb, c] if sb >= 0 else -1
            if x < 0 or (keep_b and y < 0):
                trans[i, c] = -1
                continue
            key = np.int64(x) * nb1 + y + 1
            j = index.get(key, -1)
            if j < 0:
                if n >= max_states:
                    return trans, qa, qb, -1
                qa, qb, trans = _grown(qa, n + 1), _grown(qb, n + 1), _grown(trans, n + 1)
                j = n
                index[key] = j
                qa[n] = x
                qb[n] = y
                n += 1
            trans[i, c] = j
        i += 1
    return trans, qa, qb, n


@numba.njit(cache=True)
def _product_pairs(ta, tb, symbols, keep_b, max_states, rows):  # pragma: no cover - compiled
    """Breadth-first numbering of the state pairs reachable in a product, their transition rows filled on the
    way; on byte c from pair (x, y), a goes by c and b by `symbols[x, c]` (one row: the same for every x; the
    byte itself for a plain product).  Pair (x, y) sits at index[x * (nb + 1) + y + 1] (y = -1: b is dead, a
    difference goes on in a alone).  Room for `rows` rows at first, doubled as needed (pages are only touched
    when written).  Returns (trans, qa, qb, n): pair i is (qa[i], qb[i]), n = -1 past max_states."""
    index = np.full(ta.shape[0] * (tb.shape[0] + 1), -1, np.int32)
    cap = min(ta.shape[0] * (tb.shape[0] + 1), max_states, rows) + 256
    qa = np.empty(cap, np.int32)
    qb = np.empty(cap, np.int32)
    trans = np.empty((cap, 256), np.int32)
    index[1] = 0
    qa[0] = 0
    qb[0] = 0
    n, i = 1, 0
    while True:
        i, n = _pair_rows(ta, tb, symbols, keep_b, max_states, index, qa, qb, trans, i, n)
        if n < 0 or i == n:
            return trans, qa, qb, n
        # growing out here keeps the arrays fixed inside the row loop: numba compiled the loop that could grow
        # them 14x slower
        qa, qb, trans = _grown(qa, 2 * len(qa)), _grown(qb, 2 * len(qb)), _grown(trans, 2 * len(trans))


@numba.njit(cache=True)
def _pair_rows(ta, tb, symbols, keep_b, max_states, index, qa, qb, trans, i, n):  # pragma: no cover - compiled
    """Fill the rows of `_product_pairs` from row i, n pairs numbered, while a row's new pairs (256 at most) fit
    in the arrays.  Returns (i, n): i == n when done, n = -1 past max_states."""
    nb1 = tb.shape[0] + 1
    per_state = symbols.shape[0] > 1
    while i < n and n + 256 <= len(qa):
        sa, sb = qa[i], qb[i]
        row = sa if per_state else 0
        for c in range(256):
            x = ta[sa, c]
            y = tb[sb, symbols[row, c]] if sb >= 0 else -1
            if x < 0 or (keep_b and y < 0):
                trans[i, c] = -1
                continue
            k = x * nb1 + y + 1
            j = index[k]
            if j < 0:
                if n >= max_states:
                    return i, -1
                j = n
                index[k] = j
                qa[n] = x
                qb[n] = y
                n += 1
            trans[i, c] = j
        i += 1
    return i, n


_BYTES = np.arange(256, dtype=np.int32)[None, :]
_FIRST_ROWS = 1 << 16


def _dense_pairs(a: DFA, b: DFA, keep_b: bool, max_states: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The product's transition rows and each state's pair (qa[i], qb[i]), through `_product_pairs`' flat index."""
    trans, qa, qb, n = _product_pairs(a.trans, b.trans, _BYTES, keep_b, max_states, _FIRST_ROWS)
    if n < 0:
        raise BudgetExceeded(max_states, "automaton states")
    return trans[:n], qa[:n], qb[:n]   # a view: the rows past n were never written, so they hold no memory


def counted_product(a: DFA, b: DFA, counts: np.ndarray, lo: int, hi: int | None, max_states: int) -> DFA:
    """The minimal DFA of the strings of `a` and `b` along which `b` takes its transitions marked in `counts`
    (bool [b states, 256]) between `lo` and `hi` times (None: no upper bound): the product unrolled over the
    count, a copy per count reached, only the pairs reachable.  The unrolling is itself a product, with a counter
    moved by the product's transitions: unmarked ones leave the count, marked ones add one.

    A count stops mattering once it is past `lo` and no string from the pair it reaches can carry it past `hi`
    (a hostname, at most 251 characters here, under maxLength 255: at once; a dotted name of up to four segments
    of 1-32 characters, 131 at most, under maxLength 128: once a segment is shorter), so such a pair goes on in
    one copy free of the count.  Unrolled, both passed 20,000 pairs; the dotted name now takes 9,098, for a
    minimal automaton of 7,055 states."""
    trans, qa, qb = _dense_pairs(a, b, True, max_states)
    marked = (counts[qb[:, None], np.arange(256)] & (trans >= 0)).astype(np.int32)
    accept = a.accept[qa] & b.accept[qb]
    top = hi if hi is not None else lo
    if len(trans) * (top + 3) > _DENSE_PAIRS:    # the pairs' flat index alone would take over 32 MiB
        raise BudgetExceeded(max_states, "automaton states")
    # count k, or `free` = top + 1; a move's symbol: whether it is marked, and the level of the most marked moves on
    # from its target (capped at `free`: more, or without end), one of `levels`
    free = top + 1
    levels, level_of = np.array([free]), np.zeros(len(trans), np.intp)      # one level: never free
    if hi is not None:
        found, where = np.unique(np.minimum(_most_to_accept(trans, marked, accept), free), return_inverse=True)
        if (free + 1) * 2 * len(found) <= _DENSE_PAIRS:      # the counter's table within the flat index's bound
            levels, level_of = found, where
    symbols = (marked * len(levels) + level_of[np.maximum(trans, 0)]).astype(np.int32)
    counter = np.empty((free + 1, 2 * len(levels)), np.int32)
    count = np.arange(free)[:, None]
    for step in (0, 1):
        after = count + step if hi is not None else np.minimum(count + step, lo)   # unbounded: past lo, one copy
        # (unbounded, the one level is `free`, so no count goes free: past lo it stays at lo)
        counter[:free, step * len(levels):(step + 1) * len(levels)] = np.where(
            (after >= lo) & (after + levels[None, :] <= top), free, np.where(after <= top, after, -1))
    counter[free] = free
    rows, pairs, tally, n = _product_pairs(trans, counter, symbols, True, max_states, _FIRST_ROWS)
    if n < 0:
        raise BudgetExceeded(max_states, "automaton states")
    pairs = pairs[:n]
    return minimize(DFA(rows[:n], accept[pairs] & (tally[:n] >= lo)))


@numba.njit(cache=True)
def _most_to_accept(trans, marked, accept):  # pragma: no cover - compiled
    """Per state, the most marked transitions along a way from it to acceptance; int64 max where that is without
    bound (a cycle lies on such a way) or there is no way.  Backwards from the states with no way on but to dead
    ones, a state settled once every live successor is (the states left are those a cycle reaches)."""
    n = trans.shape[0]
    ptr, moves = _moves_into(trans)                 # a live state's moves come from live states
    live = _reaching(ptr, moves, 256, accept)
    unbounded = np.iinfo(np.int64).max
    most = np.full(n, unbounded, np.int64)
    waiting = np.zeros(n, np.int64)                 # live successors (with multiplicity) not settled yet
    for s in range(n):
        if live[s]:
            for c in range(256):
                t = trans[s, c]
                if t >= 0 and live[t]:
                    waiting[s] += 1
    best = np.where(accept, 0, -1)
    stack = np.empty(n, np.int64)
    top = 0
    for s in range(n):
        if live[s] and waiting[s] == 0:
            stack[top] = s
            top += 1
    while top:
        top -= 1
        t = stack[top]
        most[t] = best[t]
        for k in range(ptr[t], ptr[t + 1]):
            s, c = moves[k] // 256, moves[k] % 256
            best[s] = max(best[s], most[t] + marked[s, c])
            waiting[s] -= 1
            if waiting[s] == 0:
                stack[top] = s
                top += 1
    return most


@numba.njit(cache=True, nogil=True)
def _byte_runs(trans, accept, cap, firsts, class_of):  # pragma: no cover - compiled
    """The kernel of `DFA.byte_runs`, over one byte of each class (`DFA.byte_classes`: the lowest bytes `firsts`,
    each byte's class): each state's main successor and its bytes, then the runs along the main successors, each
    state resolved once."""
    n = trans.shape[0]
    k = len(firsts)
    weight = np.zeros(k, np.int64)      # bytes per class
    words = np.zeros((k, 4), np.uint64)
    for b in range(256):
        weight[class_of[b]] += 1
        words[class_of[b], b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    main = np.full(n, -1, np.int64)
    bits = np.zeros((n, 4), np.uint64)
    for g in range(n):
        # the target of most of the bytes that have one, where one has most (a majority vote weighted by the
        # classes' sizes, then counted)
        best, votes, total = -1, 0, 0
        for j in range(k):
            q = trans[g, firsts[j]]
            if q < 0:
                continue
            w = weight[j]
            total += w
            if q == best:
                votes += w
            elif votes >= w:
                votes -= w
            else:
                best, votes = q, w - votes
        if best < 0 or accept[best]:
            continue
        most = 0
        for j in range(k):
            if trans[g, firsts[j]] == best:
                most += weight[j]
        if 2 * most <= total:
            continue
        main[g] = best
        for j in range(k):
            if trans[g, firsts[j]] == best:
                for word in range(4):
                    bits[g, word] |= words[j, word]
    # a run goes on into the main successor's where that one's bytes hold this state's: a path in a graph of one
    # edge per state, resolved walking each chain once (a chain that closes on itself, a loop, runs to the cap)
    link = np.full(n, -1, np.int64)
    for g in range(n):
        m = main[g]
        if m >= 0 and main[m] >= 0:
            wider = True
            for k in range(4):
                if bits[m, k] & bits[g, k] != bits[g, k]:
                    wider = False
            if wider:
                link[g] = m
    runs = np.zeros(n, np.int32)
    mark = np.zeros(n, np.int8)    # 0: not reached, 1: on the chain being walked, 2: resolved
    chain = np.empty(n, np.int64)
    for root in range(n):
        if main[root] < 0 or mark[root]:
            continue
        length, g = 0, root
        while g >= 0 and mark[g] == 0:
            mark[g] = 1
            chain[length] = g
            length += 1
            g = link[g]
        if g >= 0 and mark[g] == 1:     # the chain closes on itself: the loop and what leads into it run to the cap
            for k in range(length):
                runs[chain[k]] = cap
        else:
            after = runs[g] if g >= 0 else 0
            for k in range(length - 1, -1, -1):
                after = min(cap, after + 1)
                runs[chain[k]] = after
        for k in range(length):
            mark[chain[k]] = 2
    return runs, bits


@numba.njit(cache=True, nogil=True)
def _plain_runs(trans, accept, plain, cap):  # pragma: no cover - compiled
    """Per state, the most bytes of `plain` (a mask per byte) that can follow it, in any order, through states that
    neither accept nor end, at most `cap`: 0 where one such byte leads to an accepting state or nowhere, else one
    more than the least of its successors' on those bytes, by a search back from the states at 0 (a state they
    never reach runs on without end: `cap`)."""
    n = trans.shape[0]
    plain_bytes = np.flatnonzero(plain)
    runs = np.full(n, cap, np.int32)
    queue = np.empty(n, np.int64)
    queued = 0
    starts = np.zeros(n + 1, np.int64)     # the plain edges reversed, by target (counted, then filled)
    for q in range(n):
        ends = False
        for b in plain_bytes:
            t = trans[q, b]
            if t < 0 or accept[t]:
                ends = True
            else:
                starts[t + 1] += 1
        if ends:
            runs[q] = 0
            queue[queued] = q
            queued += 1
    for q in range(n):
        starts[q + 1] += starts[q]
    sources = np.empty(starts[n], np.int64)
    filled = starts[:n].copy()
    for q in range(n):
        for b in plain_bytes:
            t = trans[q, b]
            if t >= 0 and not accept[t]:
                sources[filled[t]] = q
                filled[t] += 1
    head = 0
    while head < queued:    # breadth first: a state is met first from its successor with the least run
        t = queue[head]
        head += 1
        for k in range(starts[t], starts[t + 1]):
            q = sources[k]
            if runs[q] == cap and runs[t] + 1 < cap:
                runs[q] = runs[t] + 1
                queue[queued] = q
                queued += 1
    return runs


def load_kernels(sample: DFA) -> None:
    """Load the compiled product, key-exclusion, signature, byte-run and key-chain kernels, with `sample` (any DFA)
    as their input: numba reads each from its disk cache on first call, and the sparse one only runs for products of
    millions of pairs (signatures only for walks over much of a large vocabulary), so without this it loads inside
    whichever compile or mask first needs one.  (Counted products go through the plain kernel, with the same argument
    types, after `_most_to_accept`.)"""
    product(sample, sample, True, 1 << 10)
    _most_to_accept(sample.trans, np.zeros(sample.trans.shape, np.int32), sample.accept)
    _sparse_pairs(sample, sample, False, 1 << 10)
    without_words(sample, [b"a"], 1 << 10)
    _canonical_ranges(sample.trans, sample.accept, _reachable_in_order(sample.trans, 0, 1))
    _byte_runs(sample.trans, sample.accept, RUN_CAP, *sample.byte_classes)
    _plain_runs(sample.trans, sample.accept, PLAIN_BYTES, RUN_CAP)
    chain_dfa(b"a")


def packed_bytes(words: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """`words` for a kernel: their bytes end to end (uint8) and where each ends (int64, a leading 0): word k is
    data[ends[k]:ends[k + 1]]."""
    # (the offsets summed in Python: numpy's cumsum of a short list cost 3 µs, and every object with extra keys
    # packs its declared keys here)
    return (np.frombuffer(b"".join(words), np.uint8),
            np.array(list(itertools.accumulate(map(len, words), initial=0)), np.int64))


def without_words(base: DFA, words: Sequence[bytes], max_states: int) -> DFA | None:
    """`base` (a minimal DFA) without the strings `words` (a finite set): base's automaton behind a trie of the
    words, each trie node falling back to base's row at the state its prefix reaches (the declared keys of an
    object excluded from any string).  Trie nodes that reach no accepting state are dropped and those with equal
    futures merged; the result is nearly minimal (base's start may stay unreachable, and a prefix that no longer
    excludes anything stays apart from base's state).  None where the trie alone passes `max_states`."""
    data, ends = packed_bytes(words)
    trans, accept, fits = _without_words(base.trans, base.accept, data, ends, max_states)
    return DFA(trans, accept) if fits else None


@numba.njit(cache=True)
def _without_words(table, accept_base, data, ends, max_states):  # pragma: no cover - compiled
    """The kernel of `without_words`: (trans, accept, True), or (empty, empty, False) past `max_states` trie
    nodes.  Every object of a schema excludes its own keys, so this runs once per object compiled."""
    max_states = max(max_states, 1)     # the root always is a node: the rows below are sized for it at least
    cap = min(len(data) + 1, max_states)
    child = np.full((cap, 256), -1, np.int32)
    first_child = np.full(cap, -1, np.int32)     # the children of a node as a list: first, then next sibling
    sibling = np.full(cap, -1, np.int32)
    byte_of = np.zeros(cap, np.int32)
    reached = np.zeros(cap, np.int32)           # base's state after each node's prefix
    ended = np.zeros(cap, np.bool_)
    degree = np.zeros(cap, np.int32)
    n = 1
    for w in range(len(ends) - 1):
        node = state = 0
        whole = True
        for i in range(ends[w], ends[w + 1]):
            byte = data[i]
            state = table[state, byte]
            if state < 0:      # base has no such string: nothing to exclude
                whole = False
                break
            c = child[node, byte]
            if c < 0:
                if n == max_states:
                    return child[:0], ended[:0], False
                c = n
                n += 1
                child[node, byte] = c
                sibling[c] = first_child[node]
                first_child[node] = c
                byte_of[c] = byte
                degree[node] += 1
                reached[c] = state
            node = c
        if whole:
            ended[node] = True
    out_degree = np.zeros(len(table), np.int32)
    for q in range(len(table)):
        for byte in range(256):
            if table[q, byte] >= 0:
                out_degree[q] += 1
    accept = np.zeros(n, np.bool_)
    for node in range(n):
        accept[node] = accept_base[reached[node]] and not ended[node]
    # Children come after their parents, so one backward pass settles liveness (a node is live where it accepts, a
    # byte leaves it for base, whose states are all live, or a child is live) and merges the nodes with the same
    # base state, acceptance and merged children (equal suffixes of the words: their closing quote).
    merged = np.full(n, -1, np.int32)
    size = 2
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, np.int32)
    for node in range(n - 1, -1, -1):
        alive = accept[node] or out_degree[reached[node]] > degree[node]
        key = np.int64(reached[node]) * 1000003 + accept[node] + degree[node] * 7919
        c = first_child[node]
        while c >= 0:
            alive = alive or merged[c] >= 0
            key += (np.int64(byte_of[c]) + 1) * (np.int64(merged[c]) + 2) * 2654435761
            c = sibling[c]
        if not alive:
            continue
        slot = (key ^ (key >> 17)) & (size - 1)
        while True:
            other = slots[slot]
            if other < 0:
                slots[slot] = node
                merged[node] = node
                break
            same = (reached[other] == reached[node] and accept[other] == accept[node]
                    and degree[other] == degree[node])
            c = first_child[node]
            while same and c >= 0:
                d = child[other, byte_of[c]]
                same = d >= 0 and merged[d] == merged[c]
                c = sibling[c]
            if same:
                merged[node] = other
                break
            slot = (slot + 1) & (size - 1)
    if merged[0] < 0:
        return np.full((1, 256), -1, np.int32), np.zeros(1, np.bool_), True
    index = np.full(n, -1, np.int32)
    index[merged[0]] = 0            # the start first, then the other kept nodes in order
    kept = 1
    for node in range(n):
        if merged[node] == node and node != merged[0]:
            index[node] = kept
            kept += 1
    trans = np.empty((kept + len(table), 256), np.int32)
    out_accept = np.empty(kept + len(table), np.bool_)
    for q in range(len(table)):
        out_accept[kept + q] = accept_base[q]
        for byte in range(256):
            target = table[q, byte]
            trans[kept + q, byte] = target + kept if target >= 0 else -1
    for node in range(n):
        i = index[node]
        if i < 0:       # dropped, or merged into another node
            continue
        trans[i] = trans[kept + reached[node]]
        out_accept[i] = accept[node]
        c = first_child[node]
        while c >= 0:
            trans[i, byte_of[c]] = index[merged[c]] if merged[c] >= 0 else -1
            c = sibling[c]
    return trans, out_accept, True


def union(dfas: list[DFA], max_states: int) -> DFA:
    """The minimal DFA of the union of `dfas`."""
    nfa = NFA(max_states * 4)
    src, dst = nfa.node(), nfa.node()
    for dfa in dfas:
        nfa.embed(dfa, src, dst)
    return minimize(determinize(nfa, src, dst, max_states))
