"""Forced-token jumps: forward passes and wall time per extracted JSON object, with and without.

The embedded SmolLM2-135M-Instruct extracts a record from each of several short documents under a JSON
schema (greedy).  With jumps, every stretch the schema fixes (keys, quotes, punctuation) is appended in one
multi-token step instead of one decode step per token.  Every output is validated with jsonschema.

    python benchmarks/bench_forced_tokens.py [--whitespace dumps|compact|flexible] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema

import leapgen
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 40},
        "occupation": {"type": "string", "maxLength": 40},
        "has_children": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "occupation", "has_children"],
    "additionalProperties": False,
}
DOCUMENTS = [
    "Maria Lopez, 34, works as a nurse in Valencia. She has two daughters.",
    "Tom Becker is a 52-year-old carpenter from Hamburg with no kids.",
    "Aiko Tanaka (29) teaches mathematics in Osaka; she is not a parent.",
    "Samuel Okafor, aged 41, drives a taxi in Lagos and has a son.",
]


def run(llm: leapgen.LLM, constraint, prompts) -> tuple[float, int, int, list]:
    engine = llm.engine
    steps, forced = engine.num_steps, engine.num_forced_tokens
    start = time.perf_counter()
    outputs = llm.generate(prompts, leapgen.SamplingParams(max_tokens=120), constraint=constraint)
    elapsed = time.perf_counter() - start
    for out in outputs:
        jsonschema.validate(json.loads(out.text), SCHEMA)
    return elapsed, engine.num_steps - steps, engine.num_forced_tokens - forced, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--whitespace", default="dumps", choices=["dumps", "compact", "flexible"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    path = convert_gguf(default_model_path())
    llms = {jump: leapgen.LLM(path, dtype="float32", enable_forced_tokens=jump) for jump in (True, False)}
    constraint = leapgen.JsonSchema(SCHEMA, {"whitespace": args.whitespace})
    prompts = [llms[True].chat_prompt(f"Extract name, age, city, occupation and has_children as JSON: {d}")
               for d in DOCUMENTS]
    for llm in llms.values():                      # compile the schema and warm the mask caches
        run(llm, constraint, prompts)
    results = {True: [], False: []}
    for _ in range(args.repeats):                  # one request at a time: per-object passes are exact
        for jump, llm in llms.items():
            for prompt in prompts:
                results[jump].append(run(llm, constraint, [prompt]))
    texts = {jump: [r[3][0].text for r in results[jump][: len(prompts)]] for jump in results}
    print(f"SmolLM2-135M-Instruct fp32, greedy, schema with 5 properties, whitespace={args.whitespace}, "
          f"{len(prompts)} documents x {args.repeats} repeats (medians per object)\n")
    print("| forced-token jumps | forward passes / object | forced tokens / object | output tokens / object | "
          "seconds / object |")
    print("|---|---:|---:|---:|---:|")
    for jump in (False, True):
        rows = results[jump]
        print(f"| {'on' if jump else 'off'} | {statistics.median(r[1] for r in rows):.0f} | "
              f"{statistics.median(r[2] for r in rows):.0f} | "
              f"{statistics.median(len(r[3][0].token_ids) for r in rows):.0f} | "
              f"{statistics.median(r[0] for r in rows):.2f} |")
    same = sum(a == b for a, b in zip(texts[True], texts[False]))
    print(f"\nidentical extracted text with and without jumps: {same}/{len(prompts)}; example: {texts[True][0]}")


if __name__ == "__main__":
    main()
