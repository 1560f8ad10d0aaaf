"""Token masks: walks of the vocabulary trie through the grammar automaton (numba).

A walk starts from one automaton state with an empty local stack ("the base
frame") at a trie node, and marks every token below that node whose bytes the
automaton can consume; calls push local frames, returns pop them.  Where the
base frame itself could return, the walk records the trie node as a *pop point*:
what follows there depends on the caller's stack, so it is resolved per parser
state by continuing the walk from the return state (see `TokenMasks.add_mask`).
Walk results depend on (state, trie nodes) only and are cached, which makes
the context-independent bulk of every mask a cached bitmask; walks inside
shared terminal automata (JSON strings...) are cached across grammars.
"""

from __future__ import annotations

import bisect
import functools
import weakref

import numba
import numpy as np
from numba import types
from numba.typed import Dict

from .automaton import Automaton
from .errors import GrammarError
from .fsm import DFA
from .vocab import Vocab

_MAX_CONFIGS = 128  # configurations per trie depth; more means a pathologically ambiguous grammar
_MAX_VISITED = 1024
_MAX_LOCAL_FRAMES = 1 << 16


@numba.njit(cache=True)
def _intern(stacks, parent, ret, count, s, r, width):  # pragma: no cover - compiled
    key = np.int64(s) * width + r
    sid = stacks.get(key, -1)
    if sid < 0:
        sid = count[0]
        if sid >= len(parent):
            return -1
        parent[sid] = s
        ret[sid] = r
        count[0] = sid + 1
        stacks[key] = sid
    return sid


@numba.njit(cache=True)
def _closure(accept, call_ptr, call_callee, call_ret, has_out, work_g, work_s, nwork,
             out_g, out_s, stacks, parent, ret, count, width):  # pragma: no cover - compiled
    """Close configurations under calls and returns; keep those that can consume a byte.
    Returns (number kept, base frame may return, error)."""
    i, nout, pop = 0, 0, False
    while i < nwork:
        g, s = work_g[i], work_s[i]
        i += 1
        if has_out[g]:
            if nout >= len(out_g):
                return nout, pop, True
            out_g[nout] = g
            out_s[nout] = s
            nout += 1
        for c in range(call_ptr[g], call_ptr[g + 1]):
            ns = _intern(stacks, parent, ret, count, s, call_ret[c], width)
            if ns < 0:
                return nout, pop, True
            nwork = _add(work_g, work_s, nwork, call_callee[c], ns)
            if nwork < 0:
                return nout, pop, True
        if accept[g]:
            if s == 0:
                pop = True
            else:
                nwork = _add(work_g, work_s, nwork, ret[s], parent[s])
                if nwork < 0:
                    return nout, pop, True
    return nout, pop, False


@numba.njit(cache=True, inline="always")
def _add(work_g, work_s, n, g, s):  # pragma: no cover - compiled
    for k in range(n):
        if work_g[k] == g and work_s[k] == s:
            return n
    if n >= len(work_g):
        return -1
    work_g[n] = g
    work_s[n] = s
    return n + 1


@numba.njit(cache=True)
def walk(trans, accept, call_ptr, call_callee, call_ret, has_out,
         t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids,
         start, t0, bits, pops, cfg_g, cfg_s, cnt, work_g, work_s, stacks, parent, ret, count):  # pragma: no cover
    """Mark in `bits` the tokens strictly below trie node t0 consumable from automaton
    state `start`; write pop points into `pops`.  Returns (number of pops, error).
    The remaining arguments are scratch buffers (see `walk_many`); local stacks persist in them."""
    width = np.int64(len(accept) + 1)
    npops = 0

    work_g[0], work_s[0] = start, 0
    n, pop, err = _closure(accept, call_ptr, call_callee, call_ret, has_out, work_g, work_s, 1,
                           cfg_g[0], cfg_s[0], stacks, parent, ret, count, width)
    if err:
        return npops, True
    cnt[0] = n
    if pop:
        pops[npops] = t0
        npops += 1
    if n == 0:
        return npops, False
    base = t_depth[t0]
    i, stop = t0 + 1, t_end[t0]
    while i < stop:
        lv = t_depth[i] - base
        b = t_byte[i]
        nraw = 0
        for k in range(cnt[lv - 1]):
            ng = trans[cfg_g[lv - 1, k], b]
            if ng >= 0:
                nraw = _add(work_g, work_s, nraw, ng, cfg_s[lv - 1, k])
        if nraw == 0:
            i = t_end[i]
            continue
        for j in range(t_tok_ptr[i], t_tok_ptr[i + 1]):
            tid = t_tok_ids[j]
            bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        plain = True
        for k in range(nraw):
            g = work_g[k]
            if accept[g] or call_ptr[g + 1] > call_ptr[g]:
                plain = False
                break
        if plain:
            # the common case (inside a terminal): nothing to close over
            n, pop = 0, False
            for k in range(nraw):
                if has_out[work_g[k]]:
                    cfg_g[lv, n] = work_g[k]
                    cfg_s[lv, n] = work_s[k]
                    n += 1
        else:
            n, pop, err = _closure(accept, call_ptr, call_callee, call_ret, has_out, work_g, work_s, nraw,
                                   cfg_g[lv], cfg_s[lv], stacks, parent, ret, count, width)
            if err:
                return npops, True
        cnt[lv] = n
        if pop:
            pops[npops] = i
            npops += 1
        i = i + 1 if n > 0 else t_end[i]
    return npops, False


@numba.njit(cache=True)
def walk_dfa(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
             start, t0, bits, pops):  # pragma: no cover - compiled
    """`walk` for an automaton without calls: one state per trie depth, no stacks."""
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


@numba.njit(cache=True)
def walk_many(trans, accept, call_ptr, call_callee, call_ret, has_out,
              t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
              start, nodes, bits, pops):  # pragma: no cover - compiled
    """`walk` from one state below each of several trie nodes, into one bitmask and pop list."""
    total = 0
    if len(call_callee) == 0:
        for node in nodes:
            total += walk_dfa(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, max_depth,
                              start, node, bits, pops[total:])
        return total, False
    levels = max_depth + 1
    cfg_g = np.empty((levels, _MAX_CONFIGS), np.int32)
    cfg_s = np.empty((levels, _MAX_CONFIGS), np.int32)
    cnt = np.zeros(levels, np.int32)
    work_g = np.empty(_MAX_VISITED, np.int32)
    work_s = np.empty(_MAX_VISITED, np.int32)
    parent = np.empty(_MAX_LOCAL_FRAMES, np.int32)
    ret = np.empty(_MAX_LOCAL_FRAMES, np.int32)
    count = np.ones(1, np.int64)
    stacks = Dict.empty(key_type=types.int64, value_type=types.int64)
    for node in nodes:
        n, err = walk(trans, accept, call_ptr, call_callee, call_ret, has_out,
                      t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, start, node, bits, pops[total:],
                      cfg_g, cfg_s, cnt, work_g, work_s, stacks, parent, ret, count)
        if err:
            return total, True
        total += n
    return total, False


Walk = tuple[np.ndarray, np.ndarray]  # (uint32 bitmask of tokens, int32 pop points)
# walks inside shared terminal automata, per vocabulary: (terminal DFA, state, trie nodes) -> Walk
_TERMINAL_WALKS: "weakref.WeakKeyDictionary[Vocab, dict[tuple[DFA, int, bytes], Walk]]" = weakref.WeakKeyDictionary()
_ROOT = np.zeros(1, np.int32)


def _run_walk(a: Automaton, vocab: Vocab, state: int, nodes: np.ndarray) -> Walk:
    t = vocab.trie
    bits = np.zeros(vocab.mask_words, np.uint32)
    pops = np.empty(int((t.end[nodes] - nodes).sum()), np.int32)
    npops, err = walk_many(a.trans, a.accept, a.call_ptr, a.call_callee, a.call_ret, a.has_out,
                           t.byte, t.depth, t.end, t.tok_ptr, t.tok_ids, vocab.max_depth, state, nodes, bits, pops)
    if err:
        raise GrammarError("grammar too ambiguous or nested too deeply within one token to compute a mask")
    return bits, pops[:npops].copy()


@functools.lru_cache(maxsize=1024)
def _terminal_automaton(dfa: DFA) -> Automaton:
    n = dfa.num_states
    empty = np.zeros(0, np.int32)
    return Automaton(dfa.trans, dfa.accept, np.zeros(n + 1, np.int32), empty, empty,
                     (dfa.trans >= 0).any(axis=1), 0)


class TokenMasks:
    """Cached trie walks of one automaton over one vocabulary."""

    def __init__(self, automaton: Automaton, vocab: Vocab):
        self.a = automaton
        self.vocab = vocab
        self._walks: dict[tuple[int, int], Walk] = {}
        self._terminal_starts = [first for first, _ in automaton.terminals]
        self._terminal_walks = _TERMINAL_WALKS.setdefault(vocab, {})

    def walk(self, state: int, nodes: np.ndarray) -> Walk:
        """(bitmask of tokens below the trie `nodes` consumable from `state`, pop points), cached."""
        key = (state, nodes.tobytes())
        hit = self._walks.get(key)
        if hit is None:
            k = bisect.bisect_right(self._terminal_starts, state) - 1
            first, dfa = self.a.terminals[k] if k >= 0 else (0, None)
            if dfa is not None and state - first < dfa.num_states:
                shared_key = (dfa, state - first, key[1])
                hit = self._terminal_walks.get(shared_key)
                if hit is None:
                    hit = self._terminal_walks[shared_key] = _run_walk(
                        _terminal_automaton(dfa), self.vocab, state - first, nodes
                    )
            else:
                hit = _run_walk(self.a, self.vocab, state, nodes)
            self._walks[key] = hit
        return hit

    def add_mask(self, bits: np.ndarray, state: int, stack: int, stacks: "StackArena") -> None:
        """OR into `bits` the tokens allowed from configuration (state, stack)."""
        todo, seen = [(state, stack, _ROOT)], set()
        while todo:
            state, stack, nodes = todo.pop()
            own, pops = self.walk(state, nodes)
            np.bitwise_or(bits, own, out=bits)
            if stack == 0 or not len(pops):
                continue  # returning from the outermost rule ends the text: nothing may follow
            r, parent = stacks.ret[stack], stacks.parent[stack]
            if (r, parent, pops.tobytes()) not in seen:
                seen.add((r, parent, pops.tobytes()))
                todo.append((r, parent, pops))


class StackArena:
    """Hash-consed parser stacks: id 0 is the empty stack; (parent id, return state) -> id."""

    def __init__(self):
        self.parent = [0]
        self.ret = [-1]
        self._ids: dict[tuple[int, int], int] = {}

    def push(self, parent: int, ret: int) -> int:
        key = (parent, ret)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self.parent)
            self.parent.append(parent)
            self.ret.append(ret)
        return sid
