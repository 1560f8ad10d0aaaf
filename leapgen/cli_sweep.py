"""`leapgen sweep`: try a grid of sampling settings on the same prompts, all in one batch, and print for each
cell of the grid how diverse, likely, long, valid and fast its samples are."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from leapgen.cli_common import (CliError, add_max_num_seqs_argument, add_model_arguments, check_device, check_dtype,
                                check_rows, compile_constraint, field_named_in, load_llm, positive_int, print_error,
                                progress_bar)
from leapgen.cli_inputs import (add_constraint_arguments, add_prompt_arguments, add_stop_argument, chat_prompts,
                                constraint, prepare_text_flags)
from leapgen.constraints import is_valid
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.admission import check_combination
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob

_DESCRIPTION = """Run every combination of the --grid values (a cell) on every prompt, N samples each, as one
continuously batched run, and print one row per cell: distinct-1 and distinct-2 (unique token ids and id
pairs over all of the cell's samples / all of them), the mean logprob of the sampled tokens under the model
(forced tokens of a constraint have none), the mean length in tokens, the % of samples the constraint's own
checker accepts (jsonschema, re.fullmatch, lark) when there is one, and tok/s: the cell's tokens / the whole
batch's wall time (the cells share the batch, so the rows add up to its throughput).  Requests that fail are
counted under "errors" and left out of the rest.  Settings not in the grid are SamplingParams' defaults
(temperature 0: greedy) but for --max-tokens and --stop."""

# SamplingParams fields a grid cannot take, and what to use instead
_REFUSED = {
    "n": "use --n",
    "seed": "use --seed (each cell gets its own seed, derived from it)",
    "stop": "use --stop",
    "constraint": "use --schema, --json-schema, --regex, --grammar or --response-format",
    "logprobs": "the sampled tokens' logprobs are always recorded (the logprob column)",
    "prompt_logprobs": "a sweep measures generated tokens only",
    "logit_bias": "it maps token ids to biases; set it in Python (SamplingParams(logit_bias=...))",
    "stop_token_ids": "use --stop with the tokens' text",
    "logits_processors": "they are Python objects; set them in Python (SamplingParams(logits_processors=...))",
    "speculative": "a sweep runs without speculative decoding",
    # (the logprob column needs logprobs, and beams take none, nor a temperature)
    "num_beams": "a sweep compares samples; compare beam searches with `leapgen generate --num-beams`",
    "length_penalty": "it ranks beams, and a sweep samples",
    "early_stopping": "it ends beam searches, and a sweep samples",
}
_FIELDS = {f.name: f for f in dataclasses.fields(SamplingParams) if f.name not in _REFUSED}

# (metric, column header, format) in the table's order; "valid_pct" only under a constraint
_COLUMNS = (("samples", "samples", "{}"), ("errors", "errors", "{}"), ("distinct_1", "distinct-1", "{:.3f}"),
            ("distinct_2", "distinct-2", "{:.3f}"), ("mean_logprob", "logprob", "{:.3f}"),
            ("mean_length", "length", "{:.1f}"), ("valid_pct", "valid%", "{:.1f}"), ("tokens_per_s", "tok/s", "{:.1f}"))
_PLOTTED = ("distinct_1", "distinct_2", "mean_logprob", "mean_length", "valid_pct", "tokens_per_s")


def add_sweep_parser(commands: Any) -> None:
    sweep = commands.add_parser("sweep", help="compare sampling settings: a grid of them on the same prompts, "
                                              "one table row per cell", description=_DESCRIPTION)
    add_model_arguments(sweep)
    add_max_num_seqs_argument(sweep)
    add_prompt_arguments(sweep)
    sweep.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                       help="a SamplingParams field (temperature, top_p, top_k, min_p, repetition_penalty, "
                            "max_tokens, presence_penalty, ...) and the values to try; repeat for more fields, the "
                            "cells being every combination; one value sets the field in every cell")
    sweep.add_argument("--n", type=positive_int, default=8, help="samples per cell and prompt (default 8)")
    sweep.add_argument("--seed", type=int, default=0,
                       help="each cell samples with a seed derived from this and its number, so the same command "
                            "gives the same samples (default 0)")
    sweep.add_argument("--max-tokens", type=positive_int, default=64, help="unless in the grid (default 64)")
    add_stop_argument(sweep)
    add_constraint_arguments(sweep)
    sweep.add_argument("--output", "-o", metavar="FILE.jsonl",
                       help="write every sample, one JSON object a line: cell, settings, seed, prompt_index, prompt, "
                            "sample, text, token_ids, finish_reason, mean_logprob, valid (under a constraint)")
    sweep.add_argument("--plot", metavar="FILE.png", help="draw the metrics across the cells (needs matplotlib)")
    sweep.add_argument("--json", action="store_true", help="print one JSON object per cell instead of the table")


# --- the grid, checked before the model loads -------------------------------------------------------------

@dataclasses.dataclass
class Axis:
    """One --grid flag: a SamplingParams field and its values, with the flag as typed for errors."""

    field: str
    values: list[Any]
    flag: str


@dataclasses.dataclass
class Cell:
    """One point of the grid: its settings, the params its requests run with, and what came back for each
    prompt (`valid`: per completion, under a constraint)."""

    index: int
    settings: dict[str, Any]
    params: SamplingParams
    outputs: list[RequestOutput] = dataclasses.field(default_factory=list)
    valid: list[list[bool]] = dataclasses.field(default_factory=list)


def parse_grid(specs: list[str]) -> list[Axis]:
    """--grid's FIELD=V1,V2,... flags as fields with typed values; CliError naming the flag."""
    axes: list[Axis] = []
    for spec in specs:
        flag = f"--grid {spec}"
        name, equals, values = spec.partition("=")
        field = name.strip().replace("-", "_")        # top-p as the other commands' flags spell it
        if not equals:
            raise CliError(f"{flag}: expected FIELD=V1,V2,... (a SamplingParams field and its values)")
        if field in _REFUSED:
            raise CliError(f"{flag}: {field} cannot be swept; {_REFUSED[field]}")
        if field not in _FIELDS:
            raise CliError(f"{flag}: unknown SamplingParams field {field!r} (fields: {', '.join(_FIELDS)})")
        if any(axis.field == field for axis in axes):
            raise CliError(f"{flag}: {field} is already in the grid; give all its values in one --grid")
        parsed: list[Any] = []
        for text in values.split(","):
            value = _value(flag, field, text)
            if value in parsed:
                raise CliError(f"{flag}: {text.strip()!r} is given twice")
            parsed.append(value)
        axes.append(Axis(field, parsed, flag))
    return axes


def _value(flag: str, field: str, text: str) -> Any:
    """`text` as a value of `field`, typed as the field's default is (SamplingParams checks the range)."""
    default = _FIELDS[field].default
    word = text.strip()
    if isinstance(default, bool):                 # before int: a bool is an int
        words = {"true": True, "false": False, **({"never": "never"} if field == "early_stopping" else {})}
        if word.lower() in words:
            return words[word.lower()]
        *others, last = words
        expected = f"{', '.join(others)} or {last}"
    else:
        try:
            return type(default)(word)
        except ValueError:
            expected = "an int" if isinstance(default, int) else "a number"
    raise CliError(f"{flag}: {field} takes {expected}, got {text!r}")


def cell_seed(seed: int, cell: int) -> int:
    """The sampling seed of cell number `cell` under --seed `seed`: the same on every run, and unrelated to
    the other cells' and other --seed values' (seed + cell would give --seed 1 the cells of --seed 0, shifted)."""
    return random.Random(f"{seed}:{cell}").getrandbits(63)


def make_cells(args: argparse.Namespace, axes: list[Axis], spec: Any) -> list[Cell]:
    """Every combination of the grid's values, each with its checked SamplingParams."""
    base = dict(max_tokens=args.max_tokens, stop=args.stop, n=args.n, logprobs=0, constraint=spec)
    combinations = itertools.product(*(axis.values for axis in axes))
    cells = []
    for index, values in enumerate(combinations):
        settings = {axis.field: value for axis, value in zip(axes, values)}
        try:
            params = SamplingParams(**{**base, **settings, "seed": cell_seed(args.seed, index)})
            check_combination(params)      # what the engine would refuse in every request of the cell
        except ValueError as exc:
            raise CliError(f"{_culprit(str(exc), axes, settings, base)}: {exc}") from None
        cells.append(Cell(index, settings, params))
    return cells


def _culprit(message: str, axes: list[Axis], settings: dict[str, Any], base: dict[str, Any]) -> str:
    """The flag a SamplingParams error is about: a --grid flag, else the flag of a base setting."""
    field = field_named_in(message, settings)
    if field is not None:
        return next(axis.flag for axis in axes if axis.field == field)
    field = field_named_in(message, base)
    return f"--{field.replace('_', '-')}" if field is not None else "--grid"


def _check_writable(flag: str, path: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise CliError(f"{flag} {path}: is a directory, not a file")
    if not target.parent.is_dir():
        raise CliError(f"{flag} {path}: no such directory {target.parent}")
    # opened now, appending nothing: a file the sweep could not write was found only after every cell had run
    existed = target.exists()
    try:
        with open(target, "ab"):
            pass
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
    if not existed:
        target.unlink(missing_ok=True)


def _file_of(flag: str, value: str | None) -> str | None:
    """The file an input flag's value reads, where it names one: not standard input, and of a schema given as
    `file.py:Model` the module's file."""
    if value is None or flag == "--prompts-file" and value == "-":
        return None
    module, _, _ = value.rpartition(":")
    return module if flag in ("--schema", "--json-schema") and module.endswith(".py") else value


def _refuse_overwrites(written: list[tuple[str, str]], read: list[tuple[str, str]]) -> None:
    """A file the sweep writes must be neither another it writes nor one it reads (by any path to it)."""
    for i, (flag, path) in enumerate(written):
        for other_flag, other in written[:i] + read:
            try:
                same = os.path.samefile(path, other) if Path(path).exists() else \
                    Path(path).resolve() == Path(other).resolve()
            except OSError:              # (a value that is no file: a module:Model, inline JSON)
                same = False
            if same:
                raise CliError(f"{flag} {path}: the file {other_flag} names; it would be written over")


def _prepare(args: argparse.Namespace) -> tuple[list[Cell], str | None, Any]:
    """Every check that needs no model: the cells, and the constraint with the flag that gave it."""
    axes = parse_grid(args.grid)
    prepare_text_flags(args)
    check_rows(args, args.n)
    check_device(args.device)
    check_dtype(args.dtype)
    flag, spec = constraint(args)
    written = [(file_flag, path) for file_flag, path in (("--output", args.output), ("--plot", args.plot)) if path]
    for file_flag, path in written:
        _check_writable(file_flag, path)
    read = [(f, _file_of(f, getattr(args, f[2:].replace("-", "_"), None)))
            for f in ("--prompts-file", "--schema", "--json-schema", "--response-format", "--grammar")]
    _refuse_overwrites(written, [(f, path) for f, path in read if path])
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise CliError("--plot needs matplotlib: pip install 'leapgen[plot]'")
    return make_cells(args, axes, spec), flag, spec


# --- running ----------------------------------------------------------------------------------------------

def run_sweep(args: argparse.Namespace) -> int:
    """Run `leapgen sweep` with checked arguments; returns the exit status."""
    cells, flag, spec = _prepare(args)
    started = time.perf_counter()
    llm = load_llm(args, speculative=None)
    loaded = time.perf_counter()
    compile_constraint(llm, flag, spec)
    prompts = chat_prompts(llm, args) if args.chat or args.system is not None else args.prompt
    requests = [(cell, prompt) for cell in cells for prompt in prompts]
    batch_started = time.perf_counter()
    with progress_bar(len(requests)) as progress:
        outputs = llm.generate([prompt for _, prompt in requests], [cell.params for cell, _ in requests],
                               on_error="return", progress=progress)
    wall_s = time.perf_counter() - batch_started
    for index, ((cell, _), output) in enumerate(zip(requests, outputs)):
        if output.error is not None:     # the engine names the request by its place in the whole batch
            output.error = output.error.removeprefix(f"prompts[{index}]: ")
        cell.outputs.append(output)
        if spec is not None:
            cell.valid.append([is_valid(spec, c.text) for c in output.outputs])
    rows = [cell_metrics(cell, wall_s, constrained=spec is not None) for cell in cells]
    _print_rows(args, cells, rows)
    if args.output is not None:
        _write_samples(args.output, cells, args.prompt, constrained=spec is not None)
    if args.plot is not None:
        _plot(args.plot, cells, rows)
    tokens = sum(len(c.token_ids) for output in outputs for c in output.outputs)
    print(f"[leapgen] sweep: {len(cells)} cells x {len(prompts)} prompts x {args.n} samples in one batch: "
          f"{tokens} tokens in {wall_s:.2f}s ({tokens / max(wall_s, 1e-9):.1f} tok/s); model loaded in "
          f"{loaded - started:.1f}s", file=sys.stderr)
    return _report_failures(cells)


def cell_metrics(cell: Cell, wall_s: float, constrained: bool) -> dict[str, Any]:
    """The cell's row of the table, over the samples of its requests that did not fail (None where there
    is nothing to measure)."""
    ok = [index for index, output in enumerate(cell.outputs) if output.error is None]
    completions = [c for i in ok for c in cell.outputs[i].outputs]
    ids = [c.token_ids for c in completions]
    tokens = sum(map(len, ids))
    bigrams = [pair for sample in ids for pair in zip(sample, sample[1:])]
    row = {"samples": len(completions), "errors": len(cell.outputs) - len(ok),
           "distinct_1": _ratio(len({token for sample in ids for token in sample}), tokens),
           "distinct_2": _ratio(len(set(bigrams)), len(bigrams)),
           "mean_logprob": _mean([lp.logprob for c in completions for lp in _sampled(c)]),
           "mean_length": _ratio(tokens, len(completions))}
    if constrained:
        valid = [flag for i in ok for flag in cell.valid[i]]
        row["valid_pct"] = None if not valid else 100 * sum(valid) / len(valid)
    row["tokens_per_s"] = tokens / max(wall_s, 1e-9)
    return row


def _ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _sampled(completion: CompletionOutput) -> list[TokenLogprob]:
    """The logprobs of the tokens the model sampled (a forced-token jump's have no probability of their own)."""
    return [lp for lp in completion.logprobs or [] if not lp.forced]


# --- what it prints and writes ----------------------------------------------------------------------------

def _print_rows(args: argparse.Namespace, cells: list[Cell], rows: list[dict[str, Any]]) -> None:
    if args.json:
        for cell, row in zip(cells, rows):
            print(json.dumps({"cell": cell.index, "settings": cell.settings, "seed": cell.params.seed, **row}))
        return
    fields = list(cells[0].settings)
    columns = [(key, header, style) for key, header, style in _COLUMNS if key in rows[0]]
    table = [["cell", *fields, *(header for _, header, _ in columns)]]
    for cell, row in zip(cells, rows):
        table.append([str(cell.index), *(_shown(cell.settings[f]) for f in fields),
                      *("-" if row[key] is None else style.format(row[key]) for key, _, style in columns)])
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("  ".join(text.rjust(width) for text, width in zip(line, widths)))


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _label(cell: Cell) -> str:
    return "\n".join(f"{field}={_shown(value)}" for field, value in cell.settings.items()) or "defaults"


def sample_records(cells: list[Cell], prompts: list[str], constrained: bool) -> Iterator[dict[str, Any]]:
    """Every sample with its cell's settings, as --output writes them."""
    for cell in cells:
        for prompt_index, (prompt, output) in enumerate(zip(prompts, cell.outputs)):
            for sample, completion in enumerate(output.outputs):
                record = {"cell": cell.index, "settings": cell.settings, "seed": cell.params.seed,
                          "prompt_index": prompt_index, "prompt": prompt, "sample": sample, "text": completion.text,
                          "token_ids": completion.token_ids, "finish_reason": completion.finish_reason,
                          "mean_logprob": _mean([lp.logprob for lp in _sampled(completion)])}
                if constrained and output.error is None:
                    record["valid"] = cell.valid[prompt_index][sample]
                if output.error is not None:
                    record["error"] = output.error
                yield record


def _write_samples(path: str, cells: list[Cell], prompts: list[str], constrained: bool) -> None:
    try:
        with open(path, "w", encoding="utf-8") as out:
            for record in sample_records(cells, prompts, constrained):
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError as exc:
        raise CliError(f"--output {path}: cannot write it ({exc.strerror or exc})") from None


def _plot(path: str, cells: list[Cell], rows: list[dict[str, Any]]) -> None:
    """One bar chart per metric, the cells along x, rendered by Agg (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    headers = {key: header for key, header, _ in _COLUMNS}
    metrics = [key for key in _PLOTTED if key in rows[0]]
    figure = Figure(figsize=(max(6.0, 0.9 * len(cells) + 2), 1.8 * len(metrics) + 1.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    positions = range(len(cells))
    for ax, key in zip(axes, metrics):
        ax.bar(positions, [math.nan if row[key] is None else row[key] for row in rows], color="tab:blue")
        ax.set_ylabel(headers[key])
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(positions, [_label(cell) for cell in cells], fontsize=8)
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise CliError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None


def _report_failures(cells: list[Cell]) -> int:
    """One error line for the requests that failed (the errors column counts them); exit status 2 if any."""
    failed = [(cell.index, prompt_index, output.error) for cell in cells
              for prompt_index, output in enumerate(cell.outputs) if output.error is not None]
    if not failed:
        return 0
    cell, prompt_index, error = failed[0]
    total = sum(len(cell.outputs) for cell in cells)
    print_error(f"{len(failed)} of {total} requests failed (the errors column); the first, cell {cell} prompt "
                f"{prompt_index}: {error}")
    return 2
