"""Scheduler: continuous batching, chunked prefill, preemption + recompute, multi-token steps, forks.

A fake runner stands in for the model: its "KV cache" stores, in each slot, a key naming the
whole token prefix ending there, written and read only through block tables, slots and
copy-on-write pairs; the "model" turns the key at the last position into the next token.  So
every output token is a pure function of the prefix, a reference stream can be computed without
the engine, and any wrong slot, missed copy or bad prefix hit changes the stream or trips an
assertion.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.block_manager import BlockManager
from leapgen.engine.scheduler import Scheduler, SchedulerOutput
from leapgen.engine.sequence import Sequence, SequenceStatus
from test_engine_block_manager import prefix_keys

VOCAB = 1000
FORK_ID = 10_000       # children forked by the fake runner get the parent's id plus this


def forced_after(token: int, remaining: int) -> list[int]:
    """A stand-in grammar: after a token divisible by 7, two more tokens are forced (a jump)."""
    return [(token + 1) % VOCAB, (token + 2) % VOCAB][:remaining] if token % 7 == 0 else []


def reference_stream(prompt: list[int], max_tokens: int, jumps: bool = False) -> list[int]:
    """What greedy decoding must produce, computed without the engine."""
    tokens = list(prompt)
    while len(tokens) - len(prompt) < max_tokens:
        token = prefix_keys(tokens)[-1] % VOCAB
        tokens.append(token)
        if jumps:
            tokens.extend(forced_after(token, max_tokens - (len(tokens) - len(prompt))))
    return tokens[len(prompt):]


class FakeRunner:
    """Runs scheduler steps the way the real step loop does, against the fake KV cache."""

    def __init__(self, scheduler: Scheduler, jumps: bool = False, num_draft_tokens: int = 0, forks: bool = False):
        self.scheduler = scheduler
        self.bm = scheduler.block_manager
        self.kv: list[int | None] = [None] * self.bm.capacity_tokens
        self.jumps = jumps
        self.num_draft_tokens = num_draft_tokens
        self.drafts: dict[int, int] = {}        # seq_id -> draft tokens awaiting verification
        self.forks = forks
        self.children: list[Sequence] = []
        self.outputs: list[SchedulerOutput] = []
        self.log: list[tuple[Sequence, int, int]] = []     # (seq, first position, num_new) of every entry

    def step(self) -> SchedulerOutput:
        """One engine step: schedule, copy on write, write K/V of the new tokens, commit, sample."""
        out = self.scheduler.schedule()
        self.outputs.append(out)
        assert not {id(seq) for seq in out.preempted} & {id(seq) for seq, _ in out.scheduled}
        size = self.bm.block_size
        for src, dst in out.copies:
            self.kv[dst * size:(dst + 1) * size] = self.kv[src * size:(src + 1) * size]
        for seq, n in out.scheduled:
            keys = prefix_keys(seq.token_ids)
            start = seq.num_computed_tokens
            assert 1 <= n <= seq.num_uncomputed
            self.log.append((seq, start, n))
            for p in range(start):              # the context is read back from the cache
                assert self.kv[self.bm.slot(seq, p)] == keys[p], (seq, p)
            for p in range(start, start + n):
                self.kv[self.bm.slot(seq, p)] = keys[p]
        self.scheduler.commit(out)
        for seq, _ in out.scheduled:
            if seq.status is SequenceStatus.RUNNING and seq.num_uncomputed == 0:
                self._sample(seq)
        return out

    def _model(self, seq: Sequence, position: int) -> int:
        return self.kv[self.bm.slot(seq, position)] % VOCAB

    def _sample(self, seq: Sequence) -> None:
        num_drafts = self.drafts.pop(seq.seq_id, 0)
        base = seq.num_tokens - num_drafts - 1          # the last verified token
        accepted = 0
        while accepted < num_drafts and seq.token_ids[base + 1 + accepted] == self._model(seq, base + accepted):
            accepted += 1
        token = self._model(seq, base + accepted)
        if accepted < num_drafts:
            self.bm.truncate(seq, base + 1 + accepted)
        seq.append_token(token)
        remaining = seq.max_tokens - seq.num_output_tokens
        if self.jumps:
            seq.append_tokens(forced_after(token, remaining))
            remaining = seq.max_tokens - seq.num_output_tokens
        if remaining == 0:
            self.scheduler.finish(seq, "length")
        elif self.forks and seq.num_output_tokens == 1 and seq.seq_id < FORK_ID and token % 3 == 0:
            # a second sample branching off after the first token, sharing everything before it
            child = self.scheduler.fork(seq, seq.seq_id + FORK_ID)
            child.token_ids[-1] = (token + 1) % VOCAB
            self.children.append(child)
        elif self.num_draft_tokens:
            drafts = self._propose(seq, min(self.num_draft_tokens, remaining - 1))
            seq.append_tokens(drafts)
            self.drafts[seq.seq_id] = len(drafts)

    @staticmethod
    def _propose(seq: Sequence, k: int) -> list[int]:
        """Drafts that are right most of the time: the true continuation with some tokens spoiled."""
        true = reference_stream(seq.token_ids, k)
        return [t if hash((seq.seq_id, seq.num_tokens, i)) % 3 else (t + 1) % VOCAB for i, t in enumerate(true)]

    def run(self, max_steps: int = 10_000) -> None:
        """Step until every request has finished, checking the block invariants after every step."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished:
                return
            out = self.step()
            assert not out.is_empty, "nothing scheduled while requests are unfinished"
            check_invariants(self.scheduler)
        raise AssertionError(f"not finished after {max_steps} steps")


def check_invariants(scheduler: Scheduler) -> None:
    """Block ownership matches the sequences: refcounts, free list, waiting ones hold nothing."""
    bm = scheduler.block_manager
    held = Counter(b for seq in scheduler.running for b in seq.block_table)
    for block in bm.blocks:
        assert block.ref_count == held[block.block_id]
    assert bm.num_free_blocks == sum(1 for b in bm.blocks if b.ref_count == 0)
    for seq in scheduler.waiting:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table and seq.num_computed_tokens == 0
    for seq in scheduler.running:
        assert seq.status is SequenceStatus.RUNNING and len(set(seq.block_table)) == len(seq.block_table)


def make_requests(specs: list[tuple[int, int]]) -> list[Sequence]:
    """Sequences with prompts of the given lengths (distinct contents) and max_tokens."""
    return [Sequence(i, [(31 * i + j) % VOCAB for j in range(length)], SamplingParams(max_tokens=m))
            for i, (length, m) in enumerate(specs)]


def run_all(seqs: list[Sequence], num_blocks: int, block_size: int = 4, max_num_seqs: int = 8,
            max_num_batched_tokens: int = 64, **runner_options) -> FakeRunner:
    scheduler = Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, max_num_batched_tokens)
    for seq in seqs:
        scheduler.add(seq)
    runner = FakeRunner(scheduler, **runner_options)
    runner.run()
    bm = scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    return runner


MIXED = [(1, 5), (17, 12), (3, 30), (40, 1), (9, 9), (25, 20), (2, 2), (33, 7),
         (12, 16), (5, 25), (28, 3), (8, 11), (19, 19), (4, 8), (36, 14), (11, 6)]


def test_mixed_requests_all_finish_with_exactly_max_tokens():
    seqs = make_requests(MIXED)
    runner = run_all(seqs, num_blocks=200)
    for seq in seqs:
        assert seq.is_finished and seq.finish_reason == "length"
        assert seq.num_output_tokens == seq.max_tokens
        assert seq.output_token_ids == reference_stream(seq.prompt_token_ids, seq.max_tokens)
    assert runner.scheduler.num_preemptions == 0
    assert any(out.is_decode and len(out.scheduled) > 1 for out in runner.outputs)   # batched decode
    for out in runner.outputs:
        assert out.num_batched_tokens <= 64 and len(out.scheduled) <= 8


def test_memory_for_two_sequences_preempts_and_recomputes_identically():
    specs = [(6 + i % 5, 20 + 3 * (i % 4)) for i in range(16)]
    ample = make_requests(specs)
    run_all(ample, num_blocks=200)
    # the longest request needs 10 + 29 = 39 tokens = 10 blocks of 4: 20 blocks hold about two
    tight = make_requests(specs)
    runner = run_all(tight, num_blocks=20)
    assert runner.scheduler.num_preemptions > 0
    assert any(out.preempted for out in runner.outputs)
    for a, b in zip(ample, tight):
        assert b.num_output_tokens == b.max_tokens
        assert a.output_token_ids == b.output_token_ids


def test_chunked_prefill_splits_a_long_prompt_while_others_decode():
    long, short = make_requests([(100, 3), (5, 10)])
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=16)
    scheduler.add(short)
    runner = FakeRunner(scheduler)
    runner.step()                          # the short prompt is admitted first
    scheduler.add(long)
    chunks = []
    while long.num_output_tokens == 0:
        out = runner.step()
        assert out.num_batched_tokens <= 16 and not out.is_decode
        assert out.scheduled[0] == (short, 1)          # decoding goes on beside the chunks
        chunks += [(seq.num_computed_tokens - n, n) for seq, n in out.scheduled if seq is long]
    assert [n for _, n in chunks] == [15] * 6 + [10]
    assert [start for start, _ in chunks] == list(range(0, 100, 15))
    runner.run()
    assert long.output_token_ids == reference_stream(long.prompt_token_ids, 3)
    assert short.output_token_ids == reference_stream(short.prompt_token_ids, 10)


def test_decodes_chunks_and_admissions_share_a_step():
    seqs = make_requests([(10, 2), (10, 2), (10, 2)])
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=16)
    for seq in seqs:
        scheduler.add(seq)
    runner = FakeRunner(scheduler)
    out = runner.step()
    assert [(s.seq_id, n) for s, n in out.scheduled] == [(0, 10), (1, 6)]
    out = runner.step()                    # a decode, the rest of the chunk, then the next admission
    assert [(s.seq_id, n) for s, n in out.scheduled] == [(0, 1), (1, 4), (2, 10)]
    assert not out.is_decode
    runner.run()
    for seq in seqs:
        assert seq.output_token_ids == reference_stream(seq.prompt_token_ids, 2)
    assert runner.outputs[-1].is_decode


def test_shared_prefix_is_served_from_the_cache():
    system = list(range(500, 524))         # 24 shared tokens = 6 blocks of 4
    first = Sequence(0, system + [1, 2, 3], SamplingParams(max_tokens=4))
    second = Sequence(1, system + [7, 8], SamplingParams(max_tokens=4))
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64)
    runner = FakeRunner(scheduler)
    scheduler.add(first)
    runner.run()
    scheduler.add(second)
    out = runner.step()
    assert out.scheduled == [(second, 2)] and second.num_cached_tokens == 24
    runner.run()
    assert second.output_token_ids == reference_stream(second.prompt_token_ids, 4)
    # prompt logprobs need every prompt position computed: no hits for such a request
    third = Sequence(2, system + [7, 8], SamplingParams(max_tokens=4, prompt_logprobs=0))
    scheduler.add(third)
    out = runner.step()
    assert out.scheduled == [(third, 26)] and third.num_cached_tokens == 0
    runner.run()
    assert third.output_token_ids == second.output_token_ids


def test_forced_token_jumps_run_as_multi_token_steps():
    specs = [(5, 20), (9, 15), (3, 25), (14, 10)]
    seqs = make_requests(specs)
    runner = run_all(seqs, num_blocks=100, jumps=True)
    for seq in seqs:
        assert seq.output_token_ids == reference_stream(seq.prompt_token_ids, seq.max_tokens, jumps=True)
    multi = [n for seq, start, n in runner.log if n > 1 and start >= seq.num_prompt_tokens]
    assert multi, "some jump should have been computed in one multi-token step"
    # jumps save forward passes: fewer steps than one per generated token of the longest request
    assert len(runner.outputs) < max(seq.max_tokens for seq in seqs)
    # under memory pressure too
    tight = make_requests(specs)
    runner = run_all(tight, num_blocks=12, jumps=True)
    assert runner.scheduler.num_preemptions > 0
    assert [s.output_token_ids for s in tight] == [s.output_token_ids for s in seqs]


@pytest.mark.parametrize("num_blocks", [100, 14])
def test_speculative_verification_with_truncation_matches_greedy(num_blocks):
    seqs = make_requests([(6, 24), (11, 18), (3, 30), (8, 12)])
    runner = run_all(seqs, num_blocks=num_blocks, num_draft_tokens=4)
    for seq in seqs:
        assert seq.output_token_ids == reference_stream(seq.prompt_token_ids, seq.max_tokens)
    steps = sum(1 for out in runner.outputs if not out.is_empty)
    assert steps < sum(seq.max_tokens for seq in seqs)      # drafts were accepted


def test_forked_samples_share_the_prompt_and_copy_on_write():
    parent = make_requests([(10, 8)])[0]
    scheduler = Scheduler(BlockManager(32, 4), max_num_seqs=8, max_num_batched_tokens=64)
    scheduler.add(parent)
    runner = FakeRunner(scheduler)
    runner.step()                           # prefill: the parent gets its first token
    children = [scheduler.fork(parent, child_id) for child_id in (1, 2, 3)]
    shared = parent.block_table[:2]
    for child in children:
        assert child.block_table[:2] == shared and child.status is SequenceStatus.RUNNING
    assert scheduler.block_manager.blocks[shared[0]].ref_count == 4
    for i, child in enumerate(children):    # each sample picks another first token
        child.token_ids[-1] = (child.token_ids[-1] + i + 1) % VOCAB
    partial = parent.block_table[2]
    out = runner.step()
    assert out.is_decode and len(out.scheduled) == 4
    # the partial third block (tokens 8..10) is written by all four: three copies, the last writes in place
    assert [src for src, _ in out.copies] == [partial] * 3
    assert children[-1].block_table[2] == partial
    runner.run()
    for seq in [parent] + children:
        assert seq.num_output_tokens == 8
        first = seq.output_token_ids[0]
        assert seq.output_token_ids[1:] == reference_stream(seq.prompt_token_ids + [first], 7)
    assert len({tuple(s.output_token_ids) for s in [parent] + children}) == 4
    bm = scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_add_rejects_a_request_that_could_never_fit():
    scheduler = Scheduler(BlockManager(4, 8), max_num_seqs=2, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match=r"prompt \(20 tokens\) \+ max_tokens \(13\) = 33 tokens exceeds the KV "
                                         r"cache capacity of 32 tokens \(4 blocks x 8\)"):
        scheduler.add(Sequence(7, list(range(20)), SamplingParams(max_tokens=13)))
    scheduler.add(Sequence(8, list(range(20)), SamplingParams(max_tokens=12)))   # exactly fits
    with pytest.raises(ValueError, match="sequence id 8 is already in use"):
        scheduler.add(scheduler.waiting[0])
    with pytest.raises(ValueError, match="sequence id 8 is already in use"):
        scheduler.fork(scheduler.waiting[0], 8)
    speculative = Scheduler(BlockManager(4, 8), max_num_seqs=2, max_num_batched_tokens=16, num_lookahead_tokens=4)
    with pytest.raises(ValueError, match=r"max_tokens \(12\) \+ 4 lookahead = 36 tokens exceeds"):
        speculative.add(Sequence(9, list(range(20)), SamplingParams(max_tokens=12)))
    with pytest.raises(ValueError, match="max_num_batched_tokens must be an int >= 1"):
        Scheduler(BlockManager(4, 8), max_num_seqs=2, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(4\) must be >= max_num_seqs \(8\)"):
        Scheduler(BlockManager(4, 8), max_num_seqs=8, max_num_batched_tokens=4)


def test_finish_aborts_waiting_and_running_sequences():
    seqs = make_requests([(6, 10), (6, 10), (6, 10)])
    scheduler = Scheduler(BlockManager(32, 4), max_num_seqs=2, max_num_batched_tokens=64)
    for seq in seqs:
        scheduler.add(seq)
    runner = FakeRunner(scheduler)
    runner.step()
    assert [s.status for s in seqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]
    scheduler.finish(seqs[2], "abort")
    scheduler.finish(seqs[0], "abort")
    assert seqs[0].block_table == [] and seqs[0].finish_reason == "abort"
    with pytest.raises(ValueError, match="already finished"):
        scheduler.finish(seqs[0], "abort")
    runner.run()
    assert seqs[1].num_output_tokens == 10
    assert scheduler.block_manager.num_free_blocks == 32


def test_a_running_sequence_with_nothing_to_compute_is_left_out():
    held, other = make_requests([(4, 5), (6, 5)])
    scheduler = Scheduler(BlockManager(16, 4), max_num_seqs=4, max_num_batched_tokens=16)
    scheduler.add(held)
    scheduler.add(other)
    out = scheduler.schedule()
    scheduler.commit(out)
    other.append_token(1)                    # the step loop appends for `other` only
    out = scheduler.schedule()
    assert out.scheduled == [(other, 1)] and out.is_decode
    scheduler.commit(out)
    scheduler.finish(other, "length")
    assert scheduler.schedule().is_empty and scheduler.has_unfinished
    scheduler.finish(held, "abort")
    assert not scheduler.has_unfinished


def test_fork_of_a_waiting_sequence_queues_the_child_behind_it():
    first, second = make_requests([(4, 3), (4, 3)])
    scheduler = Scheduler(BlockManager(16, 4), max_num_seqs=4, max_num_batched_tokens=16)
    scheduler.add(first)
    scheduler.add(second)
    child = scheduler.fork(first, 5)
    assert list(scheduler.waiting) == [first, child, second] and child.block_table == []
    runner = FakeRunner(scheduler)
    runner.run()
    assert child.output_token_ids == first.output_token_ids
    with pytest.raises(ValueError, match="cannot fork finished sequence 0"):
        scheduler.fork(first, 6)


def test_max_num_seqs_bounds_the_running_batch():
    seqs = make_requests([(3, 6)] * 10)
    runner = run_all(seqs, num_blocks=100, max_num_seqs=3)
    assert max(len(out.scheduled) for out in runner.outputs) == 3


@settings(max_examples=80, deadline=None)
@given(specs=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=10),
       block_size=st.sampled_from([1, 2, 4, 16]),
       spare_blocks=st.integers(0, 30),
       max_num_seqs=st.integers(1, 6),
       extra_budget=st.integers(0, 40),
       extension=st.sampled_from(["none", "jumps", "drafts", "forks"]),
       shared_prefix=st.integers(0, 12))
def test_random_workloads_finish_with_reference_streams(specs, block_size, spare_blocks, max_num_seqs,
                                                        extra_budget, extension, shared_prefix):
    seqs = [Sequence(i, list(range(900, 900 + shared_prefix)) + [(31 * i + j) % VOCAB for j in range(length)],
                     SamplingParams(max_tokens=m)) for i, (length, m) in enumerate(specs)]
    longest = max(seq.num_prompt_tokens + seq.max_tokens for seq in seqs)
    num_blocks = -(-longest // block_size) + spare_blocks
    # the fake grammar's jumps, fake drafts and forks do not compose; each is exercised on its own
    jumps = extension == "jumps"
    runner = run_all(seqs, num_blocks, block_size, max_num_seqs, max_num_seqs + extra_budget, jumps=jumps,
                     num_draft_tokens=3 if extension == "drafts" else 0, forks=extension == "forks")
    for seq in seqs:
        assert seq.output_token_ids == reference_stream(seq.prompt_token_ids, seq.max_tokens, jumps=jumps)
    event(f"preempted: {runner.scheduler.num_preemptions > 0}")
    event(f"forked: {bool(runner.children)}")
    for child in runner.children:
        first = child.output_token_ids[0]
        assert child.num_output_tokens == child.max_tokens
        assert child.output_token_ids[1:] == reference_stream(child.prompt_token_ids + [first], child.max_tokens - 1)
