"""What the `leapgen` commands share: one-line errors, argument types, checks before the model loads, loading."""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import re
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, NoReturn

if TYPE_CHECKING:
    from leapgen.llm import LLM

class CliError(ValueError):
    """Bad input on the command line; the message names the flag and says what is wrong."""


class Parser(argparse.ArgumentParser):
    """argparse prints its usage block before the error; leapgen prints the error alone, in one line."""

    def error(self, message: str) -> NoReturn:
        raise CliError(message)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model and the flags of where and how it runs (--dtype, --device, --threads, --kv-cache-memory,
    --no-pack-weights, --no-cuda-graphs)."""
    parser.add_argument("--model",
                        help="HF checkpoint directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="auto", help="float32, float16, bfloat16 or auto")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--threads", type=positive_int,
                        help="CPU threads for torch (default: the cores this process may use)")
    parser.add_argument("--kv-cache-memory", type=memory_size, metavar="SIZE",
                        help="KV cache size in bytes or like '512MiB' (default: chosen from the device's memory)")
    parser.add_argument("--no-pack-weights", dest="pack_weights", action="store_false",
                        help="CPU: skip the oneDNN-packed copy of the weights that speeds up the passes where MKL's "
                             "sgemm is slow (saves the weights' size in memory)")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="GPU: launch every kernel of a decode step from Python instead of replaying the step "
                             "from a CUDA graph")


DEFAULT_MAX_NUM_SEQS = 256      # the engine's (EngineConfig.max_num_seqs), without importing torch for a check


def add_max_num_seqs_argument(parser: argparse.ArgumentParser) -> None:
    """--max-num-seqs: how many sequences run at once, which also bounds a request's samples or beams."""
    parser.add_argument("--max-num-seqs", type=positive_int, default=DEFAULT_MAX_NUM_SEQS, metavar="N",
                        help="sequences the engine runs at once; a request's --n samples (or beams) run together, "
                             f"so they are at most this many (default {DEFAULT_MAX_NUM_SEQS})")


def check_rows(args: argparse.Namespace, n: int, num_beams: int = 1) -> None:
    """A request's samples or beams past --max-num-seqs, refused before the model loads (the engine would refuse
    every request)."""
    rows, flag = (num_beams, "--num-beams") if num_beams > 1 else (n, "--n")
    if rows > args.max_num_seqs:
        raise CliError(f"{flag} {rows}: more than the engine runs at once (--max-num-seqs {args.max_num_seqs}); "
                       f"raise --max-num-seqs to at least {rows}")


# --- argument types: a bad value is refused by argparse, which names the flag ---------------------------

def finite_float(text: str) -> float:
    """argparse type: a finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):     # float() accepts 'inf' and 'nan', which no setting means
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def at_least_one(parse: Callable[[str], int], text: str, expected: str) -> int:
    """`text` parsed by `parse`, refused (saying `expected`) unless it is at least 1."""
    try:
        value = parse(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    return at_least_one(int, text, "an int >= 1")


def memory_size(text: str) -> str:
    """argparse type: a byte count or a size like '512MiB', kept as text for the engine to parse."""
    from leapgen.engine.llm_engine import parse_memory

    at_least_one(parse_memory, text, "a positive number of bytes or a size like '512MiB'")
    return text


def speculative_method(text: str) -> dict:
    """argparse type of --speculative: 'ngram' or 'draft:PATH' as the start of a speculative config."""
    if text == "ngram":
        return {"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if text.startswith("draft:") and len(text) > len("draft:"):
        return {"method": "draft", "model": text[len("draft:"):]}
    raise argparse.ArgumentTypeError(f"expected 'ngram' or 'draft:PATH', got {text!r}")


def speculative_config(args: argparse.Namespace) -> dict | None:
    """The LLM's speculative config from --speculative and --num-speculative-tokens."""
    if args.speculative is None:
        if args.num_speculative_tokens is not None:
            raise CliError("--num-speculative-tokens needs --speculative")
        return None
    default_k = 8 if args.speculative["method"] == "ngram" else 4
    return {**args.speculative, "num_speculative_tokens": args.num_speculative_tokens or default_k}


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def check_device(device: str) -> None:
    from leapgen.engine.config import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise CliError(f"--device: {exc}") from None


def check_dtype(dtype: str) -> None:
    from leapgen.engine.config import resolve_dtype

    if dtype != "auto":              # 'auto' reads the checkpoint's config, checked when it loads
        try:
            resolve_dtype(dtype)
        except ValueError as exc:
            raise CliError(f"--dtype: {exc}") from None


# Exceptions that mean a bug in leapgen rather than a bad checkpoint: they keep their traceback.
BUG_TYPES = (AttributeError, NameError, AssertionError)


def load_llm(args: argparse.Namespace, **options: Any) -> LLM:
    """The LLM the command's --model/--dtype/--device/... flags describe (`options`: other LLM keywords, or
    ones that replace the flags'); a load failure is a CliError."""
    from leapgen.engine.draft_model import DraftModelError
    from leapgen.llm import LLM

    if "speculative" not in options:     # commands without the speculative flags pass their own
        options["speculative"] = speculative_config(args)
    if "max_num_seqs" not in options and hasattr(args, "max_num_seqs"):
        options["max_num_seqs"] = args.max_num_seqs
    try:
        return LLM(args.model, dtype=args.dtype, device=args.device, threads=args.threads,
                   kv_cache_memory=args.kv_cache_memory, pack_weights=args.pack_weights,
                   cuda_graphs=args.cuda_graphs, **options)
    except BUG_TYPES:
        raise
    except DraftModelError as exc:
        raise CliError(f"--speculative: {describe(exc)}") from exc
    except Exception as exc:         # the loader meets third-party errors too (safetensors, tokenizers, json)
        message = describe(exc)
        if message.startswith("kv_cache_memory="):    # a size that parses but holds too little of this model
            raise CliError(f"--kv-cache-memory: {message.removeprefix('kv_cache_memory=')}") from exc
        where = args.model if args.model is not None else "(the embedded default model)"
        raise CliError(f"cannot load model {where}: {message}") from exc


@contextlib.contextmanager
def frozen_startup_heap() -> Iterator[None]:
    """Keep what a long-running command has loaded out of the garbage collector's full collections.

    After loading, the process holds ~300k objects it keeps until it exits (torch, transformers, numba,
    the tokenizer's tables): every full collection scans them all, about 100 ms on CPU, at whatever
    request step or token mask triggers it. Frozen (`gc.freeze`), they are skipped; unfrozen on the way
    out, so a caller in the same process (the tests) gets its collector back as it was.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def describe(exc: BaseException) -> str:
    """The error's message, with its type where the message alone is no explanation (KeyError('x'))."""
    if isinstance(exc, (ValueError, OSError)) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def field_named_in(message: str, fields: dict[str, Any]) -> str | None:
    """The SamplingParams field an error is about: the one after 'SamplingParams.', else the first named."""
    named = re.search(r"SamplingParams\.(\w+)", message)
    if named and named.group(1) in fields:
        return named.group(1)
    found = [(m.start(), name) for name in fields if (m := re.search(rf"\b{name}\b", message))]
    return min(found)[1] if found else None


@contextlib.contextmanager
def progress_bar(total: int, show: bool = True) -> Iterator[Callable[[int, int], None] | Literal[False]]:
    """A tqdm bar on stderr (never stdout, which holds the results) as `LLM.generate`'s `progress` callback;
    False, which draws nothing, when not `show` or when stderr is no terminal (a log would fill with redraws)."""
    if not show or not sys.stderr.isatty():
        yield False
        return
    from tqdm import tqdm

    with tqdm(total=total, unit="req", file=sys.stderr, dynamic_ncols=True, leave=False) as bar:
        yield lambda done, _total: bar.update(done - bar.n)


def compile_constraint(llm, flag: str | None, spec: Any) -> None:
    """Compile the constraint now, so that its errors name the flag rather than the first prompt."""
    if spec is None:
        return
    try:
        llm.engine.compile(spec)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CliError(f"{flag}: {exc}") from None


def print_error(message: object) -> None:
    """One line on stderr, whatever the message holds (lark's multi-line errors, undecodable argv text)."""
    line = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    print(f"leapgen: error: {line}", file=sys.stderr)
