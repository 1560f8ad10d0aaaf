"""Save a random-weight Llama checkpoint of a standard shape, for engine benchmarks where no real weights of that
size can be fetched (the GPU machine reaches no hub).  Speed depends on the shapes, not on the values.

The tokenizer is copied from a checkpoint directory (default: the embedded SmolLM2's, converted from its GGUF), and
the vocabulary sized to it.  Weights are drawn on `--device` (a GPU draws a billion parameters in a second).

    python benchmarks/random_checkpoint.py OUT [--size 1b] [--tokenizer DIR] [--dtype bfloat16] [--device cuda]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

# Llama-3.2-1B's and SmolLM2-135M's shapes (the vocabulary comes from the tokenizer).
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, tie_word_embeddings=True),
}


def build(out: Path, size: str, tokenizer_dir: Path, dtype: torch.dtype, device: str, seed: int = 0) -> int:
    """Write the checkpoint to `out`; return its parameter count."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tokenizer.eos_token_id
    config = LlamaConfig(**SHAPES[size], vocab_size=len(tokenizer), max_position_embeddings=8192,
                         rope_theta=500000.0, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="directory to write")
    parser.add_argument("--size", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--tokenizer", type=Path, help="checkpoint directory whose tokenizer to use")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    tokenizer_dir = args.tokenizer
    if tokenizer_dir is None:
        from leapgen.engine.default_model import default_model_path
        from leapgen.engine.gguf_loader import convert_gguf
        tokenizer_dir = convert_gguf(default_model_path())
    start = time.perf_counter()
    count = build(args.out, args.size, tokenizer_dir, getattr(torch, args.dtype), args.device)
    print(f"{args.out}: random Llama {args.size}, {count / 1e6:.0f}M parameters, {args.dtype}, built on "
          f"{args.device} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
