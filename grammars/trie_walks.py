"""Walks of the vocabulary trie through a terminal DFA (numba).

Only terminal states consume bytes (see `automaton`), so every trie walk runs inside one terminal DFA: from a
state, below some trie nodes, it marks the tokens the terminal can consume and records the trie nodes where the
terminal may end (*pop points*).  A walk is a `walk_cache.Walk`: its bitmask (sparse, as words and values, or
dense) and its pop points.  Besides the plain walk (`run_walk`) there are the cheaper ways to the same result
that `token_masks` chooses between: a key's literal spelled down the trie (`spelled`), a whole-vocabulary walk
patched from a neighbouring state's (`patch_walk`) or narrowed from another automaton's (`narrow_walk`), and
several whole-vocabulary walks in one pass (`run_walks_together`).
"""

from __future__ import annotations

import threading
import weakref

import numba
import numpy as np

from .fsm import DFA, PLAIN_WORDS
from .trie_tables import child, set_tokens, sibling_tables, subtree_heights, subtree_tables
from .vocab import Vocabulary
from .walk_cache import Walk


# the trie's root as the nodes a walk starts below, and no pop points; with their keys (walks are cached by the bytes
# of their start nodes)
ROOT = np.zeros(1, np.int32)
NO_POPS = np.zeros(0, np.int32)
ROOT_KEY = ROOT.tobytes()
NO_KEY = NO_POPS.tobytes()


@numba.njit(cache=True, nogil=True)
def walk_nodes(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
               t_tok_ids, t_height, t_below, c_byte, c_node, sib, max_depth, start, nodes, bits, touched,
               pops):  # pragma: no cover - compiled
    """Mark in `bits` (all zero on entry) the tokens strictly below each trie node of `nodes` that a call-free
    DFA can consume from `start`, listing in `touched` each word it makes non-zero; write the nodes where it may
    stop (accept) into `pops`.  Returns (number of pops, number of touched words).

    One scratch row of states serves every node: a walk from the pop points of a string that may end after
    any character starts below tens of thousands of nodes, five trie nodes each on average, where allocating
    the row per node took four fifths of the time.  A subtree whose bytes (`t_below`) all keep to the state's
    main path for as many bytes as it is deep (`DFA.byte_runs`, `t_height`), or whose bytes are all plain text
    (`plain_bytes`) and no deeper than the state's plain run, has all its tokens and no pop point below its root,
    and is not entered (inside a JSON string most of the trie is such subtrees; with `runs` empty, none is).  With
    the sibling tables (`sibling_tables`), a node the state cannot enter is left for the next sibling it can."""
    npops = 0
    ntouched = 0
    if not accept[start] and not has_out[start]:
        return npops, ntouched
    skipping = len(runs) > 0    # empty tables: a plain walk
    siblings = len(c_node) > 0  # empty tables: siblings stepped through one by one
    states = np.empty(max_depth + 1, np.int32)
    states[0] = start
    for t0 in nodes:
        if accept[start]:
            pops[npops] = t0
            npops += 1
        if not has_out[start]:
            continue
        base = t_depth[t0]
        i, stop = t0 + 1, t_end[t0]
        while i < stop:
            lv = t_depth[i] - base
            q = states[lv - 1]
            g = trans[q, t_byte[i]]
            if g < 0:
                if not siblings:
                    i = t_end[i]
                    continue
                # on to the next sibling whose byte the state takes, reading the siblings' bytes side by side
                j, last = sib[i, 0] + 1, sib[i, 1]
                while j < last and trans[q, c_byte[j]] < 0:
                    j += 1
                i = c_node[j] if j < last else sib[i, 2]
                continue
            skip = False
            if skipping and t_end[i] > i + 1:     # a leaf has nothing below it to leave out
                height = t_height[i]
                # the two byte-set tests written out: a helper taking rows of t_below made skipping walks 30% slower
                if runs[g] >= height:
                    skip = True
                    for k in range(4):
                        if t_below[i, k] & ~run_bytes[g, k]:
                            skip = False
                if not skip and plain_runs[g] >= height:
                    skip = True
                    for k in range(4):
                        if t_below[i, k] & ~plain_bytes[k]:
                            skip = False
            for j in range(t_tok_ptr[i], t_tok_ptr[t_end[i] if skip else i + 1]):
                tid = t_tok_ids[j]
                w = tid >> 5
                if bits[w] == 0:
                    touched[ntouched] = w
                    ntouched += 1
                bits[w] |= np.uint32(1) << np.uint32(tid & 31)
            if accept[g]:
                pops[npops] = i
                npops += 1
            states[lv] = g
            i = i + 1 if has_out[g] and not skip else t_end[i]
    return npops, ntouched


@numba.njit(cache=True, nogil=True)
def _walk_whole(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
                t_tok_ids, t_height, t_below, max_depth, start, bits, pops):  # pragma: no cover - compiled
    """`walk_nodes` below the trie's root alone, for a state that allows much of the vocabulary: its bitmask (a copy
    of `bits`, which is left zero) and its pop points, sorted, without trie leaves.  It keeps no list of the words it
    touches and steps through siblings one by one: over most of the trie the list's test on every token and the
    sibling tables cost more than they save (a JSON string's inside, 3.2 against 1.7 ms on cl100k)."""
    npops = 0
    if accept[start]:
        pops[0] = 0
        npops = 1
    skipping = len(runs) > 0    # empty tables: a plain walk
    states = np.empty(max_depth + 1, np.int32)
    states[0] = start
    i, stop = 1, len(t_end) if has_out[start] else 1
    while i < stop:
        lv = t_depth[i]
        g = trans[states[lv - 1], t_byte[i]]
        if g < 0:
            i = t_end[i]
            continue
        end = t_end[i]
        skip = False
        if skipping and end > i + 1:    # walk_nodes' test written out again (an inlined helper: 1.4x as long)
            height = t_height[i]
            if runs[g] >= height:
                skip = True
                for k in range(4):
                    if t_below[i, k] & ~run_bytes[g, k]:
                        skip = False
            if not skip and plain_runs[g] >= height:
                skip = True
                for k in range(4):
                    if t_below[i, k] & ~plain_bytes[k]:
                        skip = False
        for j in range(t_tok_ptr[i], t_tok_ptr[end if skip else i + 1]):
            tid = t_tok_ids[j]
            bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        if accept[g] and end > i + 1:   # (nothing goes on below a leaf)
            pops[npops] = i
            npops += 1
        states[lv] = g
        i = i + 1 if has_out[g] and not skip else end
    out = bits.copy()
    bits[:] = 0
    return out, pops[:npops].copy()


@numba.njit(cache=True, nogil=True)
def row_reach(row, nodes_per_byte):  # pragma: no cover - compiled
    """(how many bytes a DFA row takes, how many trie nodes lie below them): one compiled pass, where numpy's
    boolean index and sum took 3 us on every first walk of a key."""
    out_bytes = 0
    nodes = 0
    for b in range(256):
        if row[b] >= 0:
            out_bytes += 1
            nodes += nodes_per_byte[b]
    return out_bytes, nodes


# a walk over much of the trie (from a wide state) mostly enters the next sibling: there stepping to it directly is
# cheaper than reading the siblings' row (a string's walk near its length bound, 5% faster)
_NO_SIBLINGS = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros((0, 3), np.int32))
_NO_RUNS = (np.zeros(0, np.int32), np.zeros((0, 4), np.uint64), np.zeros(0, np.int32))   # a walk skipping nothing


def skipping_args(dfa: DFA, vocabulary: Vocabulary) -> tuple:
    """The DFA's and the trie's arrays as the skipping walk kernels take them."""
    t = vocabulary.trie
    return (dfa.trans, dfa.accept, dfa.has_out, *dfa.byte_runs, PLAIN_WORDS, t.byte, t.depth, t.end, t.tok_ptr,
            t.tok_ids, *subtree_tables(vocabulary), *_NO_SIBLINGS, vocabulary.max_depth)


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
        _or_words(bits, words, values)


@numba.njit(cache=True, nogil=True)
def _or_words(bits, words, values):  # pragma: no cover - compiled
    """`bits[words] |= values` (words distinct), in one compiled call: numpy's fancy-indexed OR took 1.1-1.8 us for a
    few words, against 0.6, and a fresh parser state's mask ORs two or three walks (BFCL)."""
    for i in range(len(words)):
        bits[words[i]] |= values[i]


class _Scratch(threading.local):
    """Per thread and vocabulary: a zeroed bitmask and room for a walk's touched words and pop points, so a
    walk allocates only its result (room for a whole trie's pop points is 870 KB on cl100k)."""

    def __init__(self) -> None:
        self.buffers: weakref.WeakKeyDictionary[Vocabulary, tuple[np.ndarray, np.ndarray, np.ndarray]] = \
            weakref.WeakKeyDictionary()

    def of(self, vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        hit = self.buffers.get(vocabulary)
        if hit is None:
            words = vocabulary.mask_words
            hit = self.buffers[vocabulary] = (np.zeros(words, np.uint32), np.empty(words, np.int64),
                                              np.empty(len(vocabulary.trie.end), np.int32))
        return hit


SCRATCH = _Scratch()


@numba.njit(cache=True, nogil=True)
def _walk(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, c_byte, c_node, sib, max_depth, start,
          nodes, bits, touched, pops):  # pragma: no cover - compiled
    """`walk_nodes` into the scratch rows (`bits` all zero, left so), leaving out no subtree (empty run tables, never
    read), as a result: (dense, words, values, pops), the words sorted (none when dense: `values` is then the whole
    bitmask) and the pop points a sorted set without trie leaves (nothing goes on below a leaf, so what follows it
    adds no token)."""
    runs = np.zeros(0, np.int32)
    nothing = np.zeros((1, 4), np.uint64)   # one row: the plain bytes are a row of it
    needed = 0
    for t0 in nodes:
        needed += t_end[t0] - t0
    if needed > len(pops):     # nested start nodes: a node may be reached from each
        pops = np.empty(needed, np.int32)
    npops, ntouched = walk_nodes(trans, accept, has_out, runs, nothing, runs, nothing[0], t_byte, t_depth, t_end,
                                 t_tok_ptr, t_tok_ids, runs, nothing, c_byte, c_node, sib, max_depth, start, nodes,
                                 bits, touched, pops)
    disjoint = True     # walks from sorted disjoint subtrees list their pop points in order, once
    for i in range(len(nodes) - 1):
        if t_end[nodes[i]] > nodes[i + 1]:
            disjoint = False
    stops = pops[:npops] if disjoint else np.unique(pops[:npops])
    kept = 0
    for p in stops:
        if t_end[p] > p + 1:
            kept += 1
    found = np.empty(kept, np.int32)
    kept = 0
    for p in stops:
        if t_end[p] > p + 1:
            found[kept] = p
            kept += 1
    words = np.sort(touched[:ntouched])
    dense = ntouched * 4 >= len(bits)
    values = bits.copy() if dense else np.empty(ntouched, np.uint32)
    for i in range(ntouched):
        if not dense:
            values[i] = bits[words[i]]
        bits[words[i]] = 0
    return dense, words, values, found


@numba.njit(cache=True, nogil=True)
def _path_tokens(t_tok_ptr, t_tok_ids, path, count):  # pragma: no cover - compiled
    """The tokens of the trie nodes `path` (`count` of them), sorted."""
    tids = np.empty(count, np.int64)
    c = 0
    for node in path:
        for j in range(t_tok_ptr[node], t_tok_ptr[node + 1]):
            tids[c] = t_tok_ids[j]
            c += 1
    tids.sort()
    return tids


@numba.njit(cache=True, nogil=True)
def spelled(t_byte, t_end, t_tok_ptr, t_tok_ids, nodes, text):  # pragma: no cover - compiled
    """`_walk`'s result for a DFA that reads `text` alone and then accepts: below each of `nodes`, the
    tokens spelling a start of `text`, and the node spelling all of it where tokens go on below it (a pop point);
    (words, values, pops), the words sorted and the pops a sorted set."""
    n = len(text)
    ends = np.empty(len(nodes), np.int32)     # per node, the node below it spelling all of text (-1: none)
    path = np.empty(len(nodes) * n, np.int64)     # the nodes below them spelling a start of text
    steps = count = 0
    for k in range(len(nodes)):
        below = nodes[k]
        for i in range(n):
            below = child(t_byte, t_end, below, text[i])
            if below < 0:
                break
            path[steps] = below
            steps += 1
            count += t_tok_ptr[below + 1] - t_tok_ptr[below]
        ends[k] = below if below >= 0 and t_end[below] > below + 1 else -1
    tids = _path_tokens(t_tok_ptr, t_tok_ids, path[:steps], count)
    distinct = 0
    for i in range(count):
        if i == 0 or tids[i] >> 5 != tids[i - 1] >> 5:
            distinct += 1
    words = np.empty(distinct, np.int64)
    values = np.zeros(distinct, np.uint32)
    w = -1
    for i in range(count):
        if i == 0 or tids[i] >> 5 != tids[i - 1] >> 5:
            w += 1
            words[w] = tids[i] >> 5
        values[w] |= np.uint32(1) << np.uint32(tids[i] & 31)
    ends.sort()
    kept = 0
    for k in range(len(ends)):
        if ends[k] >= 0 and (kept == 0 or ends[k] != ends[kept - 1]):
            ends[kept] = ends[k]
            kept += 1
    return words, values, ends[:kept]


@numba.njit(cache=True, nogil=True)
def spelled_apart(t_byte, t_end, t_tok_ptr, t_tok_ids, first_nodes, nodes, texts, text_from, text_to,
                  states):  # pragma: no cover - compiled
    """`spelled` below `nodes` for many chain states at once (state q reads `texts[text_from[q]:text_to[q]]`), each
    state's tokens kept apart: (words, values, owners, popping), the states' sparse bitmasks one after another (each
    one's words sorted), the index in `states` each entry belongs to, and per state whether it spells all of its
    text at a node where tokens go on (a pop point, which `spelled` returns).  The first answers of a thousand
    object members took one `spelled` each, and the Python around it."""
    n = len(states)
    popping = np.zeros(n, np.bool_)
    longest = 0
    for k in range(n):
        longest = max(longest, text_to[states[k]] - text_from[states[k]])
    path = np.empty(len(nodes) * longest, np.int64)    # one state's path nodes at a time
    words = np.empty(64, np.int64)
    values = np.zeros(64, np.uint32)
    owners = np.empty(64, np.int32)
    m = 0
    for k in range(n):
        q = states[k]
        steps = count = 0
        for node in nodes:
            below = node
            for i in range(text_from[q], text_to[q]):
                below = first_nodes[texts[i]] if below == 0 else child(t_byte, t_end, below, texts[i])
                if below < 0:
                    break
                path[steps] = below
                steps += 1
                count += t_tok_ptr[below + 1] - t_tok_ptr[below]
            if below >= 0 and t_end[below] > below + 1:
                popping[k] = True
        own = _path_tokens(t_tok_ptr, t_tok_ids, path[:steps], count)
        if m + count > len(words):      # (room doubled: a table's first keys below many nodes hold many tokens)
            size = max(2 * len(words), m + count)
            grown_words, grown_values, grown_owners = np.empty(size, np.int64), np.zeros(size, np.uint32), \
                np.empty(size, np.int32)
            grown_words[:m], grown_values[:m], grown_owners[:m] = words[:m], values[:m], owners[:m]
            words, values, owners = grown_words, grown_values, grown_owners
        for i in range(count):
            if i == 0 or own[i] >> 5 != own[i - 1] >> 5:
                words[m] = own[i] >> 5
                owners[m] = k
                m += 1
            values[m - 1] |= np.uint32(1) << np.uint32(own[i] & 31)
    return words[:m], values[:m], owners[:m], popping


@numba.njit(cache=True, nogil=True)
def spell_from_root(t_byte, t_end, t_tok_ptr, t_tok_ids, first_nodes, texts, text_from, text_to, states,
                    bits):  # pragma: no cover - compiled
    """`spelled` from the trie's root for many states at once, each reading one text (`texts[text_from[q]:text_to[q]]`
    for state q; `text_from[q]` < 0: q reads no text of its own), ORing their tokens into the dense bitmask `bits`:
    per state of `states`, the node spelling all of its text where tokens go on below it, -1 where none does, -2
    where it reads no text.  An object of a thousand optional members holds a thousand key states after `{"`: one
    `spelled` each took a millisecond a mask."""
    ends = np.empty(len(states), np.int32)
    for k in range(len(states)):
        q = states[k]
        lo, hi = text_from[q], text_to[q]
        if lo < 0:
            ends[k] = -2
            continue
        below = 0
        for i in range(lo, hi):
            below = first_nodes[texts[i]] if below == 0 else child(t_byte, t_end, below, texts[i])
            if below < 0:
                break
            for j in range(t_tok_ptr[below], t_tok_ptr[below + 1]):
                tid = t_tok_ids[j]
                bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        ends[k] = below if below >= 0 and t_end[below] > below + 1 else -1
    return ends


@numba.njit(cache=True, nogil=True)
def patch_walk(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
                t_tok_ids, t_height, t_below, c_byte, c_node, sib, max_depth, state, ref, max_differ, bits,
                base_pops):  # pragma: no cover - compiled
    """Turn `bits` (dense), the tokens of the whole-vocabulary walk from `ref`, into those of the walk from `state`
    in the same DFA; returns the new walk's pop points (sorted, without trie leaves) given the old one's.

    At a trie node the two walks differ only below the bytes on which their states there move apart: under each
    such byte the node's token and pop point are decided anew and the patch goes on one level down, from the two
    states that byte leads to, as long as they part on at most `max_differ` bytes; where they part on more (or the
    old walk never went there) the subtree is walked afresh.  Inside a JSON string, a prefix of an excluded key
    parts from the plain string state only on the key's next character, so this visits a node or two per level of
    the key instead of the whole subtree of its first byte."""
    touched = np.empty(len(bits), np.int64)
    dropped = [(0, 1)]      # node ranges whose old pop points no longer hold; the root's is decided anew
    added = [0]
    added.pop()
    if accept[state]:
        added.append(0)
    stack = [(0, state, ref)]
    # how many bytes each pair of states parts on, in a small direct-mapped memo: below a prefix of a pattern key
    # the same pair meets again at every node of the subtree (keys matching [a-z]+ part from any string on 26
    # bytes, at ~33k nodes of cl100k: counted afresh at each, 4 ms a mask)
    memo_q, memo_r, memo_n = np.full(64, -1, np.int64), np.full(64, -1, np.int64), np.zeros(64, np.int64)
    while len(stack):
        node, q, r = stack.pop()
        h = (q * 40503 + r) & 63
        if memo_q[h] != q or memo_r[h] != r:
            nd = 0
            for b in range(256):
                nd += trans[q, b] != trans[r, b]
            memo_q[h], memo_r[h], memo_n[h] = q, r, nd
        if memo_n[h] > max_differ:     # walk afresh below the node (its own token and pop point are its caller's)
            lo, hi = node + 1, t_end[node]
            set_tokens(bits, t_tok_ids, t_tok_ptr[lo], t_tok_ptr[hi], False)
            dropped.append((lo, hi))
            found = np.empty(hi - node, np.int32)
            npops, _ = walk_nodes(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth,
                                  t_end, t_tok_ptr, t_tok_ids, t_height, t_below, c_byte, c_node, sib, max_depth, q,
                                  np.full(1, node, np.int32), bits, touched, found)
            for k in range(npops):
                if found[k] != node:
                    added.append(found[k])
            continue
        c, stop = node + 1, t_end[node]
        while c < stop:     # the children under the bytes the two states part on
            nq, nr = trans[q, t_byte[c]], trans[r, t_byte[c]]
            if nq != nr:
                dropped.append((c, c + 1))
                if nq < 0:
                    set_tokens(bits, t_tok_ids, t_tok_ptr[c], t_tok_ptr[t_end[c]], False)
                    dropped.append((c, t_end[c]))
                else:
                    set_tokens(bits, t_tok_ids, t_tok_ptr[c], t_tok_ptr[c + 1], True)
                    if accept[nq]:
                        added.append(c)
                    if nr >= 0:
                        stack.append((c, nq, nr))
                    elif has_out[nq]:   # the old walk never entered below c: nothing of it to undo there
                        found = np.empty(t_end[c] - c, np.int32)
                        npops, _ = walk_nodes(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes,
                                              t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, t_height, t_below, c_byte,
                                              c_node, sib, max_depth, nq, np.full(1, c, np.int32), bits, touched,
                                              found)
                        for m in range(npops):
                            if found[m] != c:
                                added.append(found[m])
            c = t_end[c]
    return _merge_pops(base_pops, dropped, added, t_end)


@numba.njit(cache=True, nogil=True)
def narrow_walk(trans, accept, depths, t_byte, t_end, t_tok_ptr, t_tok_ids, t_height, state, bits,
                 base_pops):  # pragma: no cover - compiled
    """Turn `bits` (dense), the tokens of the whole-vocabulary walk of another automaton in step with this one from
    `state` (`DFA.like`: it reads every byte this one reads), into this one's walk; returns the new walk's pop
    points (sorted, without trie leaves) given the old one's.  Below a trie node no deeper than the two read alike
    from its state (`depths`), the old walk holds; elsewhere the walk goes on: where this one reads no further, the
    tokens below are cleared and the old pop points there dropped, and where it accepts unlike the other (depth
    -1), its own pop point replaces the other's.  The root's token and pop point are the other walk's: `state`
    must read alike with its own (depth 0 or more)."""
    dropped = [(0, 0)]
    dropped.pop()
    added = [0]
    added.pop()
    stack = [(0, state)]
    while len(stack):
        node, q = stack.pop()
        i, stop = node + 1, t_end[node]
        while i < stop:
            g = trans[q, t_byte[i]]
            if g < 0:
                set_tokens(bits, t_tok_ids, t_tok_ptr[i], t_tok_ptr[t_end[i]], False)
                dropped.append((i, t_end[i]))
            elif depths[g] < t_height[i]:
                if depths[g] < 0:
                    dropped.append((i, i + 1))
                    if accept[g]:
                        added.append(i)
                stack.append((i, g))
            i = t_end[i]
    return _merge_pops(base_pops, dropped, added, t_end)


@numba.njit(cache=True, nogil=True)
def _merge_pops(base_pops, dropped, added, t_end):  # pragma: no cover - compiled
    """The sorted pop points `base_pops` outside the node ranges `dropped`, merged with `added`: sorted, each once,
    without trie leaves.  Merged, not sorted whole: numba's quicksort is quadratic on a sorted run with a few
    values after it (147k pop points and the root took 1.5 s)."""
    nd = len(dropped)
    if nd + len(added) > len(t_end) >> 5:
        return _marked_pops(base_pops, dropped, added, t_end)
    los, his = np.empty(nd, np.int64), np.empty(nd, np.int64)
    for k in range(nd):
        los[k], his[k] = dropped[k]
    order = np.argsort(los, kind="mergesort")
    extra = np.empty(len(added), np.int64)
    for k in range(len(added)):
        extra[k] = added[k]
    extra = extra[np.argsort(extra, kind="mergesort")]
    out = np.empty(len(base_pops) + len(extra), np.int32)
    n, i, j, r, last = 0, 0, 0, 0, -1
    hi = -1     # the end of the dropped ranges that start at or before the current base pop point
    while i < len(base_pops) or j < len(extra):
        if j >= len(extra) or (i < len(base_pops) and base_pops[i] <= extra[j]):
            p = base_pops[i]
            i += 1
            while r < nd and los[order[r]] <= p:
                hi = max(hi, his[order[r]])
                r += 1
            if p < hi:
                continue
        else:
            p = extra[j]
            j += 1
        if p != last and t_end[p] > p + 1:
            out[n] = p
            n += 1
        last = p
    return out[:n]


@numba.njit(cache=True, nogil=True)
def _marked_pops(base_pops, dropped, added, t_end):  # pragma: no cover - compiled
    """`_merge_pops` by marks on every trie node, for many changes: sorting 33k dropped nodes and 11k added ones
    (a patch below the 26 first bytes of [a-z]+ keys) took 2.3 ms, three passes over the trie ~0.5 ms."""
    n = len(t_end)
    cover = np.zeros(n + 1, np.int32)
    for k in range(len(dropped)):
        lo, hi = dropped[k]
        cover[lo] += 1
        cover[hi] -= 1
    for k in range(1, n):
        cover[k] += cover[k - 1]
    pop = np.zeros(n, np.bool_)
    for p in base_pops:
        pop[p] = cover[p] == 0
    for p in added:
        pop[p] = True
    out = np.empty(n, np.int32)
    m = 0
    for p in range(n):
        if pop[p] and t_end[p] > p + 1:
            out[m] = p
            m += 1
    return out[:m]


def run_walk(dfa: DFA, vocabulary: Vocabulary, state: int, nodes: np.ndarray, wide: bool = False,
             skipping: bool = False) -> Walk:
    """The walk from `state` below `nodes`.  `wide`: `nodes` is the root and the state's first bytes lead into much
    of the trie (`_walk_whole`; a key is spelled all the same, though a space opens half the trie), and then
    `skipping`: leaving out the subtrees of the state's main paths, which pays only on walks over much of the trie
    (`DFA.byte_runs` takes a pass over each DFA's table, the checks a little on every node)."""
    if dfa.chain is not None:   # an object key, new in nearly every grammar: a path down the trie, not a walk of it
        t = vocabulary.trie
        words, values, found = spelled(t.byte, t.end, t.tok_ptr, t.tok_ids, nodes, dfa.chain[state:])
        if len(words) * 4 < vocabulary.mask_words:
            return words, values, found, found.tobytes()
        dense = np.zeros(vocabulary.mask_words, np.uint32)
        dense[words] = values
        return None, dense, found, found.tobytes()
    if wide:
        t = vocabulary.trie
        bits, _, pops = SCRATCH.of(vocabulary)
        return new_walk(*_walk_whole(dfa.trans, dfa.accept, dfa.has_out, *(dfa.byte_runs if skipping else _NO_RUNS),
                                     PLAIN_WORDS, t.byte, t.depth, t.end, t.tok_ptr, t.tok_ids,
                                     *subtree_tables(vocabulary), vocabulary.max_depth, state, bits, pops))
    t = vocabulary.trie
    dense, words, values, found = _walk(dfa.trans, dfa.accept, dfa.has_out, t.byte, t.depth, t.end, t.tok_ptr,
                                        t.tok_ids, *sibling_tables(vocabulary), vocabulary.max_depth, state, nodes,
                                        *SCRATCH.of(vocabulary))
    return None if dense else words, values, found, found.tobytes()


@numba.njit(cache=True, nogil=True)
def _walk_many(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
               t_tok_ids, t_height, t_below, max_depth, starts, words):  # pragma: no cover - compiled
    """`walk_nodes` from the root for several start states of one table at once (DFAs stacked), visiting each trie
    node once for all of them: per start, its bitmask (a row of the result) and its pop points, sorted, without trie
    leaves (a row of the pops, as many as `npops` says)."""
    k = len(starts)
    n = len(t_end)
    bits = np.zeros((k, words), np.uint32)
    pops = np.empty((k, n), np.int32)
    npops = np.zeros(k, np.int64)
    states = np.full((max_depth + 1, k), -1, np.int32)
    for j in range(k):
        q = starts[j]
        if accept[q] and n > 1:
            pops[j, 0] = 0
            npops[j] = 1
        if has_out[q]:
            states[0, j] = q
    i = 1
    while i < n:
        lv = t_depth[i]
        b = t_byte[i]
        inner = t_end[i] > i + 1
        enter = False
        for j in range(k):
            q = states[lv - 1, j]
            g = trans[q, b] if q >= 0 else -1
            if g < 0:
                states[lv, j] = -1
                continue
            skip = False
            if inner:   # walk_nodes' test, written out again: as a compiled helper both ran 1.5-2.6x slower
                height = t_height[i]
                if runs[g] >= height:
                    skip = True
                    for m in range(4):
                        if t_below[i, m] & ~run_bytes[g, m]:
                            skip = False
                if not skip and plain_runs[g] >= height:
                    skip = True
                    for m in range(4):
                        if t_below[i, m] & ~plain_bytes[m]:
                            skip = False
            for x in range(t_tok_ptr[i], t_tok_ptr[t_end[i] if skip else i + 1]):
                tid = t_tok_ids[x]
                bits[j, tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
            if accept[g] and inner:
                pops[j, npops[j]] = i
                npops[j] += 1
            if has_out[g] and not skip:
                states[lv, j] = g
                enter = True
            else:
                states[lv, j] = -1
        i = i + 1 if enter else t_end[i]
    return bits, pops, npops


def run_walks_together(starts: list[tuple[DFA, int]], vocabulary: Vocabulary) -> list[Walk]:
    """The whole-vocabulary walks, skipping, from each (DFA, state) of `starts`, in one pass (`_walk_many`)."""
    offsets = np.cumsum([0] + [dfa.num_states for dfa, _ in starts])
    dfas = [dfa for dfa, _ in starts]
    trans = np.concatenate([np.where(dfa.trans >= 0, dfa.trans + int(o), -1) for dfa, o in zip(dfas, offsets)])
    runs = [dfa.byte_runs for dfa in dfas]
    t = vocabulary.trie
    bits, pops, npops = _walk_many(
        trans.astype(np.int32), np.concatenate([dfa.accept for dfa in dfas]),
        np.concatenate([dfa.has_out for dfa in dfas]), np.concatenate([r[0] for r in runs]),
        np.concatenate([r[1] for r in runs]), np.concatenate([r[2] for r in runs]), PLAIN_WORDS, t.byte, t.depth,
        t.end, t.tok_ptr, t.tok_ids, *subtree_tables(vocabulary), vocabulary.max_depth,
        np.array([int(o) + state for (_, state), o in zip(starts, offsets)], np.int32), vocabulary.mask_words)
    return [new_walk(bits[j].copy(), pops[j, :npops[j]].copy()) for j in range(len(starts))]


def load_kernels(vocabulary: Vocabulary) -> None:
    """Load `patch_walk`, `narrow_walk`, `_walk_many`, `spelled`, `spell_from_root`, `spelled_apart`, `_or_words`
    and the whole-vocabulary walk, and make the trie's tables, now: only a patched, narrowed or shared whole-vocabulary
    walk (inside a key beside declared ones, a length-bounded string, branches of a `oneOf` of patterns), a key's walk,
    a state of many keys and a large object's members call the first ones, and a mask ORs its sparse walks with
    `_or_words`, so they would otherwise load, from numba's disk cache, inside the first mask that needs one."""
    t = vocabulary.trie
    bits = np.zeros(vocabulary.mask_words, np.uint32)
    nowhere = DFA(np.full((1, 256), -1, np.int32), np.zeros(1, bool))
    spelled(t.byte, t.end, t.tok_ptr, t.tok_ids, ROOT, np.frombuffer(b"a", np.uint8))
    patch_walk(*skipping_args(nowhere, vocabulary), 0, 0, 0, bits, NO_POPS)
    narrow_walk(nowhere.trans, nowhere.accept, np.zeros(1, np.int32), t.byte, t.end, t.tok_ptr, t.tok_ids,
                subtree_heights(vocabulary), 0, bits, NO_POPS)
    run_walk(nowhere, vocabulary, 0, ROOT, wide=True)
    spell_from_root(t.byte, t.end, t.tok_ptr, t.tok_ids, np.full(256, -1, np.int64), np.zeros(0, np.uint8),
                    np.full(1, -1, np.int64), np.full(1, -1, np.int64), np.zeros(1, np.int64), bits)
    spelled_apart(t.byte, t.end, t.tok_ptr, t.tok_ids, np.full(256, -1, np.int64), ROOT, np.zeros(0, np.uint8),
                  np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
    run_walks_together([(nowhere, 0), (nowhere, 0)], vocabulary)
    _or_words(bits, np.zeros(1, np.int64), np.zeros(1, np.uint32))
