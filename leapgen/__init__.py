"""leapgen: structured generation and decoding strategies for causal language models.

`import leapgen` stays light (no torch, transformers or numba): every public name is imported on
first use through a module `__getattr__` (PEP 562), so `leapgen --help` and tools that only import
the package do not pay the seconds torch and transformers take to import, and `SamplingParams` or a
constraint spec costs only its own light module.  `from leapgen import LLM` works as before; it
triggers the engine import at that point.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

if "torch" not in sys.modules and not {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & set(os.environ):
    # torch's OpenMP workers (libgomp) spin for GOMP_SPINCOUNT iterations after each parallel region,
    # 300,000 by default: long enough to hold a core through the whole CPU decode-attention kernel, whose
    # second thread then gets half a core.  50,000 still covers the gaps between torch ops (batch-1 speed
    # unchanged) and lets that thread run (batch 32: 238 -> 266 tok/s).  libgomp reads it once, when torch
    # is imported, so this only helps when leapgen comes first; a spin or wait policy the user set is kept.
    os.environ["GOMP_SPINCOUNT"] = "50000"

if TYPE_CHECKING:   # static analysers and IDEs see the real names
    from leapgen.constraints import Grammar, JsonSchema, Regex, from_response_format
    from leapgen.decoding.sampling_params import SamplingParams
    from leapgen.decoding.speculative import SpeculativeConfig
    from leapgen.engine.admission import RequestError
    from leapgen.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
    from leapgen.engine.step_profile import StepProfile
    from leapgen.extraction import extract
    from leapgen.llm import LLM, generate

# Public name -> the module defining it, imported when the name is first looked up.
_LAZY = {
    "LLM": "leapgen.llm",
    "generate": "leapgen.llm",
    "SamplingParams": "leapgen.decoding.sampling_params",
    "JsonSchema": "leapgen.constraints",
    "Regex": "leapgen.constraints",
    "Grammar": "leapgen.constraints",
    "from_response_format": "leapgen.constraints",
    "RequestOutput": "leapgen.engine.outputs",
    "CompletionOutput": "leapgen.engine.outputs",
    "TokenLogprob": "leapgen.engine.outputs",
    "RequestMetrics": "leapgen.engine.outputs",
    "SpeculativeConfig": "leapgen.decoding.speculative",
    "extract": "leapgen.extraction",
    "StepProfile": "leapgen.engine.step_profile",
    "RequestError": "leapgen.engine.admission",
}

__all__ = ["LLM", "SamplingParams", "generate", "JsonSchema", "Regex", "Grammar", "RequestOutput", "CompletionOutput",
           "TokenLogprob", "RequestMetrics", "SpeculativeConfig", "from_response_format", "extract",
           "StepProfile", "RequestError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a lazily exported name on first access and cache it as a module global."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'leapgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
