"""`leapgen.LLM`: load a model once, generate for many prompts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from leapgen.constraints import Constraint, ConstraintCache
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.default_model import default_model_path
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from leapgen.engine.outputs import RequestOutput

Prompt = str | Sequence[int]


class LLM:
    """A loaded model plus its engine.  `LLM()` with no path loads the embedded SmolLM2-135M-Instruct."""

    def __init__(self, model: str | Path | None = None, *, dtype: str | torch.dtype = "auto", device: str = "auto",
                 kv_cache_memory: int | str | None = None, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, enable_prefix_caching: bool = True,
                 enable_forced_tokens: bool = True, seed: int | None = None) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        path = default_model_path() if model is None else Path(model)
        config = EngineConfig(kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens,
                              enable_prefix_caching, enable_forced_tokens)
        self.engine = LLMEngine(load_model(path, dtype, device), config, seed=seed)
        self.path = path
        self.constraints = ConstraintCache(self.engine.tokenizer)

    @property
    def tokenizer(self):
        """The model's HF tokenizer."""
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 *, constraint: Constraint | None = None,
                 progress: bool | Callable[[int, int], None] = False) -> list[RequestOutput]:
        """Generate for one prompt or a batch (strings or token-id lists); one output per prompt, in order.

        `constraint` (`leapgen.JsonSchema`, `leapgen.Regex` or `leapgen.Grammar`) keeps every output inside it.
        """
        batch = _as_batch(prompts)
        report = _progress_bar if progress is True else (progress or None)
        return self.engine.generate(batch, params, progress=report, constraint=self.constraints.get(constraint))

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               constraint: Constraint | None = None) -> Iterator[str]:
        """Yield the text of one prompt as it is produced (the pieces join to the final `text`)."""
        request_id = self.engine.add_request(prompt, params, self.constraints.get(constraint))
        emitted = 0
        try:
            while True:
                outputs = {o.request_id: o for o in self.engine.step()}
                output = outputs.get(request_id)
                if output is not None:
                    text = output.text
                    if len(text) > emitted:
                        yield text[emitted:]
                        emitted = len(text)
                    if output.finished:
                        return
        finally:
            if request_id in self.engine.requests:
                self.engine.abort(request_id)

    def chat_prompt(self, message: str, system: str | None = None) -> str:
        """`message` wrapped in the model's chat template, ready for the assistant's answer."""
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"the tokenizer of {self.path} has no chat template; pass a plain prompt instead")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def generate(model: LLM | str | Path | None, prompt: Prompt, params: SamplingParams | None = None, *,
             constraint: Constraint | None = None, **sampling: Any) -> RequestOutput:
    """One call: load `model` (a path, an `LLM`, or None for the default model) and generate for one prompt.

    Keyword arguments not given as `params` are SamplingParams fields: `generate(None, "Hi", max_tokens=20)`.
    """
    if params is not None and sampling:
        raise ValueError(f"pass either params or SamplingParams keywords, not both (got {sorted(sampling)})")
    llm = model if isinstance(model, LLM) else LLM(model)
    return llm.generate([prompt], params or SamplingParams(**sampling), constraint=constraint)[0]


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]              # one prompt given as token ids
    return prompts


def _progress_bar(done: int, total: int) -> None:
    sys.stderr.write(f"\r{done}/{total} requests finished")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
