"""The kernels of captured texts (numba): where an object's keys must differ (`uniqueItems` over strings, keys
beside declared ones), a captured terminal's walk leaves out the tokens that would write a text its object wrote
already, or reach a prefix whose every completion it did (`TokenMasks._add_captured` drives them).
"""

from __future__ import annotations

import bisect

import numba
import numpy as np

from .fsm import DFA, packed_bytes
from .trie_tables import child, set_tokens, subtree_heights, subtree_tables
from .vocab import Vocabulary

# the fewest bytes to a dead end (`dead_depth`) where no text written can leave a captured terminal without completions
NO_DEAD_END = 1 << 30


@numba.njit(cache=True, nogil=True)
def writes_again(t_byte, t_depth, t_end, t_height, node, text):  # pragma: no cover - compiled
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
def reading_nodes(t_byte, t_end, row, nodes):  # pragma: no cover - compiled
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
def followed_nodes(t_below, nodes, after):  # pragma: no cover - compiled
    """The trie `nodes` below which some byte of `after` (four 64-bit words) lies."""
    keep = np.zeros(len(nodes), np.bool_)
    for k in range(len(nodes)):
        for m in range(4):
            if t_below[nodes[k], m] & after[m]:
                keep[k] = True
                break
    return nodes[keep]


@numba.njit(cache=True, nogil=True)
def goes_on(trans, has_out, state, data, ends):  # pragma: no cover - compiled
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
def descend_texts(t_byte, t_end, node, height, data, ends, chosen):  # pragma: no cover - compiled
    """Per chosen text data[ends[k]:ends[k + 1]], the trie node it leads to below `node`; -1 where no token goes on
    with it, where it is longer than `height` bytes, and for a text not chosen."""
    out = np.full(len(ends) - 1, -1, np.int32)
    for k in range(len(out)):
        if not chosen[k] or ends[k + 1] - ends[k] > height:
            continue
        below = node
        for i in range(ends[k], ends[k + 1]):
            below = child(t_byte, t_end, below, data[i])
            if below < 0:
                break
        out[k] = below
    return out


@numba.njit(cache=True, nogil=True)
def clear_below(bits, t_end, t_tok_ptr, t_tok_ids, nodes):  # pragma: no cover - compiled
    """Clear the bits of the tokens at and below each trie node of `nodes` (-1: none)."""
    for node in nodes:
        if node >= 0:
            set_tokens(bits, t_tok_ids, t_tok_ptr[node], t_tok_ptr[t_end[node]], False)


def dead_depths(dfa: DFA) -> tuple[np.ndarray, np.ndarray]:
    """The states with finitely many strings: their counts, ascending, and to each, the fewest bytes from the start
    to a state of that count or less (see `dead_depth`)."""
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


def dead_depth(depths: tuple[np.ndarray, np.ndarray], texts: int) -> int:
    """The fewest bytes from the start of a captured text to a state with at most `texts` strings, where `texts`
    written could leave no completion (a large number where there is none)."""
    counts, reach = depths
    i = int(np.searchsorted(counts, texts, side="right"))
    return int(reach[i - 1]) if i else NO_DEAD_END


def dead_ends(dfa: DFA, state: int, rests: list[bytes]) -> list[bytes]:
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


def load_kernels(vocabulary: Vocabulary) -> None:
    """Load the kernels above now: only a captured text calls them, so they would otherwise load, from numba's disk
    cache, inside the first mask inside one."""
    t = vocabulary.trie
    bits = np.zeros(vocabulary.mask_words, np.uint32)
    nowhere = np.full((1, 256), -1, np.int32)
    no = np.zeros(1, bool)
    data, ends = packed_bytes([b"a"])
    text = np.frombuffer(b"a", np.uint8)    # read-only, as the texts they are called with
    goes_on(nowhere, no, 0, data, ends)
    clear_below(bits, t.end, t.tok_ptr, t.tok_ids, descend_texts(t.byte, t.end, 0, 1, data, ends, no))
    writes_again(t.byte, t.depth, t.end, subtree_heights(vocabulary), 0, text)
    reading_nodes(t.byte, t.end, nowhere[0], np.zeros(1, np.int32))
    followed_nodes(subtree_tables(vocabulary)[1], np.zeros(1, np.int32), np.zeros(4, np.uint64))
