"""The walks every grammar shares: two least-recently-used tiers, narrow walks by count, wide ones by bytes."""

import weakref

import numpy as np
import tokenizers_util as tu

from leapgen.grammars import captured_texts, compile_json_schema, token_masks, trie_tables, trie_walks
from leapgen.grammars.fsm import DFA, chain_dfa
from leapgen.grammars.regex import regex_dfa
from leapgen.grammars.vocab import as_vocabulary
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
    root, key = trie_walks.ROOT, trie_walks.ROOT_KEY
    assert masks._first_bytes(inside, 0)[1]     # wide
    string_walk = masks._shared_walk(inside, 0, root, key)
    for k in range(12):
        masks._shared_walk(regex_dfa(f'"key{k}"'), 0, root, key)
    assert masks._shared.get((inside.uid, 0, key)) is string_walk
    assert masks._shared_walk(inside, 0, root, key) is string_walk
    assert len(masks._shared._narrow) == 4


def _bits_of(walk, words: int) -> np.ndarray:
    bits = np.zeros(words, np.uint32)
    trie_walks.add_walk(walk, bits)
    return bits


def test_walks_taken_together_equal_walks_taken_one_by_one():
    """`_walk_many` visits each trie node once for several start states; every start's tokens, pop points and
    storage (dense or sparse) are those of its own walk, accepting and dead starts included."""
    for vocabulary in (tu.cl100k(), tu.byte_level_bpe()):
        vocabulary = as_vocabulary(vocabulary)
        dfas = [regex_dfa(p) for p in (r'[^"\\]*(customer|maker)[^"\\]*"', r'[a-z ]*"', r"(ab|cd)*", r'"[^"]{0,5}"',
                                       r"x?")]
        starts = [(dfa, state) for dfa in dfas for state in range(dfa.num_states)]
        together = trie_walks.run_walks_together(starts, vocabulary)
        for (dfa, state), walk in zip(starts, together):
            alone = trie_walks.run_walk(dfa, vocabulary, state, trie_walks.ROOT, wide=True, skipping=True)
            assert (_bits_of(walk, vocabulary.mask_words) == _bits_of(alone, vocabulary.mask_words)).all()
            assert walk[2].tolist() == alone[2].tolist() and walk[3] == alone[3]
            assert (walk[0] is None) == (alone[0] is None)


def test_a_whole_vocabulary_walk_equals_the_walk_below_the_root():
    """`_walk_whole` (no list of touched words, siblings one by one, skipping main paths or not) gives the plain
    walk's tokens, pop points and storage, for states that take much of the trie and states that take little."""
    for vocabulary in (tu.cl100k(), tu.byte_level_bpe()):
        vocabulary = as_vocabulary(vocabulary)
        for pattern in (r'[^"\\]*', r'[^"\\]*(customer|maker)[^"\\]*"', r"[a-zA-Z ]{1,40}", r".*a.*", r"[0-9]+",
                        r"(ab|cd)*", r"x?"):
            dfa = regex_dfa(pattern)
            for state in range(dfa.num_states):
                plain = trie_walks.run_walk(dfa, vocabulary, state, trie_walks.ROOT)
                for skipping in (False, True):
                    whole = trie_walks.run_walk(dfa, vocabulary, state, trie_walks.ROOT, wide=True, skipping=skipping)
                    assert (_bits_of(whole, vocabulary.mask_words) == _bits_of(plain, vocabulary.mask_words)).all()
                    assert whole[2].tolist() == plain[2].tolist() and whole[3] == plain[3], (pattern, state)
                    assert (whole[0] is None) == (plain[0] is None), (pattern, state)


def test_a_mask_needing_several_wide_walks_takes_them_in_one_pass(monkeypatch):
    """Inside a string that one of several patterns must match, each branch's automaton walks the whole vocabulary:
    the mask takes them together, once, and allows what walking them one by one allows."""
    monkeypatch.setattr(token_masks, "_SHARED_WALKS", weakref.WeakKeyDictionary())
    vocabulary = tu.cl100k()
    schema = {"type": "string", "oneOf": [{"pattern": "customer"}, {"pattern": "maker"}, {"pattern": "operator"}]}
    calls = []
    together = trie_walks.run_walks_together
    monkeypatch.setattr(token_masks, "run_walks_together", lambda starts, v: calls.append(len(starts)) or
                        together(starts, v))
    compiled = compile_json_schema(schema, vocabulary)
    matcher = compiled.matcher()
    matcher.advance(vocabulary.encode('"', add_special_tokens=False)[0])
    batched = matcher.allowed_token_ids().tolist()
    assert calls == [3]
    monkeypatch.setattr(token_masks, "_SHARED_WALKS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(token_masks.TokenMasks, "prefetch", lambda self, configurations: None)
    alone = compile_json_schema(schema, vocabulary).matcher()
    alone.advance(vocabulary.encode('"', add_special_tokens=False)[0])
    assert alone.allowed_token_ids().tolist() == batched and calls == [3]
    assert vocabulary.encode("customer", add_special_tokens=False)[0] in batched


def _spelling_cases(rng: np.random.Generator):
    """Per vocabulary (cl100k, a byte-level BPE): it, its tokens' bytes, and a maker of random sets of trie nodes
    to spell below that nest (pop points after a quote, a pop point below another, and nodes anywhere)."""
    for vocabulary in (tu.cl100k(), tu.byte_level_bpe()):
        vocabulary = as_vocabulary(vocabulary)
        below_quote = trie_walks.run_walk(chain_dfa(b'"'), vocabulary, 0, trie_walks.ROOT)[2]
        size = len(vocabulary.trie.end)

        def random_nodes(below_quote=below_quote, size=size) -> np.ndarray:
            return np.unique(np.concatenate([below_quote, rng.integers(size, size=3).astype(np.int32)])).astype(
                np.int32)

        yield vocabulary, [b for b in vocabulary.token_bytes if b], random_nodes


def test_a_chain_of_bytes_is_walked_down_its_path_as_the_trie_walk_would():
    """An object key's DFA reads one text: its walk follows the text down the trie (`trie_walks.spelled`) and equals the
    trie walk of the same DFA, tokens, pop points and storage, from every state, below the root or below nodes
    that nest (a pop point below another)."""
    rng = np.random.default_rng(7)
    for vocabulary, tokens, random_nodes in _spelling_cases(rng):
        for trial in range(300):
            text = b"".join(tokens[i] for i in rng.integers(len(tokens), size=3))[:int(rng.integers(1, 20))]
            text = b'"' + text + b'"' if trial % 3 == 0 else text
            dfa = chain_dfa(text)
            nodes = trie_walks.ROOT if trial % 2 else random_nodes()
            for state in range(dfa.num_states):
                spelled = trie_walks.run_walk(dfa, vocabulary, state, nodes)
                walked = trie_walks.run_walk(DFA(dfa.trans, dfa.accept), vocabulary, state, nodes)  # (no chain)
                assert (_bits_of(spelled, vocabulary.mask_words) == _bits_of(walked, vocabulary.mask_words)).all()
                assert spelled[2].tolist() == walked[2].tolist() and (spelled[0] is None) == (walked[0] is None)


def test_texts_spelled_apart_equal_each_text_spelled_alone():
    """`trie_walks.spelled_apart` (many chain states' texts below the same nodes in one pass, a large object's
    members' keys) gives each state the tokens and the pop point `spelled` gives it alone: below the root and below
    nodes that nest, texts that are prefixes of others, empty rests (a chain's last state) and bytes that are no
    UTF-8."""
    rng = np.random.default_rng(11)
    for vocabulary, tokens, random_nodes in _spelling_cases(rng):
        t = vocabulary.trie
        for trial in range(60):
            texts = [b'"' + b"".join(tokens[i] for i in rng.integers(len(tokens), size=2))[:int(rng.integers(1, 12))]
                     + b'"' for _ in range(int(rng.integers(1, 12)))]
            texts += [texts[0][:int(rng.integers(1, len(texts[0]) + 1))], b"\xff\xfe"]
            packed = np.frombuffer(b"".join(texts), np.uint8).copy()     # (writable, as the kernel is loaded for)
            at = np.cumsum([0] + [len(text) for text in texts])
            # states: each text from its start, from inside it and from its end
            text_from = np.concatenate([at[:-1], at[:-1] + 1, at[1:]]).astype(np.int64)
            text_to = np.concatenate([at[1:], at[1:], at[1:]]).astype(np.int64)
            states = rng.permutation(len(text_from)).astype(np.int64)
            nodes = trie_walks.ROOT if trial % 2 else random_nodes()
            words, values, owners, popping = trie_walks.spelled_apart(
                t.byte, t.end, t.tok_ptr, t.tok_ids, trie_tables.root_children(vocabulary), nodes, packed, text_from,
                text_to, states)
            for k, q in enumerate(states.tolist()):
                text = packed[text_from[q]:text_to[q]].copy()
                alone = trie_walks.spelled(t.byte, t.end, t.tok_ptr, t.tok_ids, nodes, text)
                own = owners == k
                assert words[own].tolist() == alone[0].tolist() and values[own].tolist() == alone[1].tolist()
                assert popping[k] == (len(alone[2]) > 0)


def test_a_subtree_search_finds_a_text_exactly_where_a_token_below_holds_it():
    """`captured_texts.writes_again` (whether a token below a trie node holds a text after the node), against every
    token below: from the root, whose subtree is the whole trie, and from nodes below it, texts found, at any depth,
    or absent."""
    vocabulary = as_vocabulary(tu.cl100k())
    t = vocabulary.trie
    heights = trie_tables.subtree_heights(vocabulary)
    rng = np.random.default_rng(11)
    nodes = [0] + [int(n) for n in rng.integers(len(t.end), size=40)]
    for node in nodes:
        depth = int(t.depth[node])
        below = [vocabulary.token_bytes[i][depth:] for i in t.tok_ids[t.tok_ptr[node + 1]:t.tok_ptr[t.end[node]]]]
        texts = [b"ing", b'", "', b"\n\n", b"zzqx", b"a"]
        texts += [tok[1:4] for tok in below[:3] if len(tok) > 3]
        for text in texts:
            found = captured_texts.writes_again(t.byte, t.depth, t.end, heights, node, np.frombuffer(text, np.uint8))
            assert found == any(text in tok for tok in below), (node, text)
