"""Memory benchmark (issue 13): peak resident memory of the embedded SmolLM2-135M-Instruct (fp32) generating
at batch 1 and batch 32, each in a fresh process (a process's peak covers everything it did).

Every run loads the default model with the default KV cache (or `--kv-cache-memory`), generates
`--max-tokens` greedy tokens for each of `batch` prompts (eos banned), and reports the RSS once the
libraries are imported, the peak while loading, the RSS after loading, the peak RSS (`ru_maxrss`) and the KV cache the engine
allocated.  `--no-pack-weights` measures the engine without the packed copy of the weights.

    python benchmarks/bench_memory.py [--batches 1 32] [--max-tokens 128] [--kv-cache-memory 512MiB]
                                      [--no-pack-weights]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(batch: int, max_tokens: int, kv_cache_memory: str | None, pack_weights: bool) -> dict:
    """One configuration, in this process."""
    import leapgen
    from leapgen.engine.model_runner import cache_block_bytes

    before_rss = rss_mib()                    # python, torch, transformers and leapgen imported
    llm = leapgen.LLM(dtype="float32", threads=2, kv_cache_memory=kv_cache_memory, pack_weights=pack_weights)
    loaded_rss = rss_mib()
    load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # KiB on Linux
    engine = llm.engine
    kv_mib = engine.block_manager.num_blocks * cache_block_bytes(engine.loaded, engine.config.block_size) / 2**20
    prompts = [f"Write a short story about a lighthouse keeper, number {i}." for i in range(batch)]
    eos = {e: -100.0 for e in engine.loaded.eos_token_ids}
    outputs = llm.generate(prompts, leapgen.SamplingParams(max_tokens=max_tokens, logit_bias=eos))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # KiB on Linux
    return {"batch": batch, "tokens": sum(len(o.token_ids) for o in outputs), "rss_before_load_mib": before_rss,
            "rss_after_load_mib": loaded_rss, "load_peak_rss_mib": load_peak,
            "peak_rss_mib": peak, "kv_cache_mib": kv_mib}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-memory", help="as LLM(kv_cache_memory=...); default: the engine's choice")
    parser.add_argument("--no-pack-weights", dest="pack_weights", action="store_false",
                        help="as LLM(pack_weights=False)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)      # a child run: one batch size
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.max_tokens, args.kv_cache_memory, args.pack_weights)))
        return
    print("| batch | tokens generated | RSS before load | peak RSS while loading | RSS after load | peak RSS | "
          "KV cache allocated |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        command = [sys.executable, __file__, "--one", str(batch), "--max-tokens", str(args.max_tokens)]
        if args.kv_cache_memory:
            command += ["--kv-cache-memory", args.kv_cache_memory]
        if not args.pack_weights:
            command.append("--no-pack-weights")
        result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
        print(f"| {batch} | {result['tokens']} | {result['rss_before_load_mib']:.0f} MiB | "
              f"{result['load_peak_rss_mib']:.0f} MiB | {result['rss_after_load_mib']:.0f} MiB | "
              f"{result['peak_rss_mib']:.0f} MiB | {result['kv_cache_mib']:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
