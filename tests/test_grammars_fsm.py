"""Automata: the compiled subset construction and minimisation against direct simulation of random automata."""

import random

import numpy as np
import pytest

from leapgen.grammars import fsm
from leapgen.grammars.fsm import DFA, NFA, BudgetExceeded, determinize, determinize_calls, minimize
from leapgen.grammars.regex import dfa_fullmatch

SYMBOLS = [0, 1, 40, 41, 42, 97, 98, 200, 255]


def _random_nfa(rng: random.Random) -> tuple[NFA, list[tuple[int, int, int, int]], list[tuple[int, int]]]:
    nodes = rng.randint(2, 25)
    nfa = NFA()
    for _ in range(nodes):
        nfa.node()
    edges, eps = [], []
    for _ in range(rng.randint(0, 3 * nodes)):
        lo = rng.choice(SYMBOLS)
        hi = min(255, lo + rng.choice([0, 0, 1, 2, 60, 255]))
        edges.append((rng.randrange(nodes), lo, hi, rng.randrange(nodes)))
    for _ in range(rng.randint(0, nodes)):
        eps.append((rng.randrange(nodes), rng.randrange(nodes)))
    for src, lo, hi, dst in edges:
        nfa.byte_range(src, lo, hi, dst)
    for src, dst in eps:
        nfa.epsilon(src, dst)
    return nfa, edges, eps


def _nfa_accepts(edges, eps, data: bytes, start: int = 0, final: int = 1) -> bool:
    def close(nodes):
        todo, seen = list(nodes), set(nodes)
        while todo:
            n = todo.pop()
            for src, dst in eps:
                if src == n and dst not in seen:
                    seen.add(dst)
                    todo.append(dst)
        return seen

    current = close({start})
    for b in data:
        current = close({dst for src, lo, hi, dst in edges if src in current and lo <= b <= hi})
    return final in current


def _strings(rng: random.Random, count: int):
    for _ in range(count):
        yield bytes(rng.choice(SYMBOLS + [rng.randrange(256)]) for _ in range(rng.randint(0, 6)))


def test_subset_construction_and_minimisation_keep_the_language_of_random_nfas():
    rng = random.Random(7)
    for _ in range(300):
        nfa, edges, eps = _random_nfa(rng)
        dfa = determinize(nfa, 0, 1, 10_000)
        small = minimize(dfa)
        assert small.num_states <= max(dfa.num_states, 1)
        for data in _strings(rng, 30):
            expected = _nfa_accepts(edges, eps, data)
            assert dfa_fullmatch(dfa, data) == expected, (edges, eps, data)
            assert dfa_fullmatch(small, data) == expected, (edges, eps, data)


def test_equal_languages_minimise_to_equal_tables():
    rng = np.random.default_rng(3)
    for _ in range(100):
        n = int(rng.integers(1, 30))
        trans = np.where(rng.random((n, 256)) < 0.05, rng.integers(0, n, (n, 256)), -1).astype(np.int32)
        accept = rng.random(n) < 0.3
        # the same automaton twice over: each state's copy is equivalent to it, and the copies interleave
        doubled = np.where(trans >= 0, trans + n * (np.arange(256) % 2), -1).astype(np.int32)
        a = minimize(DFA(trans, accept))
        b = minimize(DFA(np.concatenate([doubled, doubled]), np.concatenate([accept, accept])))
        assert np.array_equal(a.trans, b.trans) and np.array_equal(a.accept, b.accept)


def _words_dfa(words: list[bytes]) -> DFA:
    nfa = NFA()
    start, end = nfa.node(), nfa.node()
    for word in words:
        cur = start
        for byte in word:
            nxt = nfa.node()
            nfa.byte_range(cur, byte, byte, nxt)
            cur = nxt
        nfa.epsilon(cur, end)
    return determinize(nfa, start, end, 10_000)


def test_excluding_words_behind_a_trie_is_the_difference_with_their_automaton():
    rng = random.Random(5)
    for _ in range(300):
        nfa, _, _ = _random_nfa(rng)
        base = minimize(determinize(nfa, 0, 1, 10_000))
        # words the base accepts, prefixes of them, and others
        words = sorted({data for data in _strings(rng, 12) if dfa_fullmatch(base, data) or rng.random() < 0.3})
        trie = fsm.without_words(base, words, 10_000)
        expected = fsm.product(base, _words_dfa(words), False, 10_000)
        small = minimize(trie)
        assert np.array_equal(small.trans, expected.trans) and np.array_equal(small.accept, expected.accept)
        # no state the start reaches is dead: a token walk never enters one
        reached = fsm._reachable_in_order(trie.trans, 0, trie.num_states)
        assert fsm._live_states(trie.trans, trie.accept)[reached].all() or not expected.accept.any()
    everything = DFA(np.zeros((1, 256), np.int32), np.ones(1, bool))
    assert fsm.without_words(everything, [bytes(range(40))], 10) is None    # past the budget: the caller's product
    assert fsm.without_words(everything, [bytes(range(40))], 41).num_states == 42
    assert fsm.without_words(everything, [b"a"], 0) is None     # no room for a node past the root


def test_products_through_the_hash_table_equal_the_flat_indexed_ones(monkeypatch):
    rng = random.Random(11)
    for _ in range(150):
        (nfa_a, edges_a, eps_a), (nfa_b, edges_b, eps_b) = _random_nfa(rng), _random_nfa(rng)
        a, b = minimize(determinize(nfa_a, 0, 1, 10_000)), minimize(determinize(nfa_b, 0, 1, 10_000))
        for keep_b in (True, False):
            monkeypatch.setattr(fsm, "_DENSE_PAIRS", 1 << 23)
            flat = fsm.product(a, b, keep_b, 10_000)
            monkeypatch.setattr(fsm, "_FIRST_ROWS", 1)             # the rows grow while the pairs are numbered
            grown = fsm.product(a, b, keep_b, 10_000)
            monkeypatch.setattr(fsm, "_FIRST_ROWS", 1 << 16)
            monkeypatch.setattr(fsm, "_DENSE_PAIRS", 0)
            hashed = fsm.product(a, b, keep_b, 10_000)
            for other in (grown, hashed):
                assert np.array_equal(flat.trans, other.trans) and np.array_equal(flat.accept, other.accept)
            for data in _strings(rng, 10):
                in_b = _nfa_accepts(edges_b, eps_b, data)
                expected = _nfa_accepts(edges_a, eps_a, data) and (in_b if keep_b else not in_b)
                assert dfa_fullmatch(hashed, data) == expected
    # counting bytes mod 17 and mod 19: 323 pairs, past the 257 rows the kernel starts with here, so it grows
    monkeypatch.setattr(fsm, "_FIRST_ROWS", 1)
    mod17, mod19 = (DFA(np.repeat(((np.arange(m) + 1) % m)[:, None], 256, 1).astype(np.int32), np.arange(m) == 0)
                    for m in (17, 19))
    both = fsm.product(mod17, mod19, True, 10_000)
    assert both.num_states == 323 and dfa_fullmatch(both, bytes(323)) and not dfa_fullmatch(both, bytes(17))
    chain = DFA(np.ones((2, 256), np.int32), np.array([False, True]))      # pairs (0, 0) then (1, 1)
    assert fsm.product(chain, chain, True, 2).num_states == 2
    with pytest.raises(BudgetExceeded):               # the state budget holds on the hashed path too
        fsm.product(chain, chain, True, 1)


def _classes_by_columns(trans: np.ndarray) -> tuple[list[int], list[int]]:
    """Byte classes (lowest byte of each, each byte's class) by comparing columns outright."""
    _, firsts, class_of = np.unique(trans.T, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(firsts)                     # classes numbered by their lowest byte
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return sorted(firsts.tolist()), rank[class_of.ravel()].tolist()


def test_byte_classes_are_the_equal_columns_even_where_their_hashes_collide():
    rng = np.random.default_rng(5)
    for n in (1, 3, 40):
        trans = rng.integers(-1, 3, (n, 256)).astype(np.int32)
        trans[:, rng.integers(0, 256, 100)] = trans[:, rng.integers(0, 256, 100)]   # some columns repeated
        firsts, class_of = fsm._byte_classes(trans)
        assert (firsts.tolist(), class_of.tolist()) == _classes_by_columns(trans)
    # columns 0 and 1 differ by -1863, 1436 and -629 in the last three rows, where the hash multiplies by
    # 16777619 ** 2, 16777619 and 1: that sums to 0 modulo 2**32, so only the check along the rows parts them
    trans = np.full((2000, 256), -1, np.int32)
    trans[-3:, 0], trans[-3:, 1] = (37, 1446, 71), (1900, 10, 700)
    firsts, class_of = fsm._byte_classes(trans)
    assert (firsts.tolist(), class_of.tolist()) == _classes_by_columns(trans) and class_of[0] != class_of[1]


@pytest.mark.parametrize("pattern", [r'"[^"\\]*"', r'"(?:[^"\\]|\\.){0,40}"', r'"[a-z]+@[a-z]+\.(com|org)"', r'[0-9]+',
                                     r'"[a-zé中 ]{2,10}"', r'"(?:[^"\\a]|a[^"\\b])*(?:a|ab(?:[^"\\a]|a[^"\\b])*a?)?"'])
def test_byte_runs_over_the_byte_classes_minimisation_keeps_are_those_over_every_byte(pattern):
    """`DFA.byte_runs` reads one byte of each class `minimize` found (its columns kept equal); over every byte, with
    one class per byte, the kernels give the same runs, main bytes and plain runs."""
    from leapgen.grammars.regex import regex_dfa

    dfa = regex_dfa(pattern)
    firsts, class_of = dfa.byte_classes
    assert len(firsts) < 256 and (dfa.trans == dfa.trans[:, firsts[class_of]]).all()
    runs, bits, plain = dfa.byte_runs
    each = fsm._byte_runs(dfa.trans, dfa.accept, fsm.RUN_CAP, np.arange(256), np.arange(256))
    assert np.array_equal(runs, each[0]) and np.array_equal(bits, each[1])
    assert np.array_equal(plain, fsm._plain_runs(dfa.trans, dfa.accept, fsm.PLAIN_BYTES, fsm.RUN_CAP))
    assert DFA(dfa.trans, dfa.accept).byte_classes[0].tolist() == list(range(256))    # not minimised: every byte


def test_minimising_an_empty_language_gives_one_dead_state():
    trans = np.full((3, 256), -1, np.int32)
    trans[0, 97], trans[1, 98] = 1, 2          # no state accepts
    for dfa in (DFA(trans, np.zeros(3, bool)), DFA(np.zeros((0, 256), np.int32), np.zeros(0, bool))):
        empty = minimize(dfa)
        assert empty.num_states == 1 and not empty.accept.any() and (empty.trans < 0).all()


def test_subset_construction_stops_at_its_state_budget():
    # (a|b)*a(a|b){k}: the classic automaton whose DFA has 2**(k+1) states
    nfa = NFA()
    start, final = nfa.node(), nfa.node()
    nfa.byte_range(start, 97, 98, start)
    cur = nfa.node()
    nfa.byte_range(start, 97, 97, cur)
    for _ in range(8):
        nxt = nfa.node()
        nfa.byte_range(cur, 97, 98, nxt)
        cur = nxt
    nfa.epsilon(cur, final)
    assert determinize(nfa, start, final, 1 << 10).num_states == 1 << 9
    with pytest.raises(BudgetExceeded, match="more than 511 automaton states"):
        determinize(nfa, start, final, (1 << 9) - 1)


def test_call_subset_construction_merges_labels_and_follows_epsilons():
    nfa = NFA()
    start, final = nfa.node(), nfa.node()
    a, b = nfa.node(), nfa.node()
    nfa.call(start, "x", a)
    nfa.call(start, "x", b)          # two x-calls from one set: one DFA edge to the set {a, b}
    nfa.epsilon(a, final)
    nfa.call(b, "y", final)
    dfa = determinize_calls(nfa, start, final, 100)
    assert dfa.accept == [False, True, True]
    assert dfa.calls == [(("x", 1),), (("y", 2),), ()]


def _walk_calls(dfa, labels) -> bool:
    state = 0
    for label in labels:
        state = dict(dfa.calls[state]).get(label)
        if state is None:
            return False
    return dfa.accept[state]


def test_large_call_nfas_take_the_compiled_construction_with_the_same_language(monkeypatch):
    from leapgen.grammars import fsm

    rng = random.Random(11)
    names = ["a", "b", ("rule", 1), "<terminal 0>"]
    for _ in range(200):
        nodes = rng.randint(2, 20)
        edges = [(rng.randrange(nodes), rng.choice(names), rng.randrange(nodes))
                 for _ in range(rng.randint(0, 2 * nodes))]
        eps = [(rng.randrange(nodes), rng.randrange(nodes)) for _ in range(rng.randint(0, nodes))]
        built = []
        for threshold in (10**9, 0):        # the Python construction, then the compiled one
            monkeypatch.setattr(fsm, "_COMPILED_CALL_NODES", threshold)
            nfa = NFA()
            for _ in range(nodes):
                nfa.node()
            for src, label, dst in edges:
                nfa.call(src, label, dst)
            for src, dst in eps:
                nfa.epsilon(src, dst)
            built.append(determinize_calls(nfa, 0, 1, 10_000))
        python, compiled = built
        assert python.num_states == compiled.num_states
        for _ in range(30):
            word = [rng.choice(names) for _ in range(rng.randint(0, 5))]
            assert _walk_calls(python, word) == _walk_calls(compiled, word), (edges, eps, word)
