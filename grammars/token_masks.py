"""Token masks: walks of the vocabulary trie through the terminal DFAs (numba).

Only terminal states consume bytes (see `automaton`), so every trie walk runs
inside one terminal DFA: from a state, below some trie nodes, it marks the
tokens the terminal can consume and records the trie nodes where the terminal
may end (*pop points*).  What follows a pop point depends on the rule around
the terminal and on the parser stack, so `TokenMasks.add_mask` continues the
walk from there in the caller's return state, which dispatches to the next
terminals through its call edges.  Terminal DFAs are shared objects, so a walk
depends on (terminal DFA, state, trie nodes) only and is cached per vocabulary
across grammars: the big walks (inside a JSON string, the first token of a
value) are paid once per process, not once per grammar, and a whole-vocabulary
walk from a state that moves like another on all but a few first bytes is
patched from that state's walk instead of walking the trie again.
"""

from __future__ import annotations

import bisect
import weakref

import numba
import numpy as np

from .automaton import Automaton
from .fsm import DFA
from .stacks import StackArena
from .vocab import Vocabulary

_SHARED_WALKS_LIMIT = 1 << 15  # per vocabulary; most walks are sparse (a few words of bitmask)
_MAX_PATCHED_BYTES = 8  # a whole-vocabulary walk is patched from a neighbour's when it differs on this few bytes
_MAX_PATCH_DEPTH = 4  # ...through at most this many neighbours (prefixes of an excluded key)


@numba.njit(cache=True, nogil=True)
def walk_dfa(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
             start, t0, bits, pops):  # pragma: no cover - compiled
    """Mark in `bits` the tokens strictly below trie node t0 that a call-free DFA can consume from
    `start`; write the nodes where it may stop (accept) into `pops`.  Returns the number of pops."""
    npops = 0
    if accept[start]:
        pops[npops] = t0
        npops += 1
    if not has_out[start]:
        return npops
    base = t_depth[t0]
    states = np.empty(max_depth - base + 1, np.int32)
    states[0] = start
    i, stop = t0 + 1, t_end[t0]
    while i < stop:
        lv = t_depth[i] - base
        g = trans[states[lv - 1], t_byte[i]]
        if g < 0:
            i = t_end[i]
            continue
        for j in range(t_tok_ptr[i], t_tok_ptr[i + 1]):
            tid = t_tok_ids[j]
            bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        if accept[g]:
            pops[npops] = i
            npops += 1
        states[lv] = g
        i = i + 1 if has_out[g] else t_end[i]
    return npops



@numba.njit(cache=True, nogil=True)
def walk_nodes(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
               start, nodes, bits, pops):  # pragma: no cover - compiled
    """`walk_dfa` from one state below each of several trie nodes, into one bitmask and pop list."""
    total = 0
    for node in nodes:
        total += walk_dfa(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
                          start, node, bits, pops[total:])
    return total


@numba.njit(cache=True, nogil=True)
def _set_tokens(bits, tok_ids, lo, hi, value):  # pragma: no cover - compiled
    """Set (value=True) or clear the bits of tokens tok_ids[lo:hi]."""
    for j in range(lo, hi):
        tid = tok_ids[j]
        if value:
            bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        else:
            bits[tid >> 5] &= ~(np.uint32(1) << np.uint32(tid & 31))


def load_kernels(vocabulary: Vocabulary) -> None:
    """Load `_set_tokens` now: only a patched whole-vocabulary walk (inside a key beside declared ones) calls
    it, so it would otherwise load, from numba's disk cache, inside the first mask that patches one."""
    t = vocabulary.trie
    _set_tokens(np.zeros(vocabulary.mask_words, np.uint32), t.tok_ids, t.tok_ptr[0], t.tok_ptr[0], False)


_ROOT_CHILDREN: "weakref.WeakKeyDictionary[Vocabulary, np.ndarray]" = weakref.WeakKeyDictionary()


def _root_children(vocabulary: Vocabulary) -> np.ndarray:
    """Per first byte, the trie node of that byte below the root (-1: no token starts with it)."""
    hit = _ROOT_CHILDREN.get(vocabulary)
    if hit is None:
        t = vocabulary.trie
        nodes = np.flatnonzero(t.depth == 1)
        hit = _ROOT_CHILDREN[vocabulary] = np.full(256, -1, np.int64)
        hit[t.byte[nodes]] = nodes
    return hit


# One walk's result, a plain tuple (words, values, pops, pops_key): the allowed tokens as a bitmask (`words`
# the indices of its non-zero words, or None when `values` is the whole bitmask), the trie nodes where it
# stopped and their bytes.  Tens of thousands stay cached for the life of the process, and a tuple of arrays
# and bytes drops out of the garbage collector's scans, where a class instance (a NamedTuple too) is
# visited by every full collection: that made collections of 250 ms stall a mask in long runs.
Walk = tuple


def new_walk(bits: np.ndarray, pops: np.ndarray) -> Walk:
    """The walk allowing the tokens of bitmask `bits`, stopping at trie nodes `pops` (stored sparse when it is)."""
    nonzero = np.flatnonzero(bits)
    if len(nonzero) * 4 < len(bits):
        return nonzero, bits[nonzero], pops, pops.tobytes()
    return None, bits, pops, pops.tobytes()


def add_walk(walk: Walk, bits: np.ndarray) -> None:
    """OR the walk's allowed tokens into `bits`."""
    words, values = walk[0], walk[1]
    if words is None:
        np.bitwise_or(bits, values, out=bits)
    elif len(words):
        bits[words] |= values


# per vocabulary: (terminal DFA, state, trie nodes) or (state signature, root) -> Walk, shared by every grammar
_SHARED_WALKS: "weakref.WeakKeyDictionary[Vocabulary, dict[tuple, Walk]]" = weakref.WeakKeyDictionary()
_ROOT = np.zeros(1, np.int32)
_ROOT_KEY = _ROOT.tobytes()


def _run_walk(dfa: DFA, vocabulary: Vocabulary, state: int, nodes: np.ndarray) -> Walk:
    t = vocabulary.trie
    bits = np.zeros(vocabulary.mask_words, np.uint32)
    pops = np.empty(int((t.end[nodes] - nodes).sum()), np.int32)
    npops = walk_nodes(dfa.trans, dfa.accept, dfa.has_out, t.byte, t.depth, t.end, t.tok_ptr, t.tok_ids,
                       vocabulary.max_depth, state, nodes, bits, pops)
    pops = pops[:npops]
    # walks from nested nodes can stop at the same node twice: keep pop points a sorted set (walks from
    # sorted disjoint subtrees already list theirs in order, once)
    disjoint = len(nodes) < 2 or bool((t.end[nodes[:-1]] <= nodes[1:]).all())
    return new_walk(bits, pops if disjoint else np.unique(pops))


class TokenMasks:
    """Token masks of one automaton over one vocabulary, from cached terminal walks."""

    def __init__(self, automaton: Automaton, vocabulary: Vocabulary):
        self.a = automaton
        self.vocabulary = vocabulary
        self._walks: dict[tuple[int, bytes], Walk] = {}
        self._terminal_starts = tuple(first for first, _ in automaton.terminals)  # tuples: see StackArena
        self._shared = _SHARED_WALKS.setdefault(vocabulary, {})
        self._call_ptr = tuple(automaton.call_ptr.tolist())

    def terminal_of(self, state: int) -> tuple[int, DFA] | None:
        """(first global state, DFA) of the terminal rule holding `state`, None for a structural state."""
        k = bisect.bisect_right(self._terminal_starts, state) - 1
        if k < 0:
            return None
        first, dfa = self.a.terminals[k]
        return (first, dfa) if state - first < dfa.num_states else None

    def walk(self, state: int, nodes: np.ndarray, nodes_key: bytes) -> Walk:
        """Tokens below the trie `nodes` consumable from terminal state `state`, and pop points (cached)."""
        key = (state, nodes_key)
        hit = self._walks.get(key)
        if hit is None:
            first, dfa = self.terminal_of(state)
            hit = self._walks[key] = self._shared_walk(dfa, state - first, nodes, nodes_key)
        return hit

    def _shared_walk(self, dfa: DFA, state: int, nodes: np.ndarray, nodes_key: bytes, depth: int = 0) -> Walk:
        # walks of the whole vocabulary are the expensive ones: share them between all states
        # with the same future (the inside of every JSON string, whatever its declared keys)
        root = nodes_key == _ROOT_KEY
        signature = dfa.signature(state) if root else None
        key = (signature, nodes_key) if signature is not None else (dfa.uid, state, nodes_key)
        hit = self._shared.get(key)
        if hit is None:
            hit = self._patched_root_walk(dfa, state, depth) if root else None
            if hit is None:
                hit = _run_walk(dfa, self.vocabulary, state, nodes)
            if len(self._shared) >= _SHARED_WALKS_LIMIT:
                del self._shared[next(iter(self._shared))]
            self._shared[key] = hit
        return hit

    def _patched_root_walk(self, dfa: DFA, state: int, depth: int) -> Walk | None:
        """The whole-vocabulary walk of a wide state that moves like its main successor on all
        but a few bytes (inside a string, a prefix of an excluded key): the successor's walk with
        the subtrees of those first bytes walked again.  None where that does not apply."""
        row = dfa.trans[state]
        targets = row[row >= 0]
        if depth >= _MAX_PATCH_DEPTH or len(targets) < 128:
            return None
        ref = int(np.bincount(targets).argmax())
        differ = np.flatnonzero(row != dfa.trans[ref])
        if ref == state or len(differ) > _MAX_PATCHED_BYTES:
            return None
        base = self._shared_walk(dfa, ref, _ROOT, _ROOT_KEY, depth + 1)
        t, children = self.vocabulary.trie, _root_children(self.vocabulary)
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        add_walk(base, bits)
        base_pops = base[2]
        keep = np.ones(len(base_pops), bool)
        extra = [np.zeros(1, np.int32)] if dfa.accept[state] else []
        keep &= base_pops != 0
        for byte in differ.tolist():
            child = int(children[byte])
            if child < 0:
                continue
            end = int(t.end[child])
            _set_tokens(bits, t.tok_ids, t.tok_ptr[child], t.tok_ptr[end], False)
            keep &= (base_pops < child) | (base_pops >= end)
            nxt = int(row[byte])
            if nxt >= 0:
                _set_tokens(bits, t.tok_ids, t.tok_ptr[child], t.tok_ptr[child + 1], True)
                sub = _run_walk(dfa, self.vocabulary, nxt, np.array([child], np.int32))
                add_walk(sub, bits)
                extra.append(sub[2])
        return new_walk(bits, np.unique(np.concatenate([base_pops[keep], *extra])))

    def add_mask(self, bits: np.ndarray, state: int, stack: int, stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed from configuration (state, stack)."""
        a = self.a
        call_ptr = self._call_ptr
        todo = [(state, stack, _ROOT, _ROOT_KEY)]
        seen = {(state, stack, todo[0][3])}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            nexts = []
            if self.terminal_of(g) is not None:
                found = self.walk(g, nodes, nodes_key)
                add_walk(found, bits)
                pops, pops_key = found[2], found[3]
                if s and len(pops):
                    nexts.append((stacks.ret[s], stacks.parent[s], pops, pops_key))
            else:
                # a structural state consumes no bytes: go on into each callee from the same nodes
                for c in range(call_ptr[g], call_ptr[g + 1]):
                    called = stacks.call(s, c)
                    if called is not None:
                        nexts.append((*called, nodes, nodes_key))
                if a.accept[g] and s:
                    # returning from the outermost rule ends the text: nothing may follow
                    nexts.append((stacks.ret[s], stacks.parent[s], nodes, nodes_key))
            for item in nexts:
                key = (item[0], item[1], item[3])
                if key not in seen:
                    seen.add(key)
                    todo.append(item)
