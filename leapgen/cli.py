"""The `leapgen` command line: generate text from a terminal and try sampling settings."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from typing import Any, Sequence, TextIO

from leapgen.cli_common import (CliError, Parser, add_max_num_seqs_argument, add_model_arguments, check_device,
                                check_dtype, check_rows, compile_constraint, field_named_in, finite_float, load_llm,
                                positive_int, print_error, progress_bar, speculative_config, speculative_method)
from leapgen.cli_extract import add_extract_parser, run_extract
from leapgen.cli_inputs import (add_constraint_arguments, add_prompt_arguments, add_stop_argument, chat_prompts,
                                constraint, prepare_text_flags)
from leapgen.cli_serve import add_serve_parser, run_serve
from leapgen.cli_sweep import add_sweep_parser, run_sweep
from leapgen.decoding.sampling_params import SamplingParams

# LLM.generate's progress bar for more prompts than this; a few finish before a bar would say anything
_PROGRESS_MIN_PROMPTS = 8


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="leapgen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a continuation for one or more prompts")
    add_model_arguments(gen)
    add_max_num_seqs_argument(gen)
    add_prompt_arguments(gen)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--min-tokens", type=int, default=0)
    gen.add_argument("--temperature", type=finite_float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=finite_float, default=1.0)
    gen.add_argument("--min-p", type=finite_float, default=0.0)
    gen.add_argument("--typical-p", type=finite_float, default=1.0)
    gen.add_argument("--repetition-penalty", type=finite_float, default=1.0)
    gen.add_argument("--frequency-penalty", type=finite_float, default=0.0)
    gen.add_argument("--presence-penalty", type=finite_float, default=0.0)
    gen.add_argument("--no-repeat-ngram-size", type=int, default=0)
    gen.add_argument("--seed", type=int)
    add_stop_argument(gen)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--logprobs", type=int, help="report the chosen token's logprob and the top N alternatives")
    gen.add_argument("--n", type=int, default=1, help="samples per prompt (they share the prompt's KV blocks)")
    gen.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=finite_float, default=1.0)
    gen.add_argument("--early-stopping", choices=["true", "false", "never"], default="false")
    add_constraint_arguments(gen)
    gen.add_argument("--speculative", metavar="METHOD", type=speculative_method,
                     help="speculative decoding: 'ngram' (prompt lookup) or 'draft:PATH' (a draft model sharing the "
                          "tokenizer); greedy outputs stay the same, sampled ones follow the same distribution "
                          "(with a --seed, other draws); beam search does not speculate")
    gen.add_argument("--num-speculative-tokens", type=positive_int, metavar="K",
                     help="tokens drafted per step (default: 8 for ngram, 4 for a draft model)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt (with its metrics)")
    gen.add_argument("--stream", action="store_true", help="print text as it is produced (one prompt)")
    add_extract_parser(commands)
    add_sweep_parser(commands)
    add_serve_parser(commands)
    return parser


# --- checks of what argparse cannot see, before the model loads -----------------------------------------

def _params(args: argparse.Namespace) -> SamplingParams:
    fields: dict[str, Any] = dict(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, min_p=args.min_p, typical_p=args.typical_p, repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size, seed=args.seed, stop=args.stop, ignore_eos=args.ignore_eos,
        logprobs=args.logprobs, n=args.n, num_beams=args.num_beams, length_penalty=args.length_penalty,
        early_stopping={"true": True, "false": False, "never": "never"}[args.early_stopping])
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        field = field_named_in(str(exc), fields)
        raise CliError(f"--{field.replace('_', '-')}: {exc}" if field else str(exc)) from None


# --- running --------------------------------------------------------------------------------------------

def _prepare(args: argparse.Namespace) -> tuple[SamplingParams, str | None, Any]:
    """Every check that needs no model, so that bad input fails before a slow load: the sampling
    params, and the constraint with the flag that gave it."""
    prepare_text_flags(args)
    check_device(args.device)
    check_dtype(args.dtype)
    speculative_config(args)
    if args.stream and len(args.prompt) != 1:
        raise CliError(f"--stream takes exactly one prompt, got {len(args.prompt)}")
    check_rows(args, args.n, args.num_beams)
    if args.stream and args.json:
        raise CliError("--stream prints text as it comes and --json one object per completion at its end: give one")
    if args.stream and args.n > 1:
        raise CliError(f"--stream prints the text of one sample, got --n {args.n} (without --stream every sample is "
                       "printed)")
    return (_params(args), *constraint(args))


def _generate(args: argparse.Namespace) -> int:
    params, flag, spec = _prepare(args)
    started = time.perf_counter()
    llm = load_llm(args)
    loaded = time.perf_counter()
    compile_constraint(llm, flag, spec)
    prompts = chat_prompts(llm, args) if args.chat or args.system is not None else args.prompt
    if args.stream:
        return _stream(llm, prompts[0], params, spec)
    with progress_bar(len(prompts), show=len(prompts) > _PROGRESS_MIN_PROMPTS) as progress:
        outputs = llm.generate(prompts, params, constraint=spec, progress=progress)
    elapsed = time.perf_counter() - loaded
    _print_outputs(args, outputs)
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    print(f"[leapgen] model loaded in {loaded - started:.1f}s; {tokens} tokens in {elapsed:.2f}s "
          f"({tokens / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    # a request that fails while running comes back with finish_reason "error" (naming prompts[i]) rather than raising
    failed = [out.error for out in outputs if out.error is not None]
    for error in failed:
        print_error(error)
    return 2 if failed else 0


def _print_outputs(args: argparse.Namespace, outputs: list) -> None:
    for prompt, out in zip(args.prompt, outputs):
        if args.json:
            record = {"prompt": prompt, **_completion(out.outputs[0])}
            if len(out.outputs) > 1:
                record["outputs"] = [_completion(c) for c in out.outputs]
            if out.error is not None:
                record["error"] = out.error
            record["metrics"] = dataclasses.asdict(out.metrics)
            print(json.dumps(record, ensure_ascii=False))
        elif out.error is None:      # a failed request's partial text would pass for an answer
            for completion in out.outputs:
                print(completion.text)


def _stream(llm, prompt: str, params: SamplingParams, constraint: Any) -> int:
    wrote = False
    try:
        for piece in llm.stream(prompt, params, constraint=constraint):
            sys.stdout.write(piece)
            sys.stdout.flush()
            wrote = True
    except RuntimeError as exc:      # LLM.stream's way to report a request that failed while running
        if wrote:
            sys.stdout.write("\n")
        print_error(f"prompts[0]: {exc}")
        return 2
    except KeyboardInterrupt:        # end the text cut mid-line; `main` says it was interrupted
        if wrote:
            print(flush=True)
        raise
    sys.stdout.write("\n")
    return 0


def _completion(completion) -> dict:
    record = {"text": completion.text, "token_ids": completion.token_ids, "finish_reason": completion.finish_reason}
    if completion.logprobs is not None:
        record["logprobs"] = [{"token_id": lp.token_id, "logprob": lp.logprob,
                               "top": {str(k): v for k, v in lp.top.items()}} for lp in completion.logprobs]
    if completion.score is not None:
        record["score"] = completion.score
    return record


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: TextIO | None = None, line: str | None = None) -> None:
    """A warning as one line of its own (Python's shows the file and the source line it came from)."""
    print(f"leapgen: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


_CLOSED_PIPE = 141     # the status a shell gives a tool that SIGPIPE ended (128 + 13), as `yes | head` has it


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `leapgen` command; bad input exits with status 2 and one `leapgen: error:` line."""
    try:
        args = _parser().parse_args(argv)
        commands = {"generate": _generate, "extract": run_extract, "sweep": run_sweep, "serve": run_serve}
        with warnings.catch_warnings():     # (restores the way warnings show for a caller in this process)
            warnings.showwarning = _one_line_warning
            return commands[args.command](args)
    except BrokenPipeError:                 # the reader went away (`| head -1`): nothing is wrong, nothing to say
        # (the interpreter flushes stdout once more at exit, which would fail again and print its own message)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):       # a stdout with no file behind it (a caller's capture)
            pass
        return _CLOSED_PIPE
    except (ValueError, OSError) as exc:    # CliError, and what the engine refuses (RequestError)
        print_error(exc)
        return 2
    except KeyboardInterrupt:               # Ctrl-C: what was printed stays; a traceback would only hide it
        print_error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
