"""Long-prompt benchmark (issue 13): time to first token for 1k / 4k / 8k-token prompts, leapgen vs
transformers `generate()`, on the embedded SmolLM2-135M-Instruct (fp32).

Each run prefills one prompt and generates one token.  Every run uses a prompt neither system has seen
(a different slice of the text), and leapgen runs with prefix caching off, so no run reuses another's KV.
leapgen prefills in chunks of `--chunk` tokens (its `max_num_batched_tokens`): a chunk attends to the
positions cached before it through the paged KV cache.  transformers prefills the whole prompt in one
forward pass with SDPA.  Per length the systems alternate; medians over `--repeats`.

    python benchmarks/bench_long_prompt.py [--lengths 1000 4000 8000] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

import leapgen
from leapgen import SamplingParams
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.llm import set_threads

TEXT = ("The harbour town woke slowly. Fishing boats came in with the tide, gulls argued over the nets, and the "
        "baker on the corner opened his shutters to the smell of bread. ")


def prompt_ids(tokenizer, length: int, offset: int) -> list[int]:
    """`length` token ids no other run uses (a numbered passage, starting at `offset`)."""
    ids: list[int] = []
    part = offset
    while len(ids) < length:
        ids += tokenizer.encode(f"[{part}] {TEXT}", add_special_tokens=False)
        part += 1
    return ids[:length]


def leapgen_ttft(llm: leapgen.LLM, ids: list[int]) -> float:
    started = time.perf_counter()
    llm.generate([ids], SamplingParams(max_tokens=1))
    return time.perf_counter() - started


def transformers_ttft(model, ids: list[int]) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(torch.tensor([ids]), max_new_tokens=1, do_sample=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000, 4000, 8000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=2048, help="leapgen's max_num_batched_tokens")
    args = parser.parse_args()

    set_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, torch threads {args.threads}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    path = convert_gguf(default_model_path())
    llm = leapgen.LLM(path, dtype="float32", threads=args.threads, enable_prefix_caching=False,
                      max_num_batched_tokens=args.chunk)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = llm.tokenizer
    leapgen_ttft(llm, prompt_ids(tokenizer, 64, 0))          # warm both up
    transformers_ttft(hf, prompt_ids(tokenizer, 64, 0))
    offset = 1
    rows = []
    for length in args.lengths:
        ours, theirs = [], []
        for repeat in range(args.repeats):
            ids = prompt_ids(tokenizer, length, offset)
            offset += length
            first, second = (ours, theirs) if repeat % 2 == 0 else (theirs, ours)
            for times in (first, second):
                times.append(leapgen_ttft(llm, ids) if times is ours else transformers_ttft(hf, ids))
        rows.append((length, statistics.median(ours), statistics.median(theirs)))
        print(f"{length:5d} tokens: leapgen {rows[-1][1]:6.2f}s  transformers {rows[-1][2]:6.2f}s", flush=True)

    base_ours, base_theirs = rows[0][1], rows[0][2]
    print("\n| prompt tokens | leapgen TTFT | transformers TTFT | leapgen / transformers | leapgen growth | "
          "transformers growth |")
    print("|---:|---:|---:|---:|---:|---:|")
    for length, ours, theirs in rows:
        print(f"| {length} | {ours:.2f} s | {theirs:.2f} s | {ours / theirs:.2f} | {ours / base_ours:.1f}x | "
              f"{theirs / base_theirs:.1f}x |")
    print(f"\n# load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
