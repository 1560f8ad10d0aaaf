"""Server benchmark (issue 15): N concurrent streaming clients against `leapgen serve` vs the same prompts
through `LLM.generate` in this process.

Both sides run the embedded SmolLM2-135M-Instruct with the same torch thread count, greedy, every prompt for
exactly `--max-tokens` tokens (eos is banned by logit_bias on both sides), so both generate the same tokens.
The server runs in its own process (`leapgen serve` on a loopback port); the clients are one asyncio loop in
this process, each streaming one completion (`stream: true`) and timing its first content chunk.

Figures per client count N (median over `--repeats`, the server and in-process runs interleaved):
  tok/s            generated tokens / wall time from the first request sent to the last token received
                   (in-process: the `generate` call)
  ratio            server tok/s / in-process tok/s (issue 15's target: >= 0.8)
  ttft p50 / p99   time to first token over the N requests of a run (server: from sending the request to the
                   first chunk with text; in-process: `RequestOutput.metrics.time_to_first_token`, from the
                   request's admission), then the median of each over repeats

    python benchmarks/bench_server.py [--clients 16 64] [--max-tokens 64] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import httpx

import leapgen
from leapgen import SamplingParams

TOPICS = ["rivers", "volcanoes", "bread", "bicycles", "owls", "glaciers", "jazz", "chess", "tides", "bees",
          "lighthouses", "maps", "comets", "tea", "bridges", "coral"]


def prompts(count: int) -> list[str]:
    return [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (note {i}):" for i in range(count)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    """`leapgen serve` on a free loopback port; returns the process and its /v1 URL once /health answers."""
    command = [sys.executable, "-m", "leapgen.cli", "serve", "--port", "0", "--threads", str(threads),
               "--dtype", "float32", "--max-concurrent-requests", "1024"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        found = re.search(r"at (http://\S+/v1)", line)
        if found:
            url = found.group(1)
            break
    else:
        raise RuntimeError(f"the server did not start (exit code {process.wait()})")
    while True:
        try:
            if httpx.get(url.removesuffix("/v1") + "/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)


async def one_stream(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float | None, int, float]:
    """Stream one completion: (seconds to the first text chunk, completion tokens, seconds to the end)."""
    started = time.perf_counter()
    first = None
    tokens = 0
    async with client.stream("POST", url + "/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            # the clients share the machine with the server: parse only the chunks that tell something
            if first is None and line.startswith("data: {"):
                if any(choice.get("text") for choice in json.loads(line[len("data: "):])["choices"]):
                    first = time.perf_counter() - started
            elif '"usage": {' in line:
                tokens = json.loads(line[len("data: "):])["usage"]["completion_tokens"]
    return first, tokens, time.perf_counter() - started


async def run_clients(url: str, texts: list[str], bias: dict[str, float], max_tokens: int) -> dict:
    limits = httpx.Limits(max_connections=len(texts), max_keepalive_connections=len(texts))
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(
            one_stream(client, url, {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                                     "stream_options": {"include_usage": True}, "logit_bias": bias})
            for text in texts))
        wall = time.perf_counter() - started
    ttfts = [first for first, _, _ in results if first is not None]
    tokens = sum(count for _, count, _ in results)
    return {"tok_s": tokens / wall, "ttft_p50": percentile(ttfts, 0.5), "ttft_p99": percentile(ttfts, 0.99),
            "tokens": tokens}


def run_in_process(llm: leapgen.LLM, texts: list[str], eos: list[int], max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, logit_bias={e: -100.0 for e in eos})
    started = time.perf_counter()
    outputs = llm.generate(texts, params)
    wall = time.perf_counter() - started
    ttfts = [o.metrics.time_to_first_token for o in outputs]
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"tok_s": tokens / wall, "ttft_p50": percentile(ttfts, 0.5), "ttft_p99": percentile(ttfts, 0.99),
            "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads {args.threads}, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    llm = leapgen.LLM(dtype="float32", threads=args.threads, max_num_seqs=max(args.clients))
    eos = list(llm.engine.loaded.eos_token_ids)
    bias = {str(e): -100.0 for e in eos}
    server, url = start_server(args.threads)
    figures = {}
    try:
        for count in args.clients:
            texts = prompts(count)
            asyncio.run(run_clients(url, texts[:2], bias, 4))      # warm both sides up
            run_in_process(llm, texts[:2], eos, 4)
            runs: dict[str, list[dict]] = {"server": [], "in_process": []}
            for repeat in range(args.repeats):
                order = ["server", "in_process"] if repeat % 2 == 0 else ["in_process", "server"]
                for side in order:
                    run = (asyncio.run(run_clients(url, texts, bias, args.max_tokens)) if side == "server"
                           else run_in_process(llm, texts, eos, args.max_tokens))
                    runs[side].append(run)
            summary = {side: {key: statistics.median(r[key] for r in results) for key in results[0]}
                       for side, results in runs.items()}
            summary["ratio"] = summary["server"]["tok_s"] / summary["in_process"]["tok_s"]
            figures[count] = summary
            s, p = summary["server"], summary["in_process"]
            print(f"N={count:3d}  server {s['tok_s']:7.1f} tok/s  ttft p50 {s['ttft_p50']:.2f}s p99 "
                  f"{s['ttft_p99']:.2f}s | in-process {p['tok_s']:7.1f} tok/s  ttft p50 {p['ttft_p50']:.2f}s p99 "
                  f"{p['ttft_p99']:.2f}s | ratio {summary['ratio']:.2f}", flush=True)
    finally:
        server.terminate()
        server.wait()
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
