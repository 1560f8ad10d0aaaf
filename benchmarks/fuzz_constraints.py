"""Fuzzing campaign for the JSON schema compiler: random schemas, valid and invalid instances, mask walks.

    python benchmarks/fuzz_constraints.py [--pairs 10000] [--seed 0] [--tokenizers cl100k,smollm2] [--property-order any]

The long run of tests/test_grammars_fuzz.py (the checks live in tests/fuzz_checks.py).  Schemas are drawn
from the keywords the compiler supports and compiled under each tokenizer (whitespace option drawn too);
for each compiled schema, hypothesis-jsonschema's instances confirmed valid by jsonschema must be accepted
token by token with eos allowed at the end, mutated instances jsonschema calls invalid must never be
accepted to completion, and random walks over the masks under a token budget must finish with a valid
instance.  Every compile (and its first mask) is timed against a bound.  Runs until `--pairs` schema x
instance pairs were checked, prints a summary table and one reproducer per failure, and exits 1 on any
soundness failure.  With `--property-order any` the schemas compile with that option and every instance has
its object keys shuffled.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings, strategies as st
from hypothesis.errors import HypothesisException
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_checks  # noqa: E402
from fuzz_checks import COMPILE_BOUND_S, Fuzzer  # noqa: E402
from fuzz_schemas import WHITESPACES, schemas  # noqa: E402


def load_tokenizers(names: list[str]) -> dict:
    factories = fuzz_checks.tokenizer_factories()
    out = {}
    for name in names:
        start = time.perf_counter()
        out[name] = factories[name]()
        # build the Vocabulary (byte trie) now, so the first compile's time is the compile's
        fuzz_checks.compile_timed({"type": "null"}, out[name], "compact")
        print(f"{name}: {len(out[name])} tokens, ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return out


def campaign(fuzzer: Fuzzer, pairs: int, random_seed: int, max_leaves: int, batch: int = 25) -> None:
    """Draw schemas until `pairs` pairs were checked: hypothesis runs of `batch` schemas each, seeded by
    (seed, batch number), so a seed always replays the same campaign.  Generation only: nothing raises
    (the fuzzer collects failures), so hypothesis has nothing to shrink."""
    progress = tqdm(total=pairs, unit="pair", dynamic_ncols=True)
    for number in range(10 ** 9):
        if fuzzer.pairs >= pairs:
            break

        @seed(random_seed * 1_000_003 + number)
        @settings(max_examples=batch, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
        @given(schema=schemas(max_leaves), whitespace=st.sampled_from(WHITESPACES), data=st.data())
        def one_schema(schema, whitespace, data):
            if fuzzer.pairs >= pairs:
                return
            before = fuzzer.pairs
            fuzzer.run(schema, whitespace, data)
            progress.update(min(fuzzer.pairs, pairs) - min(before, pairs))
            progress.set_postfix(schemas=fuzzer.counts["schemas"], failures=len(fuzzer.failures), refresh=False)

        try:
            one_schema()
        except HypothesisException as exc:    # e.g. FlakyStrategyDefinition: lose the rest of this batch only
            fuzzer.counts["batches cut short by hypothesis"] += 1
            progress.write(f"batch {number}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    progress.close()


def quantiles_ms(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    p50, p90 = np.quantile(seconds, [0.5, 0.9]) * 1e3
    return f"{p50:.1f} / {p90:.1f} / {max(seconds) * 1e3:.0f}"


def summary(fuzzer: Fuzzer, elapsed: float) -> str:
    c = fuzzer.counts
    rows = [
        ("schemas generated", c["schemas"]),
        ("compiled (every tokenizer)", c["compiled"]),
        ("refused", sum(fuzzer.refused.values())),
        *((f"  refused: {key}", n) for key, n in fuzzer.refused.most_common()),
        ("  unsatisfiable confirmed by hypothesis-jsonschema", c["unsatisfiable confirmed"]),
        ("compiled, no instance generated", c["no instance generated"]),
        ("generator errors (hypothesis-jsonschema)", c["generator errors"]),
        ("valid instances checked", c["valid checked"]),
        ("  accepted (instance x tokenizer)", c["valid accepted"]),
        ("  rejected (instance x tokenizer)", c["valid rejected"]),
        ("  discarded: generated but not valid per the oracle", c["valid discarded by oracle"]),
        ("invalid instances checked", c["invalid checked"]),
        ("  refused (instance x tokenizer)", c["invalid refused"]),
        ("  accepted (instance x tokenizer)", c["invalid accepted"]),
        ("  discarded: mutation still valid", c["invalid discarded (valid)"]),
        ("walks", c["walks"]),
        ("  finished", c["walks finished"]),
        ("  validated", c["walks validated"]),
        ("  no spellable completion (skipped)", c["walks without a completion"]),
        *((f"texts the tokenizer cannot spell ({name}, skipped)", c[f"text not spellable ({name})"])
          for name in fuzzer.tokenizers),
        *((f"compile p50 / p90 / max ms ({name})", quantiles_ms(s)) for name, s in fuzzer.compile_seconds.items()),
        ("hypothesis batches cut short (FlakyStrategyDefinition...)", c["batches cut short by hypothesis"]),
        ("failures", len(fuzzer.failures)),
        *((f"  {kind}", n) for kind, n in Counter(f.kind for f in fuzzer.failures).most_common()),
        ("wall time", f"{elapsed:.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"| {name:<{width}} | {value!s:>18} |" for name, value in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10_000, help="schema x instance pairs to check")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (the same seed, the same run)")
    parser.add_argument("--tokenizers", default="cl100k,smollm2")
    parser.add_argument("--max-leaves", type=int, default=8, help="leaf schemas per generated schema, at most")
    parser.add_argument("--compile-bound", type=float, default=COMPILE_BOUND_S, help="seconds per compile")
    parser.add_argument("--property-order", default="schema", choices=["schema", "any"],
                        help="the compiler option; 'any' also shuffles every instance's keys")
    args = parser.parse_args()

    fuzzer = Fuzzer(load_tokenizers(args.tokenizers.split(",")), args.compile_bound, args.property_order)
    start = time.perf_counter()
    campaign(fuzzer, args.pairs, args.seed, args.max_leaves)
    elapsed = time.perf_counter() - start
    print(f"\nseed {args.seed}, {args.pairs} pairs asked, tokenizers {args.tokenizers}, max leaves {args.max_leaves}, "
          f"property order {args.property_order}\n")
    print(summary(fuzzer, elapsed))
    for failure in fuzzer.failures:
        print("\n" + failure.reproducer())
    return 1 if fuzzer.failures else 0


if __name__ == "__main__":
    sys.exit(main())
