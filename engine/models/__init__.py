"""leapgen's own model code, by HF `model_type`."""

from __future__ import annotations

from leapgen.engine.models.llama import LlamaForCausalLM

MODEL_CLASSES = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
}

__all__ = ["LlamaForCausalLM", "MODEL_CLASSES"]
