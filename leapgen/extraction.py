"""The extraction pipeline (`leapgen extract`, `leapgen.extract(...)`): records -> prompts -> JSON-constrained
generation -> one output line per record, resumable.

Each output line is `{"id", "status": "ok"|"error", "data", "error", "finish_reason", "usage": {"prompt_tokens",
"completion_tokens", "forced_tokens", "forward_passes"[, "drafted_tokens", "accepted_tokens"]}, "latency_s",
"time_to_first_token_s"}`: `data` is the parsed object when it parses and validates against the schema
(status "ok"), else null with the reason in `error`.  A record that cannot run (too long for the context)
gets its error line and the others go on.  Running the same command again skips the ids already in the
output; the output does not record the schema or model it was made with, so resume with the same ones.
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from leapgen.constraints import JsonSchema, load_schema, model_json_schema
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.speculative import SpeculativeConfig
from leapgen.grammars.json_schema import JsonSchemaOptions
from leapgen.grammars.json_validation import exact_json, schema_validator
from leapgen.extraction_io import (OutputWriter, Record, check_same_run, read_finished, read_records,
                                   refuse_input_as_output, write_run_record)

if TYPE_CHECKING:
    from leapgen.decoding.constraint import TokenConstraint
    from leapgen.engine.outputs import RequestOutput
    from leapgen.llm import LLM

DEFAULT_WHITESPACE = "dumps"   # the most accurate and the fewest tokens on benchmarks/extraction (README)
DEFAULT_MAX_TOKENS = 256
# Caps on values the schema leaves unbounded (strings, arrays): the usual runaway of a small model
DEFAULT_MAX_STRING_LENGTH: int | None = None
DEFAULT_MAX_ITEMS: int | None = None
DEFAULT_BATCH_SIZE = 32
# Prompt lookup: an extracted value is usually copied from the record, which is in the prompt, so drafts are
# often right; lossless (the same outputs as without), 1.2-1.3x faster on benchmarks/extraction (README).
DEFAULT_SPECULATIVE = SpeculativeConfig("ngram", num_speculative_tokens=8, prompt_lookup_max=4, prompt_lookup_min=1)
WHITESPACES = ("compact", "dumps", "flexible")
DEFAULT_TEMPLATE = ("Extract the information in the text below as one JSON object that matches this JSON Schema:\n"
                    "{schema}\n\nText:\n{text}")
# Ray: records per map_batches batch, times the batch size (each batch drains its last requests before the
# actor takes the next, so batches much larger than the engine's batch keep that tail small).
WINDOW_BATCHES = 16
# SamplingParams fields an extraction cannot honour, with why: each record gets one line, under the schema
NOT_FOR_EXTRACTION = {"n": "each record gets one output line", "constraint": "the schema is the constraint",
                      **dict.fromkeys(("ignore_eos", "min_tokens", "stop", "stop_token_ids"),
                                      "the schema decides where the JSON ends")}


# --- prompts ----------------------------------------------------------------------------------------------

def extraction_prompt(tokenizer: Any, record: dict, schema: dict, template: str | None = None, *,
                      text_field: str = "text") -> str:
    """The prompt for one record: `template` (default: an instruction with the schema, then the record's
    `text_field`) with the record's fields as {placeholders} and `{schema}` as compact JSON, in the
    tokenizer's chat template as the user's message when it has one, else as plain text."""
    schema_text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if template is None:
        content = DEFAULT_TEMPLATE.format(schema=schema_text, text=_as_text(record[text_field]))
    else:
        content = template.format_map({**{k: _as_text(v) for k, v in record.items()}, "schema": schema_text})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
    return content


def template_fields(template: str) -> set[str]:
    """The record fields `template` uses ({schema} is the schema, not a field); ValueError for a bad template."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"template: {exc} (write {{{{ and }}}} for literal braces)") from None
    for name in names:
        if re.search(r"[\"'\n]", name):   # JSON in the prompt: {"color": "red"} reads as the field '"color"'
            shown = " ".join(name.split())
            raise ValueError(f"template: {{{shown}...}} reads as a placeholder; write {{{{ and }}}} for the braces of "
                             "JSON in the prompt")
        if not name or name.isdigit() or re.search(r"[.\[]", name):
            raise ValueError(f"template: placeholder {{{name}}} must be a record field's plain name, like {{text}}")
    return set(names) - {"schema"}


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# --- the job, checked before any work ------------------------------------------------------------------

@dataclass(frozen=True)
class ExtractJob:
    """How every record runs; plain data, so Ray actors run the same job as the local loop."""

    schema: dict
    template: str | None
    text_field: str
    schema_options: dict[str, Any]       # the JSON-schema compiler's: whitespace and the value caps
    sampling: dict[str, Any]             # SamplingParams fields (max_tokens, ...), greedy unless they say otherwise

    def constraint(self) -> JsonSchema:
        # additional_properties=False: an extraction must not invent keys the schema did not ask for
        return JsonSchema(self.schema, options={**self.schema_options, "additional_properties": False})

    def params(self) -> SamplingParams:
        return SamplingParams(**{"temperature": 0.0, **self.sampling, "constraint": self.constraint()})

    def prompt(self, tokenizer: Any, record: Record) -> str:
        return extraction_prompt(tokenizer, record.fields, self.schema, self.template, text_field=self.text_field)


@dataclass
class ExtractPlan:
    """A checked job: the records still to run (those not yet in `output`) and how many were skipped."""

    job: ExtractJob
    pending: list[Record]
    skipped: int
    output: Path
    retry_errors: bool = False           # error lines already in the output run again
    # the input and schema, kept beside the output (empty beside an older output's lines, whose run is not known)
    run: dict[str, Any] = dataclasses.field(default_factory=dict)


def prepare(input: str | Path, schema: dict | type | str | Path, output: str | Path, *,
            template: str | Path | None = None, id_field: str | None = None, text_field: str = "text",
            whitespace: str = DEFAULT_WHITESPACE, max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
            max_items: int | None = DEFAULT_MAX_ITEMS, retry_errors: bool = False, **sampling: Any) -> ExtractPlan:
    """Read and check everything that needs no model (input records, schema, template, sampling and compiler
    options, the output so far); ValueError names the file and line, the schema or the field that is wrong."""
    if whitespace not in WHITESPACES:
        raise ValueError(f"whitespace: expected one of {', '.join(WHITESPACES)}, got {whitespace!r}")
    options = {"whitespace": whitespace, "max_string_length": max_string_length, "max_items": max_items}
    _check_sampling(sampling)
    job = ExtractJob(_schema_dict(schema), _template_text(template), text_field, options, sampling)
    job.params()                         # a bad sampling field fails here, naming it
    JsonSchemaOptions(**options)         # and so does a bad cap
    try:
        job.constraint().check()         # and a bad or unsupported schema, before any model loads
    except (ValueError, TypeError, RecursionError) as exc:
        why = " (extract generates only the properties the schema declares)" if "unsatisfiable" in str(exc) else ""
        where = f"schema {schema}" if isinstance(schema, (str, Path)) else "schema"
        raise ValueError(f"{where}: {exc}{why}") from None
    records = read_records(input, id_field, text_field)
    needed = {text_field} if job.template is None else template_fields(job.template)
    for record in records:
        missing = sorted(name for name in needed if record.fields.get(name) is None)
        if missing:
            # (absent, null, or a CSV cell left empty, which the reader drops)
            raise ValueError(f"{record.where}: no value for {missing[0]!r} (the template uses it)")
        if all(isinstance(record.fields[name], str) and not record.fields[name].strip() for name in needed):
            # the model would make a record up from the instructions alone, and its line would read ok
            fields = " and ".join(map(repr, sorted(needed)))
            raise ValueError(f"{record.where}: {'the fields' if len(needed) > 1 else 'the'} {fields} "
                             f"{'are' if len(needed) > 1 else 'field is'} empty: nothing to extract from")
    refuse_input_as_output(input, output)
    finished = read_finished(output, retry_errors)
    # the schema as the record reads it back (a tuple is a list there, a date a string)
    run = {"input": str(Path(input).resolve()), "schema": json.loads(json.dumps(job.schema, default=str))}
    if not check_same_run(output, run):
        run = {}
    pending = [record for record in records if record.id not in finished]
    return ExtractPlan(job, pending, len(records) - len(pending), Path(output), retry_errors, run)


def _schema_dict(schema: dict | type | str | Path) -> dict:
    where = "schema"
    if isinstance(schema, (str, Path)):
        where = f"schema {schema}"       # (a file's or a module's: the error names it)
        try:
            schema = load_schema(str(schema))
        except ValueError as exc:
            raise ValueError(f"schema {exc}") from None
    if isinstance(schema, type):         # a pydantic model class (load_schema has checked that)
        try:
            schema = model_json_schema(schema)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if not isinstance(schema, dict):
        # (a boolean is a schema, but not of the object each record is extracted into)
        raise ValueError(f"{where}: expected a JSON Schema object (each record is extracted into the properties it "
                         f"declares), got {type(schema).__name__}")
    return schema


def _check_sampling(sampling: dict[str, Any]) -> None:
    """ValueError naming a keyword that is no SamplingParams field, or one extraction would ignore."""
    defaults = {field.name: field for field in dataclasses.fields(SamplingParams)}
    for name, value in sampling.items():
        if name not in defaults:
            raise ValueError(f"{name}: not an option of extract, nor a SamplingParams field")
        if name in NOT_FOR_EXTRACTION and value and value != defaults[name].default:     # (stop=[] stops nothing)
            raise ValueError(f"{name}={value!r}: not for extraction ({NOT_FOR_EXTRACTION[name]})")


def _template_text(template: str | Path | None) -> str | None:
    where = "template"
    if isinstance(template, Path):
        where = f"template {template}"
        try:
            template = template.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    # one with no field gives every record the same prompt: surely a file name taken for the text, or a slip
    if template is not None and not template_fields(template):
        raise ValueError(f"{where}: names no field of the records (write them as {{placeholders}}, like {{text}})")
    return template


class LimitError(ValueError):
    """A setting no record of the job can run with (every one would end in the same error line); `option`
    names it: "max_tokens" or "kv_cache_memory"."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def check_schema(llm: LLM, job: ExtractJob) -> None:
    """Compile the job's schema for the model now, so a bad or unsupported one fails before any record runs
    (the message names the keyword and its JSON pointer), as does a max_tokens no output could fit in."""
    try:
        compiled = llm.engine.compile(job.constraint())
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"schema: {exc}") from None
    check_budget(compiled, job.params().max_tokens)


def check_budget(compiled: TokenConstraint, max_tokens: int) -> None:
    """ValueError when even the schema's shortest instance takes more than `max_tokens` tokens: every
    record would fail the same way."""
    shortest = compiled.matcher().completion_tokens()
    if shortest is not None and len(shortest) > max_tokens:
        raise LimitError("max_tokens", f"max_tokens={max_tokens} is too small for the schema: its shortest "
                                       f"instance takes {len(shortest)} tokens")


def check_context(max_tokens: int, context: int) -> None:
    """LimitError when max_tokens alone fills the model's context (a prompt takes a token at least)."""
    if max_tokens >= context:
        raise LimitError("max_tokens", f"max_tokens={max_tokens} leaves no room for a prompt in the model's "
                                       f"context of {context} tokens; at most {context - 1}")


def check_limits(llm: LLM, plan: ExtractPlan) -> None:
    """LimitError when the model's limits refuse every record for the same reason: max_tokens alone fills
    its context, or its KV cache holds no record's prompt + max_tokens.  (A record too long for the context
    is that record's error line; the others go on.)  Tokenizes prompts only until one fits."""
    limits = llm.engine.limits
    max_tokens = plan.job.params().max_tokens
    context, capacity = limits.max_model_len, limits.kv_capacity_tokens
    check_context(max_tokens, context)
    shortest = None                  # tokens of the shortest prompt that fits the context
    for record in plan.pending:
        tokens = _prompt_tokens(llm.tokenizer, plan.job.prompt(llm.tokenizer, record))
        if tokens is None or tokens + max_tokens > context:
            continue
        if tokens + max_tokens <= capacity:
            return
        shortest = tokens if shortest is None else min(shortest, tokens)
    if shortest is not None:
        raise LimitError("kv_cache_memory", f"the KV cache holds {capacity} tokens, too few for any record: the "
                                            f"shortest prompt ({shortest} tokens) + max_tokens ({max_tokens}) needs "
                                            f"{shortest + max_tokens}; raise kv_cache_memory or lower max_tokens")


# --- running records ---------------------------------------------------------------------------------------

def run_records(llm: LLM, records: Sequence[Record], job: ExtractJob) -> Iterator[dict[str, Any]]:
    """The output line of each record, as it finishes (all of them continuously batched together)."""
    validator = schema_validator(job.schema)
    speculating = llm.engine.config.speculative is not None
    prompts = [job.prompt(llm.tokenizer, record) for record in records]
    # queued as room frees up: the first lines come at once, and the batch never drains between records
    outputs = llm.generate_iter(prompts, job.params(), on_error="return", max_pending=2 * llm.engine.config.max_num_seqs)
    for index, output in outputs:
        prompt_tokens = None
        if not output.prompt_token_ids:  # refused before it ran (too long, ...): the engine kept no tokens
            prompt_tokens = _prompt_tokens(llm.tokenizer, prompts[index])
        yield output_line(records[index].id, output, validator, speculating, prompt_tokens)


def _prompt_tokens(tokenizer: Any, prompt: str) -> int | None:
    """The prompt's length in tokens as the engine counts it; None when it cannot be encoded."""
    from leapgen.engine.admission import encode_prompt

    try:
        return len(encode_prompt(prompt, tokenizer)[1])
    except (ValueError, TypeError):
        return None


def output_line(record_id: Any, output: RequestOutput, validator: Any, speculating: bool,
                prompt_tokens: int | None = None) -> dict[str, Any]:
    """One record's output line: its data when the text parses and validates, else the reason it failed; an
    output cut at max_tokens is an error too, with the data it was closed to (a pipeline keeps the rows whose status
    is ok, and `--retry-errors` runs the others again).  `validator`: `json_validation.schema_validator`'s for the
    job's schema (it is given exact numbers); `prompt_tokens`: the prompt's length where `output` holds no prompt (a
    request refused before it ran)."""
    data, error = _checked_data(output, validator)
    metrics = output.metrics
    if prompt_tokens is None:
        prompt_tokens = len(output.prompt_token_ids)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(output.token_ids),
             "forced_tokens": metrics.forced_tokens, "forward_passes": metrics.forward_passes}
    if speculating:
        usage.update(drafted_tokens=metrics.drafted_tokens, accepted_tokens=metrics.accepted_tokens)
    return {"id": record_id, "status": "ok" if error is None else "error", "data": data, "error": error,
            "finish_reason": output.finish_reason, "usage": usage, "latency_s": _rounded(metrics.total_time),
            "time_to_first_token_s": _rounded(metrics.time_to_first_token)}


def _checked_data(output: RequestOutput, validator: Any) -> tuple[Any, str | None]:
    import jsonschema

    if output.error is not None:         # drop the engine's "prompts[i]: " (a window's index): the id says which
        return None, re.sub(r"^prompts\[\d+\]: ", "", output.error)
    try:        # closing under the token budget makes a "length" output complete JSON too
        data = json.loads(output.text)
        problem = jsonschema.exceptions.best_match(validator.iter_errors(exact_json(output.text)))
    except ValueError as exc:
        return None, f"not valid JSON: {exc}"
    except RecursionError:
        return None, "nested too deeply to check against the schema"
    if problem is not None:
        return None, f"does not match the schema at /{'/'.join(map(str, problem.absolute_path))}: {problem.message}"
    if output.finish_reason == "length":    # valid, but its last values may be the shortest ones that close it
        return data, _CUT_SHORT
    return data, None


_CUT_SHORT = "cut at max_tokens: the JSON was closed to fit, so its last values may be cut short (raise max_tokens)"


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


# --- writing, progress and the summary -----------------------------------------------------------------

@dataclass
class ExtractSummary:
    """What a run did: records ok / error / skipped (already in the output), tokens and wall time."""

    output: Path
    ok: int = 0
    error: int = 0
    skipped: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    repaired_bytes: int = 0              # a torn last line cut off the output before this run appended

    @property
    def records_per_s(self) -> float:
        return (self.ok + self.error) / self.wall_s if self.wall_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s else 0.0

    def add(self, line: dict[str, Any]) -> None:
        if line["status"] == "ok":
            self.ok += 1
        else:
            self.error += 1
        self.prompt_tokens += line["usage"]["prompt_tokens"]
        self.completion_tokens += line["usage"]["completion_tokens"]

    def __str__(self) -> str:
        repaired = f"; cut a torn last line ({self.repaired_bytes} bytes)" if self.repaired_bytes else ""
        return (f"[leapgen] extract: {self.ok} ok, {self.error} error, {self.skipped} skipped (already in "
                f"{self.output}){repaired}; {self.completion_tokens} tokens generated in {self.wall_s:.1f}s "
                f"({self.tokens_per_s:.1f} tok/s, {self.records_per_s:.2f} records/s)")


def write_lines(lines: Iterable[dict[str, Any]], plan: ExtractPlan, progress: bool = True) -> ExtractSummary:
    """Append `lines` to the plan's output as they come, with a progress bar on stderr (when it is a
    terminal and `progress`); the one writer of both the local loop and the Ray driver."""
    from tqdm import tqdm

    summary = ExtractSummary(plan.output, skipped=plan.skipped)
    started = time.perf_counter()
    bar = tqdm(total=len(plan.pending), unit="rec", file=sys.stderr, dynamic_ncols=True,
               disable=not progress or not sys.stderr.isatty())
    with OutputWriter(plan.output, retry_errors=plan.retry_errors) as writer, bar:
        summary.repaired_bytes = writer.repaired_bytes
        if plan.run:
            write_run_record(plan.output, plan.run)
        for line in lines:
            if not writer.write(line):
                continue                 # written meanwhile (by a retried Ray task): never twice
            summary.add(line)
            summary.wall_s = time.perf_counter() - started
            bar.update(1)
            bar.set_postfix({"ok": summary.ok, "error": summary.error, "tok/s": f"{summary.tokens_per_s:.0f}"},
                            refresh=False)
    summary.wall_s = time.perf_counter() - started
    return summary


def run(llm: LLM | None, plan: ExtractPlan, progress: bool = True) -> ExtractSummary:
    """Run the plan's pending records on `llm` in this process (None is fine when nothing is pending)."""
    if not plan.pending:
        return write_lines([], plan, progress)
    return write_lines(run_records(llm, plan.pending, plan.job), plan, progress)


# --- the one-call entry point ------------------------------------------------------------------------------

def extract(input: str | Path, schema: dict | type | str | Path, output: str | Path, *,
            model: LLM | str | Path | None = None, template: str | Path | None = None, id_field: str | None = None,
            text_field: str = "text", batch_size: int = DEFAULT_BATCH_SIZE, max_tokens: int = DEFAULT_MAX_TOKENS,
            whitespace: str = DEFAULT_WHITESPACE, max_string_length: int | None = DEFAULT_MAX_STRING_LENGTH,
            max_items: int | None = DEFAULT_MAX_ITEMS, retry_errors: bool = False,
            speculative: SpeculativeConfig | dict[str, Any] | None = DEFAULT_SPECULATIVE, progress: bool = True,
            llm_options: dict[str, Any] | None = None, ray: bool = False, workers: int = 2,
            ray_address: str | None = None, ray_options: dict[str, Any] | None = None,
            **sampling: Any) -> ExtractSummary:
    """Extract one JSON object per record of `input` (.jsonl, .csv or a folder of .txt files) into `output`
    (.jsonl, one line per record, appended; ids already there are skipped, so a rerun resumes).

    `schema`: a dict, a pydantic model class, a JSON Schema file or "module:Model".  `template`: the prompt
    with the record's fields as {placeholders} (a Path: read from the file).  `model`: an LLM, a path, or
    None for the embedded default; `batch_size`, `speculative` (prompt lookup by default, which never changes
    the outputs; None turns it off) and `llm_options` (LLM keywords: threads, device, dtype, ...) apply where
    this call loads it.  Other keywords are SamplingParams fields (greedy by default; not n, constraint,
    stop, stop_token_ids, min_tokens or ignore_eos, which the schema decides: ValueError).  `ray=True` runs on
    Ray Data with `workers` actors (`ray_address`: an existing cluster; `ray_options`: each actor's resources,
    e.g. {"num_gpus": 1}).
    `retry_errors=True` runs again the records whose lines in `output` say status "error" (their lines are
    replaced).  Every bad input raises ValueError before any record runs.
    """
    plan = prepare(input, schema, output, template=template, id_field=id_field, text_field=text_field,
                   whitespace=whitespace, max_string_length=max_string_length, max_items=max_items,
                   retry_errors=retry_errors, max_tokens=max_tokens, **sampling)
    llm_options = {"max_num_seqs": batch_size, "speculative": speculative, **(llm_options or {})}
    if ray:
        from leapgen.extraction_ray import run_on_ray

        return run_on_ray(plan, model, workers=workers, address=ray_address, llm_options=llm_options,
                          ray_options=ray_options, progress=progress)
    if not plan.pending:
        return run(None, plan, progress)
    from leapgen.llm import LLM

    llm = model if isinstance(model, LLM) else LLM(model, **llm_options)
    check_schema(llm, plan.job)
    check_limits(llm, plan)
    return run(llm, plan, progress)
