"""Test-session setup shared by every test module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
