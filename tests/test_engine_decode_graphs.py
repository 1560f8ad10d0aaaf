"""Decode steps replayed from recorded graphs give the eager engine's outputs.

On CPU the graphs are stood in for by a recorder that reruns the pass on replay: what is tested there is everything
around the capture (static buffers, padding rows, stale block-table entries, one graph per padded batch size).  On
a GPU the engine records real CUDA graphs by default, and the last test compares them with eager steps.
"""

from __future__ import annotations

import pytest
import torch

from checkpoints import build_checkpoint
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.decode_graphs import DecodeGraphs, graph_batch_sizes
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from test_engine_generate import hf_greedy, random_prompts


def record_eagerly(run):
    """A stand-in for CUDA graph capture: replay reruns the pass over the static buffers into the same output."""
    output = run()
    return (lambda: output.copy_(run())), output


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("graphs")
    return directory, build_checkpoint(directory, "llama")


def engine_on(directory, device: str, **config) -> LLMEngine:
    return LLMEngine(load_model(directory, "float32", device),
                     EngineConfig(kv_cache_memory="8MiB", block_size=4, **config))


def test_batch_sizes_pad_by_under_sixteen_rows_and_under_half_the_batch():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 5]
    assert graph_batch_sizes(17) == [1, 2, 4, 8, 16, 32]
    sizes = graph_batch_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256
    for batch in range(1, 257):
        padded = next(n for n in sizes if n >= batch)
        assert padded - batch < min(16, max(batch, 2))


def test_replayed_decode_steps_match_eager_steps_and_transformers(checkpoint):
    directory, hf = checkpoint
    # Budgets from 2 to 23 tokens: rows finish one after another, so the batch steps down through 12 sizes
    # and the static buffers keep rows (and block tables) from wider steps before.
    prompts = random_prompts(hf.config.vocab_size, [3, 17, 5, 40, 9, 1, 26, 12, 7, 33, 2, 20])
    budgets = [2 * i + 1 for i in range(1, 13)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in budgets]
    eager = engine_on(directory, "cpu").generate(prompts, params)
    engine = engine_on(directory, "cpu")
    runner = engine.runner
    runner.graphs = DecodeGraphs(runner.model, runner.device, 12, engine.loaded.max_model_len, 4, record_eagerly)
    replayed = engine.generate(prompts, params)
    assert [o.token_ids for o in replayed] == [o.token_ids for o in eager]
    assert [o.token_ids for o in replayed] == [hf_greedy(hf, p, n) for p, n in zip(prompts, budgets)]
    assert runner.graphs.recorded == [1, 2, 4, 8, 16]
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_table_wider_than_the_graphs_falls_back_to_an_eager_step(checkpoint):
    directory, hf = checkpoint
    prompts = random_prompts(hf.config.vocab_size, [3, 30])
    budgets = [20, 4]
    engine = engine_on(directory, "cpu")
    runner = engine.runner
    # Graphs sized for 16 positions: while the 30-token prompt runs, every step is eager; then the short one
    # replays alone until its 17th position needs a fifth block, and runs eagerly again.
    runner.graphs = DecodeGraphs(runner.model, runner.device, 4, 16, 4, record_eagerly)
    replays = []
    run = runner.graphs.run
    runner.graphs.run = lambda *args: replays.append(len(args[0])) or run(*args)
    outputs = engine.generate(prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in budgets])
    assert [o.token_ids for o in outputs] == [hf_greedy(hf, p, n) for p, n in zip(prompts, budgets)]
    assert replays == [1] * 10       # the short sequence's positions 6..15: its 4th to 13th generated tokens in
    assert runner.graphs.recorded == [1]


def test_a_failed_recording_turns_graphs_off_with_a_warning_and_the_step_runs_eagerly(checkpoint):
    directory, hf = checkpoint
    prompts = random_prompts(hf.config.vocab_size, [3, 17])

    def refuse(run):
        raise RuntimeError("operation not permitted when stream is capturing")

    engine = engine_on(directory, "cpu")
    runner = engine.runner
    runner.graphs = DecodeGraphs(runner.model, runner.device, 4, engine.loaded.max_model_len, 4, refuse)
    with pytest.warns(RuntimeWarning, match="recording the decode step of 2 rows as a CUDA graph failed: "
                                            "RuntimeError: operation not permitted"):
        outputs = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in outputs] == [hf_greedy(hf, p, 6) for p in prompts]
    assert runner.graphs is None and all(o.finish_reason == "length" for o in outputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graphs_give_the_eager_outputs(checkpoint):
    directory, hf = checkpoint
    prompts = random_prompts(hf.config.vocab_size, [3, 17, 5, 40, 9, 1])
    params = [SamplingParams(max_tokens=4 + 3 * i, ignore_eos=True) for i in range(6)]
    eager = engine_on(directory, "cuda", cuda_graphs=False)
    graphs = engine_on(directory, "cuda")
    assert eager.runner.graphs is None and graphs.runner.graphs is not None
    expected = [o.token_ids for o in eager.generate(prompts, params)]
    assert [o.token_ids for o in graphs.generate(prompts, params)] == expected
    assert [o.token_ids for o in graphs.generate(prompts, params)] == expected      # replaying recorded graphs
    assert graphs.runner.graphs.recorded == [1, 2, 4, 8]
