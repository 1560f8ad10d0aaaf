"""Constraint engines side by side on MaskBench: leapgen, llguidance, xgrammar, outlines-core.

`leapgen-any` is leapgen with property_order="any" (object keys in any order).

    python benchmarks/bench_constraints.py [--n 50] [--tokenizer cl100k|o200k] [--engines leapgen,llguidance,...]

For each subset (Github_easy, Github_medium, Glaiveai2K by default) the first
`--n` schemas are compiled by every engine, single-threaded, for the same HF
tokenizer.  Every test instance (json.dumps, ensure_ascii=False, tokenized by
that tokenizer) is fed token by token, computing the full token mask before
each token: a valid instance must be accepted to the end with EOS allowed; an
invalid one must be refused somewhere.  Printed as a markdown table:

- coverage: % of schemas compiled;
- passing: schemas compiled with every test right (MaskBench's count);
- invalid accepted: invalid instances accepted to completion (must be 0);
- time to first mask (compile + the first mask) p50/p90/max (ms) and mask time per token p50/p99/max (µs);

then, with two engines or more, each one's time to first mask p50/p90 over the schemas every engine compiled
(an engine compiling more schemas also compiles harder ones, which only its own p50 and p90 count).

Engines take turns: per subset, each one in turn, the first alternating from subset to subset, so that a
machine whose speed drifts during the run slows them alike (run `leapgen` and `leapgen-any` in processes of
their own: in one process they share leapgen's memoised automata, which would flatter the second).

Each engine warms up on a small schema (leapgen through `grammars.warm_up`, which `leapgen serve` runs at
start: numba's kernels loaded), then its startup heap (imports, tokenizer, vocabulary tables) is frozen out of
the garbage collector's full collections, as `leapgen serve` does; what compiling and masking allocate is not.

With `--compile-only`, no test instance is fed: the time to first mask alone, quickly (an A/B of two commits of
the compiler checks out each one's `grammars/` and runs this once per commit, interleaved).

With `--large`, also the time to first mask of four schemas that stress a compiler: enums of 10,000
strings and of 10,000 integers, an object with 1,000 optional properties, a string with maxLength 10,000;
and the masks through an instance of the object writing every 7th member.

Needs the `bench` extra (xgrammar, llguidance, outlines-core) and the
../shared/corpora/maskbench corpus.
"""

from __future__ import annotations

import argparse
import array
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from leapgen.cli_common import frozen_startup_heap

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MASKBENCH = ROOT.parent / "shared" / "corpora" / "maskbench"


class Leapgen:
    name = "leapgen"
    options: dict = {}

    def __init__(self, tokenizer):
        from leapgen.grammars import compile_json_schema, warm_up

        warm_up(tokenizer)   # as `leapgen serve` does at start
        self.compile_fn, self.tokenizer = compile_json_schema, tokenizer
        self.buf = np.zeros((len(tokenizer) + 31) // 32, np.int32)

    def compile(self, schema):
        return self.compile_fn(schema, self.tokenizer, **self.options)

    def start(self, compiled):
        return compiled.matcher()

    def mask(self, m):
        m.fill_bitmask(self.buf)
        return self.buf

    def consume(self, m, token):
        m.advance(token)
        return True


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.numpy

        self.ll, self.lln = llguidance, llguidance.numpy
        self.tok = llguidance.hf.from_tokenizer(tokenizer)
        self.buf = llguidance.numpy.allocate_token_bitmask(1, self.tok.vocab_size)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar, matcher

    def start(self, compiled):
        grammar, first = compiled
        return first.deep_copy() if hasattr(first, "deep_copy") else self.ll.LLMatcher(self.tok, grammar, log_level=0)

    def mask(self, m):
        self.lln.fill_next_token_bitmask(m, self.buf)
        return self.buf[0]

    def consume(self, m, token):
        return m.consume_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar

        self.xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.buf = xgrammar.allocate_token_bitmask(1, self.info.vocab_size)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, m):
        m.fill_next_token_bitmask(self.buf)
        return self.buf[0].numpy()

    def consume(self, m, token):
        return m.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer):
        import outlines_core
        from leapgen.grammars import vocabulary_for

        self.oc = outlines_core
        vocabulary = vocabulary_for(tokenizer)
        eos = tokenizer.eos_token_id
        tokens: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocabulary.token_bytes):
            if b:        # special tokens and eos have no bytes
                tokens.setdefault(b, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, tokens)
        self.buf = np.zeros((len(tokenizer) + 31) // 32, np.int32)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocab)

    def start(self, compiled):
        return self.oc.Guide(compiled)

    def mask(self, m):
        m.write_mask_into(self.buf.ctypes.data, self.buf.size, 4)
        return self.buf

    def consume(self, m, token):
        m.advance(token)
        return True


class LeapgenAnyOrder(Leapgen):
    """property_order="any": object keys in any order, so instances need not follow the schema's order."""

    name = "leapgen-any"
    options = {"property_order": "any"}


ENGINES = {e.name: e for e in (Leapgen, LeapgenAnyOrder, LLGuidance, XGrammar, OutlinesCore)}
PACKAGES = {"leapgen": "leapgen", "leapgen-any": "leapgen", "llguidance": "llguidance", "xgrammar": "xgrammar",
            "outlines-core": "outlines-core"}


def _allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


def run_instance(engine, compiled, token_ids, eos, mask_times) -> str | None:
    """Feed one instance, then EOS; None when it is accepted to completion, else where it stopped."""
    m = engine.start(compiled)
    for k, token in enumerate([*token_ids, eos]):
        t = time.perf_counter()
        mask = engine.mask(m)
        mask_times.append(time.perf_counter() - t)
        if not _allowed(mask, token):
            return f"token {k} of {len(token_ids)} not allowed"
        if k < len(token_ids) and not _consumed(engine, m, token):
            return f"token {k} of {len(token_ids)} refused"
    return None


def _consumed(engine, m, token: int) -> bool:
    try:
        return bool(engine.consume(m, token))
    except Exception:   # an engine's refusal may be an exception
        return False


def bench(engine, files: list[str], tokenizer, instances: bool = True) -> dict:
    """Compile each schema (`files`: paths of MaskBench documents) and take its first mask; with `instances`, also
    feed every test instance."""
    eos = tokenizer.eos_token_id
    compiled_n = passing = invalid_accepted = valid_rejected = 0
    # The harness's own bookkeeping stays out of the garbage collector's walks, which would lengthen the pauses
    # of the engine being measured: floats in flat arrays (a list of half a million float objects would be
    # traversed by every full collection), paths as strings (a Path object and its parts list are two objects
    # the collector tracks, 2,000 for a subset of 1,000 schemas).
    compile_times, first_masks, mask_times = array.array("d"), array.array("d"), array.array("d")
    by_schema: dict[str, float] = {}     # each compiled schema's time to first mask, for the common-schema table
    for name in files:
        path = Path(name)       # one per schema, freed with the next
        doc = json.loads(path.read_text())
        # the last schema's grammar goes before the clock starts: bound to `compiled` until the next compile
        # returned, it was torn down inside that compile's time (leapgen's, with the caches its instances filled:
        # 0.4 ms at the median of Github_hard)
        compiled = None
        t = time.perf_counter()
        try:
            compiled = engine.compile(doc["schema"])
        except Exception:
            continue
        compile_times.append(time.perf_counter() - t)
        first_masks.append(compile_times[-1] + _first_mask_time(engine, compiled))
        by_schema[path.stem] = first_masks[-1]
        compiled_n += 1
        ok = True
        for case in doc["tests"] if instances else ():
            ids = tokenizer.encode(json.dumps(case["data"], ensure_ascii=False), add_special_tokens=False)
            accepted = run_instance(engine, compiled, ids, eos, mask_times) is None
            if accepted != case["valid"]:
                ok = False
                invalid_accepted += not case["valid"]
                valid_rejected += case["valid"]
        passing += ok
    ms = lambda xs, q: float(np.quantile(xs, q)) * 1e3 if xs else float("nan")  # noqa: E731
    return {"schemas": len(files), "compiled": compiled_n, "passing": passing, "invalid_accepted": invalid_accepted,
            "valid_rejected": valid_rejected, "compile_p50": ms(compile_times, 0.5),
            "compile_p90": ms(compile_times, 0.9), "ttfm_p50": ms(first_masks, 0.5), "ttfm_p90": ms(first_masks, 0.9),
            "ttfm_max": ms(first_masks, 1.0), "mask_p50": ms(mask_times, 0.5) * 1e3,
            "mask_p99": ms(mask_times, 0.99) * 1e3, "mask_max": ms(mask_times, 1.0) * 1e3, "tokens": len(mask_times),
            "by_schema": by_schema}


LARGE = {
    "enum of 10,000 strings": {"enum": [f"value-{i * 7919 % 100_003}" for i in range(10_000)]},
    "enum of 10,000 integers": {"enum": [i * 7919 % 100_003 for i in range(10_000)]},
    "object with 1,000 properties": {"type": "object",
                                     "properties": {f"field_{i}": {"type": "integer"} for i in range(1000)}},
    "string with maxLength 10,000": {"type": "string", "maxLength": 10_000},
}


# an instance of the 1,000-property object, every 7th member written: each mask where a key comes next or is being
# written holds hundreds of candidate keys
LARGE_INSTANCE = ("object with 1,000 properties", {f"field_{i}": i for i in range(0, 1000, 7)})


def _masks_through(engine, schema, instance, tokenizer) -> str:
    """Mask times while `instance` is fed token by token (p50 / max, total), or why there are none."""
    try:
        compiled = engine.compile(schema)
    except Exception as exc:
        return f"refused ({type(exc).__name__})"
    times = array.array("d")
    ids = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
    stopped = run_instance(engine, compiled, ids, tokenizer.eos_token_id, times)
    if stopped is not None:
        return f"stopped: {stopped}"
    return (f"{np.median(times) * 1e6:.0f} / {max(times) * 1e6:.0f} µs, {sum(times) * 1e3:.0f} ms over "
            f"{len(times)} masks")


def _time_to_first_mask(engine, schema) -> str:
    t = time.perf_counter()
    try:
        compiled = engine.compile(schema)
    except Exception as exc:  # an engine refusing a schema is a result too
        return f"refused ({type(exc).__name__})"
    return f"{(time.perf_counter() - t + _first_mask_time(engine, compiled)) * 1e3:.0f} ms"


def _first_mask_time(engine, compiled) -> float:
    """Seconds from a compiled grammar to the first token mask (what a request waits for beyond compiling)."""
    t = time.perf_counter()
    engine.mask(engine.start(compiled))
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="schemas per subset")
    parser.add_argument("--tokenizer", default="cl100k", choices=["cl100k", "o200k"])
    parser.add_argument("--subsets", default="Github_easy,Github_medium,Glaiveai2K")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--large", action="store_true", help="also time the stress schemas")
    parser.add_argument("--compile-only", action="store_true",
                        help="time compiles and first masks only, feeding no test instance")
    args = parser.parse_args()
    import tokenizers_util

    tokenizer = getattr(tokenizers_util, args.tokenizer)()
    rows, large, engines = [], [], {}
    for name in args.engines.split(","):
        try:
            engines[name] = ENGINES[name](tokenizer)
        except ImportError as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
            continue
        engines[name].mask(engines[name].start(engines[name].compile({"type": "object"})))  # warm-up: JIT, tables
    # What the process keeps from here on (imports, tokenizer, vocabulary tables) leaves the full garbage
    # collections, as in `leapgen serve`: otherwise each one scans ~300k objects (~100 ms) inside some mask.
    with frozen_startup_heap():
        if args.large:
            for name, engine in engines.items():
                large.append((name, {label: _time_to_first_mask(engine, schema) for label, schema in LARGE.items()}))
                large[-1][1]["instance"] = _masks_through(engine, LARGE[LARGE_INSTANCE[0]], LARGE_INSTANCE[1],
                                                          tokenizer)
                print(f"{name} large: {large[-1][1]}", file=sys.stderr, flush=True)
        for turn, subset in enumerate(args.subsets.split(",")):
            files = sorted(str(path) for path in (MASKBENCH / subset).glob("*.json"))[: args.n]
            # engines take turns per subset, the first one alternating: a machine whose speed drifts over the
            # minutes of a run then slows every engine alike
            for name in list(engines)[:: -1 if turn % 2 else 1]:
                r = bench(engines[name], files, tokenizer, instances=not args.compile_only)
                rows.append((name, subset, r))
                print(f"{name} {subset}: { {k: v for k, v in r.items() if k != 'by_schema'} }", file=sys.stderr,
                      flush=True)
    rows.sort(key=lambda row: list(engines).index(row[0]))     # stable: each engine's subsets in order
    if large:
        print("\n| engine | " + " | ".join(LARGE) + " |")
        print("|---|" + "---:|" * len(LARGE))
        for name, times in large:
            print(f"| {name} | " + " | ".join(times[label] for label in LARGE) + " |")
        print(f"\n| engine | masks through the {LARGE_INSTANCE[0]}, every 7th member written: p50 / max, total |")
        print("|---|---:|")
        for name, times in large:
            print(f"| {name} | {times['instance']} |")
    print(f"\ntokenizer {args.tokenizer}, {args.n} schemas per subset, one thread; versions: "
          + ", ".join(f"{n} {version(PACKAGES[n])}" for n in args.engines.split(",") if n in ENGINES))
    print("\n| engine | subset | schemas | compiled | passing | invalid accepted | valid rejected "
          "| time to first mask p50 / p90 / max (ms) | mask p50 / p99 / max (µs) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, subset, r in rows:
        checked = ("- | - | -" if args.compile_only else
                   f"{r['passing']} | {r['invalid_accepted']} | {r['valid_rejected']}")
        masks = "-" if args.compile_only else f"{r['mask_p50']:.1f} / {r['mask_p99']:.0f} / {r['mask_max']:.0f}"
        print(f"| {name} | {subset} | {r['schemas']} | {r['compiled']} | {checked} | {r['ttfm_p50']:.1f} / "
              f"{r['ttfm_p90']:.1f} / {r['ttfm_max']:.0f} | {masks} |")
    _print_common(rows)


def _print_common(rows: list[tuple[str, str, dict]]) -> None:
    """Time to first mask over the schemas every engine compiled: an engine that compiles more schemas than another
    also compiles harder ones, which its p50 and p90 over its own set count and the other's do not.  A subset with
    no schema every engine compiled has no row."""
    engines = list(dict.fromkeys(name for name, _, _ in rows))
    if len(engines) < 2:
        return
    print("\n| subset | schemas every engine compiled | " + " | ".join(
        f"time to first mask p50 / p90 (ms): {name}" for name in engines) + " |")
    print("|---|---:|" + "---:|" * len(engines))
    for subset in dict.fromkeys(subset for _, subset, _ in rows):
        times = {name: r["by_schema"] for name, sub, r in rows if sub == subset}
        common = sorted(set.intersection(*(set(t) for t in times.values())))
        if not common:
            continue
        cells = [" / ".join(f"{np.quantile([times[name][k] for k in common], q) * 1e3:.1f}" for q in (0.5, 0.9))
                 for name in engines]
        print(f"| {subset} | {len(common)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
