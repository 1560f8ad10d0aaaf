"""Speculative decoding on input-grounded prompts: leapgen plain vs prompt lookup vs a draft model, next to
transformers' plain greedy, prompt lookup (`prompt_lookup_num_tokens=10`) and assistant model.

Every system decodes greedily, so every output must be identical to leapgen's plain output (checked).
transformers speculates at batch 1 only; at batch 8 it appears plain.  No smaller SmolLM2 ships in a
package, so the draft model is the target cut to its first `--draft-layers` layers (with the final
norm and head), a self-speculative draft that costs no training; its figures are what they are.

    python benchmarks/bench_speculative.py [--repeats 3] [--max-tokens 128] [--k 8] [--draft-layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import leapgen
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import cache_root, convert_gguf

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest_item(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
'''
LETTER = ("Dear Ms. Alvarez, thank you for your order of 12 ceramic bowls and 4 serving plates, placed on "
          "3 March. Your parcel left our warehouse in Porto this morning and should reach your address at "
          "Rua das Flores 48, Lisbon, within three working days. The tracking number is PT-5521-8830. "
          "If anything arrives damaged, reply to this message with a photo and we will replace it at no cost. "
          "Kind regards, Jonas Weber, Customer Care")
TASKS = [
    f"Rename the function total_price to compute_total in this code. Reply with the full code only.\n\n{CODE}",
    f"Copy this letter exactly, but replace the name Jonas Weber with Maria Costa:\n\n{LETTER}",
    f"Extract every number from this letter together with the words around it, one per line:\n\n{LETTER}",
    f"Add a docstring to each function in this code and reply with the full code:\n\n{CODE}",
    f"Rewrite this letter so that it is addressed to Mr. Okafor instead of Ms. Alvarez:\n\n{LETTER}",
    f"Quote the sentence of this letter that mentions the tracking number, then the one about damage:\n\n{LETTER}",
    f"Convert this code so that both functions use a while loop instead of a for loop:\n\n{CODE}",
    f"Repeat the address and the tracking number from this letter, then summarise it in one line:\n\n{LETTER}",
]


def draft_checkpoint(target: Path, layers: int) -> Path:
    """The target cut to its first `layers` decoder layers, saved once under leapgen's cache."""
    out = cache_root() / "drafts" / f"{target.name}-first{layers}"
    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {}
    for file in sorted(target.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                weights[name] = tensor
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    for file in target.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config", "vocab", "merges")):
            (out / file.name).write_bytes(file.read_bytes())
    return out


def timed(run) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outputs = run()
    return time.perf_counter() - start, outputs


def leapgen_run(llm: leapgen.LLM, prompts: list[str], max_tokens: int) -> tuple[float, list[list[int]], dict]:
    seconds, outputs = timed(lambda: llm.generate(prompts, leapgen.SamplingParams(max_tokens=max_tokens)))
    drafted = sum(o.metrics.drafted_tokens for o in outputs)
    accepted = sum(o.metrics.accepted_tokens for o in outputs)
    return seconds, [o.token_ids for o in outputs], {"drafted": drafted, "accepted": accepted}


@torch.inference_mode()
def transformers_run(model, tokenizer, prompts: list[str], max_tokens: int, **extra) -> tuple[float, list[list[int]]]:
    def run():
        results = []
        for prompt in prompts:                   # batch 1 each: its speculative modes take no batches
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, **extra)
            results.append(out[0, ids.shape[1]:].tolist())
        return results
    return timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens for prompt lookup")
    parser.add_argument("--lookup-min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--draft-k", type=int, default=4, help="num_speculative_tokens for the draft model")
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--batch1-prompts", type=int, default=3, help="prompts run one at a time at batch 1")
    args = parser.parse_args()

    target = convert_gguf(default_model_path())
    draft = draft_checkpoint(target, args.draft_layers)
    llms = {
        "leapgen": leapgen.LLM(target, dtype="float32"),
        "leapgen + ngram": leapgen.LLM(target, dtype="float32", speculative={
            "method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4,
            "prompt_lookup_min": args.lookup_min}),
        "leapgen + draft": leapgen.LLM(target, dtype="float32", speculative={
            "method": "draft", "model": str(draft), "num_speculative_tokens": args.draft_k}),
    }
    tokenizer = llms["leapgen"].tokenizer
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    hf_draft = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    prompts = [llms["leapgen"].chat_prompt(task) for task in TASKS]
    hf_systems = {"transformers": {}, "transformers + prompt lookup": {"prompt_lookup_num_tokens": 10},
                  "transformers + assistant": {"assistant_model": hf_draft}}

    for batch, batch_prompts in (("1", prompts[:args.batch1_prompts]), ("8", prompts)):
        one_at_a_time = batch == "1"
        tps: dict[str, list[float]] = {}
        accept: dict[str, dict] = {}
        reference = None
        for repeat in range(args.repeats + 1):           # the first round warms up and is not counted
            for name, llm in llms.items():
                if one_at_a_time:
                    runs = [leapgen_run(llm, [p], args.max_tokens) for p in batch_prompts]
                    seconds = sum(r[0] for r in runs)
                    ids = [r[1][0] for r in runs]
                    counts = {key: sum(r[2][key] for r in runs) for key in ("drafted", "accepted")}
                else:
                    seconds, ids, counts = leapgen_run(llm, batch_prompts, args.max_tokens)
                reference = reference or ids
                assert ids == reference, f"{name}: outputs differ from plain greedy"
                if repeat:
                    tps.setdefault(name, []).append(sum(map(len, ids)) / seconds)
                    accept[name] = counts
            for name, extra in hf_systems.items():
                if not one_at_a_time and extra:
                    continue                             # transformers speculates at batch 1 only
                seconds, ids = transformers_run(hf, tokenizer, batch_prompts, args.max_tokens, **extra)
                assert ids == reference, f"{name}: outputs differ from leapgen's greedy"
                if repeat:
                    tps.setdefault(name, []).append(sum(map(len, ids)) / seconds)
        print_table(batch, tps, accept, args)


def print_table(batch: str, tps: dict[str, list[float]], accept: dict[str, dict], args: argparse.Namespace) -> None:
    base = statistics.median(tps["leapgen"])
    print(f"\nbatch {batch}: SmolLM2-135M-Instruct fp32, greedy, up to {args.max_tokens} new tokens, "
          f"median of {args.repeats} interleaved repeats; threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print("| system | tok/s | vs leapgen plain | acceptance |")
    print("|---|---:|---:|---:|")
    for name, values in tps.items():
        median = statistics.median(values)
        counts = accept.get(name)
        rate = f"{counts['accepted'] / counts['drafted']:.0%} of {counts['drafted']}" if counts and counts["drafted"] else ""
        print(f"| {name} | {median:.1f} | {median / base:.2f}x | {rate} |")


if __name__ == "__main__":
    main()
