"""The `leapgen` command line: generate text from a terminal and try sampling settings."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from leapgen.decoding.sampling_params import SamplingParams


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leapgen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a continuation for one or more prompts")
    gen.add_argument("--model", help="HF checkpoint directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    gen.add_argument("--system", help="system message for --chat")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--min-tokens", type=int, default=0)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--typical-p", type=float, default=1.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--frequency-penalty", type=float, default=0.0)
    gen.add_argument("--presence-penalty", type=float, default=0.0)
    gen.add_argument("--no-repeat-ngram-size", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append", help="stop string; repeat for several")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--logprobs", type=int, help="report the chosen token's logprob and the top N alternatives")
    gen.add_argument("--n", type=int, default=1, help="samples per prompt (they share the prompt's KV blocks)")
    gen.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=float, default=1.0)
    gen.add_argument("--early-stopping", choices=["true", "false", "never"], default="false")
    constraint = gen.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", metavar="FILE", help="constrain output to this JSON schema file")
    constraint.add_argument("--regex", help="constrain output to match this regex")
    constraint.add_argument("--grammar", metavar="FILE", help="constrain output to this lark grammar file")
    gen.add_argument("--dtype", default="auto", help="float32, float16, bfloat16 or auto")
    gen.add_argument("--device", default="auto")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    gen.add_argument("--stream", action="store_true", help="print text as it is produced (one prompt)")
    return parser


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, min_p=args.min_p, typical_p=args.typical_p, repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos,
        logprobs=args.logprobs, n=args.n, num_beams=args.num_beams, length_penalty=args.length_penalty,
        early_stopping={"true": True, "false": False, "never": "never"}[args.early_stopping])


def _constraint(args: argparse.Namespace):
    from leapgen.constraints import Grammar, JsonSchema, Regex

    if args.json_schema:
        with open(args.json_schema, encoding="utf-8") as f:
            try:
                return JsonSchema(json.load(f))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{args.json_schema}: not valid JSON ({exc})") from None
    if args.regex:
        return Regex(args.regex)
    if args.grammar:
        with open(args.grammar, encoding="utf-8") as f:
            return Grammar(f.read())
    return None


def _generate(args: argparse.Namespace) -> int:
    from leapgen.llm import LLM

    params = _params(args)          # bad values fail before the model loads
    constraint = _constraint(args)
    started = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, device=args.device)
    loaded = time.perf_counter()
    prompts = [llm.chat_prompt(p, args.system) if args.chat else p for p in args.prompt]
    if args.stream:
        if len(prompts) != 1:
            raise ValueError("--stream takes exactly one --prompt")
        for piece in llm.stream(prompts[0], params, constraint=constraint):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    outputs = llm.generate(prompts, params, constraint=constraint)
    elapsed = time.perf_counter() - loaded
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            record = {"prompt": prompt, **_completion(out.outputs[0])}
            if len(out.outputs) > 1:
                record["outputs"] = [_completion(c) for c in out.outputs]
            print(json.dumps(record, ensure_ascii=False))
        else:
            for completion in out.outputs:
                print(completion.text)
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    print(f"[leapgen] model loaded in {loaded - started:.1f}s; {tokens} tokens in {elapsed:.2f}s "
          f"({tokens / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    return 0


def _completion(completion) -> dict:
    record = {"text": completion.text, "token_ids": completion.token_ids, "finish_reason": completion.finish_reason}
    if completion.logprobs is not None:
        record["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob,
                               "top": {str(k): v for k, v in lp.top.items()}} for lp in completion.logprobs]
    if completion.score is not None:
        record["score"] = completion.score
    return record


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `leapgen` command."""
    args = _parser().parse_args(argv)
    try:
        return _generate(args)
    except (ValueError, OSError, TypeError) as exc:
        print(f"leapgen: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
