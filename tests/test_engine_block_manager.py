"""BlockManager: allocation, prefix caching, revival, fork + copy-on-write, truncation, random-operation invariants."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from leapgen.engine.block_manager import BlockManager, OutOfBlocksError, chain_hash
from leapgen.engine.sequence import Sequence


def assert_no_leaks(bm: BlockManager) -> None:
    """Every block is free and unreferenced."""
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)


def prefix_keys(token_ids: list[int]) -> list[int]:
    """A key naming each prefix of `token_ids`."""
    keys, key = [], 0
    for token in token_ids:
        key = hash((key, token))
        keys.append(key)
    return keys


def compute(bm: BlockManager, seq: Sequence, n: int | None = None) -> list[tuple[int, int]]:
    """Pretend a step computed the next `n` (default: all) uncomputed tokens of `seq`."""
    n = seq.num_uncomputed if n is None else n
    copies = bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.commit(seq)
    return copies


def test_allocate_slots_and_free():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, list(range(10)))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 5
    assert seq.num_computed_tokens == 0
    b0, b1, b2 = seq.block_table
    assert bm.slot(seq, 0) == b0 * 4
    assert bm.slot(seq, 5) == b1 * 4 + 1
    assert bm.slots(seq, 8, 10) == [b2 * 4, b2 * 4 + 1]
    with pytest.raises(ValueError, match="position 12 is outside its 3 blocks"):
        bm.slot(seq, 12)
    with pytest.raises(ValueError, match="already holds blocks"):
        bm.allocate(seq)
    bm.free(seq)
    assert seq.block_table == [] and seq.num_computed_tokens == 0
    assert_no_leaks(bm)


def test_allocate_without_room_raises():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = Sequence(0, list(range(9)))
    assert not bm.can_allocate(seq)
    with pytest.raises(OutOfBlocksError, match="needs 3 free blocks, 2 are free"):
        bm.allocate(seq)
    assert_no_leaks(bm)


def test_append_slots_grows_one_block_at_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = Sequence(0, [1, 2, 3, 4])
    bm.allocate(seq)
    compute(bm, seq)
    seq.append_token(5)
    assert bm.can_append(seq, 1) and bm.num_blocks_to_append(seq, 1) == 1
    assert compute(bm, seq) == []
    assert len(seq.block_table) == 2
    seq.append_token(6)
    assert bm.num_blocks_to_append(seq, 1) == 0
    # room for draft tokens past the current ones
    assert bm.num_blocks_to_append(seq, 8) == 2
    bm.append_slots(seq, 8)
    assert len(seq.block_table) == 4 and bm.num_free_blocks == 0
    assert not bm.can_append(seq, 12)
    with pytest.raises(OutOfBlocksError, match="needs 1 free blocks for 12 new tokens, 0 are free"):
        bm.append_slots(seq, 12)
    bm.free(seq)
    assert_no_leaks(bm)


def test_prefix_hit_reuses_blocks_and_sets_computed_count():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = Sequence(0, list(range(10)))
    bm.allocate(a)
    compute(bm, a)
    assert bm.num_cached_blocks == 2          # two full blocks; the partial third is not registered
    b = Sequence(1, list(range(8)) + [99, 98, 97])
    assert bm.num_blocks_to_allocate(b) == 1  # both hits are blocks `a` still holds
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] != a.block_table[2]
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2, 1]
    assert b.block_hashes == a.block_hashes
    # a different first block breaks the chain even when the second block's tokens match
    c = Sequence(2, [50, 1, 2, 3] + list(range(4, 10)))
    bm.allocate(c)
    assert c.num_computed_tokens == 0
    for seq in (a, b, c):
        bm.free(seq)
    assert_no_leaks(bm)


def test_prefix_hit_always_leaves_the_last_token_to_compute():
    bm = BlockManager(num_blocks=10, block_size=4)
    a = Sequence(0, list(range(8)))
    bm.allocate(a)
    compute(bm, a)
    assert bm.num_cached_blocks == 2
    b = Sequence(1, list(range(8)))           # identical prompt, exactly two full blocks
    bm.allocate(b)
    assert b.num_computed_tokens == 4 and b.num_uncomputed == 4
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
    c = Sequence(2, list(range(9)))           # one token past: both full blocks hit
    bm.allocate(c)
    assert c.num_computed_tokens == 8 and c.num_uncomputed == 1
    for seq in (a, b, c):
        bm.free(seq)
    assert_no_leaks(bm)


def test_freed_cached_block_is_revived_by_a_later_hit():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = Sequence(0, list(range(9)))
    bm.allocate(a)
    compute(bm, a)
    cached = a.block_table[:2]
    bm.free(a)
    assert_no_leaks(bm)
    assert bm.num_cached_blocks == 2          # freed but still registered
    # unregistered free blocks are reused first; the cached ones wait, prefix block last
    assert bm.free_block_ids()[-2:] == [cached[1], cached[0]]
    b = Sequence(1, list(range(8)) + [7, 7])
    assert bm.num_blocks_to_allocate(b) == 3  # revived blocks come off the free list too
    bm.allocate(b)
    assert b.block_table[:2] == cached and b.num_computed_tokens == 8
    assert bm.num_free_blocks == 1
    bm.free(b)
    assert_no_leaks(bm)


def test_reset_prefix_cache_forgets_free_blocks_and_keeps_held_ones():
    bm = BlockManager(num_blocks=8, block_size=4)
    held, done = Sequence(0, list(range(9))), Sequence(1, [5] * 9)
    for seq in (held, done):
        bm.allocate(seq)
        compute(bm, seq)
    bm.free(done)
    assert bm.num_cached_blocks == 4
    assert bm.reset_prefix_cache() == 2       # done's two full blocks; held's stay registered
    assert bm.num_cached_blocks == 2
    again = Sequence(2, [5] * 9)
    bm.allocate(again)
    assert again.num_computed_tokens == 0     # no hit among the forgotten blocks
    twin = Sequence(3, list(range(8)) + [1])
    bm.allocate(twin)
    assert twin.num_computed_tokens == 8      # the held prefix is still found
    for seq in (held, again, twin):
        bm.free(seq)
    assert_no_leaks(bm)


def test_least_recently_freed_cached_block_is_evicted_first():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = Sequence(0, [1, 1, 1]), Sequence(1, [2, 2, 2])
    for seq in (a, b):
        bm.allocate(seq)
        compute(bm, seq)
    a_block, b_block = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)
    assert bm.free_block_ids()[2:] == [a_block, b_block]
    d = Sequence(2, [4, 4, 4])               # takes the two unregistered partial blocks: nothing evicted
    bm.allocate(d)
    assert bm.num_cached_blocks == 2
    e = Sequence(3, [5])                     # evicts a's block, freed before b's
    bm.allocate(e)
    assert e.block_table == [a_block]
    assert bm.lookup(chain_hash(None, (1, 1))) is None
    assert bm.lookup(chain_hash(None, (2, 2))) == b_block
    again = Sequence(4, [2, 2, 9])
    bm.free(d)
    bm.allocate(again)
    assert again.num_computed_tokens == 2 and again.block_table[0] == b_block
    bm.free(e)
    bm.free(again)
    assert_no_leaks(bm)


def test_fork_shares_blocks_and_copy_on_write_gives_private_copies():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, list(range(6)))
    bm.allocate(parent)
    compute(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and child.num_computed_tokens == 6
    assert all(bm.blocks[i].ref_count == 2 for i in parent.block_table)
    full, partial = parent.block_table
    parent.append_token(100)
    child.append_token(200)
    copies = compute(bm, parent)
    assert len(copies) == 1 and copies[0][0] == partial
    new_block = copies[0][1]
    assert parent.block_table == [full, new_block]
    assert bm.blocks[partial].ref_count == 1 and bm.blocks[full].ref_count == 2
    assert compute(bm, child) == []           # now the sole holder: writes in place
    assert child.block_table == [full, partial]
    bm.free(parent)
    assert bm.blocks[full].ref_count == 1
    bm.free(child)
    assert_no_leaks(bm)


def test_fork_at_a_block_boundary_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, list(range(8)))
    bm.allocate(parent)
    compute(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    for seq, token in ((parent, 1), (child, 2)):
        seq.append_token(token)
        assert compute(bm, seq) == []
    assert parent.block_table[:2] == child.block_table[:2] and parent.block_table[2] != child.block_table[2]
    bm.free(parent)
    bm.free(child)
    assert_no_leaks(bm)


def test_fork_rejects_a_child_with_other_tokens():
    bm = BlockManager(num_blocks=4, block_size=4)
    parent = Sequence(0, [1, 2, 3])
    bm.allocate(parent)
    compute(bm, parent)
    with pytest.raises(ValueError, match="does not start with the 3 computed tokens"):
        bm.fork(parent, Sequence(1, [1, 2, 4]))
    bm.free(parent)
    assert_no_leaks(bm)


def test_truncate_across_a_block_boundary_unregisters_and_frees():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, list(range(6)))
    bm.allocate(seq)
    compute(bm, seq)
    seq.append_tokens([10, 11, 12, 13, 14, 15, 16])      # 13 tokens: e.g. six speculative drafts
    compute(bm, seq)
    assert len(seq.block_table) == 4 and len(seq.block_hashes) == 3 and bm.num_cached_blocks == 3
    b0, b1, b2, b3 = seq.block_table
    h1, h2 = seq.block_hashes[1], seq.block_hashes[2]
    bm.truncate(seq, 7)
    assert seq.token_ids == [0, 1, 2, 3, 4, 5, 10]
    assert seq.num_computed_tokens == 7 and seq.block_table == [b0, b1]
    assert len(seq.block_hashes) == 1
    assert bm.lookup(h1) is None and bm.blocks[b1].hash is None          # no longer full
    assert bm.lookup(h2) == b2 and bm.blocks[b2].ref_count == 0          # freed whole: content still valid
    assert bm.blocks[b3].ref_count == 0 and bm.num_free_blocks == 6
    seq.append_token(20)
    compute(bm, seq)
    assert seq.block_table == [b0, b1] and bm.lookup(h1) is None and len(seq.block_hashes) == 2
    with pytest.raises(ValueError, match="between the prompt length 6 and the current length 8"):
        bm.truncate(seq, 5)
    bm.free(seq)
    assert_no_leaks(bm)


def test_truncate_of_uncomputed_tokens_keeps_computed_state():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, list(range(5)))
    bm.allocate(seq)
    compute(bm, seq)
    seq.append_tokens([7, 8, 9, 10])
    bm.append_slots(seq, 4)
    bm.truncate(seq, 6)
    assert seq.num_computed_tokens == 5 and len(seq.block_table) == 2 and bm.num_free_blocks == 6
    bm.free(seq)
    assert_no_leaks(bm)


def test_truncate_into_a_shared_block_copies_on_the_next_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, list(range(3)))
    bm.allocate(parent)
    compute(bm, parent)
    parent.append_tokens([3, 4])
    compute(bm, parent)                      # block 0 full and registered
    child = parent.fork(1)
    bm.fork(parent, child)
    shared = parent.block_table[0]
    h0 = parent.block_hashes[0]
    bm.truncate(child, 3)
    assert bm.lookup(h0) == shared           # still right for the parent
    child.append_token(42)
    copies = compute(bm, child)
    assert copies == [(shared, child.block_table[0])] and child.block_table[0] != shared
    assert bm.lookup(h0) == shared
    bm.free(parent)
    bm.free(child)
    assert_no_leaks(bm)


def test_block_kept_registered_while_shared_is_unregistered_when_overwritten():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence(0, [1, 2, 3])
    bm.allocate(parent)
    compute(bm, parent)
    parent.append_tokens([4, 5])
    compute(bm, parent)
    child = parent.fork(1)
    bm.fork(parent, child)
    block, h0 = parent.block_table[0], parent.block_hashes[0]
    bm.truncate(parent, 3)                   # shared: stays registered for the child
    bm.free(child)                           # now private to the parent, still registered
    assert bm.blocks[block].ref_count == 1 and bm.lookup(h0) == block
    parent.append_token(9)
    assert compute(bm, parent) == [] and parent.block_table[0] == block
    assert bm.lookup(h0) is None
    assert bm.lookup(parent.block_hashes[0]) == block    # re-registered under its new content
    bm.free(parent)
    assert_no_leaks(bm)


def test_hash_collisions_never_alias_blocks(monkeypatch):
    import leapgen.engine.block_manager as block_manager
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: 0)
    bm = BlockManager(num_blocks=8, block_size=2)
    a = Sequence(0, [1, 1, 2, 2, 3])
    bm.allocate(a)
    compute(bm, a)
    b = Sequence(1, [5, 5, 6])               # same (colliding) hash, other tokens: no hit
    bm.allocate(b)
    assert b.num_computed_tokens == 0
    c = Sequence(2, [1, 1, 9])
    bm.allocate(c)
    assert c.num_computed_tokens == 2 and c.block_table[0] == a.block_table[0]
    for seq in (a, b, c):
        bm.free(seq)
    assert_no_leaks(bm)


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = Sequence(0, list(range(9)))
    bm.allocate(a)
    compute(bm, a)
    assert bm.num_cached_blocks == 0 and len(a.block_hashes) == 2
    b = Sequence(1, list(range(9)))
    bm.allocate(b)
    assert b.num_computed_tokens == 0
    bm.free(a)
    bm.free(b)
    assert_no_leaks(bm)


def test_bad_construction_arguments():
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        BlockManager(4, 0)
    with pytest.raises(ValueError, match="num_blocks must be an int >= 1"):
        BlockManager(2.5, 4)
    with pytest.raises(ValueError, match="prompt is empty"):
        Sequence(0, [])
    with pytest.raises(ValueError, match="prompt token 1 must be a token id >= 0"):
        Sequence(0, [1, -2])
    with pytest.raises(ValueError, match="num_new_tokens must be an int >= 1"):
        BlockManager(4, 4).can_append(Sequence(0, [1]), 0)


class BlockManagerMachine(RuleBasedStateMachine):
    """Random allocate / compute / append / fork / truncate / free sequences against a fake KV cache.

    The fake cache stores, in each slot, a key naming the whole token prefix ending at that
    position (what real K/V depend on) and the last block_size tokens of it.  Every computed
    position of every live sequence must read back its own prefix, which catches wrong prefix
    hits, missing copy-on-write and reuse of a block still in use.
    """

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(num_blocks=12, block_size=3)
        self.kv: list[tuple[int, tuple[int, ...]] | None] = [None] * self.bm.capacity_tokens
        self.seqs: list[Sequence] = []
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    @rule(prompt=st.lists(st.integers(0, 1), min_size=1, max_size=10))
    def add(self, prompt):
        seq = Sequence(self._new_id(), prompt)
        if self.bm.can_allocate(seq):
            self.bm.allocate(seq)
            self.seqs.append(seq)
        else:
            with pytest.raises(OutOfBlocksError):
                self.bm.allocate(seq)

    def _compute(self, seq: Sequence, n: int) -> None:
        """What a runner does for one scheduled sequence: copy on write, write the new K/V, commit."""
        if not self.bm.can_append(seq, n):
            return
        size = self.bm.block_size
        for src, dst in self.bm.append_slots(seq, n):
            self.kv[dst * size:(dst + 1) * size] = self.kv[src * size:(src + 1) * size]
        n = min(n, seq.num_uncomputed)     # slots past the tokens are reserved, not computed
        keys = prefix_keys(seq.token_ids)
        for p in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
            self.kv[self.bm.slot(seq, p)] = (keys[p], tuple(seq.token_ids[max(0, p + 1 - size):p + 1]))
        seq.num_computed_tokens += n
        self.bm.commit(seq)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def step_one(self, data):
        self._compute(data.draw(st.sampled_from(self.seqs)), data.draw(st.integers(1, 4)))

    @precondition(lambda self: self.seqs)
    @rule()
    def step_all(self):
        for seq in self.seqs:
            if seq.num_uncomputed:
                self._compute(seq, seq.num_uncomputed)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 1), min_size=1, max_size=4))
    def append(self, data, tokens):
        data.draw(st.sampled_from(self.seqs)).append_tokens(tokens)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.seqs))
        child = parent.fork(self._new_id())
        self.bm.fork(parent, child)
        self.seqs.append(child)
        # beams diverge right after a fork
        parent.append_token(2)
        child.append_token(3)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def truncate(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.truncate(seq, data.draw(st.integers(seq.num_prompt_tokens, seq.num_tokens)))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.seqs))
        self.bm.free(seq)
        self.seqs.remove(seq)

    @invariant()
    def refcounts_and_free_list_agree(self):
        held = Counter(b for seq in self.seqs for b in seq.block_table)
        for block in self.bm.blocks:
            assert block.ref_count == held[block.block_id]
        assert set(self.bm.free_block_ids()) == {b.block_id for b in self.bm.blocks if b.ref_count == 0}
        for seq in self.seqs:
            assert len(set(seq.block_table)) == len(seq.block_table)

    @invariant()
    def registrations_are_consistent(self):
        registered = [b for b in self.bm.blocks if b.hash is not None]
        assert len(registered) == self.bm.num_cached_blocks
        for block in registered:
            assert self.bm.lookup(block.hash) == block.block_id
            assert len(block.token_ids) == self.bm.block_size
            # a registered block holds exactly the prefix its hash names
            last = self.kv[block.block_id * self.bm.block_size + self.bm.block_size - 1]
            assert last is not None and last[1] == block.token_ids

    @invariant()
    def computed_tokens_read_back_from_the_cache(self):
        for seq in self.seqs:
            assert seq.num_computed_tokens <= seq.num_tokens
            assert len(seq.block_table) * self.bm.block_size >= seq.num_computed_tokens
            assert len(seq.block_hashes) == seq.num_computed_tokens // self.bm.block_size
            keys = prefix_keys(seq.token_ids)
            for p in range(seq.num_computed_tokens):
                assert self.kv[self.bm.slot(seq, p)][0] == keys[p]

    def teardown(self):
        for seq in self.seqs:
            self.bm.free(seq)
        assert_no_leaks(self.bm)


BlockManagerMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_block_manager_random_operations = BlockManagerMachine.TestCase


def test_token_array_follows_appends_truncations_and_forks():
    seq = Sequence(0, [5, 6, 7])
    assert seq.token_array().tolist() == [5, 6, 7]
    for token in range(20):                     # grows its buffer several times
        seq.append_token(100 + token)
        assert seq.token_array().tolist() == seq.token_ids
    seq.truncate_tokens(5)
    seq.append_tokens([1, 2])                   # same length as an earlier state, other ids
    assert seq.token_array().tolist() == [5, 6, 7, 100, 101, 1, 2]
    child = seq.fork(1)
    child.append_token(9)
    assert child.token_array().tolist() == [5, 6, 7, 100, 101, 1, 2, 9]
    assert seq.token_array().tolist() == [5, 6, 7, 100, 101, 1, 2]
