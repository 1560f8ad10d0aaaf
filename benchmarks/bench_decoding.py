"""Per-step cost of leapgen's logits processing + sampling: `SamplingBatch.build` then `Sampler`, on CPU.

`--batch` rows of `--vocab`-token logits (default 32 x 100k, Llama-3-sized) for six settings, each row
with 500 prompt + 500 generated tokens of history (what penalties scan) and every other row seeded.
Logits are Zipf-like (rank^-1.1, shuffled per row: roughly how LM next-token distributions fall off)
or `--logits gaussian` (N(0, 3^2), a flatter worst case for nucleus sizes).  Repeats are interleaved
across settings and medians reported, since the machine may be shared.  `--model-step` adds the
sampler's share of a decode step of the embedded model (SmolLM2-135M, batch `--batch`).

    python benchmarks/bench_decoding.py [--batch 32] [--vocab 100000] [--repeats 15] [--logits zipf|gaussian]
                                        [--threads N] [--model-step]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from typing import Callable

import leapgen  # noqa: I001 - before torch, as a user's script would: it sets torch's OpenMP spin (leapgen/__init__.py)
import torch

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.candidates import torch_row_logsumexp
from leapgen.decoding.sampler import Sampler, request_generator
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.kernels.dispatch import compiled_row_logsumexp

HISTORY = 500       # prompt tokens and generated tokens per row
EOS = 0


def _mixed(i: int) -> SamplingParams:
    return [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9),
            SamplingParams(temperature=1.0, top_k=40, min_p=0.05), SamplingParams(temperature=0.9)][i % 4]


SETTINGS: dict[str, Callable[[int], SamplingParams]] = {
    "greedy": lambda i: SamplingParams(),
    "T=0.7 top_p=0.9": lambda i: SamplingParams(temperature=0.7, top_p=0.9),
    "T=0.8 top_k=50": lambda i: SamplingParams(temperature=0.8, top_k=50),
    "mixed rows: greedy / T=0.7 top_p=0.9 / T=1 top_k=40 min_p=0.05 / T=0.9": _mixed,
    "T=0.7 top_p=0.9 + repetition 1.1, frequency 0.2, presence 0.2 + logprobs=5": lambda i: SamplingParams(
        temperature=0.7, top_p=0.9, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.2, logprobs=5),
    "everything: above + top_k=100 min_p=0.02 typical_p=0.95 no_repeat_ngram=3 logit_bias min_tokens": lambda i:
        SamplingParams(temperature=0.7, top_k=100, top_p=0.9, min_p=0.02, typical_p=0.95, repetition_penalty=1.1,
                       frequency_penalty=0.2, presence_penalty=0.2, no_repeat_ngram_size=3, logit_bias={5: 1.0},
                       min_tokens=HISTORY + 10, max_tokens=HISTORY + 100, logprobs=5),
}


def make_logits(kind: str, batch: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """`[batch, vocab]` float32 logits: 'zipf' (shuffled rank^-1.1 fall-off) or 'gaussian' (N(0, 9))."""
    generator = torch.Generator().manual_seed(seed)
    if kind == "zipf":
        ranked = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float32))
        return torch.stack([ranked[torch.randperm(vocab, generator=generator)] for _ in range(batch)])
    if kind == "gaussian":
        return torch.randn(batch, vocab, generator=generator) * 3
    raise ValueError(f"--logits must be 'zipf' or 'gaussian', got {kind!r}")


def make_rows(setting: Callable[[int], SamplingParams], batch: int, vocab: int, seed: int = 1) -> list[SamplingRow]:
    """One row per index with its history; odd rows carry their own seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(batch):
        params = setting(i)
        if i % 2 and not params.greedy:
            params = dataclasses.replace(params, seed=i)
        # Views of one int64 array per row, as the engine passes each sequence's ids.
        history = torch.randint(1, vocab, (2 * HISTORY,), generator=generator).numpy()
        rows.append(SamplingRow(params, history[:HISTORY], history[HISTORY:],
                                request_generator(i) if params.seed is not None else None))
    return rows


def engine_sampler() -> Sampler:
    """The sampler as the engine builds it on CPU (with the compiled row normaliser)."""
    return Sampler(row_logsumexp=compiled_row_logsumexp(torch.device("cpu")) or torch_row_logsumexp)


def measure(samplers: dict[str, Callable[[], Sampler]], logits: torch.Tensor, repeats: int,
            settings: dict[str, Callable[[int], SamplingParams]] = SETTINGS, warmup: int = 2
            ) -> dict[str, dict[str, tuple[float, float]]]:
    """{setting: {sampler name: (median ms per step, median ms of it building the batch)}}, repeats interleaved."""
    batch, vocab = logits.shape
    rows = {name: make_rows(make, batch, vocab) for name, make in settings.items()}
    instances = {name: factory() for name, factory in samplers.items()}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(s, n): [] for s in settings for n in samplers}
    for repeat in range(warmup + repeats):
        for setting in settings:
            # Alternate which sampler goes first so neither always runs on a warmer cache.
            order = list(instances.items())
            for name, sampler in (order if repeat % 2 else order[::-1]):
                start = time.perf_counter()
                sampling_batch = SamplingBatch.build(rows[setting], vocab, eos_token_ids=[EOS])
                built = time.perf_counter()
                sampler(logits, sampling_batch)
                done = time.perf_counter()
                if repeat >= warmup:
                    times[setting, name].append((done - start, built - start))
    return {s: {n: (1e3 * statistics.median(t for t, _ in times[s, n]),
                    1e3 * statistics.median(b for _, b in times[s, n])) for n in samplers} for s in settings}


def model_step_ms(batch: int, params: SamplingParams, short: int = 2, long: int = 8, repeats: int = 3) -> float:
    """Median ms of one decode step of the embedded model at `batch` prompts: (t(long) - t(short)) / (long - short)."""
    llm = _embedded_llm()
    prompts = [f"Write a short story about a {animal} who learns to sail." for animal in
               ("cat", "dog", "fox", "owl", "bear", "hare", "wolf", "crow")] * (batch // 8 + 1)
    prompts = prompts[:batch]

    def seconds(tokens: int) -> float:
        start = time.perf_counter()
        llm.generate(prompts, dataclasses.replace(params, max_tokens=tokens, ignore_eos=True))
        return time.perf_counter() - start

    seconds(short)
    steps = [(seconds(long) - seconds(short)) / (long - short) for _ in range(repeats)]
    return 1e3 * statistics.median(steps)


_LLM: list[leapgen.LLM] = []


def _embedded_llm() -> leapgen.LLM:
    if not _LLM:
        _LLM.append(leapgen.LLM(dtype="float32", device="cpu", seed=0))
    return _LLM[0]


def print_table(results: dict[str, dict[str, tuple[float, float]]], columns: list[str]) -> None:
    """Markdown: one row per setting, ms/step per sampler column (batch-build share in parentheses)."""
    print("| setting | " + " | ".join(f"{c} ms/step (of which batch build)" for c in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for setting, by_name in results.items():
        cells = [f"{by_name[c][0]:.2f} ({by_name[c][1]:.2f})" for c in columns]
        print(f"| {setting} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--logits", choices=["zipf", "gaussian"], default="zipf")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--model-step", action="store_true",
                        help="also time decode steps of the embedded SmolLM2-135M and the sampler's share of them")
    args = parser.parse_args()
    if args.batch < 1 or args.vocab < 2 or args.repeats < 1:
        parser.error("--batch and --repeats must be >= 1 and --vocab >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)

    logits = make_logits(args.logits, args.batch, args.vocab)
    results = measure({"leapgen": engine_sampler}, logits, args.repeats)
    print(f"torch {torch.__version__}  leapgen {leapgen.__version__}  threads {torch.get_num_threads()}  "
          f"{platform.processor() or platform.machine()}")
    print(f"batch {args.batch} x vocab {args.vocab}, {args.logits} logits, history {2 * HISTORY} tokens/row, "
          f"median of {args.repeats} interleaved repeats\n")
    print_table(results, ["leapgen"])

    if args.model_step:
        vocab = len(_embedded_llm().tokenizer)
        model_logits = make_logits(args.logits, args.batch, vocab)
        print(f"\nembedded model (SmolLM2-135M fp32, vocab {vocab}), batch {args.batch}: "
              "the sampler's share of a decode step\n")
        print("| setting | decode step ms | sampler ms/step | share |")
        print("|---|---:|---:|---:|")
        for setting in ("greedy", "T=0.7 top_p=0.9"):
            sampler_ms = measure({"leapgen": engine_sampler}, model_logits, args.repeats,
                                 {setting: SETTINGS[setting]})[setting]["leapgen"][0]
            step_ms = model_step_ms(args.batch, SETTINGS[setting](1))
            print(f"| {setting} | {step_ms:.1f} | {sampler_ms:.2f} | {100 * sampler_ms / step_ms:.1f}% |")


if __name__ == "__main__":
    main()
