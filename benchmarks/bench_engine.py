"""leapgen's engine vs transformers.generate() on the same weights: output tokens/s, batch 1 and batch 32.

Both run greedy with eos disabled, so each produces exactly `--max-tokens` per prompt.  transformers gets
the batch left-padded (its standard batched generate); leapgen gets the prompts as they are (continuous
batching, paged cache).  Repeats are interleaved in one process and medians reported.

`--constrained` adds leapgen under a JSON schema (forced-token jumps off, so every token is sampled
through a mask), compared with leapgen unconstrained asked for exactly as many tokens per prompt as the
constrained run produced, so both do the same steps at the same batch sizes.
`--profile` then runs each configuration once more and prints where a step's time goes.  `--bound`
measures the device's memory bandwidth with a copy and with a sum and prints the batch-1 bound each implies
(weight bytes read per token / bandwidth): on a GPU, leapgen's share of it is its model-bandwidth utilisation.
`--device cuda` runs both systems on the GPU (build a checkpoint there with benchmarks/random_checkpoint.py).

    python benchmarks/bench_engine.py [--model PATH] [--repeats 3] [--max-tokens 64] [--batches 1 32]
                                      [--dtype float32|bfloat16] [--device cpu|cuda] [--no-cuda-graphs] [--threads N]
                                      [--constrained] [--profile] [--bound]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import leapgen  # noqa: I001 - before torch, as a user's script would: it sets torch's OpenMP spin (leapgen/__init__.py)
import torch
import transformers
from transformers import AutoModelForCausalLM
from leapgen.decoding.constraint import ConstraintSpec
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.default_model import default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from leapgen.engine.step_profile import StepProfile

PASSAGE = ("The river wound through the valley, past orchards and stone bridges, carrying the melted snow of the "
           "mountains towards the distant sea. Travellers who followed it spoke of markets, festivals and quiet "
           "villages where the evenings were long and the bread was warm. ")


def mixed_prompts(tokenizer, batch: int, seed: int = 0) -> list[list[int]]:
    """`batch` prompts of very different lengths (8 to ~400 tokens), cut from one long passage."""
    ids = tokenizer.encode(PASSAGE * 12)
    generator = torch.Generator().manual_seed(seed)
    if batch == 1:
        return [ids[:128]]
    lengths = torch.randint(8, 400, (batch,), generator=generator).tolist()
    return [ids[i % 17: i % 17 + n] for i, n in enumerate(lengths)]


# The prompts are cut from a long passage, so a string field invites the model to go on copying it: under
# greedy decoding every row fills its max_tokens (the benchmark checks) and the budget rule closes the JSON.
SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}


def run_leapgen(engine: LLMEngine, prompts: list[list[int]], max_tokens: int | list[int],
                constraint: ConstraintSpec | None = None) -> tuple[float, list[int]]:
    """Seconds and each prompt's output tokens; `max_tokens` per prompt when a list."""
    budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    # A constraint decides where the text ends itself (leapgen refuses ignore_eos with one).
    params = [SamplingParams(max_tokens=n, ignore_eos=constraint is None, constraint=constraint) for n in budgets]
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return elapsed, [len(o.token_ids) for o in outputs]


@torch.inference_mode()
def run_transformers(model, pad_id: int, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    start = time.perf_counter()
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                         do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    _synchronize(model.device)
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - width) * len(prompts)


def memory_bandwidth(device: torch.device, repeats: int = 5) -> tuple[float, float]:
    """GB/s of a large tensor copy (each byte read once and written once) and of a sum (each byte read once) on
    `device` (on CPU, torch's threads): the best of `repeats` each.  A decode step reads its weights, so the read
    figure is its bound; the copy figure is the usual yardstick (some machines copy faster than they read)."""
    megabytes = 4096 if device.type == "cuda" else 512  # several times the GPU's L2 / the CPU's caches
    source = torch.ones(megabytes << 18, device=device)  # float32: megabytes MiB
    target = torch.empty_like(source)
    target.copy_(source)
    nbytes = source.numel() * source.element_size()
    copy = min(_seconds(lambda: target.copy_(source), device) for _ in range(repeats))
    read = min(_seconds(source.sum, device) for _ in range(repeats))
    return 2 * nbytes / copy / 1e9, nbytes / read / 1e9


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(work, device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    work()
    _synchronize(device)
    return time.perf_counter() - start


def weight_bytes(loaded) -> int:
    """Bytes of parameters one decode step reads: every weight once (a tied embedding counts as the lm_head)."""
    unique = {p.data_ptr(): p for p in loaded.model.parameters()}.values()
    return sum(p.numel() * p.element_size() for p in unique)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def profile_table(engine: LLMEngine, prompts: list[list[int]], max_tokens: int,
                  constraint: ConstraintSpec | None) -> str:
    profile = StepProfile()
    with profile.active():
        run_leapgen(engine, prompts, max_tokens, constraint)
    return profile.table()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF checkpoint dir or .gguf (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both systems' weights")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N: where both systems run")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="GPU: leapgen launches every kernel of a decode step from Python")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--constrained", action="store_true",
                        help="also time leapgen under a JSON schema (forced-token jumps off)")
    parser.add_argument("--profile", action="store_true", help="print where each configuration's step time goes")
    parser.add_argument("--bound", action="store_true", help="measure memory bandwidth and print the batch-1 bound")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = convert_gguf(default_model_path()) if args.model is None else args.model
    if str(path).endswith(".gguf"):
        path = convert_gguf(path)
    dtype = getattr(torch, args.dtype)
    loaded = load_model(path, args.dtype, args.device)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory="1GiB", max_num_batched_tokens=4096,
                                            enable_forced_tokens=False, cuda_graphs=args.cuda_graphs))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(loaded.device).eval()
    pad_id = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    schema = leapgen.JsonSchema(SCHEMA) if args.constrained else None

    rows, profiles = [], []
    for batch in args.batches:
        prompts = mixed_prompts(loaded.tokenizer, batch)
        run_leapgen(engine, prompts, 4)                      # warm-up every path
        run_transformers(hf, pad_id, prompts, 4)
        if schema:
            run_leapgen(engine, prompts, 16, schema)
        ours, theirs, constrained, constrained_tokens = [], [], [], 0.0
        for _ in range(args.repeats):                        # interleaved repeats, medians
            seconds, tokens = run_leapgen(engine, prompts, args.max_tokens)
            ours.append(sum(tokens) / seconds)
            seconds, total = run_transformers(hf, pad_id, prompts, args.max_tokens)
            theirs.append(total / seconds)
            if schema:
                seconds, tokens = run_leapgen(engine, prompts, args.max_tokens, schema)
                plain_seconds, _ = run_leapgen(engine, prompts, tokens)
                constrained.append((sum(tokens) / seconds, sum(tokens) / plain_seconds))
                constrained_tokens = sum(tokens) / batch
        ours_tps, theirs_tps = statistics.median(ours), statistics.median(theirs)
        constrained_tps = tuple(statistics.median(c[i] for c in constrained) for i in (0, 1)) if schema else None
        lengths = [len(p) for p in prompts]
        rows.append((batch, f"{min(lengths)}-{max(lengths)}", ours_tps, theirs_tps, constrained_tps, constrained_tokens))
        if args.profile:
            profiles.append((f"batch {batch}", profile_table(engine, prompts, args.max_tokens, None)))
            if schema:
                profiles.append((f"batch {batch}, JSON schema", profile_table(engine, prompts, args.max_tokens,
                                                                              schema)))

    graphs = ", decode steps from CUDA graphs" if engine.runner.graphs is not None else ""
    print(f"model: {path}  {args.dtype}{graphs}  torch {torch.__version__}  transformers {transformers.__version__}  "
          f"leapgen {leapgen.__version__}  threads {torch.get_num_threads()}  {_device_name(loaded.device)}")
    print(f"greedy, {args.max_tokens} new tokens per prompt, median of {args.repeats} interleaved repeats\n")
    extra = (" leapgen + JSON schema tok/s | leapgen, same lengths, tok/s | constrained / unconstrained | "
             "tokens / prompt |") if schema else ""
    print("| batch | prompt tokens | leapgen tok/s | transformers tok/s | speedup |" + extra)
    print("|---:|---|---:|---:|---:|" + ("---:|---:|---:|---:|" if schema else ""))
    for batch, lengths, ours_tps, theirs_tps, constrained_tps, constrained_tokens in rows:
        cells = (f" {constrained_tps[0]:.1f} | {constrained_tps[1]:.1f} | {constrained_tps[0] / constrained_tps[1]:.2f} |"
                 f" {constrained_tokens:.1f} |" if schema else "")
        print(f"| {batch} | {lengths} | {ours_tps:.1f} | {theirs_tps:.1f} | {ours_tps / theirs_tps:.2f}x |" + cells)
    if args.bound:
        (copy_gbps, read_gbps), weights = memory_bandwidth(loaded.device), weight_bytes(loaded)
        for kind, gbps in (("copy", copy_gbps), ("read", read_gbps)):
            bound = gbps * 1e9 / weights
            print(f"\nbatch-1 bound: {weights / 1e6:.0f} MB of weights per token / {gbps:.1f} GB/s {kind} bandwidth = "
                  f"{bound:.1f} tok/s")
            for batch, _, ours_tps, theirs_tps, _, _ in rows:
                if batch == 1:
                    print(f"leapgen reaches {100 * ours_tps / bound:.0f}% of it, transformers "
                          f"{100 * theirs_tps / bound:.0f}%")
    for label, table in profiles:
        print(f"\nprofile, {label}:\n{table}")


if __name__ == "__main__":
    main()
