"""Tiny random-weight checkpoints of every native family, saved with transformers for tests."""

from __future__ import annotations

import os

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen3Config)

# Where the engine suites load their checkpoints: the CPU unless LEAPGEN_TEST_DEVICE names another (the GPU
# check runs them on "cuda"); transformers' references stay on the CPU.
ENGINE_DEVICE = os.environ.get("LEAPGEN_TEST_DEVICE", "cpu")

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15, bos_token_id=1,
             eos_token_id=2, pad_token_id=0)

CHECKPOINTS = {
    "llama": (LlamaConfig, dict(), None),
    "llama-tied-llama3-rope": (LlamaConfig, dict(tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), None),
    "llama-linear-rope-bias": (LlamaConfig, dict(attention_bias=True, mlp_bias=True,
                                                 rope_scaling={"rope_type": "linear", "factor": 2.0}), None),
    "mistral": (MistralConfig, dict(sliding_window=None, head_dim=24), None),
    "qwen2-sharded": (Qwen2Config, dict(), "60KB"),
    "qwen3": (Qwen3Config, dict(head_dim=16, tie_word_embeddings=True), None),
}


def save_tiny_tokenizer(directory) -> None:
    """A word-level tokenizer over VOCAB ids, enough for the loader to find and load one."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="<unk>").save_pretrained(directory)


def build_checkpoint(directory, name: str):
    """Save a tiny random checkpoint of family `name`; returns the transformers model (fp32, eval)."""
    config_class, extra, shard_size = CHECKPOINTS[name]
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config_class(**SMALL, **extra)).eval()
    with torch.no_grad():
        # Random norms and biases too, so a misplaced norm or bias cannot hide behind ones and zeros.
        for param_name, param in hf.named_parameters():
            if param_name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif param_name.endswith("bias"):
                param.normal_(0.0, 0.3)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    hf.save_pretrained(directory, **kwargs)
    save_tiny_tokenizer(directory)
    return hf


def build_checkpoint_for_tokenizer(directory, tokenizer, seed: int = 0, padding: int = 0, layers: int | None = None):
    """A tiny random Llama sized to `tokenizer`'s vocabulary (plus `padding` embedding rows the tokenizer
    lacks, as checkpoints padded to a multiple of 64 have), saved with it (for constraint tests);
    `layers` overrides the depth (a smaller draft model)."""
    torch.manual_seed(seed)
    depth = {"num_hidden_layers": layers} if layers is not None else {}
    config = LlamaConfig(**{**SMALL, **depth, "vocab_size": len(tokenizer) + padding, "max_position_embeddings": 2048, "bos_token_id": None,
                            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.eos_token_id})
    hf = AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return hf
