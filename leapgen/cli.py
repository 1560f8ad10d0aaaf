"""The `leapgen` command line: generate text from a terminal and try sampling settings."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from typing import Any, Sequence

from leapgen.cli_common import (CliError, Parser, check_device, check_dtype, compile_constraint, describe,
                                finite_float, load_llm, memory_size, positive_int, print_error, speculative_config,
                                speculative_method)
from leapgen.cli_extract import add_extract_parser, run_extract
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.text_files import parse_json, read_text


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="leapgen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a continuation for one or more prompts")
    gen.add_argument("--model", help="HF checkpoint directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    gen.add_argument("--system", help="system message (implies --chat)")
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
    gen.add_argument("--stop", action="append",
                     help=r"stop string; repeat for several; escapes such as \n, \t, \\ and \u00e9 are decoded")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--logprobs", type=int, help="report the chosen token's logprob and the top N alternatives")
    gen.add_argument("--n", type=int, default=1, help="samples per prompt (they share the prompt's KV blocks)")
    gen.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=finite_float, default=1.0)
    gen.add_argument("--early-stopping", choices=["true", "false", "never"], default="false")
    constraint = gen.add_mutually_exclusive_group()
    constraint.add_argument("--schema", metavar="FILE|module:Model",
                            help="constrain output to this JSON schema file or pydantic model class "
                                 "('pkg.module:Model' or 'path/to/file.py:Model')")
    constraint.add_argument("--json-schema", metavar="FILE", help="the same as --schema")
    constraint.add_argument("--response-format", metavar="JSON_OR_FILE",
                            help="constrain output as OpenAI's response_format does, given inline "
                                 "('{\"type\": \"json_object\"}') or as a JSON file")
    constraint.add_argument("--regex", help="constrain output to match this regex ('' means empty output)")
    constraint.add_argument("--grammar", metavar="FILE", help="constrain output to this lark grammar file")
    gen.add_argument("--dtype", default="auto", help="float32, float16, bfloat16 or auto")
    gen.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    gen.add_argument("--threads", type=positive_int,
                     help="CPU threads for torch (default: the cores this process may use)")
    gen.add_argument("--kv-cache-memory", type=memory_size, metavar="SIZE",
                     help="KV cache size in bytes or like '512MiB' (default: chosen from the device's memory)")
    gen.add_argument("--speculative", metavar="METHOD", type=speculative_method,
                     help="speculative decoding: 'ngram' (prompt lookup) or 'draft:PATH' (a draft model sharing the "
                          "tokenizer); outputs stay the same, only faster")
    gen.add_argument("--num-speculative-tokens", type=positive_int, metavar="K",
                     help="tokens drafted per step (default: 8 for ngram, 4 for a draft model)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt (with its metrics)")
    gen.add_argument("--stream", action="store_true", help="print text as it is produced (one prompt)")
    add_extract_parser(commands)
    return parser


# --- checks of what argparse cannot see, before the model loads -----------------------------------------

_ESCAPE = re.compile(r"\\(?:([\\nrt0abfv'\"])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
_SIMPLE_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t", "0": "\0", "a": "\a", "b": "\b", "f": "\f",
                   "v": "\v", "'": "'", '"': '"'}


def decode_escapes(text: str) -> str:
    r"""`text` with the backslash escapes a shell passes through literally decoded (\n, \t, \\, \xNN,
    \uNNNN, \UNNNNNNNN ...); other backslashes and non-ASCII text stay as they are.  ValueError for an
    escape past the last code point."""
    def replace(match: re.Match) -> str:
        simple, *hex_digits = match.groups()
        if simple is not None:
            return _SIMPLE_ESCAPES[simple]
        code = int(next(h for h in hex_digits if h is not None), 16)
        if code > sys.maxunicode:
            raise ValueError(f"escape {match.group(0)!r} is past the last Unicode code point")
        return chr(code)

    return _ESCAPE.sub(replace, text)


def _check_utf8(flag: str, values: Sequence[str]) -> None:
    """Python hands undecodable argv bytes over as lone surrogates; no tokenizer can take them."""
    for number, value in enumerate(values, 1):
        bad = next((i for i, ch in enumerate(value) if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is None:
            continue
        code = ord(value[bad])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        where = flag if len(values) == 1 else f"{flag} #{number}"
        raise CliError(f"{where}: the text is not valid UTF-8 ({what} at character {bad}); "
                       f"check the terminal's or the file's encoding")


def _check_inputs(args: argparse.Namespace) -> None:
    for flag, values in (("--prompt", args.prompt), ("--system", [args.system] if args.system is not None else []),
                         ("--stop", args.stop or []), ("--regex", [args.regex] if args.regex is not None else [])):
        _check_utf8(flag, values)
    check_device(args.device)
    check_dtype(args.dtype)


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
        field = _field_named_in(str(exc), fields)
        raise CliError(f"--{field.replace('_', '-')}: {exc}" if field else str(exc)) from None


def _field_named_in(message: str, fields: dict[str, Any]) -> str | None:
    """The SamplingParams field an error is about: the one after 'SamplingParams.', else the first named."""
    named = re.search(r"SamplingParams\.(\w+)", message)
    if named and named.group(1) in fields:
        return named.group(1)
    found = [(m.start(), name) for name in fields if (m := re.search(rf"\b{name}\b", message))]
    return min(found)[1] if found else None


def _read_text(flag: str, path: str) -> str:
    try:
        return read_text(path)
    except ValueError as exc:        # its messages start with the path
        raise CliError(f"{flag} {exc}") from None


def _read_json(flag: str, path: str) -> Any:
    return _parse_json(f"{flag} {path}", _read_text(flag, path))


def _parse_json(where: str, text: str) -> Any:
    try:
        return parse_json(where, text)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _schema(flag: str, source: str) -> Any:
    """--schema's spec: a JSON Schema file, or a pydantic model class named `module:Model` or `file.py:Model`."""
    from leapgen.constraints import JsonSchema, load_schema

    if ":" not in source:            # surely a file: read it with the messages every file flag gives
        return JsonSchema(_read_json(flag, source))
    try:
        return JsonSchema(load_schema(source))
    except ValueError as exc:        # load_schema's messages start with the source
        raise CliError(f"{flag} {exc}") from None
    except Exception as exc:         # the user's module failed while it was imported (SyntaxError, ...)
        raise CliError(f"{flag} {source}: importing it failed: {describe(exc)}") from None


def _response_format(text: str) -> tuple[str, Any]:
    """--response-format's spec, from inline JSON or a JSON file, with the flag (and file) that gave it."""
    from leapgen.constraints import from_response_format

    inline = text.lstrip().startswith("{")
    where = "--response-format" if inline else f"--response-format {text}"
    value = _parse_json(where, text) if inline else _read_json("--response-format", text)
    try:
        return where, from_response_format(value)
    except ValueError as exc:
        raise CliError(f"{where}: {exc}") from None


def _constraint(args: argparse.Namespace) -> tuple[str, Any] | tuple[None, None]:
    """The constraint spec and the flag that gave it; `is not None`, since `--regex ''` means empty output."""
    from leapgen.constraints import Grammar, Regex

    for flag, source in (("--schema", args.schema), ("--json-schema", args.json_schema)):
        if source is not None:
            return f"{flag} {source}", _schema(flag, source)
    if args.response_format is not None:
        return _response_format(args.response_format)
    if args.regex is not None:
        return "--regex", Regex(args.regex)
    if args.grammar is not None:
        return f"--grammar {args.grammar}", Grammar(_read_text("--grammar", args.grammar))
    return None, None


# --- running --------------------------------------------------------------------------------------------

def _prepare(args: argparse.Namespace) -> tuple[SamplingParams, str | None, Any]:
    """Every check that needs no model, so that bad input fails before a slow load: the sampling
    params, and the constraint with the flag that gave it."""
    if args.stop is not None:
        try:
            args.stop = [decode_escapes(s) for s in args.stop]
        except ValueError as exc:
            raise CliError(f"--stop: {exc}") from None
    _check_inputs(args)
    speculative_config(args)
    if args.stream and len(args.prompt) != 1:
        raise CliError("--stream takes exactly one --prompt")
    params = _params(args)
    flag, constraint = _constraint(args)
    return params, flag, constraint


def _generate(args: argparse.Namespace) -> int:
    params, flag, constraint = _prepare(args)
    started = time.perf_counter()
    llm = load_llm(args)
    loaded = time.perf_counter()
    compile_constraint(llm, flag, constraint)
    prompts = _chat_prompts(llm, args) if args.chat or args.system is not None else args.prompt
    if args.stream:
        return _stream(llm, prompts[0], params, constraint)
    outputs = llm.generate(prompts, params, constraint=constraint)
    elapsed = time.perf_counter() - loaded
    _print_outputs(args, outputs)
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    print(f"[leapgen] model loaded in {loaded - started:.1f}s; {tokens} tokens in {elapsed:.2f}s "
          f"({tokens / max(elapsed, 1e-9):.1f} tok/s)", file=sys.stderr)
    # a request that fails while running comes back with finish_reason "error" rather than raising
    failed = [(i, out.error) for i, out in enumerate(outputs) if out.error is not None]
    for index, error in failed:
        print_error(f"prompts[{index}]: {error}")
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


def _chat_prompts(llm, args: argparse.Namespace) -> list[str]:
    """The prompts in the chat template (a system message is only meaningful there, so it implies --chat)."""
    try:
        return [llm.chat_prompt(p, args.system) for p in args.prompt]
    except ValueError as exc:        # e.g. a tokenizer without a chat template
        raise CliError(f"{'--system' if args.system is not None else '--chat'}: {exc}") from None


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `leapgen` command; bad input exits with status 2 and one `leapgen: error:` line."""
    try:
        args = _parser().parse_args(argv)
        return run_extract(args) if args.command == "extract" else _generate(args)
    except (ValueError, OSError) as exc:    # CliError, and what the engine refuses (RequestError)
        print_error(exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
