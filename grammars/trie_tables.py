"""Tables of the vocabulary's token trie that the walks read, made once per vocabulary, and its smallest kernels.

The trie (`vocab.Trie`) lists its nodes in preorder: a node's subtree is the range up to `end[node]`, its
children follow it, and its tokens are `tok_ids[tok_ptr[node]:tok_ptr[node + 1]]`.  The tables here add, per node,
how deep tokens go below it and which bytes they hold there (for skipping subtrees), and the children side by side
(for skipping siblings).

numba's disk cache checks only the file of the kernel it loads, not the files of kernels it calls: the kernels
here are called from `trie_walks` and `captured_texts`, so a change to one of them must touch those files too
(or clear the cache) before it shows in their compiled callers.
"""

from __future__ import annotations

import weakref

import numba
import numpy as np

from .vocab import Vocabulary


@numba.njit(cache=True, nogil=True)
def set_tokens(bits, tok_ids, lo, hi, value):  # pragma: no cover - compiled
    """Set (value=True) or clear the bits of tokens tok_ids[lo:hi]."""
    for j in range(lo, hi):
        tid = tok_ids[j]
        if value:
            bits[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        else:
            bits[tid >> 5] &= ~(np.uint32(1) << np.uint32(tid & 31))


@numba.njit(cache=True, nogil=True)
def child(t_byte, t_end, node, byte):  # pragma: no cover - compiled
    """The trie node below `node` by `byte`, -1 where no token goes on with it."""
    i, stop = node + 1, t_end[node]
    while i < stop:
        if t_byte[i] == byte:
            return i
        i = t_end[i]
    return -1


_ROOT_CHILDREN: "weakref.WeakKeyDictionary[Vocabulary, np.ndarray]" = weakref.WeakKeyDictionary()


def root_children(vocabulary: Vocabulary) -> np.ndarray:
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


def first_byte_nodes(vocabulary: Vocabulary) -> np.ndarray:
    """Per first byte, how many trie nodes lie below it (its subtree)."""
    hit = _FIRST_BYTE_NODES.get(vocabulary)
    if hit is None:
        children = root_children(vocabulary)
        ends = vocabulary.trie.end[np.maximum(children, 0)]
        hit = _FIRST_BYTE_NODES[vocabulary] = np.where(children >= 0, ends - children, 0)
    return hit


_SUBTREES: "weakref.WeakKeyDictionary[Vocabulary, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def subtree_tables(vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
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


_SIBLINGS: "weakref.WeakKeyDictionary[Vocabulary, tuple[np.ndarray, np.ndarray, np.ndarray]]" = \
    weakref.WeakKeyDictionary()


def sibling_tables(vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(children's bytes side by side, their nodes, per node its place among them; see `_siblings`): a walk from a
    state that takes few bytes skips the siblings it cannot enter reading their bytes from one short row, where
    stepping from sibling to sibling across the trie met a cache miss each (a key's walk from the root, 3.0 ->
    2.1 us; 4 MB for cl100k)."""
    hit = _SIBLINGS.get(vocabulary)
    if hit is None:
        c_node, sib = _siblings(vocabulary.trie.end)
        hit = _SIBLINGS[vocabulary] = (vocabulary.trie.byte[c_node], c_node, sib)
    return hit


def subtree_heights(vocabulary: Vocabulary) -> np.ndarray:
    """Per trie node, the most bytes a token goes on below it (see `_subtrees`)."""
    return subtree_tables(vocabulary)[0]
