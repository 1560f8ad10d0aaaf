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

Above the walks, a mask is searched one stack frame at a time (`TokenMasks._in_frame`): what a configuration
allows before its top frame returns, and the trie nodes where it returns, depend on its state, the tag of that
frame and the nodes only (guards read their own frame), so the answer is kept per grammar and shared by every
parser state holding that frame, whatever lies below it; a frame pushed on it is answered the same way.

Inside a captured terminal (`ir.Capture`) the walk is the terminal's own, less the tokens that would write a
text its object wrote already, or would reach a prefix whose every completion it did; where the text ends
inside a token, the walk goes on with the text added to the object's (`StackArena.pop`), so a token holding
two keys is checked for both.
"""

from __future__ import annotations

import bisect
import threading
import weakref

import numba
import numpy as np

from .automaton import CAPTURE_FRAME, Automaton, ObjectFrame
from .fsm import DFA, PLAIN_WORDS, packed_bytes
from .object_members import CLAIM, MemberSet
from .stacks import Edge, FrameTag, StackArena
from .vocab import Vocabulary
from .walk_cache import SharedWalks, Walk

_SHARED_WALKS_LIMIT = 1 << 15  # per vocabulary, walks of narrow states; most are sparse (a few words of bitmask)
_SHARED_FRAMES_LIMIT = 1 << 11  # per vocabulary, answers of frames inside rules every grammar reads alike (one
# of more than _MAX_FRAME_WALKS walks holds a whole bitmask: 12 KB on cl100k)
# per vocabulary, wide states' walks (a dense bitmask, often tens of thousands of pop points: 12-250 KB on cl100k)
_SHARED_WIDE_BYTES = 64 << 20
# a whole-vocabulary walk over fewer trie nodes is kept per DFA state only, not shared between DFAs by its state's
# signature: the signature costs 20-50 us, as much as walking ~20k nodes (walks of keys and enum values enter a few
# hundred)
_SIGNED_WALK_NODES = 20_000
# a whole-vocabulary walk is patched from a neighbour's when it differs on this few bytes: up to a class of hex
# digits (a key pattern of 32 hex digits beside any key: each position of it walked the trie afresh, 6 ms a mask)
_MAX_PATCHED_BYTES = 32
_MAX_PATCH_DEPTH = 4  # ...through at most this many neighbours (prefixes of an excluded key)
_PATCHED_MIN_BYTES = 128  # ...from a state taking at least this many first bytes (a string's inside)
# a whole-vocabulary walk is narrowed from another automaton's when the two read alike for this many bytes (a
# length-bounded string's short of its bound): closer to the bound, most of the trie lies deeper, and a walk of
# its own skips more of it (cl100k: at 7 bytes, 4.7 ms narrowed against 3.3 walked; at 15, 0.5 against 1.3)
_NARROWED_DEPTH = 12
_FRAME_CACHE_LIMIT = 1 << 12  # per grammar; an entry holds up to a whole bitmask (12 KB on cl100k)
# a wide walk skips main paths (`DFA.byte_runs`: 0.5 us per DFA state, a pass over its table) from the first for a
# DFA of this many states, and from the k-th for one k times larger: skipping saves about 1 ms a walk on cl100k,
# and a pattern under a length bound unrolled over the count took 6 ms for its first walk where 1.5 walked plainly
_SKIPPING_STATES = 2048
_MAX_FRAME_WALKS = 8  # a frame's answer keeps this many walks as they are, more merged into one bitmask
_MAX_FRAME_NESTING = 48  # frames searched one inside another (two Python calls each), well inside the recursion limit
# objects with this many members or more have their members' answers taken together where a member comes next (see
# `_Claims`); below it, the edges one by one cost about as much as the index (Kubernetes' instances: 8 members took
# 1% longer, 16 and 32 the same)
_CLAIMS_TOGETHER = 16
_NO_DEAD_END = 1 << 30     # `_dead_reach` where no text written can leave a captured terminal without completions


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
    the sibling tables (`_sibling_tables`), a node the state cannot enter is left for the next sibling it can."""
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
def _row_reach(row, nodes_per_byte):  # pragma: no cover - compiled
    """(how many bytes a DFA row takes, how many trie nodes lie below them): one compiled pass, where numpy's
    boolean index and sum took 3 us on every first walk of a key."""
    out_bytes = 0
    nodes = 0
    for b in range(256):
        if row[b] >= 0:
            out_bytes += 1
            nodes += nodes_per_byte[b]
    return out_bytes, nodes


@numba.njit(cache=True, nogil=True)
def _or_chosen(words, values, owners, chosen, bits, touched):  # pragma: no cover - compiled
    """The sparse entries (`words`, `values`) whose owner is `chosen` (a flag per owner) ORed together, as sorted
    words and their values; `bits` (all zero, left so) and `touched` are scratch rows.  A sparse walk's values are
    never zero, so a word is listed in `touched` once."""
    n = 0
    for i in range(len(words)):
        if chosen[owners[i]]:
            w = words[i]
            if bits[w] == 0:
                touched[n] = w
                n += 1
            bits[w] |= values[i]
    out = np.sort(touched[:n])
    merged = bits[out]
    bits[out] = 0
    return out, merged


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
    """Load `_patch_walk`, `_narrow_walk`, `_walk_many`, `_or_chosen`, `_spelled`, the captured texts' kernels and
    the trie's subtree tables now: only a patched, narrowed or shared whole-vocabulary walk (inside a key beside
    declared ones, a length-bounded string, branches of a `oneOf` of patterns), a key's walk, a large object and
    captured texts call them, so they would otherwise load, from numba's disk cache, inside the first mask that
    needs one."""
    t = vocabulary.trie
    bits = np.zeros(vocabulary.mask_words, np.uint32)
    nowhere = np.full((1, 256), -1, np.int32)
    no = np.zeros(1, bool)
    data, ends = packed_bytes([b"a"])
    text = np.frombuffer(b"a", np.uint8)    # read-only, as the texts they are called with
    _goes_on(nowhere, no, 0, data, ends)
    _clear_below(bits, t.end, t.tok_ptr, t.tok_ids, _descend_texts(t.byte, t.end, 0, 1, data, ends, no))
    _writes_again(t.byte, t.depth, t.end, _heights(vocabulary), 0, text)
    _reading_nodes(t.byte, t.end, nowhere[0], _ROOT)
    _spelled(t.byte, t.end, t.tok_ptr, t.tok_ids, _ROOT, text)
    nowhere_dfa = DFA(nowhere, no)
    _patch_walk(*_skipping_args(nowhere_dfa, vocabulary), 0, 0, _MAX_PATCHED_BYTES, bits, _NO_POPS)
    _narrow_walk(nowhere, no, np.zeros(1, np.int32), t.byte, t.end, t.tok_ptr, t.tok_ids, _heights(vocabulary), 0,
                 bits, _NO_POPS)
    scratch = _SCRATCH.of(vocabulary)
    _walk_skipping(*_skipping_args(nowhere_dfa, vocabulary), 0, _ROOT, *scratch)
    _run_walks_together([(nowhere_dfa, 0), (nowhere_dfa, 0)], vocabulary)
    _or_chosen(np.zeros(1, np.int64), np.zeros(1, np.uint32), np.zeros(1, np.int32), np.zeros(1, np.uint8),
               *scratch[:2])


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


@numba.njit(cache=True, nogil=True)
def _subtrees(byte, end):  # pragma: no cover - compiled
    """Per trie node, the most bytes a token goes on below it and the bytes below it (four 64-bit words); children
    come after their parent, in order."""
    heights = np.zeros(len(byte), np.int32)
    below = np.zeros((len(byte), 4), np.uint64)
    for i in range(len(byte) - 1, -1, -1):
        j = i + 1
        while j < end[i]:
            heights[i] = max(heights[i], heights[j] + 1)
            below[i, byte[j] >> 6] |= np.uint64(1) << np.uint64(byte[j] & 63)
            for k in range(4):
                below[i, k] |= below[j, k]
            j = end[j]
    return heights, below


_FIRST_BYTE_NODES: "weakref.WeakKeyDictionary[Vocabulary, np.ndarray]" = weakref.WeakKeyDictionary()


def _first_byte_nodes(vocabulary: Vocabulary) -> np.ndarray:
    """Per first byte, how many trie nodes lie below it (its subtree)."""
    hit = _FIRST_BYTE_NODES.get(vocabulary)
    if hit is None:
        children = _root_children(vocabulary)
        ends = vocabulary.trie.end[np.maximum(children, 0)]
        hit = _FIRST_BYTE_NODES[vocabulary] = np.where(children >= 0, ends - children, 0)
    return hit


_SUBTREES: "weakref.WeakKeyDictionary[Vocabulary, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def _subtree_tables(vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """(heights, bytes below) per trie node (see `_subtrees`; 7 MB for cl100k)."""
    hit = _SUBTREES.get(vocabulary)
    if hit is None:
        hit = _SUBTREES[vocabulary] = _subtrees(vocabulary.trie.byte, vocabulary.trie.end)
    return hit


@numba.njit(cache=True, nogil=True)
def _siblings(end):  # pragma: no cover - compiled
    """The trie's children side by side: per parent in order, its children's nodes (`c_node`); per node, where it
    stands among them, where they end, and where its parent's subtree ends (`sib`, three columns)."""
    n = len(end)
    first = np.zeros(n + 1, np.int64)    # where each node's children start in `c_node`
    for p in range(n):
        i = p + 1
        while i < end[p]:
            first[p + 1] += 1
            i = end[i]
    for p in range(n):
        first[p + 1] += first[p]
    c_node = np.empty(max(n - 1, 0), np.int32)
    sib = np.zeros((n, 3), np.int32)
    for p in range(n):
        k = first[p]
        i = p + 1
        while i < end[p]:
            c_node[k] = i
            sib[i, 0], sib[i, 1], sib[i, 2] = k, first[p + 1], end[p]
            k += 1
            i = end[i]
    return c_node, sib


# a walk over much of the trie (from a wide state) mostly enters the next sibling: there stepping to it directly is
# cheaper than reading the siblings' row (a string's walk near its length bound, 5% faster)
_NO_SIBLINGS = (np.zeros(0, np.uint8), np.zeros(0, np.int32), np.zeros((0, 3), np.int32))
_SIBLINGS: "weakref.WeakKeyDictionary[Vocabulary, tuple[np.ndarray, np.ndarray, np.ndarray]]" = \
    weakref.WeakKeyDictionary()


def _sibling_tables(vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(children's bytes side by side, their nodes, per node its place among them; see `_siblings`): a walk from a
    state that takes few bytes skips the siblings it cannot enter reading their bytes from one short row, where
    stepping from sibling to sibling across the trie met a cache miss each (a key's walk from the root, 3.0 ->
    2.1 us; 4 MB for cl100k)."""
    hit = _SIBLINGS.get(vocabulary)
    if hit is None:
        c_node, sib = _siblings(vocabulary.trie.end)
        hit = _SIBLINGS[vocabulary] = (vocabulary.trie.byte[c_node], c_node, sib)
    return hit


def _heights(vocabulary: Vocabulary) -> np.ndarray:
    return _subtree_tables(vocabulary)[0]


def _skipping_args(dfa: DFA, vocabulary: Vocabulary) -> tuple:
    """The DFA's and the trie's arrays as the skipping walk kernels take them."""
    t = vocabulary.trie
    return (dfa.trans, dfa.accept, dfa.has_out, *dfa.byte_runs, PLAIN_WORDS, t.byte, t.depth, t.end, t.tok_ptr,
            t.tok_ids, *_subtree_tables(vocabulary), *_NO_SIBLINGS, vocabulary.max_depth)


# What a configuration allows before its top frame returns: its walks, and the trie nodes where the frame returns
# (an array and its bytes, per distinct set)
FrameAnswer = tuple[tuple[Walk, ...], tuple[tuple[np.ndarray, bytes], ...]]


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
_SHARED_WALKS: "weakref.WeakKeyDictionary[Vocabulary, SharedWalks]" = weakref.WeakKeyDictionary()
# per vocabulary: ((rule key, state in the rule), frame tag, trie nodes) -> FrameAnswer, shared by every grammar
# holding the rule (`Automaton.portable`), in a cache of walks' kind (its narrow tier: bounded by count)
_SHARED_FRAMES: "weakref.WeakKeyDictionary[Vocabulary, SharedWalks]" = weakref.WeakKeyDictionary()
_ROOT = np.zeros(1, np.int32)
_NO_POPS = np.zeros(0, np.int32)
_ROOT_KEY = _ROOT.tobytes()
_NO_KEY = _NO_POPS.tobytes()


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


_SCRATCH = _Scratch()


@numba.njit(cache=True, nogil=True)
def _walk(trans, accept, has_out, t_byte, t_depth, t_end, t_tok_ptr, t_tok_ids, c_byte, c_node, sib, max_depth, start,
          nodes, bits, touched, pops):  # pragma: no cover - compiled
    """`_walk_skipping` with no runs at all (empty tables, never read): no subtree is left out (most walks are small:
    four arrays fewer to pass from Python)."""
    runs = np.zeros(0, np.int32)
    nothing = np.zeros((1, 4), np.uint64)   # one row: the plain bytes are a row of it
    return _walk_skipping(trans, accept, has_out, runs, nothing, runs, nothing[0], t_byte, t_depth, t_end, t_tok_ptr,
                          t_tok_ids, runs, nothing, c_byte, c_node, sib, max_depth, start, nodes, bits, touched,
                          pops)


@numba.njit(cache=True, nogil=True)
def _walk_skipping(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
                   t_tok_ids, t_height, t_below, c_byte, c_node, sib, max_depth, start, nodes, bits, touched,
                   pops):  # pragma: no cover - compiled
    """`walk_nodes` into the scratch rows (`bits` all zero, left so), as a result: (dense, words, values, pops),
    the words sorted (none when dense: `values` is then the whole bitmask) and the pop points a sorted set
    without trie leaves (nothing goes on below a leaf, so what follows it adds no token)."""
    needed = 0
    for t0 in nodes:
        needed += t_end[t0] - t0
    if needed > len(pops):     # nested start nodes: a node may be reached from each
        pops = np.empty(needed, np.int32)
    npops, ntouched = walk_nodes(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth,
                                 t_end, t_tok_ptr, t_tok_ids, t_height, t_below, c_byte, c_node, sib, max_depth, start,
                                 nodes, bits, touched, pops)
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
def _child(t_byte, t_end, node, byte):  # pragma: no cover - compiled
    """The trie node below `node` by `byte`, -1 where no token goes on with it."""
    i, stop = node + 1, t_end[node]
    while i < stop:
        if t_byte[i] == byte:
            return i
        i = t_end[i]
    return -1


@numba.njit(cache=True, nogil=True)
def _spelled(t_byte, t_end, t_tok_ptr, t_tok_ids, nodes, text):  # pragma: no cover - compiled
    """`_walk_skipping`'s result for a DFA that reads `text` alone and then accepts: below each of `nodes`, the
    tokens spelling a start of `text`, and the node spelling all of it where tokens go on below it (a pop point);
    (words, values, pops), the words sorted and the pops a sorted set."""
    n = len(text)
    ends = np.empty(len(nodes), np.int32)     # per node, the node below it spelling all of text (-1: none)
    path = np.empty(len(nodes) * n, np.int64)     # the nodes below them spelling a start of text
    steps = count = 0
    for k in range(len(nodes)):
        below = nodes[k]
        for i in range(n):
            below = _child(t_byte, t_end, below, text[i])
            if below < 0:
                break
            path[steps] = below
            steps += 1
            count += t_tok_ptr[below + 1] - t_tok_ptr[below]
        ends[k] = below if below >= 0 and t_end[below] > below + 1 else -1
    tids = np.empty(count, np.int64)
    count = 0
    for node in path[:steps]:
        for j in range(t_tok_ptr[node], t_tok_ptr[node + 1]):
            tids[count] = t_tok_ids[j]
            count += 1
    tids.sort()
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
def _writes_again(t_byte, t_depth, t_end, t_height, node, text):  # pragma: no cover - compiled
    """Whether some token below trie `node` holds `text` after the node: a search of the subtree in preorder, each
    node's match of `text` so far going on from its parent's (kept per depth below the node, `t_height[node]` at
    most)."""
    n = len(text)
    if n == 0:
        return True
    fail = np.zeros(n, np.int64)    # per prefix of `text`, its longest proper border
    k = 0
    for i in range(1, n):
        while k and text[i] != text[k]:
            k = fail[k - 1]
        if text[i] == text[k]:
            k += 1
        fail[i] = k
    base = t_depth[node]
    matched = np.zeros(t_height[node] + 1, np.int64)
    for i in range(node + 1, t_end[node]):
        d = t_depth[i] - base
        k = matched[d - 1]
        c = t_byte[i]
        while k and c != text[k]:
            k = fail[k - 1]
        if c == text[k]:
            k += 1
        if k == n:
            return True
        matched[d] = k
    return False


@numba.njit(cache=True, nogil=True)
def _reading_nodes(t_byte, t_end, row, nodes):  # pragma: no cover - compiled
    """The trie `nodes` with a child on a byte that DFA row `row` reads."""
    keep = np.zeros(len(nodes), np.bool_)
    for k in range(len(nodes)):
        i, stop = nodes[k] + 1, t_end[nodes[k]]
        while i < stop:
            if row[t_byte[i]] >= 0:
                keep[k] = True
                break
            i = t_end[i]
    return nodes[keep]


@numba.njit(cache=True, nogil=True)
def _goes_on(trans, has_out, state, data, ends):  # pragma: no cover - compiled
    """Per text data[ends[k]:ends[k + 1]], whether a call-free DFA goes on from `state` after reading it (False
    where it leaves the automaton)."""
    out = np.zeros(len(ends) - 1, np.bool_)
    for k in range(len(out)):
        q = state
        for i in range(ends[k], ends[k + 1]):
            q = trans[q, data[i]]
            if q < 0:
                break
        out[k] = q >= 0 and has_out[q]
    return out


@numba.njit(cache=True, nogil=True)
def _descend_texts(t_byte, t_end, node, height, data, ends, chosen):  # pragma: no cover - compiled
    """Per chosen text data[ends[k]:ends[k + 1]], the trie node it leads to below `node`; -1 where no token goes on
    with it, where it is longer than `height` bytes, and for a text not chosen."""
    out = np.full(len(ends) - 1, -1, np.int32)
    for k in range(len(out)):
        if not chosen[k] or ends[k + 1] - ends[k] > height:
            continue
        below = node
        for i in range(ends[k], ends[k + 1]):
            below = _child(t_byte, t_end, below, data[i])
            if below < 0:
                break
        out[k] = below
    return out


@numba.njit(cache=True, nogil=True)
def _clear_below(bits, t_end, t_tok_ptr, t_tok_ids, nodes):  # pragma: no cover - compiled
    """Clear the bits of the tokens at and below each trie node of `nodes` (-1: none)."""
    for node in nodes:
        if node >= 0:
            _set_tokens(bits, t_tok_ids, t_tok_ptr[node], t_tok_ptr[t_end[node]], False)


@numba.njit(cache=True, nogil=True)
def _patch_walk(trans, accept, has_out, runs, run_bytes, plain_runs, plain_bytes, t_byte, t_depth, t_end, t_tok_ptr,
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
            _set_tokens(bits, t_tok_ids, t_tok_ptr[lo], t_tok_ptr[hi], False)
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
                    _set_tokens(bits, t_tok_ids, t_tok_ptr[c], t_tok_ptr[t_end[c]], False)
                    dropped.append((c, t_end[c]))
                else:
                    _set_tokens(bits, t_tok_ids, t_tok_ptr[c], t_tok_ptr[c + 1], True)
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
def _narrow_walk(trans, accept, depths, t_byte, t_end, t_tok_ptr, t_tok_ids, t_height, state, bits,
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
                _set_tokens(bits, t_tok_ids, t_tok_ptr[i], t_tok_ptr[t_end[i]], False)
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


def _run_walk(dfa: DFA, vocabulary: Vocabulary, state: int, nodes: np.ndarray, skipping: bool = False) -> Walk:
    """The walk from `state` below `nodes`; `skipping`: leaving out the subtrees of the state's main paths, which
    pays only on walks over much of the trie (`DFA.byte_runs` takes a pass over each DFA's table, the checks a
    little on every node)."""
    if dfa.chain is not None:   # an object key, new in nearly every grammar: a path down the trie, not a walk of it
        t = vocabulary.trie
        words, values, found = _spelled(t.byte, t.end, t.tok_ptr, t.tok_ids, nodes, dfa.chain[state:])
        if len(words) * 4 < vocabulary.mask_words:
            return words, values, found, found.tobytes()
        dense = np.zeros(vocabulary.mask_words, np.uint32)
        dense[words] = values
        return None, dense, found, found.tobytes()
    bits, touched, pops = _SCRATCH.of(vocabulary)
    if skipping:
        dense, words, values, found = _walk_skipping(*_skipping_args(dfa, vocabulary), state, nodes, bits, touched,
                                                     pops)
    else:
        t = vocabulary.trie
        dense, words, values, found = _walk(dfa.trans, dfa.accept, dfa.has_out, t.byte, t.depth, t.end, t.tok_ptr,
                                            t.tok_ids, *_sibling_tables(vocabulary), vocabulary.max_depth, state,
                                            nodes, bits, touched, pops)
    return None if dense else words, values, found, found.tobytes()


def _narrowable(dfa: DFA, state: int) -> bool:
    """Whether the whole-vocabulary walk of wide `state` is narrowed from another automaton's
    (`_narrowed_root_walk`)."""
    return dfa.like is not None and dfa.like_depths[state] >= _NARROWED_DEPTH


def _patch_reference(dfa: DFA, state: int, depth: int) -> int | None:
    """The state whose whole-vocabulary walk that of `state` is patched from (`_patched_root_walk`): its main
    successor, where the two part on at most `_MAX_PATCHED_BYTES` bytes; None where no walk is patched."""
    row = dfa.trans[state]
    targets = row[row >= 0]
    if depth >= _MAX_PATCH_DEPTH or len(targets) < _PATCHED_MIN_BYTES:
        return None
    ref = int(np.bincount(targets).argmax())
    if ref == state or np.count_nonzero(row != dfa.trans[ref]) > _MAX_PATCHED_BYTES:
        return None
    return ref


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


def _run_walks_together(starts: list[tuple[DFA, int]], vocabulary: Vocabulary) -> list[Walk]:
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
        t.end, t.tok_ptr, t.tok_ids, *_subtree_tables(vocabulary), vocabulary.max_depth,
        np.array([int(o) + state for (_, state), o in zip(starts, offsets)], np.int32), vocabulary.mask_words)
    return [new_walk(bits[j].copy(), pops[j, :npops[j]].copy()) for j in range(len(starts))]


ClaimEdges = tuple[MemberSet, tuple[int, ...], int, tuple[int, ...]]


def _claim_edges(automaton: Automaton, g: int, frame: ObjectFrame) -> ClaimEdges:
    """At `g`, a state of `frame` where a member comes next: its members, per member the claim edge that pushes the
    member's frame (-1: none), the bits of those members, and the other edges."""
    lo, hi = int(automaton.call_ptr[g]), int(automaton.call_ptr[g + 1])
    claims, others, edged = [-1] * frame.members.size, [], 0
    for c, guard in enumerate(automaton.call_guard[lo:hi].tolist(), lo):
        kind, member = automaton.guards[guard][1:] if guard >= 0 else (-1, -1)
        if kind == CLAIM and (automaton.framed[automaton.call_callee[c]] or not automaton.tail[automaton.call_ret[c]]):
            claims[member] = c
            edged |= 1 << member
        else:
            others.append(c)
    return frame.members, tuple(claims), edged, tuple(others)


class _Claims:
    """Where a member of a large object comes next (after `{` or a separator), below some trie nodes: what each
    member's frame allows, the same whatever the object wrote before it, and the sparse walks of all of them in one
    index, so that a new tag takes its claimable members' tokens in one compiled pass instead of a hundred guarded
    edges one by one (after each member of a Snowplow event, 0.3-0.9 ms).  Members join as they are first claimable.
    Slots and few containers: a grammar keeps a table per such state and trie nodes (up to ~100 replaying a
    subset's instances), and the garbage collector walks each container it holds."""

    __slots__ = ("known", "returns", "dense", "_sparse", "_index")

    def __init__(self) -> None:
        self.known = 0          # bits of the members whose answers are in
        self.returns: dict[int, tuple[tuple[np.ndarray, bytes], ...]] = {}   # of members whose frame can return
        self.dense: list[tuple[int, Walk]] = []     # (member, walk) of the walks kept whole
        self._sparse: list[tuple[np.ndarray, np.ndarray, int]] = []
        self._index: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None   # of the first n sparse

    def add(self, member: int, answer: FrameAnswer) -> None:
        if answer[1]:
            self.returns[member] = answer[1]
        for walk in answer[0]:
            if walk[0] is None:
                self.dense.append((member, walk))
            elif len(walk[0]):
                self._sparse.append((walk[0], walk[1], member))
        self.known |= 1 << member    # last: a member counts as known once all of it is in

    def index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sparse walks' words, values and owners (member indices), concatenated."""
        n, kept = len(self._sparse), self._index
        if kept is None or kept[0] != n:
            parts = self._sparse[:n] or [(np.zeros(0, np.int64), np.zeros(0, np.uint32), 0)]
            kept = self._index = (n, (
                np.concatenate([words for words, _, _ in parts]), np.concatenate([values for _, values, _ in parts]),
                np.concatenate([np.full(len(words), member, np.int32) for words, _, member in parts])))
        return kept[1]


class TokenMasks:
    """Token masks of one automaton over one vocabulary, from cached terminal walks."""

    def __init__(self, automaton: Automaton, vocabulary: Vocabulary):
        self.a = automaton
        self.vocabulary = vocabulary
        self._walks: dict[tuple[int, bytes], Walk] = {}
        # per terminal state met by `prefetch`: whether its whole-vocabulary walk is wide and its own (not narrowed
        # from another automaton's), which its DFA alone decides: asked of every configuration of every new parser
        # state (a key's start, after each member of an object), and found by a compiled pass over its row
        self._wide_own: dict[int, bool] = {}
        # a frame's answer, its walks and its returns kept apart: cached as one nested pair it would stay tracked by
        # the garbage collector into its old generation (see CompiledGrammar's closures)
        self._frame_walks: dict[tuple[int, FrameTag, bytes], tuple[Walk, ...]] = {}
        self._frame_returns: dict[tuple[int, FrameTag, bytes], tuple[tuple[np.ndarray, bytes], ...]] = {}
        self._first_byte_nodes = _first_byte_nodes(vocabulary)
        self._shared = _SHARED_WALKS.get(vocabulary)
        if self._shared is None:
            self._shared = _SHARED_WALKS.setdefault(vocabulary, SharedWalks(_SHARED_WALKS_LIMIT, _SHARED_WIDE_BYTES))
        # read per configuration by the searches here and by the parser's closures, and indexing numpy from Python
        # costs ~0.1 us a time: the structural states' call edges as ranges (made once: a closure took two lookups
        # and a range per state), whether each state accepts and reads bytes as bytes (0 or 1)
        ptr = automaton.call_ptr[:automaton.first_terminal + 1].tolist()
        self.call_edges = tuple(map(range, ptr[:-1], ptr[1:]))
        self.accepting, self.reading = automaton.accept.tobytes(), automaton.has_out.tobytes()
        # a token that ends a captured text goes on with the text added to its object's only where enough of it is
        # left to write a separator and that text again, or the start of another that it may make a dead end (see
        # `_dead_reach`)
        captured = [automaton.terminal_of(int(first))[1] for first in np.flatnonzero(automaton.framed == CAPTURE_FRAME)]
        # captured terminals whose strings can run out from some state on (then a prefix may be a dead end)
        self._runs_out = {dfa.uid for dfa in captured if (dfa.finite & dfa.has_out).any()}
        self._dead_depths = [_dead_depths(dfa) for dfa in captured if dfa.uid in self._runs_out]
        self._dead_reaches: dict[int, int] = {}   # by the number of texts the stack's objects hold
        # the states of objects with `_CLAIMS_TOGETHER` members or more where a member comes next, and their edges
        # once searched or read by the parser (see `claim_edges`)
        self.large_objects = {g: frame for frame in automaton.frames if frame.members.size >= _CLAIMS_TOGETHER
                              for g in (frame.first, frame.next)}
        self._claim_edges: dict[int, ClaimEdges] = {}
        self._claims: dict[tuple[int, bytes], _Claims] = {}
        # the structural states of rules that read the same in every grammar holding them, as (rule key, state in
        # the rule): answers inside them are shared between grammars (`_in_frame`)
        self._portable = {g: (key, g - first) for first, end, key in automaton.portable for g in range(first, end)}
        self._shared_frames = _SHARED_FRAMES.get(vocabulary)
        if self._shared_frames is None:
            self._shared_frames = _SHARED_FRAMES.setdefault(vocabulary, SharedWalks(_SHARED_FRAMES_LIMIT, 0))

    def walk(self, state: int, nodes: np.ndarray, nodes_key: bytes) -> Walk:
        """Tokens below the trie `nodes` consumable from terminal state `state`, and pop points (cached)."""
        key = (state, nodes_key)
        hit = self._walks.get(key)
        if hit is None:
            first, dfa = self.a.terminal_of(state)
            hit = self._walks[key] = self._shared_walk(dfa, state - first, nodes, nodes_key)
        return hit

    def claim_edges(self, g: int) -> ClaimEdges | None:
        """Where `g` is a state of a large object where a member comes next, its claim edges (see `_claim_edges`);
        None for any other state."""
        frame = self.large_objects.get(g)
        if frame is None:
            return None
        claims = self._claim_edges.get(g)
        if claims is None:
            claims = self._claim_edges[g] = _claim_edges(self.a, g, frame)
        return claims

    def _shared_walk(self, dfa: DFA, state: int, nodes: np.ndarray, nodes_key: bytes, depth: int = 0) -> Walk:
        # kept per DFA state, and walks of the whole vocabulary from a wide state also by the state's signature:
        # they are the expensive ones, shared between all states with the same future (the inside of every JSON
        # string, whatever its declared keys)
        key = (dfa.uid, state, nodes_key)
        hit = self._shared.get(key)
        if hit is not None:
            return hit
        root = nodes_key == _ROOT_KEY
        out_bytes, wide = self._first_bytes(dfa, state) if root else (0, False)
        if wide and _narrowable(dfa, state):
            hit = self._narrowed_root_walk(dfa, state)
            self._shared.put(key, hit, wide)
            return hit
        signature = dfa.signature(state) if wide else None
        signed = (signature, nodes_key) if signature is not None else None
        hit = self._shared.get(signed) if signed is not None else None
        if hit is None:
            # counted already: the patch's own check would index the row again (2 us on every key's first walk)
            hit = self._patched_root_walk(dfa, state, depth) if out_bytes >= _PATCHED_MIN_BYTES else None
            if hit is None:
                hit = _run_walk(dfa, self.vocabulary, state, nodes, skipping=wide and self._skips(dfa))
            if signed is not None:
                self._shared.put(signed, hit, wide)
        # a dense walk below other nodes (a long string's first chunk after every token opening it) costs as much as
        # a wide state's: among the narrow walks, a few hundred schemas pushed it out and each walked it again (2-3
        # ms a mask on Github_hard)
        self._shared.put(key, hit, wide or hit[0] is None)
        return hit

    def _skips(self, dfa: DFA) -> bool:
        """Whether a wide walk of `dfa` skips main paths: it pays for the byte runs once the walks without them
        have cost about as much (see `_SKIPPING_STATES`)."""
        if dfa.has_byte_runs or dfa.num_states <= _SKIPPING_STATES:
            return True
        dfa.plain_walks += 1    # (on the DFA: grammars share it)
        return dfa.num_states <= dfa.plain_walks * _SKIPPING_STATES

    def prefetch(self, configurations: tuple[tuple[int, int], ...]) -> None:
        """Take together the whole-vocabulary walks from wide states that `configurations` (a parser state's, ready to
        read) need and no cache holds or derives (for a patched walk, its reference's), where there are two or more:
        one pass over the trie serves them all.  Each branch of a `oneOf` of patterns walked the trie by itself, 1-2
        ms each (five of them, 9 ms in one mask)."""
        if len(configurations) < 2:     # the common case, and nothing to take together
            return
        batch: dict[tuple, tuple[DFA, int, tuple | None]] = {}
        wide_own = self._wide_own
        for g, _ in configurations:
            if wide_own.get(g) is False or (g, _ROOT_KEY) in self._walks:
                continue
            if g < self.a.first_terminal:    # a large object's state: its members' keys are not wide
                wide_own[g] = False
                continue
            first, dfa = self.a.terminal_of(g)
            if g not in wide_own:
                wide_own[g] = self._first_bytes(dfa, g - first)[1] and not _narrowable(dfa, g - first)
                if not wide_own[g]:
                    continue
            found = self._walk_to_run(dfa, g - first)
            if found is not None and found[0] not in batch:
                batch[found[0]] = (dfa, *found[1:])
        if len(batch) < 2:
            return
        walks = _run_walks_together([(dfa, state) for dfa, state, _ in batch.values()], self.vocabulary)
        for (key, (_, _, signed)), walk in zip(batch.items(), walks):
            if signed is not None:
                self._shared.put(signed, walk, True)
            self._shared.put(key, walk, True)

    def _walk_to_run(self, dfa: DFA, state: int, depth: int = 0) -> tuple[tuple, int, tuple | None] | None:
        """The wide walk on the trie that the whole-vocabulary walk from `state` would take where no cache holds it
        (its own, or its patch reference's), as (key, state, signature key); None where it is known, narrowed, or
        not wide (see `_shared_walk`)."""
        key = (dfa.uid, state, _ROOT_KEY)
        if self._shared.get(key) is not None:
            return None
        out_bytes, wide = self._first_bytes(dfa, state)
        if not wide or _narrowable(dfa, state):
            return None
        signature = dfa.signature(state)
        signed = (signature, _ROOT_KEY) if signature is not None else None
        if signed is not None and self._shared.get(signed) is not None:
            return None
        ref = _patch_reference(dfa, state, depth) if out_bytes >= _PATCHED_MIN_BYTES else None
        return (key, state, signed) if ref is None else self._walk_to_run(dfa, ref, depth + 1)

    def _first_bytes(self, dfa: DFA, state: int) -> tuple[int, bool]:
        """How many first bytes `state` takes, and whether they lead into at least `_SIGNED_WALK_NODES` trie nodes (a
        bound on what its whole-vocabulary walk visits; it is wide): only such a walk is worth a signature, which
        costs as much as walking ~20k nodes."""
        out_bytes, nodes = _row_reach(dfa.trans[state], self._first_byte_nodes)
        return out_bytes, nodes >= _SIGNED_WALK_NODES

    def _patched_root_walk(self, dfa: DFA, state: int, depth: int) -> Walk | None:
        """The whole-vocabulary walk of a wide state that moves like its main successor on all
        but a few bytes (inside a string, a prefix of an excluded key): the successor's walk, patched
        under those bytes (`_patch_walk`).  None where that does not apply."""
        ref = _patch_reference(dfa, state, depth)
        if ref is None:
            return None
        base = self._shared_walk(dfa, ref, _ROOT, _ROOT_KEY, depth + 1)
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        add_walk(base, bits)
        pops = _patch_walk(*_skipping_args(dfa, self.vocabulary), state, ref, _MAX_PATCHED_BYTES, bits, base[2])
        return new_walk(bits, pops)

    def _narrowed_root_walk(self, dfa: DFA, state: int) -> Walk:
        """The whole-vocabulary walk of a state that reads like a state of another automaton for a few bytes (a
        length-bounded string, any string's): that state's walk, narrowed where the two part (`_narrow_walk`).
        Each position of a string with maxLength 128 walked the trie afresh, 2-5 ms a mask."""
        base = self._shared_walk(dfa.like, int(dfa.like_states[state]), _ROOT, _ROOT_KEY)
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        add_walk(base, bits)
        t = self.vocabulary.trie
        pops = _narrow_walk(dfa.trans, dfa.accept, dfa.like_depths, t.byte, t.end, t.tok_ptr, t.tok_ids,
                            _heights(self.vocabulary), state, bits, base[2])
        return new_walk(bits, pops)

    def add_mask(self, bits: np.ndarray, configurations: tuple[tuple[int, int], ...], stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed from the configurations (state, stack) of a parser state."""
        if stacks.captures:     # a captured text reads the frames below its own: no frame stands alone
            self._search(bits, [(g, s, _ROOT, _ROOT_KEY) for g, s in configurations], stacks)
            return
        # configurations of one state often share the frames below their own (parallel parses of overlapping
        # branches): each is searched once
        todo = [(g, s, _ROOT, _ROOT_KEY) for g, s in configurations]
        seen = {(g, s, _ROOT_KEY) for g, s in configurations}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            walks, returns = self._in_frame(g, s, nodes, nodes_key, stacks)
            for walk in walks:
                add_walk(walk, bits)
            if s:
                up, below = stacks.ret[s], stacks.parent[s]
                for pops, pops_key in returns:
                    if (up, below, pops_key) not in seen:
                        seen.add((up, below, pops_key))
                        todo.append((up, below, pops, pops_key))

    def _in_frame(self, g: int, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                  depth: int = 0) -> FrameAnswer:
        """From configuration (g, s) below trie `nodes`: the tokens allowed before the top frame of `s` returns,
        and the trie nodes where it does (cached).  Guards read only the tag of their own frame, so this
        depends on g, that tag and the nodes, not on the frames below: a new parser state deep in a document
        shares the answers of the frames it has in common with earlier ones."""
        if g >= self.a.first_terminal:
            return self._terminal_answer(g, nodes, nodes_key)
        key = (g, stacks.tag[s], nodes_key)
        walks = self._frame_walks.get(key)
        if walks is not None:
            return walks, self._frame_returns[key]
        if len(self._frame_walks) >= _FRAME_CACHE_LIMIT:
            self._frame_walks.clear()
            self._frame_returns.clear()
        # inside a rule every grammar reads alike (any JSON value), the answer is another grammar's: the first mask
        # inside each schema's `{}` searched a dozen frames and walked some forty terminals (240 us on BFCL_java).
        # The top frame may be a caller's that called the rule last (not pushed): it returns where the rule does.
        place = self._portable.get(g)
        shared = None if place is None else (place, key[1], nodes_key)
        answer = None if shared is None else self._shared_frames.get(shared)
        if answer is None:
            answer = self._frame_search(g, s, nodes, nodes_key, stacks, depth)
            if shared is not None:
                self._shared_frames.put(shared, answer, False)
        walks, returns = answer
        self._frame_walks[key], self._frame_returns[key] = walks, returns
        return walks, returns

    def _in_pushed(self, s: int, edge: Edge, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                   depth: int) -> FrameAnswer:
        """`_in_frame` for the frame that call `edge` pushes from stack `s`, made only where its answer is not known
        yet: a terminal's reads no stack, and a rule's is kept by the pushed frame's tag."""
        callee = edge[0]
        if callee >= self.a.first_terminal:
            return self._terminal_answer(callee, nodes, nodes_key)
        key = (callee, edge[4], nodes_key)
        walks = self._frame_walks.get(key)
        if walks is not None:
            return walks, self._frame_returns[key]
        return self._in_frame(callee, stacks.made(s, edge), nodes, nodes_key, stacks, depth)

    def _terminal_answer(self, g: int, nodes: np.ndarray, nodes_key: bytes) -> FrameAnswer:
        """What terminal state `g` allows below trie `nodes`, and where it returns: its walk."""
        found = self.walk(g, nodes, nodes_key)
        return (found,), (((found[2], found[3]),) if len(found[2]) else ())

    def _frame_search(self, g: int, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                      depth: int) -> FrameAnswer:
        """`_in_frame`, searched.  The frames of the base level are those sharing the parent and return state of
        `s` (a guard that changes the tag makes another frame in its place; hash-consing makes no other); a frame
        pushed on them is answered by `_in_frame` in turn, so a rule called from many places (a value, a
        definition) is searched once per tag and trie nodes.  That never comes back to the frame being searched
        (left recursion is refused), but each level of it is a Python call: past `_MAX_FRAME_NESTING` the
        search goes on inside the pushed frames instead."""
        a, call_edges, parent, ret = self.a, self.call_edges, stacks.parent, stacks.ret
        first_terminal = a.first_terminal
        base = (parent[s], ret[s])
        nested = depth < _MAX_FRAME_NESTING
        walks: dict[int, Walk] = {}
        returns: dict[bytes, np.ndarray] = {}
        todo = [(g, s, nodes, nodes_key)]
        seen = {(g, s, nodes_key)}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            nexts = []
            if g >= first_terminal:
                found = self.walk(g, nodes, nodes_key)
                walks[id(found)] = found
                ends, ends_key = found[2], found[3]
                returning = len(ends) > 0
            else:
                edges = call_edges[g]
                claims = self.claim_edges(g) if nested else None
                if claims is not None:
                    self._claimed(g, claims, s, nodes, nodes_key, stacks, depth, walks, nexts)
                    edges = claims[3]
                for c in edges:
                    edge = stacks.edge(s, c)
                    if edge is None:
                        continue
                    if nested and edge[3]:
                        inner, rets = self._in_pushed(s, edge, nodes, nodes_key, stacks, depth + 1)
                        for walk in inner:
                            walks[id(walk)] = walk
                        if rets:
                            below = stacks.below(s, edge)
                            for ends, ends_key in rets:
                                nexts.append((edge[1], below, ends, ends_key))
                    else:
                        nexts.append((edge[0], stacks.made(s, edge), nodes, nodes_key))
                ends, ends_key = nodes, nodes_key
                returning = bool(self.accepting[g])
            if returning:
                if (parent[s], ret[s]) == base:
                    returns[ends_key] = ends
                else:
                    nexts.append((ret[s], parent[s], ends, ends_key))
            for item in nexts:
                key = (item[0], item[1], item[3])
                if key not in seen:
                    seen.add(key)
                    todo.append(item)
        found = tuple(walks.values())
        if len(found) > _MAX_FRAME_WALKS:
            found = (self._union(found),)
        return found, tuple((pops, key) for key, pops in returns.items())

    def _claimed(self, g: int, claims: ClaimEdges, s: int, nodes: np.ndarray, nodes_key: bytes, stacks: StackArena,
                 depth: int, walks: dict[int, Walk], nexts: list) -> None:
        """`_frame_search`'s claim edges from object state `g` (see `_claim_edges`), taken together (`_Claims`):
        into `walks` what the claimable members allow, into `nexts` where their frames return."""
        members, edges, edged, _ = claims
        chosen = members.claimable(stacks.tag[s]) & edged
        if not chosen:
            return
        table = self._claims.get((g, nodes_key))
        if table is None:
            if len(self._claims) >= _FRAME_CACHE_LIMIT:
                self._claims.clear()
            table = self._claims[(g, nodes_key)] = _Claims()
        missing = chosen & ~table.known
        while missing:
            member = missing.bit_length() - 1
            missing ^= 1 << member
            table.add(member, self._in_pushed(s, stacks.edge(s, edges[member]), nodes, nodes_key, stacks, depth + 1))
        words, values, owners = table.index()
        if len(words):
            flags = np.unpackbits(np.frombuffer(chosen.to_bytes((members.size + 7) // 8, "little"), np.uint8),
                                  bitorder="little")
            merged = (*_or_chosen(words, values, owners, flags, *_SCRATCH.of(self.vocabulary)[:2]), _NO_POPS, _NO_KEY)
            walks[id(merged)] = merged
        for member, walk in table.dense:
            if chosen >> member & 1:
                walks[id(walk)] = walk
        for member, rets in table.returns.items():
            if chosen >> member & 1:
                edge = stacks.edge(s, edges[member])
                below = stacks.below(s, edge)
                for ends, ends_key in rets:
                    nexts.append((edge[1], below, ends, ends_key))

    def _union(self, walks: tuple[Walk, ...]) -> Walk:
        """The tokens of all `walks` as one walk (no pop points)."""
        bits = np.zeros(self.vocabulary.mask_words, np.uint32)
        sparse = []
        for w in walks:
            if w[0] is None:
                np.bitwise_or(bits, w[1], out=bits)
            elif len(w[0]):
                sparse.append(w)
        if sparse:  # at once: the walks of a hundred keys, one fancy-indexed OR each, took half an object's mask
            np.bitwise_or.at(bits, np.concatenate([w[0] for w in sparse]), np.concatenate([w[1] for w in sparse]))
        return new_walk(bits, _NO_POPS)

    def _search(self, bits: np.ndarray, todo: list[tuple[int, int, np.ndarray, bytes]], stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed from configurations (state, stack) below trie nodes."""
        a = self.a
        call_edges = self.call_edges
        seen = {(g, s, key) for g, s, _, key in todo}
        while todo:
            g, s, nodes, nodes_key = todo.pop()
            nexts = []
            if type(stacks.tag[s]) is bytes:
                self._add_captured(bits, g, s, nodes, stacks)
            elif g >= a.first_terminal:
                found = self.walk(g, nodes, nodes_key)
                add_walk(found, bits)
                pops, pops_key = found[2], found[3]
                if s and len(pops):
                    nexts.append((stacks.ret[s], stacks.parent[s], pops, pops_key))
            else:
                # a structural state consumes no bytes: go on into each callee from the same nodes
                nexts = [(*called, nodes, nodes_key) for called in stacks.calls(s, call_edges[g])]
                if self.accepting[g] and s:
                    # returning from the outermost rule ends the text: nothing may follow
                    nexts.append((stacks.ret[s], stacks.parent[s], nodes, nodes_key))
            for item in nexts:
                key = (item[0], item[1], item[3])
                if key not in seen:
                    seen.add(key)
                    todo.append(item)

    def _add_captured(self, bits: np.ndarray, g: int, s: int, nodes: np.ndarray, stacks: StackArena) -> None:
        """OR into `bits` the tokens allowed in a captured terminal, from each trie node on its own (the text
        written since differs per node).  The written texts go to the kernels packed: checked one Python call per
        text and byte, JsonSchemaStore's webhook (41 unique role ids, then a repeat) took up to 11 ms a mask."""
        t, text = self.vocabulary.trie, stacks.tag[s]
        written = [w[len(text):] for w in stacks.written(s) if w.startswith(text)]
        dead_reach = self._dead_reach(stacks, s)
        first, dfa = self.a.terminal_of(g)
        # the written texts, then the starts only such texts complete (where they can run out), packed together
        dead = _dead_ends(dfa, g - first, written) if dfa.uid in self._runs_out else []
        data, ends = packed_bytes(written + dead)
        # a written text the terminal cannot go on from (a string, its quote closed) cuts every token that writes
        # it; one it can (a number: 10 after 1) only cuts the readings that end the text there; a dead start cuts
        goes_on = _goes_on(dfa.trans, dfa.has_out, g - first, data, ends)
        goes_on[len(written):] = False
        cuts = ~goes_on
        heights = _heights(self.vocabulary)
        # where the text may not end here, a node with no child the terminal can read adds nothing (its own token came
        # with the walk that popped there): whitespace before an item pops at 180 nodes, few of which go on with a quote
        if not dfa.accept[g - first]:
            nodes = _reading_nodes(t.byte, t.end, dfa.trans[g - first], nodes)
        for node in nodes.tolist():
            depth, height = int(t.depth[node]), int(heights[node])
            # every token this node adds lies below it, so where no cut does they go straight into `bits`
            cut = _descend_texts(t.byte, t.end, node, height, data, ends, cuts)
            cut = cut[cut >= 0]
            own = np.zeros_like(bits) if len(cut) else bits
            one = np.array([node], np.int32)
            found = self.walk(g, one, one.tobytes())
            add_walk(found, own)
            pops = found[2]
            follow = []
            # a token ending the text at a pop goes on with the text added only where a token below writes the text
            # again (another text written already is cut all the same without it), or may reach a dead end that the
            # text added might make
            tall = []
            for pop in pops[heights[pops] > np.minimum(len(text) - depth + t.depth[pops], dead_reach)].tolist():
                whole = text + self._path(pop)[depth:]
                if heights[pop] > dead_reach or _writes_again(t.byte, t.depth, t.end, heights, pop,
                                                              np.frombuffer(whole, np.uint8)):
                    tall.append((pop, whole))
            short = pops[heights[pops] > 0]
            if tall:
                short = short[~np.isin(short, [pop for pop, _ in tall])]
            if len(short) and goes_on.any():
                short = short[~np.isin(short, _descend_texts(t.byte, t.end, node, height, data, ends, goes_on))]
            if len(short):      # the texts of the object do not matter to what follows
                follow.append((stacks.ret[s], stacks.parent[s], short, short.tobytes()))
            for pop, whole in tall:
                popped = stacks.pop(s, whole)
                if popped is not None:
                    pop_nodes = np.array([pop], np.int32)
                    follow.append((*popped, pop_nodes, pop_nodes.tobytes()))
            if follow:
                self._search(own, follow, stacks)
            if len(cut):
                _clear_below(own, t.end, t.tok_ptr, t.tok_ids, cut)
                np.bitwise_or(bits, own, out=bits)

    def _dead_reach(self, stacks: StackArena, s: int) -> int:
        """The fewest bytes from the start of a captured text to a dead end that the text of stack `s`, once added
        to its object, might make: a state with no more strings than the texts the stack's objects hold and this
        one (a large number where no captured terminal runs out)."""
        if not self._dead_depths:
            return _NO_DEAD_END
        texts = stacks.texts_held(s)
        reach = self._dead_reaches.get(texts)
        if reach is None:
            reach = self._dead_reaches[texts] = min(_dead_depth(depths, texts + 1) for depths in self._dead_depths)
        return reach

    def _path(self, node: int) -> bytes:
        """The bytes from the trie's root to `node`: the start of any token below it."""
        t = self.vocabulary.trie
        return self.vocabulary.token_bytes[t.tok_ids[t.tok_ptr[node]]][:t.depth[node]]


def _dead_depths(dfa: DFA) -> tuple[np.ndarray, np.ndarray]:
    """The states with finitely many strings: their counts, ascending, and to each, the fewest bytes from the start
    to a state of that count or less (see `_dead_depth`)."""
    depth = np.full(dfa.num_states, -1, np.int64)
    depth[0], level, steps = 0, np.zeros(1, np.int64), 0
    while len(level):
        steps += 1
        level = np.unique(dfa.trans[level])
        level = level[level >= 0]
        level = level[depth[level] < 0]
        depth[level] = steps
    finite = np.flatnonzero(dfa.finite & (depth >= 0))
    order = np.argsort(dfa.counts[finite], kind="stable")
    return dfa.counts[finite][order], np.minimum.accumulate(depth[finite][order])


def _dead_depth(depths: tuple[np.ndarray, np.ndarray], texts: int) -> int:
    """The fewest bytes from the start of a captured text to a state with at most `texts` strings, where `texts`
    written could leave no completion (a large number where there is none)."""
    counts, reach = depths
    i = int(np.searchsorted(counts, texts, side="right"))
    return int(reach[i - 1]) if i else _NO_DEAD_END


def _dead_ends(dfa: DFA, state: int, rests: list[bytes]) -> list[bytes]:
    """The shortest continuations (in `dfa`, from `state`), each short of one of `rests` (the ends of the texts
    written, sorted), after which every completion is one of them: where as many strings are left as were
    written (every written text is one of the terminal's strings, so the counts tell)."""
    finite, counts = dfa.finite, dfa.counts
    cuts = []
    for rest in rests:
        q = state
        for i in range(len(rest) - 1):
            q = int(dfa.trans[q, rest[i]])
            if q < 0:
                break
            if finite[q] and counts[q] <= len(rests):
                done = rest[:i + 1]     # texts starting with it: a run of the sorted rests (UTF-8 never holds 0xff)
                if counts[q] <= bisect.bisect_left(rests, done + b"\xff") - bisect.bisect_left(rests, done):
                    cuts.append(done)
                    break
    return cuts

