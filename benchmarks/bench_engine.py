"""leapgen's engine vs transformers.generate() on the same weights: output tokens/s, batch 1 and batch 32.

Both run greedy with eos disabled, so each produces exactly `--max-tokens` per prompt.  transformers gets
the batch left-padded (its standard batched generate); leapgen gets the prompts as they are (continuous
batching, paged cache).  Repeats are interleaved in one process and medians reported.

    python benchmarks/bench_engine.py [--model PATH] [--repeats 3] [--max-tokens 64] [--batches 1 32]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

import leapgen
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model

PASSAGE = ("The river wound through the valley, past orchards and stone bridges, carrying the melted snow of the "
           "mountains towards the distant sea. Travellers who followed it spoke of markets, festivals and quiet "
           "villages where the evenings were long and the bread was warm. ")


def mixed_prompts(tokenizer, batch: int, seed: int = 0) -> list[list[int]]:
    """`batch` prompts of very different lengths (8 to ~400 tokens), cut from one long passage."""
    ids = tokenizer.encode(PASSAGE * 12)
    generator = torch.Generator().manual_seed(seed)
    if batch == 1:
        return [ids[:128]]
    lengths = torch.randint(8, 400, (batch,), generator=generator).tolist()
    return [ids[i % 17: i % 17 + n] for i, n in enumerate(lengths)]


def run_leapgen(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.token_ids) for o in outputs)


@torch.inference_mode()
def run_transformers(model, pad_id: int, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                         do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - width) * len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF checkpoint dir or .gguf (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()

    path = convert_gguf(default_model_path()) if args.model is None else args.model
    if str(path).endswith(".gguf"):
        path = convert_gguf(path)
    loaded = load_model(path, "float32")
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory="1GiB", max_num_batched_tokens=4096))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0

    rows = []
    for batch in args.batches:
        prompts = mixed_prompts(loaded.tokenizer, batch)
        run_leapgen(engine, prompts, 4)                      # warm-up both paths
        run_transformers(hf, pad_id, prompts, 4)
        ours, theirs = [], []
        for _ in range(args.repeats):                        # interleaved repeats, medians
            seconds, tokens = run_leapgen(engine, prompts, args.max_tokens)
            ours.append(tokens / seconds)
            seconds, tokens = run_transformers(hf, pad_id, prompts, args.max_tokens)
            theirs.append(tokens / seconds)
        ours_tps, theirs_tps = statistics.median(ours), statistics.median(theirs)
        lengths = [len(p) for p in prompts]
        rows.append((batch, f"{min(lengths)}-{max(lengths)}", ours_tps, theirs_tps, ours_tps / theirs_tps))

    print(f"model: {path}  fp32  torch {torch.__version__}  transformers {transformers.__version__}  "
          f"leapgen {leapgen.__version__}  threads {torch.get_num_threads()}  {platform.processor() or platform.machine()}")
    print(f"greedy, {args.max_tokens} new tokens per prompt, median of {args.repeats} interleaved repeats\n")
    print("| batch | prompt tokens | leapgen tok/s | transformers tok/s | speedup |")
    print("|---:|---|---:|---:|---:|")
    for batch, lengths, ours_tps, theirs_tps, ratio in rows:
        print(f"| {batch} | {lengths} | {ours_tps:.1f} | {theirs_tps:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
