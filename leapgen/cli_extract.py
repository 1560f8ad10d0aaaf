"""`leapgen extract`: the extraction pipeline's command (arguments, checks before the model loads, the run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from leapgen.cli_common import (CliError, add_model_arguments, check_device, check_dtype, compile_constraint,
                                frozen_startup_heap, load_llm, positive_float, positive_int, print_error,
                                speculative_config, speculative_method)

_EXTRACT_DESCRIPTION = """Extract one JSON object per input record into OUT.jsonl, one line per record:
{"id", "status": "ok"|"error", "data", "error", "finish_reason", "usage": {"prompt_tokens", "completion_tokens",
"forced_tokens", "forward_passes"}, "latency_s", "time_to_first_token_s"}.  Lines are appended as records
finish; running the same command again skips the ids already in OUT (resume after a crash)."""



def add_extract_parser(commands: Any) -> None:
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
    add_model_arguments(ext)
    ext.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE,
                     help=f"records generated together, continuously batched (default {DEFAULT_BATCH_SIZE})")
    ext.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS)
    ext.add_argument("--whitespace", choices=WHITESPACES, default=DEFAULT_WHITESPACE,
                     help="the whitespace the JSON is written with")
    ext.add_argument("--max-string-length", type=positive_int, default=DEFAULT_MAX_STRING_LENGTH, metavar="N",
                     help="at most N characters in strings the schema leaves unbounded")
    ext.add_argument("--max-items", type=positive_int, default=DEFAULT_MAX_ITEMS, metavar="N",
                     help="at most N items in arrays the schema leaves unbounded")
    speculation = ext.add_mutually_exclusive_group()
    speculation.add_argument("--speculative", metavar="METHOD", type=speculative_method,
                             help="'ngram' (prompt lookup: drafts copied from the record; the default) or "
                                  "'draft:PATH'")
    speculation.add_argument("--no-speculative", action="store_true",
                             help="decode one token per step (the outputs are the same either way)")
    ext.add_argument("--num-speculative-tokens", type=positive_int, metavar="K")
    ext.add_argument("--retry-errors", action="store_true",
                     help="run again the records whose lines in the output say status \"error\" (their lines "
                          "are replaced)")
    ext.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    ray = ext.add_argument_group("Ray Data (pip install 'leapgen[ray]')")
    ray.add_argument("--ray", action="store_true", help="run on Ray Data, one model per actor")
    ray.add_argument("--workers", type=positive_int, help="actors (default 2)")
    ray.add_argument("--ray-address", metavar="ADDRESS", help="an existing Ray cluster (default: start a local one)")
    ray.add_argument("--cpus-per-worker", type=positive_float,
                     help="CPUs each actor asks for (default: a share of the cluster's, or 1 on --ray-address)")
    ray.add_argument("--gpus-per-worker", type=positive_float, help="GPUs each actor asks for")


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


def run_extract(args: argparse.Namespace) -> int:
    """Run `leapgen extract` with checked arguments; returns the exit status."""
    import leapgen.extraction as pipeline

    check_device(args.device)
    check_dtype(args.dtype)
    speculative = speculative_config(args)
    if speculative is None and not args.no_speculative:
        speculative = pipeline.DEFAULT_SPECULATIVE
    ray_options = _ray_options(args)
    template = _template(args.template)
    try:
        plan = pipeline.prepare(args.input, args.schema, args.output, template=template, id_field=args.id_field,
                                text_field=args.text_field, whitespace=args.whitespace,
                                max_string_length=args.max_string_length, max_items=args.max_items,
                                retry_errors=args.retry_errors, max_tokens=args.max_tokens)
    except ValueError as exc:            # the schema's refusals name the flag that gave it
        named = (f"schema {args.schema}:", f"schema {args.schema.rpartition(':')[0]}:")   # (`file.py:Model`'s file)
        if str(exc).startswith(named):
            raise CliError(f"--{exc}") from None
        raise
    try:
        if args.ray:
            from leapgen.extraction_ray import run_on_ray

            llm_options = dict(dtype=args.dtype, device=args.device, kv_cache_memory=args.kv_cache_memory,
                               speculative=speculative, max_num_seqs=args.batch_size, pack_weights=args.pack_weights,
                               cuda_graphs=args.cuda_graphs)
            if args.threads is not None:
                llm_options["threads"] = args.threads
            summary = run_on_ray(plan, args.model, workers=args.workers or 2, address=args.ray_address,
                                 llm_options=llm_options, ray_options=ray_options, progress=not args.quiet)
        else:
            llm = None
            if plan.pending:             # a finished job loads no model
                llm = load_llm(args, max_num_seqs=args.batch_size, speculative=speculative)
                compile_constraint(llm, f"--schema {args.schema}", plan.job.constraint())
                pipeline.check_budget(llm.engine.compile(plan.job.constraint()), args.max_tokens)
                pipeline.check_limits(llm, plan)
            with frozen_startup_heap():
                summary = pipeline.run(llm, plan, progress=not args.quiet)
    except pipeline.LimitError as exc:  # a setting no record can run with, refused before any (local or on Ray)
        raise CliError(f"--{exc.option.replace('_', '-')}: {exc}") from None
    except KeyboardInterrupt:
        print_error(f"interrupted; the lines in {args.output} are kept: run the same command again to resume")
        return 130
    # a record that ended in error is finished (a rerun skips it): the status tells a script to look
    failed = "; exit status 1: records ended in error (--retry-errors runs them again)" if summary.error else ""
    if not args.quiet:
        print(f"{summary}{failed}", file=sys.stderr)
    return 1 if summary.error else 0


def _template(value: str | None) -> Path | str | None:
    """--template's file, else its text; a value that names no file and uses no record field is surely a
    file name mistyped, not a prompt."""
    if value is None:
        return None
    try:
        if Path(value).is_file():
            return Path(value)
    except OSError:                      # text too long to be a file name (ENAMETOOLONG)
        pass
    from leapgen.extraction import template_fields

    try:
        fields = template_fields(value)
    except ValueError:
        return value                     # the pipeline's checks name what is wrong with it
    if not fields:
        raise CliError(f"--template {value}: no such file, and as the prompt's text it names no record field "
                       f"(like {{text}})")
    return value
