"""leapgen: structured generation and decoding strategies for causal language models."""

from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from leapgen.llm import LLM, generate

__all__ = ["LLM", "SamplingParams", "generate", "RequestOutput", "CompletionOutput", "TokenLogprob"]
__version__ = "0.1.0"
