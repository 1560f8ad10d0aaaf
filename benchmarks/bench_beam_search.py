"""Beam search: leapgen (beams as forked sequences sharing KV blocks) vs transformers generate(num_beams=...).

Same weights (the embedded SmolLM2-135M-Instruct, fp32), eos disabled so every beam runs `--max-tokens`;
prompts one at a time; tokens/s counts the returned best sequence's tokens.  Medians over interleaved repeats;
the best sequences of both are compared token for token.

    python benchmarks/bench_beam_search.py [--beams 4] [--max-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model

PROMPTS = ["The history of the printing press", "A recipe for tomato soup:", "def quicksort(items):",
           "The three laws of motion are"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    path = convert_gguf(default_model_path())
    loaded = load_model(path, "float32")
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory="512MiB"))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    params = SamplingParams(max_tokens=args.max_tokens, num_beams=args.beams, ignore_eos=True)
    prompts = [loaded.tokenizer.encode(p) for p in PROMPTS]

    def ours(prompt):
        start = time.perf_counter()
        ids = engine.generate([prompt], params)[0].token_ids
        return time.perf_counter() - start, ids

    @torch.inference_mode()
    def theirs(prompt):
        start = time.perf_counter()
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                          num_beams=args.beams, do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - start, out[0, len(prompt):].tolist()

    ours(prompts[0]), theirs(prompts[0])                  # warm-up
    rates = {"leapgen": [], "transformers": []}
    same = 0
    for _ in range(args.repeats):
        for prompt in prompts:
            (t_ours, ids_ours), (t_theirs, ids_theirs) = ours(prompt), theirs(prompt)
            rates["leapgen"].append(len(ids_ours) / t_ours)
            rates["transformers"].append(len(ids_theirs) / t_theirs)
            same += ids_ours == ids_theirs
    ours_rate, theirs_rate = statistics.median(rates["leapgen"]), statistics.median(rates["transformers"])
    print(f"SmolLM2-135M-Instruct fp32, {args.beams} beams, {args.max_tokens} tokens, {len(prompts)} prompts x "
          f"{args.repeats} repeats, threads {torch.get_num_threads()}\n")
    print("| engine | tokens/s (best beam) |\n|---|---:|")
    print(f"| leapgen | {ours_rate:.1f} |\n| transformers | {theirs_rate:.1f} |")
    print(f"\nspeedup {ours_rate / theirs_rate:.2f}x; identical best sequences: {same}/{len(prompts) * args.repeats}")


if __name__ == "__main__":
    main()
