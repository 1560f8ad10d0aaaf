"""One request as the engine sees it: token ids, how many already have K/V in the cache, and where."""

from __future__ import annotations

import operator
from enum import Enum, auto

import numpy as np

from leapgen.decoding.sampling_params import SamplingParams


class SequenceStatus(Enum):
    """Where a sequence is in the scheduler's life cycle."""

    WAITING = auto()    # queued (new or preempted); holds no KV blocks
    RUNNING = auto()    # admitted; holds KV blocks
    FINISHED = auto()


def _token_id(value, where: str) -> int:
    """`value` as a token id (an int >= 0, numpy ints accepted), else ValueError naming `where`."""
    try:
        token = operator.index(value)
    except TypeError:
        raise ValueError(f"{where} must be an int token id, got {value!r}") from None
    if token < 0 or isinstance(value, bool):
        raise ValueError(f"{where} must be a token id >= 0, got {value!r}")
    return token


class Sequence:
    """Prompt plus generated token ids, with the bookkeeping the block manager and scheduler keep on it.

    `num_computed_tokens` counts the leading tokens whose K/V are in the cache; the rest
    (`num_uncomputed`) are what the next step computes.  `block_table[i]` holds tokens
    `[i * block_size, (i + 1) * block_size)`; `block_hashes[i]` is the chained hash of block `i`
    once it is full and computed.
    """

    def __init__(self, seq_id: int, prompt_token_ids: list[int], params: SamplingParams | None = None):
        if not isinstance(seq_id, int) or isinstance(seq_id, bool):
            raise ValueError(f"Sequence.seq_id must be an int, got {seq_id!r}")
        tokens = [_token_id(t, f"sequence {seq_id}: prompt token {i}") for i, t in enumerate(prompt_token_ids)]
        if not tokens:
            raise ValueError(f"sequence {seq_id}: the prompt is empty; at least one token is needed to produce logits")
        self.seq_id = seq_id
        self.params = params if params is not None else SamplingParams()
        self.token_ids: list[int] = tokens
        # token_ids as int64, grown a few ids a step: what the sampler's penalties read, without converting
        # the whole history from Python ints at every step.  Its first `_mirrored` ids are current.
        self._array = np.empty(0, dtype=np.int64)
        self._mirrored = 0
        self.num_prompt_tokens = len(tokens)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0          # prompt tokens served by the prefix cache at the last admission
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        # the sequence it was forked from, first of all (its own id if none): a request's beams share it
        self.group_id = seq_id

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, {self.status.name}, tokens={self.num_tokens} "
                f"(prompt {self.num_prompt_tokens}, computed {self.num_computed_tokens}), blocks={self.block_table})")

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (a copy)."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def prompt_token_ids(self) -> list[int]:
        """The prompt tokens (a copy)."""
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose K/V are not in the cache yet: what the next step for this sequence computes."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def last_token_id(self) -> int:
        """The most recent token."""
        return self.token_ids[-1]

    @property
    def max_tokens(self) -> int:
        """The most tokens this request may generate."""
        return self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        """True once the scheduler has retired the sequence."""
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        """Append one generated (or forced / draft) token; its K/V are computed by a later step."""
        self.token_ids.append(_token_id(token_id, f"sequence {self.seq_id}: appended token"))

    def append_tokens(self, token_ids: list[int]) -> None:
        """Append several tokens at once (a forced-token jump or speculative draft)."""
        where = f"sequence {self.seq_id}: appended token"
        self.token_ids.extend(_token_id(t, f"{where} {i}") for i, t in enumerate(token_ids))

    def truncate_tokens(self, num_tokens: int) -> None:
        """Drop every token after the first `num_tokens` (a rejected draft, a rollback)."""
        del self.token_ids[num_tokens:]
        self._mirrored = min(self._mirrored, num_tokens)

    def token_array(self) -> np.ndarray:
        """`token_ids` as an int64 array; the view stays valid until the tokens change."""
        count = len(self.token_ids)
        if count > self._array.size:
            grown = np.empty(max(count, 2 * self._array.size), dtype=np.int64)
            grown[:self._mirrored] = self._array[:self._mirrored]
            self._array = grown
        if self._mirrored < count:
            self._array[self._mirrored:count] = self.token_ids[self._mirrored:count]
            self._mirrored = count
        return self._array[:count]

    def fork(self, seq_id: int) -> Sequence:
        """A new WAITING sequence with the same tokens and params and no blocks (`BlockManager.fork` shares them)."""
        child = Sequence(seq_id, self.prompt_token_ids, self.params)
        child.token_ids = list(self.token_ids)
        child.group_id = self.group_id
        return child
