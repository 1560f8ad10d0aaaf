"""Benchmark leapgen's Triton attention kernels on a CUDA GPU; prints markdown tables.

Prefill: achieved TFLOP/s of `flash_attn_varlen` (causal, packed equal-length sequences) next to
`torch.nn.functional.scaled_dot_product_attention` pinned to its flash backend, seq lengths 512-16k.
Decode: achieved bandwidth of `paged_decode_attention` (bytes of K/V read / kernel time) and its share of
the card's peak, batch 1-256, context 512-32k.

Times are medians over repeats, each one call timed with CUDA events after an L2 flush; by default each
call is a CUDA-graph replay so Python launch overhead is not counted (`--eager` to count it).

    python benchmarks/bench_kernels.py [--dtype bf16] [--only prefill|decode] [--peak-gbps 3350]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from typing import Callable

import torch
import torch.nn.functional as F

# Peak DRAM bandwidth in GB/s by device-name fragment, most specific first (vendor datasheets).
PEAK_GBPS = [
    ("GH200", 4000.0), ("H200", 4800.0), ("H100 NVL", 3900.0), ("H100 PCIe", 2000.0), ("H100", 3350.0),
    ("H800", 3350.0), ("B200", 8000.0), ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0), ("A800", 2039.0), ("L40S", 864.0), ("L40", 864.0), ("L4", 300.0), ("A10G", 600.0),
    ("A10", 600.0), ("RTX 4090", 1008.0), ("RTX 3090", 936.0), ("V100", 900.0), ("T4", 320.0),
]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def peak_gbps(device_name: str, override: float | None) -> float | None:
    """The card's peak bandwidth: the override, else the first table entry whose fragment is in the name."""
    if override is not None:
        return override
    return next((gbps for fragment, gbps in PEAK_GBPS if fragment in device_name), None)


class Timer:
    """Median CUDA-event time of one call, with the L2 cache flushed before each repeat."""

    def __init__(self, repeats: int, warmup: int, use_graph: bool):
        self.repeats, self.warmup, self.use_graph = repeats, warmup, use_graph
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 * 2**20
        self.flush = torch.empty(4 * l2_bytes, dtype=torch.uint8, device="cuda")

    def median_ms(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of `fn` (compiled and warmed first; replayed from a CUDA graph unless eager)."""
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        run = fn
        if self.use_graph:
            side = torch.cuda.Stream()  # graph capture wants the work warmed on a side stream first
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            run = graph.replay
        times = []
        for _ in range(self.repeats):
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def copy_gbps(gigabytes: float = 4.0, repeats: int = 5) -> float:
    """The card's measured bandwidth: GB/s of a large device-to-device copy (bytes read plus bytes written),
    the best of `repeats`: the ceiling a memory-bound kernel can reach in practice, next to the datasheet's."""
    source = torch.empty(int(gigabytes * 1e9) // 2, dtype=torch.bfloat16, device="cuda").normal_()
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * source.numel() * source.element_size() / min(times) / 1e6


def _max_abs_diff(actual: torch.Tensor, expected: torch.Tensor) -> str:
    return f"{(actual.float() - expected.float()).abs().max().item():.1e}"


def _prefill_row(args: argparse.Namespace, timer: Timer, dtype: torch.dtype, seq_len: int) -> str:
    """One prefill table row; the tensors die with this frame, before the next row allocates."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from leapgen.kernels.triton_attention import flash_attn_varlen

    hq, hkv, dim = args.q_heads, args.kv_heads, args.head_dim
    batch = max(1, args.prefill_tokens // seq_len)
    q = torch.randn(batch * seq_len, hq, dim, dtype=dtype, device="cuda")
    k = torch.randn(batch * seq_len, hkv, dim, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    cu = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * seq_len
    # Causal: each sequence has seq_len*(seq_len+1)/2 query-key pairs, 2 matmuls x 2 FLOPs per MAC.
    flops = 4 * dim * hq * batch * seq_len * (seq_len + 1) / 2

    def ours() -> torch.Tensor:
        return flash_attn_varlen(q, k, v, cu, cu, seq_len, seq_len, causal=True)

    # SDPA sees the same storage as [batch, heads, seq, dim]; K/V expanded to all heads because not
    # every torch build's flash backend takes grouped-query inputs.
    sq = q.view(batch, seq_len, hq, dim).transpose(1, 2)
    sk = k.view(batch, seq_len, hkv, dim).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    sv = v.view(batch, seq_len, hkv, dim).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)

    def sdpa() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)

    ours_ms = timer.median_ms(ours)
    try:
        expected = sdpa().transpose(1, 2).reshape_as(q)
        sdpa_ms = timer.median_ms(sdpa)
    except RuntimeError as err:  # no flash kernel for this GPU/dtype/shape in this torch build
        print(f"<!-- SDPA flash failed at seq {seq_len}: {str(err).splitlines()[0]} -->")
        return (f"| {seq_len} | {batch} | {ours_ms:.3f} | {flops / ours_ms / 1e9:.1f} | n/a | n/a | n/a "
                f"| n/a |")
    return (f"| {seq_len} | {batch} | {ours_ms:.3f} | {flops / ours_ms / 1e9:.1f} | {sdpa_ms:.3f} | "
            f"{flops / sdpa_ms / 1e9:.1f} | {sdpa_ms / ours_ms:.2f} | {_max_abs_diff(ours(), expected)} |")


def bench_prefill(args: argparse.Namespace, timer: Timer, dtype: torch.dtype) -> None:
    """Print TFLOP/s of our packed prefill and of SDPA's flash backend, causal, at each sequence length."""
    print(f"\n### Prefill (causal, {args.q_heads} query / {args.kv_heads} KV heads, head_dim {args.head_dim}, "
          f"{args.dtype}, ~{args.prefill_tokens} tokens per call)\n")
    print("| seq len | batch | leapgen ms | leapgen TFLOP/s | SDPA flash ms | SDPA flash TFLOP/s "
          "| leapgen speed / SDPA | max abs diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seq_len in args.seq_lens:
        print(_prefill_row(args, timer, dtype, seq_len), flush=True)
        torch.cuda.empty_cache()


def _decode_row(args: argparse.Namespace, timer: Timer, dtype: torch.dtype, peak: float | None, measured: float,
                batch: int, context: int, kv_bytes: int) -> str:
    """One decode table row; the caches die with this frame, before the next row allocates."""
    from leapgen.kernels import reference
    from leapgen.kernels.triton_attention import paged_decode_attention

    hq, hkv, dim, block_size = args.q_heads, args.kv_heads, args.head_dim, args.block_size
    blocks_per_seq = math.ceil(context / block_size)
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, block_size, hkv, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn_like(k_cache)
    # Scattered blocks, as a long-running cache hands them out.
    table = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, dim, dtype=dtype, device="cuda")

    def ours() -> torch.Tensor:
        return paged_decode_attention(q, k_cache, v_cache, table, seq_lens)

    ms = timer.median_ms(ours)
    gbps = kv_bytes / ms / 1e6
    share = "n/a" if peak is None else f"{100 * gbps / peak:.0f}%"
    # The reference gathers a dense copy of the K/V it reads: check only where that is cheap.
    diff = "n/a"
    if kv_bytes <= args.check_kv_gb * 1e9:
        diff = _max_abs_diff(ours(), reference.paged_decode_attention(q, k_cache, v_cache, table, seq_lens))
    return f"| {batch} | {context} | {ms * 1e3:.1f} | {gbps:.0f} | {share} | {100 * gbps / measured:.0f}% | {diff} |"


def bench_decode(args: argparse.Namespace, timer: Timer, dtype: torch.dtype, peak: float | None) -> None:
    """Print the bandwidth our paged decode achieves over K/V, and its share of the card's datasheet peak and of
    the bandwidth a plain copy reaches on it."""
    elem = torch.finfo(dtype).bits // 8
    measured = copy_gbps()
    torch.cuda.empty_cache()
    print(f"\n### Decode (paged, block size {args.block_size}, {args.q_heads} query / {args.kv_heads} KV heads, "
          f"head_dim {args.head_dim}, {args.dtype}; datasheet peak "
          f"{'unknown' if peak is None else f'{peak:.0f} GB/s'}, device copy {measured:.0f} GB/s)\n")
    print("| batch | context | leapgen us | K/V GB/s | % of peak | % of copy | max abs diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        for context in args.contexts:
            kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * elem
            if kv_bytes > args.max_kv_gb * 1e9:
                print(f"| {batch} | {context} | skipped: K/V {kv_bytes / 1e9:.1f} GB > --max-kv-gb "
                      f"{args.max_kv_gb:.1f} | | | | |")
                continue
            print(_decode_row(args, timer, dtype, peak, measured, batch, context, kv_bytes), flush=True)
            torch.cuda.empty_cache()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("prefill", "decode"), help="run one half only")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--prefill-tokens", type=int, default=16384,
                        help="tokens per prefill call (batch = this / seq len)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    parser.add_argument("--max-kv-gb", type=float, default=None,
                        help="skip decode shapes whose K/V exceed this (default: 60%% of GPU memory)")
    parser.add_argument("--check-kv-gb", type=float, default=1.0,
                        help="check decode against the reference up to this K/V size")
    parser.add_argument("--peak-gbps", type=float, default=None, help="the card's peak bandwidth, GB/s")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="time eager calls instead of CUDA-graph replays")
    args = parser.parse_args(argv)
    if args.q_heads % args.kv_heads:
        parser.error(f"--q-heads ({args.q_heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit 0 with a message where there is no CUDA GPU to run them on."""
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA GPU here; the Triton kernels run only on CUDA, so there is nothing to measure.")
        return 0
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("bench_kernels: unset TRITON_INTERPRET; the interpreter cannot run on CUDA tensors.", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("bench_kernels: triton is not installed (pip install triton).", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    if args.max_kv_gb is None:
        args.max_kv_gb = 0.6 * props.total_memory / 1e9
    peak = peak_gbps(props.name, args.peak_gbps)
    dtype = DTYPES[args.dtype]
    print(f"## leapgen kernels on {props.name} ({props.multi_processor_count} SMs, "
          f"{props.total_memory / 2**30:.0f} GiB)\n")
    print(f"torch {torch.__version__}, triton {triton.__version__}; median of {args.repeats} "
          f"{'eager calls' if args.eager else 'CUDA-graph replays'}, L2 flushed before each")
    if peak is None:
        print(f"\nPeak bandwidth of '{props.name}' is not in the table: pass --peak-gbps for the % column.")
    timer = Timer(args.repeats, args.warmup, use_graph=not args.eager)
    if args.only in (None, "prefill"):
        bench_prefill(args, timer, dtype)
    if args.only in (None, "decode"):
        bench_decode(args, timer, dtype, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
