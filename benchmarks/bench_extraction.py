"""Extraction benchmark (issue 12): leapgen vs transformers + xgrammar / + llguidance on hand-written records.

Every case in `benchmarks/extraction/cases.jsonl` is a short document, the name of a schema in
`benchmarks/extraction/schemas/` and a gold answer (checked against its schema at start).  The embedded
SmolLM2-135M-Instruct extracts each one greedily (CPU, fp32) from the prompt `leapgen.extraction.extraction_prompt`
builds; every system gets the same prompt token ids and the same `--max-tokens`.

Configurations (`--configs`):
  plain, forced, ngram   leapgen without forced-token jumps, with them (the engine's default), and with them
                         plus prompt-lookup speculation (8 tokens)
  pipeline               ngram plus prefix caching, as `leapgen extract` runs: at batch 1 each record finds the
                         instruction and schema cached, as every record after a schema's first does in a
                         pipeline (the cache is emptied and that shared prefix prefilled, untimed, before each
                         record); the batched runs start from an empty cache
  xgrammar, llguidance   transformers `generate()` on the same weights with xgrammar's logits processor
                         (`xgrammar.contrib.hf`) or with llguidance's matcher (llguidance ships no transformers
                         processor; `LLGuidanceProcessor` below applies its masks with its numpy helpers)
  whitespace             leapgen `forced` with whitespace "flexible" (bounded), "compact" and "dumps"
  caps                   leapgen `forced` with the compiler options max_string_length=64, max_items=8, and without
                         (caps apply only where the schema sets no maxLength / maxItems of its own)
All systems use `--whitespace` except the whitespace study; the anchors get the closest setting of their own
(flexible: xgrammar any_whitespace with max_whitespace_cnt=22, llguidance leapgen's whitespace regex).

Figures:
  valid %          outputs that parse and validate (jsonschema with format checks: email, date)
  field acc        micro-averaged over records: credit / fields.  Leaf fields are the gold's scalars, reached by
                   object key and, in arrays of objects, by position; an array of scalars is one field whose
                   credit is the multiset overlap / the longer array's length.  Strings match after strip +
                   casefold, numbers numerically.  A predicted leaf the gold lacks (a hallucinated optional
                   field, an extra array item) adds one field with no credit; an unparsable output scores 0.
  latency          batch 1, seconds per record: median over `--repeats` of each record, then median over records
  rec/s seq        records / the sum of those per-record latencies (one request at a time)
  rec/s b32        all records at once: leapgen in one `generate` call with max_num_seqs=`--batch-size`;
                   transformers in left-padded batches of `--batch-size` (median over repeats)
  tokens, passes   per record (mean): output tokens without eos; forward passes, the one that chose eos included
                   (transformers: one per generated token)
  cut %            outputs stopped by `--max-tokens` (leapgen closes the JSON within the budget, so its cut
                   outputs may still validate; the anchors' do not)
Timing is interleaved: per record, every configuration in turn (rotating the order), so drift hits all alike.

    python benchmarks/bench_extraction.py [--threads 2] [--repeats 3] [--limit N] [--configs ...]
                                          [--whitespace compact] [--max-tokens 200] [--batch-size 32] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jsonschema
import llguidance
import llguidance.hf
import llguidance.numpy
import torch
import transformers
import xgrammar
import xgrammar.contrib.hf
from transformers import AutoModelForCausalLM, LogitsProcessorList

import leapgen
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.extraction import DEFAULT_WHITESPACE, extraction_prompt
from leapgen.grammars import compile_json_schema

DATA = Path(__file__).parent / "extraction"
LEAPGEN_SYSTEMS: dict[str, dict[str, Any]] = {
    "plain": {"enable_forced_tokens": False},
    "forced": {},
    "ngram": {"speculative": {"method": "ngram", "num_speculative_tokens": 8}},
    "pipeline": {"speculative": {"method": "ngram", "num_speculative_tokens": 8}, "enable_prefix_caching": True},
}
ANCHORS = ("xgrammar", "llguidance")
WHITESPACES = ("flexible", "compact", "dumps")
CAPS = {"max_string_length": 64, "max_items": 8}
# leapgen's "flexible" whitespace: at most one line break, then at most 20 spaces or tabs.
FLEXIBLE_WS = r"(?:\r?\n)?[ \t]{0,20}"


@dataclass(frozen=True)
class Case:
    id: str
    schema_name: str
    schema: dict
    gold: dict
    prompt_ids: tuple[int, ...]
    shared_prefix: tuple[int, ...]      # the prompt up to the record's text: the same for every record of the schema


@dataclass(frozen=True)
class Config:
    """One system under one constraint setting."""

    system: str          # a key of LEAPGEN_SYSTEMS, or one of ANCHORS
    whitespace: str
    caps: bool = False

    @property
    def name(self) -> str:
        prefix = "hf+" if self.system in ANCHORS else "leapgen "
        return f"{prefix}{self.system} [{self.whitespace}{', caps' if self.caps else ''}]"


@dataclass
class Result:
    """One record's output: `tokens` excludes eos, `passes` counts every forward pass (the one that chose eos
    too), `forced` the tokens appended by forced-token jumps, `cut` means stopped by max tokens."""

    text: str
    tokens: int
    passes: int
    forced: int
    cut: bool


class Runner(Protocol):
    def prepare(self, config: Config, cases: list[Case]) -> None:
        """Untimed set-up before `run` on the same cases."""

    def run(self, config: Config, cases: list[Case], max_tokens: int) -> list[Result]:
        """Extract all `cases` in one go (the runner batches as it can)."""


@dataclass
class Figures:
    """What one configuration measured: batch-1 outputs and times per record, batched rates."""

    outputs: dict[str, Result] = field(default_factory=dict)            # case id -> first repeat's output
    seconds: dict[str, list[float]] = field(default_factory=dict)       # case id -> batch-1 seconds per repeat
    batched_rates: list[float] = field(default_factory=list)            # records/s per repeat
    batched_outputs: dict[str, Result] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- data


def load_cases(tokenizer, limit: int | None) -> list[Case]:
    """The cases with their schemas and prompt ids; every gold answer must validate against its schema."""
    schemas = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted((DATA / "schemas").glob("*.json"))}
    cases, seen = [], set()
    for line_no, line in enumerate((DATA / "cases.jsonl").read_text(encoding="utf-8").splitlines(), 1):
        record = json.loads(line)
        where = f"cases.jsonl:{line_no} ({record.get('id')})"
        if record["id"] in seen or record["schema"] not in schemas:
            raise ValueError(f"{where}: duplicate id or unknown schema {record['schema']!r}")
        seen.add(record["id"])
        schema = schemas[record["schema"]]
        errors = [e.message for e in validator(schema).iter_errors(record["gold"])]
        if errors:
            raise ValueError(f"{where}: gold does not validate: {errors}")
        prompt = tokenizer.encode(extraction_prompt(tokenizer, {"text": record["text"]}, schema))
        without_text = tokenizer.encode(extraction_prompt(tokenizer, {"text": ""}, schema))
        shared = next((i for i, (a, b) in enumerate(zip(prompt, without_text)) if a != b), len(without_text))
        cases.append(Case(record["id"], record["schema"], schema, record["gold"], tuple(prompt),
                          tuple(prompt[:shared])))
    return cases[:limit]


def validator(schema: dict) -> jsonschema.Draft202012Validator:
    """A validator that also checks formats (email, date), which jsonschema skips by default."""
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


# --------------------------------------------------------------------------------------------- scoring


def parse(text: str) -> Any:
    """The output as JSON, or None when it does not parse (typically cut at max tokens)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def leaves(value: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Leaf fields by path: objects by key, arrays of objects by position; arrays of scalars are one leaf."""
    if isinstance(value, dict):
        return {p: v for key, item in value.items() for p, v in leaves(item, path + (key,)).items()}
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return {p: v for i, item in enumerate(value) for p, v in leaves(item, path + (i,)).items()}
    return {path: value}


def normalise(value: Any) -> Any:
    if isinstance(value, str):
        return value.strip().casefold()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)          # 18.5 == 18.50, 1200 == 1200.0
    return value


def credit(predicted: Any, gold: Any) -> float:
    """1 for a match, 0 for none; arrays of scalars: multiset overlap / the longer length."""
    if isinstance(gold, list):
        if not isinstance(predicted, list):
            return 0.0
        overlap = Counter(map(_hashable, predicted)) & Counter(map(_hashable, gold))
        return sum(overlap.values()) / max(len(predicted), len(gold), 1)
    return float(type(normalise(predicted)) is type(normalise(gold)) and normalise(predicted) == normalise(gold))


def _hashable(value: Any) -> Any:
    value = normalise(value)
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def field_score(text: str, gold: dict) -> tuple[float, int]:
    """(credit, fields) for one output; see the module docstring."""
    gold_leaves = leaves(gold)
    predicted = parse(text)
    if not isinstance(predicted, dict):
        return 0.0, len(gold_leaves)
    predicted_leaves = leaves(predicted)
    missing = object()
    earned = sum(credit(predicted_leaves.get(path, missing), value) for path, value in gold_leaves.items())
    return earned, len(gold_leaves) + len(predicted_leaves.keys() - gold_leaves.keys())


def is_valid(text: str, schema: dict) -> bool:
    value = parse(text)
    return value is not None and validator(schema).is_valid(value)


# ---------------------------------------------------------------------------------------------- leapgen


class LeapgenRunner:
    """leapgen's engine, one LLM per system (the engine's options are fixed when it starts).

    Prefix caching is off but in the `pipeline` system: the warm-up and the repeats run every prompt again,
    which a pipeline never does, and transformers caches nothing between calls.  `pipeline` empties the cache
    before every run and, for one record, prefills its schema's shared prefix first (see the module docstring).
    """

    def __init__(self, systems: set[str], threads: int, batch_size: int) -> None:
        self.llms = {name: leapgen.LLM(None, dtype="float32", threads=threads, kv_cache_memory="1GiB",
                                       max_num_seqs=batch_size,
                                       **({"enable_prefix_caching": False} | LEAPGEN_SYSTEMS[name]))
                     for name in sorted(systems)}

    def prepare(self, config: Config, cases: list[Case]) -> None:
        llm = self.llms[config.system]
        if not llm.engine.config.enable_prefix_caching:
            return
        llm.reset_prefix_cache()
        if len(cases) == 1:
            llm.generate([list(cases[0].shared_prefix)], leapgen.SamplingParams(max_tokens=1))

    def run(self, config: Config, cases: list[Case], max_tokens: int) -> list[Result]:
        llm = self.llms[config.system]
        options = {"additional_properties": False, "whitespace": config.whitespace} | (CAPS if config.caps else {})
        params = [leapgen.SamplingParams(max_tokens=max_tokens, temperature=0,
                                         constraint=leapgen.JsonSchema(c.schema, options=options)) for c in cases]
        outputs = llm.generate([list(c.prompt_ids) for c in cases], params)
        eos = set(llm.engine.loaded.eos_token_ids)
        results = []
        for out in outputs:
            ids = out.token_ids
            content = len(ids) - (1 if ids and ids[-1] in eos else 0)     # token_ids end with eos when it stopped
            results.append(Result(out.text, content, out.metrics.forward_passes, out.metrics.forced_tokens,
                                  out.finish_reason == "length"))
        return results


def caps_unsupported(tokenizer, schema: dict) -> str | None:
    """Why leapgen's compiler does not take the cap options, or None when it does."""
    try:
        compile_json_schema(schema, tokenizer, **CAPS)
    except TypeError as exc:
        return str(exc)
    return None


# ----------------------------------------------------------------------------------------- transformers


class LLGuidanceProcessor(transformers.LogitsProcessor):
    """llguidance matchers (one per batch row) as a transformers logits processor; one per generate() call."""

    def __init__(self, matchers: list[llguidance.LLMatcher], vocab_size: int) -> None:
        self.matchers = matchers
        self.bitmask = llguidance.numpy.allocate_token_bitmask(len(matchers), vocab_size)
        self.started = False

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.started:                       # the first call comes before any token was chosen
            for matcher, token in zip(self.matchers, input_ids[:, -1].tolist()):
                if not matcher.is_stopped():   # finished rows are padded with eos; their matcher is done
                    matcher.consume_token(token)
        self.started = True
        for row, matcher in enumerate(self.matchers):
            llguidance.numpy.fill_next_token_bitmask(matcher, self.bitmask, row)
        llguidance.numpy.apply_token_bitmask_inplace(scores.numpy(), self.bitmask)   # a view: masks in place
        return scores


class TransformersRunner:
    """transformers `generate()` (greedy) with xgrammar's or llguidance's logits processor."""

    def __init__(self, path: Path, batch_size: int) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.vocab_size = self.model.config.vocab_size
        self.eos = self.model.generation_config.eos_token_id
        self.pad = self.model.generation_config.pad_token_id
        self.batch_size = batch_size
        self.xgr_compiler = xgrammar.GrammarCompiler(
            xgrammar.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size))
        self.ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
        self.grammars: dict[tuple[str, str, str], Any] = {}      # compiled on first use: in the warm-up

    def grammar(self, config: Config, case: Case) -> Any:
        """`case`'s schema compiled for `config`'s engine and whitespace (once)."""
        key = (config.system, config.whitespace, case.schema_name)
        if key not in self.grammars:
            self.grammars[key] = self._compile(config, case.schema)
        return self.grammars[key]

    def _compile(self, config: Config, schema: dict) -> Any:
        if config.system == "xgrammar":
            if config.whitespace == "flexible":
                return self.xgr_compiler.compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=22)
            separators = (",", ":") if config.whitespace == "compact" else (", ", ": ")
            return self.xgr_compiler.compile_json_schema(schema, any_whitespace=False, separators=separators)
        if config.whitespace == "flexible":
            options = {"whitespace_flexible": True, "whitespace_pattern": FLEXIBLE_WS}
        else:
            item, key = (",", ":") if config.whitespace == "compact" else (", ", ": ")
            options = {"whitespace_flexible": False, "item_separator": item, "key_separator": key}
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=options)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"llguidance rejects the schema: {messages}")
        return grammar

    def run(self, config: Config, cases: list[Case], max_tokens: int) -> list[Result]:
        results = []
        for start in range(0, len(cases), self.batch_size):
            results += self._run_batch(config, cases[start:start + self.batch_size], max_tokens)
        return results

    def prepare(self, config: Config, cases: list[Case]) -> None:
        """Nothing: transformers keeps no state between calls."""

    @torch.inference_mode()
    def _run_batch(self, config: Config, cases: list[Case], max_tokens: int) -> list[Result]:
        grammars = [self.grammar(config, c) for c in cases]
        if config.system == "xgrammar":
            processor = xgrammar.contrib.hf.LogitsProcessor(grammars)
        else:
            processor = LLGuidanceProcessor([llguidance.LLMatcher(self.ll_tokenizer, g) for g in grammars],
                                            self.vocab_size)
        width = max(len(c.prompt_ids) for c in cases)
        input_ids = torch.tensor([[self.pad] * (width - len(c.prompt_ids)) + list(c.prompt_ids) for c in cases])
        mask = torch.tensor([[0] * (width - len(c.prompt_ids)) + [1] * len(c.prompt_ids) for c in cases])
        out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens,
                                  do_sample=False, eos_token_id=self.eos, pad_token_id=self.pad,
                                  logits_processor=LogitsProcessorList([processor]))
        results = []
        for row in out[:, width:].tolist():
            content = row.index(self.eos) if self.eos in row else len(row)
            text = self.tokenizer.decode(row[:content], skip_special_tokens=True)
            # One forward pass per generated token, the eos step included.
            results.append(Result(text, content, min(content + 1, max_tokens), 0, self.eos not in row))
        return results


# ----------------------------------------------------------------------------------------------- timing


def rotated(items: list, shift: int) -> list:
    shift %= max(len(items), 1)
    return items[shift:] + items[:shift]


def measure(configs: list[Config], batched: list[Config], runners: dict[str, Runner], cases: list[Case],
            repeats: int, max_tokens: int) -> dict[Config, Figures]:
    """Batch-1 runs per record with the configurations interleaved, then the batched runs, interleaved too."""
    figures = {config: Figures() for config in configs}
    one_per_schema = list({c.schema_name: c for c in cases}.values())
    # Warm-up: compile every schema.  With the full budget: leapgen refuses a max_tokens below the shortest output.
    for config in configs:
        runners[config.system].run(config, one_per_schema, max_tokens)
    for repeat in range(repeats):
        for index, case in enumerate(cases):
            for config in rotated(configs, index + repeat):
                runners[config.system].prepare(config, [case])
                start = time.perf_counter()
                [result] = runners[config.system].run(config, [case], max_tokens)
                figures[config].seconds.setdefault(case.id, []).append(time.perf_counter() - start)
                figures[config].outputs.setdefault(case.id, result)
            print(f"  repeat {repeat + 1}/{repeats}: record {index + 1}/{len(cases)} done", flush=True)
    for repeat in range(repeats):
        for config in rotated(batched, repeat):
            runners[config.system].prepare(config, cases)
            start = time.perf_counter()
            results = runners[config.system].run(config, cases, max_tokens)
            figures[config].batched_rates.append(len(cases) / (time.perf_counter() - start))
            figures[config].batched_outputs = {case.id: r for case, r in zip(cases, results)}
        print(f"  batched repeat {repeat + 1}/{repeats} done", flush=True)
    return figures


# ---------------------------------------------------------------------------------------------- report


def summarise(figures: Figures, cases: list[Case]) -> dict[str, Any]:
    """The figures of one configuration as a dict (the table's row and the --json entry)."""
    outputs = [figures.outputs[c.id] for c in cases]
    scores = [field_score(o.text, c.gold) for o, c in zip(outputs, cases)]
    latencies = [statistics.median(figures.seconds[c.id]) for c in cases]
    row = {
        "valid_pct": 100 * sum(is_valid(o.text, c.schema) for o, c in zip(outputs, cases)) / len(cases),
        "field_accuracy": sum(s[0] for s in scores) / sum(s[1] for s in scores),
        "median_latency_s": statistics.median(latencies),
        "records_per_s_sequential": len(cases) / sum(latencies),
        "records_per_s_batched": statistics.median(figures.batched_rates) if figures.batched_rates else None,
        "tokens_per_record": statistics.mean(o.tokens for o in outputs),
        "passes_per_record": statistics.mean(o.passes for o in outputs),
        "forced_per_record": statistics.mean(o.forced for o in outputs),
        "cut_pct": 100 * sum(o.cut for o in outputs) / len(cases),
    }
    if figures.batched_outputs:
        row["batched_same_as_batch1"] = sum(figures.batched_outputs[c.id].text == figures.outputs[c.id].text
                                            for c in cases)
    row["records"] = [{"id": c.id, "text": o.text, "valid": is_valid(o.text, c.schema), "credit": s[0],
                       "fields": s[1], "tokens": o.tokens, "passes": o.passes, "cut": o.cut,
                       "seconds": figures.seconds[c.id]} for c, o, s in zip(cases, outputs, scores)]
    return row


def print_table(title: str, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}\n")
    print("| config | valid % | field acc | median latency s | rec/s seq | rec/s b32 | tokens/rec | passes/rec | "
          "cut % |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        batched = "-" if r["records_per_s_batched"] is None else f"{r['records_per_s_batched']:.2f}"
        print(f"| {name} | {r['valid_pct']:.0f} | {r['field_accuracy']:.3f} | {r['median_latency_s']:.2f} | "
              f"{r['records_per_s_sequential']:.2f} | {batched} | {r['tokens_per_record']:.1f} | "
              f"{r['passes_per_record']:.1f} | {r['cut_pct']:.0f} |")


def print_targets(rows: dict[Config, dict[str, Any]], main_configs: list[Config], whitespace: str) -> None:
    """Issue 12's targets for each leapgen configuration of the main table against the anchors."""
    xgr = rows.get(Config("xgrammar", whitespace))
    anchors = [rows[c] for c in rows if c.system in ANCHORS and c.whitespace == whitespace]
    if xgr is None or not anchors:
        print("\ntargets: need the xgrammar and llguidance configurations")
        return
    best_anchor = max(a["field_accuracy"] for a in anchors)
    print(f"\ntargets (vs hf+xgrammar: median latency {xgr['median_latency_s']:.2f} s, "
          f"sequential {xgr['records_per_s_sequential']:.2f} rec/s; best anchor field acc {best_anchor:.3f})")
    for config in main_configs:
        if config.system in ANCHORS:
            continue
        r = rows[config]
        checks = {
            "100% valid": r["valid_pct"] == 100,
            "acc >= best anchor": r["field_accuracy"] >= best_anchor,
            "latency <= 1/2 xgrammar": r["median_latency_s"] <= xgr["median_latency_s"] / 2,
            "b32 >= 4x xgrammar seq": (r["records_per_s_batched"] or 0) >= 4 * xgr["records_per_s_sequential"],
        }
        print(f"  {config.name}: " + ", ".join(f"{k} {'yes' if ok else 'NO'}" for k, ok in checks.items()))


def print_agreement(rows: dict[Config, dict[str, Any]], batched: list[Config], whitespace: str, n: int) -> None:
    """How many outputs are the same text: batched vs batch 1, forced jumps vs plain (jumps tokenize the forced
    text canonically, so the model may then choose differently), prompt lookup + jumps vs jumps alone
    (speculation by itself is lossless, so a difference comes from how drafts and forced jumps combine)."""
    for config in batched:
        print(f"  {config.name}: batched outputs identical to batch 1: {rows[config]['batched_same_as_batch1']}/{n}")
    for system, reference in (("forced", "plain"), ("ngram", "forced"), ("pipeline", "ngram")):
        ours, theirs = rows.get(Config(system, whitespace)), rows.get(Config(reference, whitespace))
        if ours and theirs:
            same = sum(a["text"] == b["text"] for a, b in zip(ours["records"], theirs["records"]))
            print(f"  leapgen {system} outputs identical to leapgen {reference}: {same}/{n}")


def select_configs(chosen: list[str], whitespace: str, caps: bool) -> tuple[list[Config], list[Config]]:
    """(every configuration to run at batch 1, those also run batched: the main table's, not the studies')."""
    main_configs = [Config(s, whitespace) for s in (*LEAPGEN_SYSTEMS, *ANCHORS) if s in chosen]
    configs = list(main_configs)
    if "whitespace" in chosen:
        configs += [Config("forced", ws) for ws in WHITESPACES]
    if caps:
        configs += [Config("forced", whitespace), Config("forced", whitespace, caps=True)]
    return list(dict.fromkeys(configs)), main_configs          # the studies share rows with the main table


def build_runners(systems: set[str], path: Path, threads: int, batch_size: int) -> dict[str, Runner]:
    """One runner per system: leapgen's systems share one runner (an LLM each), the anchors another."""
    runners: dict[str, Runner] = {}
    if systems - set(ANCHORS):
        runners |= dict.fromkeys(systems - set(ANCHORS), LeapgenRunner(systems - set(ANCHORS), threads, batch_size))
    if systems & set(ANCHORS):
        runners |= dict.fromkeys(systems & set(ANCHORS), TransformersRunner(path, batch_size))
    return runners


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats; medians are reported")
    parser.add_argument("--limit", type=int, help="only the first N cases (quick checks)")
    parser.add_argument("--configs", nargs="+", default=[*LEAPGEN_SYSTEMS, *ANCHORS, "whitespace", "caps"],
                        choices=[*LEAPGEN_SYSTEMS, *ANCHORS, "whitespace", "caps"])
    parser.add_argument("--whitespace", default=DEFAULT_WHITESPACE, choices=WHITESPACES,
                        help="whitespace of every configuration but the whitespace study's (default: leapgen "
                             "extract's)")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="concurrent records in the batched runs")
    parser.add_argument("--json", type=Path, help="write every figure and output here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores; threads {args.threads}")

    path = convert_gguf(default_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)       # the files every system loads
    cases = load_cases(tokenizer, args.limit)
    caps = "caps" in args.configs
    if caps and (reason := caps_unsupported(tokenizer, cases[0].schema)):
        print(f"NOTE: caps study skipped: leapgen's JSON schema compiler does not take {CAPS} yet ({reason})")
        caps = False
    configs, batched = select_configs(args.configs, args.whitespace, caps)
    runners = build_runners({c.system for c in configs}, path, args.threads, args.batch_size)

    print(f"SmolLM2-135M-Instruct fp32, greedy, CPU ({platform.processor() or platform.machine()}), torch "
          f"{torch.__version__}, transformers {transformers.__version__}, leapgen {leapgen.__version__}; "
          f"{len(cases)} records over {len({c.schema_name for c in cases})} schemas, max tokens {args.max_tokens}, "
          f"{args.repeats} repeats, batch {args.batch_size}")
    figures = measure(configs, batched, runners, cases, args.repeats, args.max_tokens)
    rows = {config: summarise(figures[config], cases) for config in configs}

    print_table(f"Extraction, whitespace {args.whitespace}", {c.name: rows[c] for c in batched})
    print_targets(rows, batched, args.whitespace)
    print_agreement(rows, batched, args.whitespace, len(cases))
    if "whitespace" in args.configs:
        print_table("Whitespace study (leapgen forced)", {c.name: rows[c] for c in configs
                                                          if c.system == "forced" and not c.caps})
    if caps:
        print_table("Caps study (leapgen forced)", {c.name: rows[c] for c in configs
                                                    if c.system == "forced" and c.whitespace == args.whitespace})
    if args.json:
        report = {"load_average": load, "threads": args.threads, "repeats": args.repeats, "records": len(cases),
                  "max_tokens": args.max_tokens, "batch_size": args.batch_size, "whitespace": args.whitespace,
                  "configs": {c.name: rows[c] for c in configs}}
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")

if __name__ == "__main__":
    main()
