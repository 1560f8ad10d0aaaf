"""Test-session setup shared by every test module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# `python -m pytest` puts the checkout root on sys.path, where the folders `kernels/`, `engine/`, ...
# would shadow unrelated top-level packages (transformers probes for the HF `kernels` package).
# leapgen is imported through its installed mapping (`leapgen.kernels`), so the root is not needed.
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _ROOT]

# Without CUDA the Triton kernels are tested in Triton's interpreter.  Triton reads this variable when it is
# first imported, and transformers imports it early, so it must be set before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def byte_level_model_dir(tmp_path_factory):
    """A tiny random Llama checkpoint on the byte-level BPE test tokenizer, built once for every module that
    runs the public API on it (the tests that only need some model, not a particular one)."""
    from checkpoints import build_checkpoint_for_tokenizer
    from tokenizers_util import byte_level_bpe

    directory = tmp_path_factory.mktemp("byte-level-llama")
    build_checkpoint_for_tokenizer(directory, byte_level_bpe())
    return directory


@pytest.fixture(scope="session")
def cli_model(tmp_path_factory) -> str:
    """The directory of a tiny random Llama checkpoint on the word-level test tokenizer ("w3".."w95"), built once
    for the command-line tests (`leapgen generate`, `leapgen sweep`); read only: a test that breaks a checkpoint
    copies it first."""
    from checkpoints import build_checkpoint

    directory = tmp_path_factory.mktemp("word-level-llama")
    build_checkpoint(directory, "llama")
    return str(directory)
