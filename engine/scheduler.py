"""Continuous batching: which sequences run in the next step, and how many tokens each computes.

Policy (one screen; nano-vllm's structure with vLLM-v1-style mixed steps and chunked prefill):
- every running sequence computes its uncomputed tokens, oldest first: one for a plain decode, a
  prompt chunk, a forced-token jump or draft tokens to verify all in the same step, so a jump
  never stalls the sequences that are simply decoding;
- waiting sequences are admitted behind them with what is left of `max_num_batched_tokens`;
- a prompt longer than its share of the budget is cut into chunks over several steps; a chunk
  leaves one token of budget for each running sequence behind it, so decodes never starve;
- when a running sequence cannot get a block, the most recently admitted running sequence is
  preempted: its blocks are freed (registered ones stay revivable through the prefix cache) and it
  goes back to the front of the waiting queue with all its tokens, to be recomputed later;
- a request's beams (`Sequence.group_id`) step together, so they come back together: a beam
  preempted sends its running siblings after it at the next step (they would only hold their blocks,
  waiting), and a request's waiting beams stand together in the queue, so that the request at its
  head is back, one beam a step (the later ones sharing the prompt blocks the first computed),
  before another's start.  Two requests' beams each part running, part waiting for the blocks the
  other's held, stalled the engine for good.  Beams that cannot all be back with nothing else running
  are `unfit`: their request fails instead.
A step whose entries are all single tokens past their prompts is a decode step (`is_decode`),
which the runner sends down the paged-decode path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from leapgen.engine.block_manager import BlockManager, beam_search_blocks
from leapgen.engine.sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    """What the next step computes.

    `scheduled`: `(seq, num_new_tokens)` in batch order; each computes tokens
    `seq.num_computed_tokens .. + num_new_tokens - 1`.  `is_decode`: every entry has one new
    token past its prompt.  `copies`: copy-on-write `(src_block, dst_block)` pairs to apply to
    the KV tensors before the step.  `preempted`: sequences sent back to the waiting queue.
    `unfit`: the sequences of a request that cannot fit the cache with nothing else running (its
    beams: those back and the next); the caller must finish them.
    """

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    is_decode: bool = False
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    unfit: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed by the step."""
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when nothing was scheduled."""
        return not self.scheduled


class Scheduler:
    """Owns the waiting queue and the running batch; see the module docstring for the policy."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 num_lookahead_tokens: int = 0):
        for name, value, minimum in (("max_num_seqs", max_num_seqs, 1),
                                     ("max_num_batched_tokens", max_num_batched_tokens, 1),
                                     ("num_lookahead_tokens", num_lookahead_tokens, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"Scheduler.{name} must be an int >= {minimum}, got {value!r}")
        if max_num_batched_tokens < max_num_seqs:
            # else a full decode step would not fit the token budget and the last sequences would starve
            raise ValueError(f"Scheduler.max_num_batched_tokens ({max_num_batched_tokens}) must be >= "
                             f"max_num_seqs ({max_num_seqs})")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # tokens a sequence may hold beyond prompt + max_tokens (speculative drafts awaiting verification)
        self.num_lookahead_tokens = num_lookahead_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []      # in admission order: the last one is preempted first
        self._seq_ids: set[int] = set()          # of unfinished sequences
        self.num_preemptions = 0

    @property
    def has_unfinished(self) -> bool:
        """True while some sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence; ValueError if it could never fit in the cache even alone."""
        if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id} must be new (WAITING, no blocks) to be added, got {seq!r}")
        self._check_new_id(seq.seq_id)
        bm = self.block_manager
        need = seq.num_prompt_tokens + seq.max_tokens + self.num_lookahead_tokens
        if need > bm.capacity_tokens:
            lookahead = f" + {self.num_lookahead_tokens} lookahead" if self.num_lookahead_tokens else ""
            raise ValueError(f"sequence {seq.seq_id}: prompt ({seq.num_prompt_tokens} tokens) + max_tokens "
                             f"({seq.max_tokens}){lookahead} = {need} tokens exceeds the KV cache capacity of "
                             f"{bm.capacity_tokens} tokens ({bm.num_blocks} blocks x {bm.block_size})")
        beams = seq.params.num_beams
        blocks = beam_search_blocks(seq.num_prompt_tokens, seq.max_tokens, beams, bm.block_size) if beams > 1 else 0
        if blocks > bm.num_blocks:
            raise ValueError(f"sequence {seq.seq_id}: {beams} beams of prompt ({seq.num_prompt_tokens} tokens) + "
                             f"max_tokens ({seq.max_tokens}) need up to {blocks} blocks of the KV cache, which holds "
                             f"{bm.num_blocks} ({bm.block_size} tokens each)")
        self.waiting.append(seq)
        self._seq_ids.add(seq.seq_id)

    def fork(self, parent: Sequence, child_seq_id: int) -> Sequence:
        """A copy of `parent` (beams, n>1 samples) sharing its blocks; call it after `commit`.

        Forks join the running batch even past `max_num_seqs` (a beam group must stay whole);
        admissions then wait until the batch is back under the limit.
        """
        self._check_new_id(child_seq_id)
        child = parent.fork(child_seq_id)
        if parent.status is SequenceStatus.RUNNING:
            self.block_manager.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.running.append(child)          # admitted now: among the first to be preempted
        elif parent.status is SequenceStatus.WAITING:
            self.waiting.insert(self.waiting.index(parent) + 1, child)
        else:
            raise ValueError(f"cannot fork finished sequence {parent.seq_id}")
        self._seq_ids.add(child_seq_id)
        return child

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a waiting or running sequence (finished or aborted) and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            raise ValueError(f"sequence {seq.seq_id} is already finished ({seq.finish_reason})")
        self.block_manager.free(seq)
        self._seq_ids.discard(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def schedule(self) -> SchedulerOutput:
        """Pick the next step (see the module docstring).

        Empty only when every running sequence is fully computed (the step loop appended no
        token) and nothing can be admitted; then, where nothing else runs, the request at the head of
        the queue is `unfit`.
        """
        out = SchedulerOutput()
        self._regroup(out)
        budget = self.max_num_batched_tokens
        behind = sum(1 for seq in self.running if seq.num_uncomputed)    # running ones still to schedule
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING or not seq.num_uncomputed:
                continue       # preempted by this loop, or the step loop appended no token for it
            behind -= 1
            n = min(seq.num_uncomputed, max(1, budget - behind))
            if self._reserve(seq, n, out):
                out.scheduled.append((seq, n))
                budget -= n
        # a step that had to preempt has no memory to spare: admitting now would only churn
        while budget > 0 and not out.preempted and self._can_admit():
            budget = self._admit(out, budget)
        if not out.scheduled and self.waiting and not out.preempted:
            head = self.waiting[0].group_id
            if all(seq.group_id == head for seq in self.running):    # (its beams back so far, waiting for the rest)
                # nothing else runs to free blocks: the head comes in if its blocks are free at all, else never
                if self._can_admit(reserve=False):
                    self._admit(out, budget)
                else:
                    out.unfit = [seq for seq in self.running + list(self.waiting) if seq.group_id == head]
        out.is_decode = bool(out.scheduled) and all(
            n == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens for seq, n in out.scheduled)
        return out

    def commit(self, out: SchedulerOutput) -> None:
        """After the forward pass: mark the scheduled tokens computed and register newly full blocks."""
        for seq, n in out.scheduled:
            if seq.status is not SequenceStatus.RUNNING:     # finished meanwhile
                continue
            if n > seq.num_uncomputed:
                raise ValueError(f"sequence {seq.seq_id}: committing {n} tokens but only {seq.num_uncomputed} "
                                 "are uncomputed (was it truncated before commit?)")
            seq.num_computed_tokens += n
            self.block_manager.commit(seq)

    def _check_new_id(self, seq_id: int) -> None:
        if seq_id in self._seq_ids:
            raise ValueError(f"sequence id {seq_id} is already in use by an unfinished sequence")

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        """Admit the head of the waiting queue into `out` within `budget` tokens; the budget left."""
        seq = self.waiting.popleft()
        self.block_manager.allocate(seq)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        n = min(seq.num_uncomputed, budget)
        out.scheduled.append((seq, n))
        return budget - n

    def _can_admit(self, reserve: bool = True) -> bool:
        """True when the head of the waiting queue fits now, keeping the blocks running ones need next (with
        `reserve`)."""
        if not self.waiting:
            return False
        head = self.waiting[0]
        if len(self.running) >= self.max_num_seqs and not (
                head.params.num_beams > 1 and any(seq.group_id == head.group_id for seq in self.running)):
            return False    # (a request's beams coming back join their siblings past the limit, as forks do)
        bm = self.block_manager
        # running sequences whose blocks are full need a new block for their next token; admitting
        # into those blocks would only force a preemption right after
        kept = sum(1 for seq in self.running if seq.num_tokens >= len(seq.block_table) * bm.block_size)
        return bm.num_blocks_to_allocate(head) + (kept if reserve else 0) <= bm.num_free_blocks

    def _regroup(self, out: SchedulerOutput) -> None:
        """Preempt the running beams whose siblings wait, but those of the request at the head of the queue
        (coming back), and stand each request's waiting beams together (see the module docstring)."""
        groups = {seq.group_id for seq in self.waiting if seq.params.num_beams > 1}
        if not groups:
            return
        back = self.waiting[0].group_id
        for seq in reversed(self.running):
            if seq.params.num_beams > 1 and seq.group_id in groups and seq.group_id != back:
                self._preempt(seq, out)
        # (preempted one by one to the front, between other requests' beams); the one coming back stays first
        first: dict[int, int] = {}
        for index, seq in enumerate(self.waiting):
            first.setdefault(seq.group_id, index)
        self.waiting = deque(sorted(self.waiting, key=lambda seq: (seq.group_id != back, first[seq.group_id])))

    def _reserve(self, seq: Sequence, n: int, out: SchedulerOutput) -> bool:
        """Give `seq` slots for its next `n` tokens, preempting from the back; False if `seq` itself was preempted."""
        while not self.block_manager.can_append(seq, n):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        out.copies.extend(self.block_manager.append_slots(seq, n))
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1
