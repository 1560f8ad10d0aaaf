"""Decode steps replayed from CUDA graphs, one graph per padded batch size, recorded the first time a decode step
of that size runs.

On a GPU an eager decode step is bound by launching its kernels from Python, not by reading the weights: a random
1B Llama took 9.7 ms a step on an H200, whose memory reads those weights in 0.5 ms.  A graph launches the whole
forward pass at once.  It reads its inputs from static buffers, so each step copies its token ids, positions,
cache slots, context lengths and block tables in, pads the rows past its batch (slot -1 stores nothing, context
length 0 reads nothing), replays and hands back the first rows of the graph's output.  The block tables are as
wide as the longest sequence the model takes, so the attention kernels' grids are the same at every step;
partitions past a sequence's end exit at once.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from leapgen.engine.attention_metadata import AttentionMetadata

Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
# Records `run` (one forward pass over the static buffers) and returns (replay, output): replay() recomputes
# the pass from the buffers' current contents into `output`.
Recorder = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], None], torch.Tensor]]


class GraphRecordingError(RuntimeError):
    """Recording a decode step's graph failed (an operation the device cannot capture, say)."""


def graph_batch_sizes(max_batch: int) -> list[int]:
    """The padded batch sizes graphs are recorded for: 1, 2, 4, 8, then every multiple of 16, up to `max_batch`
    rounded up (a step pads to the next size, so its padding stays under 16 rows and under half its batch)."""
    small = [n for n in (1, 2, 4, 8) if n < max_batch]
    return small + (list(range(16, 16 * math.ceil(max_batch / 16) + 1, 16)) if max_batch > 8 else [max_batch])


class CudaGraphRecorder:
    """Records passes as CUDA graphs sharing one memory pool (one graph replays at a time)."""

    def __init__(self) -> None:
        self._pool = None

    def __call__(self, run: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        run()     # compiles the kernels and sets up the libraries' handles outside the capture
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread must avoid unsafe calls while capturing, not, say, a server's other threads
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            output = run()
        self._pool = graph.pool()
        return graph.replay, output


class DecodeGraphs:
    """Static input buffers and the graphs recorded over them, by padded batch size."""

    def __init__(self, forward: Forward, device: torch.device, max_batch: int, max_model_len: int, block_size: int,
                 record: Recorder) -> None:
        self.forward, self.record = forward, record
        self.sizes = graph_batch_sizes(max_batch)
        self.max_model_len = max_model_len
        rows, self.max_blocks = self.sizes[-1], math.ceil(max_model_len / block_size)
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.full((rows, self.max_blocks), -1, dtype=torch.int32, device=device)
        self._graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}

    @property
    def recorded(self) -> list[int]:
        """The padded batch sizes recorded so far."""
        return sorted(self._graphs)

    def fits(self, batch: int, table_width: int) -> bool:
        """Whether a decode step of `batch` rows whose widest block table has `table_width` blocks can replay."""
        return 0 < batch <= self.sizes[-1] and table_width <= self.max_blocks

    def run(self, ids: list[int], positions: list[int], slots: list[int], context_lens: list[int],
            block_tables: list[list[int]]) -> torch.Tensor:
        """Hidden states `[len(ids), hidden]` of one decode step (one token per sequence), from its graph."""
        batch = len(ids)
        size = next(n for n in self.sizes if n >= batch)
        self.input_ids[:batch].copy_(torch.tensor(ids))
        self.positions[:batch].copy_(torch.tensor(positions))
        self.slot_mapping[:batch].copy_(torch.tensor(slots))
        self.context_lens[:batch].copy_(torch.tensor(context_lens, dtype=torch.int32))
        if size > batch:
            self.slot_mapping[batch:size].fill_(-1)
            self.context_lens[batch:size].zero_()
        width = max(len(table) for table in block_tables)
        # Entries past a sequence's own blocks may hold another step's: the kernels never read past its length.
        padded = [table + [-1] * (width - len(table)) for table in block_tables]
        self.block_tables[:batch, :width].copy_(torch.tensor(padded, dtype=torch.int32))
        if size not in self._graphs:
            try:
                self._graphs[size] = self.record(self._pass(size))
            except Exception as exc:  # whatever the capture raised: the caller runs the step eagerly instead
                raise GraphRecordingError(f"recording the decode step of {size} rows as a CUDA graph failed: "
                                          f"{type(exc).__name__}: {exc}") from exc
        replay, hidden = self._graphs[size]
        replay()
        return hidden[:batch]

    def _pass(self, size: int) -> Callable[[], torch.Tensor]:
        # max_seqlen_k only feeds the sliding-window check, which max_model_len (the window at most) passes.
        metadata = AttentionMetadata(False, self.slot_mapping[:size], block_tables=self.block_tables[:size],
                                     context_lens=self.context_lens[:size], max_seqlen_k=self.max_model_len)
        return lambda: self.forward(self.input_ids[:size], self.positions[:size], metadata)
