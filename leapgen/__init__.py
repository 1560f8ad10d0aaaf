"""leapgen: structured generation and decoding strategies for causal language models."""

from leapgen.constraints import Grammar, JsonSchema, Regex
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from leapgen.llm import LLM, generate

__all__ = ["LLM", "SamplingParams", "generate", "JsonSchema", "Regex", "Grammar", "RequestOutput", "CompletionOutput",
           "TokenLogprob"]
__version__ = "0.1.0"
