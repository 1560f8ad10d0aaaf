"""The walks every grammar shares: two least-recently-used tiers, narrow walks by count, wide ones by bytes."""

import weakref

import numpy as np
import tokenizers_util as tu

from leapgen.grammars import compile_json_schema, token_masks
from leapgen.grammars.regex import regex_dfa
from leapgen.grammars.walk_cache import SharedWalks, walk_bytes


def _walk(dense_words: int, pops: int):
    """A dense walk of `dense_words` bitmask words stopping at `pops` trie nodes."""
    nodes = np.arange(pops, dtype=np.int32)
    return None, np.ones(dense_words, np.uint32), nodes, nodes.tobytes()


def test_walk_bytes_counts_its_arrays_and_the_pop_points_key():
    sparse = (np.array([3, 7], np.int64), np.array([1, 2], np.uint32), np.zeros(5, np.int32), bytes(20))
    assert walk_bytes(sparse) == 16 + 8 + 20 + 20
    assert walk_bytes(_walk(10, 4)) == 40 + 16 + 16


def test_the_wide_tier_keeps_to_its_bytes_least_recently_used_first():
    size = walk_bytes(_walk(100, 0))
    cache = SharedWalks(narrow_limit=2, wide_bytes=3 * size)
    walks = [_walk(100, 0) for _ in range(5)]
    for k in range(3):
        cache.put(("w", k), walks[k], wide=True)
    assert cache.get(("w", 0)) is walks[0]     # now the most recently used
    cache.put(("w", 3), walks[3], wide=True)   # evicts ("w", 1)
    assert cache.get(("w", 1)) is None
    assert [cache.get(("w", k)) is walks[k] for k in (0, 2, 3)] == [True, True, True]
    assert cache.wide_bytes == 3 * size
    cache.put(("w", 3), walks[4], wide=True)   # a key put again replaces its walk and its bytes
    assert cache.get(("w", 3)) is walks[4] and cache.wide_bytes == 3 * size
    big = _walk(400, 0)                        # larger than the whole tier: it alone is kept
    cache.put(("big",), big, wide=True)
    assert len(cache) == 1 and cache.get(("big",)) is big and cache.wide_bytes == walk_bytes(big)


def test_narrow_walks_never_push_out_wide_ones():
    cache = SharedWalks(narrow_limit=2, wide_bytes=1 << 20)
    wide = _walk(100, 50)
    cache.put(("wide",), wide, wide=True)
    for k in range(10):
        cache.put(("key", k), _walk(1, 0), wide=False)
    assert cache.get(("wide",)) is wide
    assert len(cache) == 3 and cache.get(("key", 7)) is None and cache.get(("key", 9)) is not None


def test_a_string_walk_outlives_the_walks_of_many_keys(monkeypatch):
    """Inside a JSON string the walk covers the whole vocabulary (a wide state, shared by every grammar): the key
    walks of later schemas, each named once, must not evict it, however many they are."""
    monkeypatch.setattr(token_masks, "_SHARED_WALKS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(token_masks, "_SHARED_WALKS_LIMIT", 4)
    vocabulary = tu.cl100k()
    masks = compile_json_schema({"type": "string"}, vocabulary).masks
    inside = regex_dfa(r'[a-z ]*"')
    root, key = token_masks._ROOT, token_masks._ROOT_KEY
    assert masks._first_bytes(inside, 0)[1]     # wide
    string_walk = masks._shared_walk(inside, 0, root, key)
    for k in range(12):
        masks._shared_walk(regex_dfa(f'"key{k}"'), 0, root, key)
    assert masks._shared.get((inside.uid, 0, key)) is string_walk
    assert masks._shared_walk(inside, 0, root, key) is string_walk
    assert len(masks._shared._narrow) == 4
