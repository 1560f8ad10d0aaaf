"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, copy-on-write, prefix caching.

Pure Python over token ids; the model runner owns the tensors and only applies what this
module decides (which slot a token goes to, which blocks to copy).

A block that becomes full of computed tokens is registered under a hash chained over every
block before it, so a later sequence with the same leading tokens reuses it instead of
recomputing.  A freed registered block keeps its hash on the free list and can be revived by
such a hit until it is reused; blocks without a hash are reused first, then registered ones
in least-recently-freed order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from leapgen.engine.sequence import Sequence


def beam_search_blocks(num_prompt_tokens: int, max_tokens: int, num_beams: int, block_size: int) -> int:
    """Blocks a beam search holds at its widest: the prompt's full blocks shared by every beam, the rest (the
    prompt's last partial block, copied on write, and the generated tokens) each beam's own."""
    own = -(-(num_prompt_tokens % block_size + max_tokens) // block_size)
    return num_prompt_tokens // block_size + num_beams * own


def beam_search_room(num_prompt_tokens: int, num_beams: int, block_size: int, capacity_tokens: int) -> int:
    """The most max_tokens a beam search over the prompt fits in a cache of `capacity_tokens` (see
    `beam_search_blocks`); below 1 where not even one token does."""
    own = (capacity_tokens // block_size - num_prompt_tokens // block_size) // num_beams
    return own * block_size - num_prompt_tokens % block_size


class OutOfBlocksError(RuntimeError):
    """An allocation was attempted without checking the matching `can_*` predicate first."""


@dataclass
class Block:
    """One KV-cache block: how many sequences hold it and, once full and computed, its content hash."""

    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()     # content of a registered block, compared on every hit


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of one full block's tokens chained to the hash of the block before it (None for the first)."""
    return hash((parent_hash, token_ids))


class BlockManager:
    """Owns `num_blocks` KV blocks of `block_size` token slots each and hands them to sequences."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BlockManager.{name} must be an int >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # free block ids in reuse order: unregistered ones at the front, registered ones behind in LRU order
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}   # chained hash -> block id

    # ---- queries ----------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (registered ones among them can still be revived by a prefix hit)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks, held or free."""
        return len(self._cached)

    @property
    def capacity_tokens(self) -> int:
        """Token slots in the whole cache."""
        return self.num_blocks * self.block_size

    def free_block_ids(self) -> list[int]:
        """Free block ids in the order they will be reused."""
        return list(self._free)

    def lookup(self, block_hash: int) -> int | None:
        """The block registered under `block_hash`, or None."""
        return self._cached.get(block_hash)

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def slot(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (`block_id * block_size + offset`) of token `position` of `seq`."""
        if not 0 <= position < len(seq.block_table) * self.block_size:
            raise ValueError(f"sequence {seq.seq_id}: position {position} is outside its "
                             f"{len(seq.block_table)} blocks of {self.block_size} slots")
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Flat cache slots of tokens `start .. end - 1` of `seq`."""
        return [self.slot(seq, p) for p in range(start, end)]

    # ---- admission ----------------------------------------------------------------------------

    def num_blocks_to_allocate(self, seq: Sequence) -> int:
        """Free blocks `allocate(seq)` would take (prefix hits on held blocks cost none)."""
        return self._blocks_to_allocate(seq, self._prefix_hits(seq)[0])

    def _blocks_to_allocate(self, seq: Sequence, hits: list[int]) -> int:
        return self.num_blocks_for(seq.num_tokens) - sum(1 for b in hits if self.blocks[b].ref_count > 0)

    def can_allocate(self, seq: Sequence) -> bool:
        """True when `allocate(seq)` would succeed."""
        return self.num_blocks_to_allocate(seq) <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give a sequence without blocks blocks for all its tokens, reusing cached prefix blocks.

        Sets `seq.num_computed_tokens` to the cached length, which always leaves at least the
        last token to compute so the step that follows produces logits.
        """
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks {seq.block_table}; free it before allocating")
        hits, hashes = self._prefix_hits(seq)
        needed = self._blocks_to_allocate(seq, hits)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"sequence {seq.seq_id} needs {needed} free blocks, {self.num_free_blocks} are free")
        for block_id in hits:
            self._hold(block_id)
        fresh = [self._take_free() for _ in range(self.num_blocks_for(seq.num_tokens) - len(hits))]
        seq.block_table = hits + fresh
        seq.block_hashes = hashes
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size

    def _prefix_hits(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Registered blocks holding `seq`'s leading full blocks, and their hashes; never covers the last token."""
        hits: list[int] = []
        hashes: list[int] = []
        # prompt logprobs need every prompt position computed, so such requests take no hits
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return hits, hashes
        parent = None
        for i in range((seq.num_tokens - 1) // self.block_size):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            parent = chain_hash(parent, tokens)
            block_id = self._cached.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            hashes.append(parent)
        return hits, hashes

    # ---- growth ----------------------------------------------------------------------------------

    def _write_range(self, seq: Sequence, num_new_tokens: int) -> tuple[int, int]:
        """Indices `[first, last]` of the blocks the next `num_new_tokens` computed tokens land in."""
        if not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise ValueError(f"sequence {seq.seq_id}: num_new_tokens must be an int >= 1, got {num_new_tokens!r}")
        start = seq.num_computed_tokens
        return start // self.block_size, (start + num_new_tokens - 1) // self.block_size

    def num_blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        """Free blocks `append_slots(seq, num_new_tokens)` would take: new ones plus copy-on-write copies."""
        first, last = self._write_range(seq, num_new_tokens)
        table, blocks = seq.block_table, self.blocks
        needed = max(0, last + 1 - len(table))
        for i in range(first, min(last + 1, len(table))):
            if blocks[table[i]].ref_count > 1:
                needed += 1
        return needed

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """True when `append_slots(seq, num_new_tokens)` would succeed."""
        return self.num_blocks_to_append(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make the slots of tokens `num_computed_tokens .. + num_new_tokens - 1` exist and belong to `seq` alone.

        The range may run past the current tokens (room reserved for draft tokens).  Returns the
        copy-on-write `(src_block, dst_block)` pairs the runner must copy in the KV tensors
        before the step writes into them.
        """
        needed = self.num_blocks_to_append(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"sequence {seq.seq_id} needs {needed} free blocks for {num_new_tokens} "
                                   f"new tokens, {self.num_free_blocks} are free")
        first, last = self._write_range(seq, num_new_tokens)
        table = seq.block_table
        copies = []
        for i in range(first, min(last + 1, len(table))):
            block = self.blocks[table[i]]
            if block.ref_count > 1:
                table[i] = self._take_free()
                block.ref_count -= 1
                copies.append((block.block_id, table[i]))
            elif block.hash is not None:
                # kept registered through a truncate while shared; now its content is about to change
                self._unregister(block)
        table.extend(self._take_free() for _ in range(last + 1 - len(table)))
        return copies

    def commit(self, seq: Sequence) -> None:
        """Register the blocks `seq`'s computed tokens have filled since its last commit (call after each step)."""
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for i in range(len(seq.block_hashes), num_full):
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            block_hash = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            seq.block_hashes.append(block_hash)
            block = self.blocks[seq.block_table[i]]
            # an equal block registered earlier (same prefix computed in the same step) stays the cached one
            if self.enable_prefix_caching and block.hash is None and block_hash not in self._cached:
                block.hash, block.token_ids = block_hash, tokens
                self._cached[block_hash] = block.block_id

    # ---- sharing and release -------------------------------------------------------------------

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Let `child` (no blocks yet, same computed tokens) share all of `parent`'s blocks; writes copy on write."""
        if child.block_table:
            raise ValueError(f"fork: child sequence {child.seq_id} already holds blocks {child.block_table}")
        n = parent.num_computed_tokens
        if child.token_ids[:n] != parent.token_ids[:n]:
            raise ValueError(f"fork: child sequence {child.seq_id} does not start with the {n} computed tokens "
                             f"of parent sequence {parent.seq_id}")
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = n

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Roll `seq` back to its first `num_tokens` tokens (never into the prompt), releasing blocks past them."""
        if not isinstance(num_tokens, int) or not seq.num_prompt_tokens <= num_tokens <= seq.num_tokens:
            raise ValueError(f"sequence {seq.seq_id}: cannot truncate to {num_tokens!r} tokens; must be between "
                             f"the prompt length {seq.num_prompt_tokens} and the current length {seq.num_tokens}")
        seq.truncate_tokens(num_tokens)
        seq.num_computed_tokens = min(seq.num_computed_tokens, num_tokens)
        del seq.block_hashes[seq.num_computed_tokens // self.block_size:]
        keep = self.num_blocks_for(num_tokens)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]
        if num_tokens % self.block_size and keep <= len(seq.block_table):
            # a private block no longer full will be overwritten: its hash must stop matching; a shared
            # one is still right for its other holders and gets copied on write instead
            last = self.blocks[seq.block_table[keep - 1]]
            if last.ref_count == 1 and last.hash is not None:
                self._unregister(last)

    def free(self, seq: Sequence) -> None:
        """Release all of `seq`'s blocks and mark nothing of it computed; registered blocks stay revivable."""
        # the tail goes first so the prefix, most likely to be hit again, is evicted last
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> int:
        """Forget every cached block no sequence holds, so later prompts find no prefix hits among them;
        returns how many were forgotten.  Blocks that running sequences hold stay registered."""
        forgotten = [block_id for block_id in self._free if self.blocks[block_id].hash is not None]
        for block_id in forgotten:
            self._unregister(self.blocks[block_id])
            self._free.move_to_end(block_id, last=False)
        return len(forgotten)

    # ---- internals -------------------------------------------------------------------------------

    def _take_free(self) -> int:
        """Pop the next free block for new content, evicting its old registration."""
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            self._unregister(block)
        block.ref_count = 1
        return block_id

    def _hold(self, block_id: int) -> None:
        """One more holder of a block found by a prefix hit; revives it if it was free."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        """One holder fewer; the last one puts the block on the free list."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.hash is None:
                self._free.move_to_end(block_id, last=False)

    def _unregister(self, block: Block) -> None:
        """Forget a held or just-evicted block's hash."""
        del self._cached[block.hash]
        block.hash, block.token_ids = None, ()
