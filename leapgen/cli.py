"""The `leapgen` command line: generate text from a terminal and try sampling settings."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from typing import Any, Callable, NoReturn, Sequence

from leapgen.decoding.sampling_params import SamplingParams


class CliError(ValueError):
    """Bad input on the command line; the message names the flag and says what is wrong."""


class _Parser(argparse.ArgumentParser):
    """argparse prints its usage block before the error; leapgen prints the error alone, in one line."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


# --- argument types: a bad value is refused by argparse, which names the flag ---------------------------

def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):     # float() accepts 'inf' and 'nan', which no setting means
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _at_least_one(parse: Callable[[str], int], text: str, expected: str) -> int:
    try:
        value = parse(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _at_least_one(int, text, "an int >= 1")


def _memory_size(text: str) -> str:
    from leapgen.engine.llm_engine import parse_memory

    _at_least_one(parse_memory, text, "a positive number of bytes or a size like '512MiB'")
    return text


def _speculative_method(text: str) -> dict:
    if text == "ngram":
        return {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if text.startswith("draft:") and len(text) > len("draft:"):
        return {"method": "draft", "model": text[len("draft:"):]}
    raise argparse.ArgumentTypeError(f"expected 'ngram' or 'draft:PATH', got {text!r}")


def _speculative(args: argparse.Namespace) -> dict | None:
    """The LLM's speculative config from --speculative and --num-speculative-tokens."""
    if args.speculative is None:
        if args.num_speculative_tokens is not None:
            raise CliError("--num-speculative-tokens needs --speculative")
        return None
    default_k = 8 if args.speculative["method"] == "ngram" else 4
    return {**args.speculative, "num_speculative_tokens": args.num_speculative_tokens or default_k}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="leapgen", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate a continuation for one or more prompts")
    gen.add_argument("--model", help="HF checkpoint directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--prompt", action="append", required=True, help="prompt text; repeat for a batch")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    gen.add_argument("--system", help="system message (implies --chat)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--min-tokens", type=int, default=0)
    gen.add_argument("--temperature", type=_finite_float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=_finite_float, default=1.0)
    gen.add_argument("--min-p", type=_finite_float, default=0.0)
    gen.add_argument("--typical-p", type=_finite_float, default=1.0)
    gen.add_argument("--repetition-penalty", type=_finite_float, default=1.0)
    gen.add_argument("--frequency-penalty", type=_finite_float, default=0.0)
    gen.add_argument("--presence-penalty", type=_finite_float, default=0.0)
    gen.add_argument("--no-repeat-ngram-size", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stop", action="append",
                     help=r"stop string; repeat for several; escapes such as \n, \t, \\ and \u00e9 are decoded")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--logprobs", type=int, help="report the chosen token's logprob and the top N alternatives")
    gen.add_argument("--n", type=int, default=1, help="samples per prompt (they share the prompt's KV blocks)")
    gen.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams")
    gen.add_argument("--length-penalty", type=_finite_float, default=1.0)
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
    gen.add_argument("--threads", type=_positive_int,
                     help="CPU threads for torch (default: the cores this process may use)")
    gen.add_argument("--kv-cache-memory", type=_memory_size, metavar="SIZE",
                     help="KV cache size in bytes or like '512MiB' (default: chosen from the device's memory)")
    gen.add_argument("--speculative", metavar="METHOD", type=_speculative_method,
                     help="speculative decoding: 'ngram' (prompt lookup) or 'draft:PATH' (a draft model sharing the "
                          "tokenizer); outputs stay the same, only faster")
    gen.add_argument("--num-speculative-tokens", type=_positive_int, metavar="K",
                     help="tokens drafted per step (default: 8 for ngram, 4 for a draft model)")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt (with its metrics)")
    gen.add_argument("--stream", action="store_true", help="print text as it is produced (one prompt)")
    _add_extract_parser(commands)
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


def _check_device(device: str) -> None:
    from leapgen.engine.config import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise CliError(f"--device: {exc}") from None


def _check_dtype(dtype: str) -> None:
    from leapgen.engine.config import resolve_dtype

    if dtype != "auto":              # 'auto' reads the checkpoint's config, checked when it loads
        try:
            resolve_dtype(dtype)
        except ValueError as exc:
            raise CliError(f"--dtype: {exc}") from None


def _check_inputs(args: argparse.Namespace) -> None:
    for flag, values in (("--prompt", args.prompt), ("--system", [args.system] if args.system is not None else []),
                         ("--stop", args.stop or []), ("--regex", [args.regex] if args.regex is not None else [])):
        _check_utf8(flag, values)
    _check_device(args.device)
    _check_dtype(args.dtype)


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
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{flag} {path}: is a directory, not a file") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{flag} {path}: not UTF-8 text (byte offset {exc.start})") from None
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def _read_json(flag: str, path: str) -> Any:
    return _parse_json(f"{flag} {path}", _read_text(flag, path))


def _parse_json(where: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise CliError(f"{where}: JSON nested too deeply to read") from None


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
        raise CliError(f"{flag} {source}: importing it failed: {_describe(exc)}") from None


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

# Exceptions that mean a bug in leapgen rather than a bad checkpoint: they keep their traceback.
_BUG_TYPES = (AttributeError, NameError, AssertionError)


def _load(args: argparse.Namespace, **options: Any):
    from leapgen.llm import LLM

    try:
        return LLM(args.model, dtype=args.dtype, device=args.device, threads=args.threads,
                   kv_cache_memory=args.kv_cache_memory, speculative=_speculative(args), **options)
    except _BUG_TYPES:
        raise
    except Exception as exc:         # the loader meets third-party errors too (safetensors, tokenizers, json)
        where = args.model if args.model is not None else "(the embedded default model)"
        raise CliError(f"cannot load model {where}: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    """The error's message, with its type where the message alone is no explanation (KeyError('x'))."""
    if isinstance(exc, (ValueError, OSError)) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _compile(llm, flag: str | None, spec: Any) -> None:
    """Compile the constraint now, so that its errors name the flag rather than the first prompt."""
    if spec is None:
        return
    try:
        llm.engine.compile(spec)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CliError(f"{flag}: {exc}") from None


def _prepare(args: argparse.Namespace) -> tuple[SamplingParams, str | None, Any]:
    """Every check that needs no model, so that bad input fails before a slow load: the sampling
    params, and the constraint with the flag that gave it."""
    if args.stop is not None:
        try:
            args.stop = [decode_escapes(s) for s in args.stop]
        except ValueError as exc:
            raise CliError(f"--stop: {exc}") from None
    _check_inputs(args)
    _speculative(args)
    if args.stream and len(args.prompt) != 1:
        raise CliError("--stream takes exactly one --prompt")
    params = _params(args)
    flag, constraint = _constraint(args)
    return params, flag, constraint


def _generate(args: argparse.Namespace) -> int:
    params, flag, constraint = _prepare(args)
    started = time.perf_counter()
    llm = _load(args)
    loaded = time.perf_counter()
    _compile(llm, flag, constraint)
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
        _print_error(f"prompts[{index}]: {error}")
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
        _print_error(f"prompts[0]: {exc}")
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


# --- leapgen extract ------------------------------------------------------------------------------------

_EXTRACT_DESCRIPTION = """Extract one JSON object per input record into OUT.jsonl, one line per record:
{"id", "status": "ok"|"error", "data", "error", "finish_reason", "usage": {"prompt_tokens", "completion_tokens",
"forced_tokens", "forward_passes"}, "latency_s", "time_to_first_token_s"}.  Lines are appended as records
finish; running the same command again skips the ids already in OUT (resume after a crash)."""


def _positive_float(text: str) -> float:
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _add_extract_parser(commands: Any) -> None:
    from leapgen.extraction import (DEFAULT_BATCH_SIZE, DEFAULT_MAX_ITEMS, DEFAULT_MAX_STRING_LENGTH,
                                    DEFAULT_MAX_TOKENS, DEFAULT_WHITESPACE, WHITESPACES)

    ext = commands.add_parser("extract", help="extract one JSON object per record of a file into a .jsonl file",
                              description=_EXTRACT_DESCRIPTION)
    ext.add_argument("input", metavar="INPUT", help="a .jsonl file (one object a line), a .csv file or a folder "
                                                    "of .txt files")
    ext.add_argument("--schema", required=True, metavar="FILE|module:Model",
                     help="a JSON Schema file or a pydantic model class ('pkg.module:Model' or 'file.py:Model')")
    ext.add_argument("--output", "-o", required=True, metavar="OUT.jsonl",
                     help="appended to; ids already in it are skipped")
    ext.add_argument("--template", metavar="FILE|TEXT",
                     help="the prompt, as a file or the text itself: the record's fields as {placeholders} and "
                          "{schema} (default: an instruction with the schema, then the record's text)")
    ext.add_argument("--id-field", help="the field holding each record's id (default: 'id' when the records "
                                        "have one, else the line number; a folder's ids are its file names)")
    ext.add_argument("--text-field", default="text", help="the field the default template extracts from")
    ext.add_argument("--model", help="HF checkpoint directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    ext.add_argument("--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE,
                     help=f"records generated together, continuously batched (default {DEFAULT_BATCH_SIZE})")
    ext.add_argument("--max-tokens", type=_positive_int, default=DEFAULT_MAX_TOKENS)
    ext.add_argument("--whitespace", choices=WHITESPACES, default=DEFAULT_WHITESPACE,
                     help="the whitespace the JSON is written with")
    ext.add_argument("--max-string-length", type=_positive_int, default=DEFAULT_MAX_STRING_LENGTH, metavar="N",
                     help="at most N characters in strings the schema leaves unbounded")
    ext.add_argument("--max-items", type=_positive_int, default=DEFAULT_MAX_ITEMS, metavar="N",
                     help="at most N items in arrays the schema leaves unbounded")
    ext.add_argument("--speculative", metavar="METHOD", type=_speculative_method,
                     help="'ngram' (prompt lookup: drafts copied from the record) or 'draft:PATH'")
    ext.add_argument("--num-speculative-tokens", type=_positive_int, metavar="K")
    ext.add_argument("--dtype", default="auto", help="float32, float16, bfloat16 or auto")
    ext.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    ext.add_argument("--threads", type=_positive_int, help="CPU threads for torch")
    ext.add_argument("--kv-cache-memory", type=_memory_size, metavar="SIZE")
    ext.add_argument("--retry-errors", action="store_true",
                     help="run again the records whose lines in the output say status \"error\" (their lines "
                          "are replaced)")
    ext.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    ray = ext.add_argument_group("Ray Data (pip install 'leapgen[ray]')")
    ray.add_argument("--ray", action="store_true", help="run on Ray Data, one model per actor")
    ray.add_argument("--workers", type=_positive_int, help="actors (default 2)")
    ray.add_argument("--ray-address", metavar="ADDRESS", help="an existing Ray cluster (default: start a local one)")
    ray.add_argument("--cpus-per-worker", type=_positive_float,
                     help="CPUs each actor asks for (default: a share of the cluster's, or 1 on --ray-address)")
    ray.add_argument("--gpus-per-worker", type=_positive_float, help="GPUs each actor asks for")


def _ray_options(args: argparse.Namespace) -> dict[str, float]:
    """Each actor's Ray resources; the Ray flags need --ray."""
    given = [flag for flag, value in (("--workers", args.workers), ("--ray-address", args.ray_address),
                                      ("--cpus-per-worker", args.cpus_per_worker),
                                      ("--gpus-per-worker", args.gpus_per_worker)) if value is not None]
    if given and not args.ray:
        raise CliError(f"{given[0]} needs --ray")
    options = {"num_cpus": args.cpus_per_worker, "num_gpus": args.gpus_per_worker}
    if args.ray_address is not None:
        options["num_cpus"] = options["num_cpus"] or 1.0      # a share of an unknown cluster means nothing
    return {key: value for key, value in options.items() if value is not None}


def _extract(args: argparse.Namespace) -> int:
    from pathlib import Path

    import leapgen.extraction as pipeline

    _check_device(args.device)
    _check_dtype(args.dtype)
    speculative = _speculative(args)
    ray_options = _ray_options(args)
    template = Path(args.template) if args.template is not None and Path(args.template).is_file() else args.template
    plan = pipeline.prepare(args.input, args.schema, args.output, template=template, id_field=args.id_field,
                            text_field=args.text_field, whitespace=args.whitespace,
                            max_string_length=args.max_string_length, max_items=args.max_items,
                            retry_errors=args.retry_errors, max_tokens=args.max_tokens)
    try:
        if args.ray:
            from leapgen.extraction_ray import run_on_ray

            llm_options = dict(dtype=args.dtype, device=args.device, kv_cache_memory=args.kv_cache_memory,
                               speculative=speculative, max_num_seqs=args.batch_size)
            if args.threads is not None:
                llm_options["threads"] = args.threads
            summary = run_on_ray(plan, args.model, workers=args.workers or 2, address=args.ray_address,
                                 llm_options=llm_options, ray_options=ray_options, progress=not args.quiet)
        else:
            llm = None
            if plan.pending:             # a finished job loads no model
                llm = _load(args, max_num_seqs=args.batch_size)
                _compile(llm, f"--schema {args.schema}", plan.job.constraint())
                try:
                    pipeline.check_budget(llm.engine.compile(plan.job.constraint()), args.max_tokens)
                except ValueError as exc:
                    raise CliError(f"--max-tokens: {exc}") from None
            summary = pipeline.run(llm, plan, progress=not args.quiet)
    except KeyboardInterrupt:
        _print_error(f"interrupted; the lines in {args.output} are kept: run the same command again to resume")
        return 130
    if not args.quiet:
        print(summary, file=sys.stderr)
    return 0


def _print_error(message: object) -> None:
    """One line on stderr, whatever the message holds (lark's multi-line errors, undecodable argv text)."""
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"leapgen: error: {line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `leapgen` command; bad input exits with status 2 and one `leapgen: error:` line."""
    try:
        args = _parser().parse_args(argv)
        return _extract(args) if args.command == "extract" else _generate(args)
    except (ValueError, OSError) as exc:    # CliError, and what the engine refuses (RequestError)
        _print_error(exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
