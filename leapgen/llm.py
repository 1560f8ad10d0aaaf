"""`leapgen.LLM`: load a model once, generate for many prompts."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, Literal, Sequence

import torch
from jinja2 import TemplateError

from leapgen.constraints import Constraint, as_constraint, from_response_format, pydantic_model
from leapgen.decoding.sampling_params import SEEDS, SamplingParams, is_integer
from leapgen.decoding.speculative import SpeculativeConfig
from leapgen.engine.default_model import default_model_path
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from leapgen.engine.outputs import RequestOutput

Prompt = str | Sequence[int]
Message = dict[str, str]                      # OpenAI-style: {"role": "system"|"user"|"assistant", "content": str}
ResponseFormat = dict[str, Any] | type        # OpenAI-style response_format, or a pydantic model class
_ROLES = ("system", "user", "assistant")


class LLM:
    """A loaded model plus its engine.  `LLM()` with no path loads the embedded SmolLM2-135M-Instruct.

    `speculative` (vLLM's keys): `{"method": "ngram", "num_speculative_tokens": 8}` drafts by prompt lookup,
    `{"method": "draft", "model": PATH, "num_speculative_tokens": 4}` with a smaller model; outputs are
    the same as without (greedy: token for token; sampling: in distribution).  `pack_weights`: on CPU the
    linear layers keep a oneDNN-packed copy of their weights for the passes where it beats MKL's sgemm (float32
    passes of 4-127 tokens and bfloat16 of 1-127; on AMD CPUs, where MKL is slow, every pass);
    False saves that copy's memory.  `cuda_graphs`: on a GPU, decode steps replay from CUDA graphs recorded
    the first time each padded batch size runs; False launches every kernel from Python instead.
    """

    def __init__(self, model: str | Path | None = None, *, dtype: str | torch.dtype = "auto", device: str = "auto",
                 kv_cache_memory: int | str | None = None, block_size: int = 16, max_num_seqs: int = 256,
                 max_num_batched_tokens: int | None = None, enable_prefix_caching: bool = True,
                 enable_forced_tokens: bool = True, seed: int | None = None, threads: int | None = None,
                 speculative: SpeculativeConfig | dict[str, Any] | None = None, pack_weights: bool = True,
                 cuda_graphs: bool = True) -> None:
        set_threads(threads)
        speculative = SpeculativeConfig.parse(speculative)       # a bad config fails before the model loads
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be a path (str or Path) or None for the default model, got "
                            f"{type(model).__name__}")
        if isinstance(model, str) and not model.strip():     # (Path("") is the working directory)
            raise ValueError("model is an empty path: give a checkpoint directory or a .gguf file, or None for the "
                             "default model")
        if seed is not None and not is_integer(seed):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if seed is not None and int(seed) not in SEEDS:
            raise ValueError(f"seed must fit in 64 bits, got {seed}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        path = default_model_path() if model is None else Path(model)
        config = EngineConfig(kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens,
                              enable_prefix_caching, enable_forced_tokens, speculative, pack_weights, cuda_graphs)
        self.engine = LLMEngine(load_model(path, dtype, device), config, seed=None if seed is None else int(seed))
        self.path = path

    @property
    def tokenizer(self):
        """The model's HF tokenizer."""
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 constraint: Constraint | type | None = None, response_format: ResponseFormat | None = None,
                 on_error: Literal["raise", "return"] = "raise",
                 progress: bool | Callable[[int, int], None] = False) -> list[RequestOutput]:
        """Generate for one prompt or a batch (strings or token-id lists); one output per prompt, in order.

        Each request's constraint is `params.constraint`; `constraint` (`leapgen.JsonSchema`, `Regex`,
        `Grammar` or a pydantic model class) or OpenAI's `response_format` is the shorthand that puts one
        on every prompt.  Under a pydantic model each finished completion's `parsed` is the model instance
        (None where the text does not validate).  A bad prompt raises RequestError naming `prompts[i]`
        before anything runs, or with `on_error="return"` comes back with finish_reason "error" while the
        rest run; a request that fails while running comes back so in either mode.
        """
        batch = _as_batch(prompts)
        params_list = _params_list(params, len(batch), constraint, response_format)
        report = _progress_bar if progress is True else (progress or None)
        outputs = self.engine.generate(batch, params_list, progress=report, on_error=on_error)
        return [_with_parsed(output, p) for output, p in zip(outputs, params_list)]

    def generate_iter(self, prompts: Prompt | Sequence[Prompt],
                      params: SamplingParams | Sequence[SamplingParams] | None = None,
                      *, constraint: Constraint | type | None = None, response_format: ResponseFormat | None = None,
                      on_error: Literal["raise", "return"] = "raise", max_pending: int | None = None
                      ) -> Iterator[tuple[int, RequestOutput]]:
        """Like `generate`, but yields `(prompt index, output)` as each prompt finishes, in finishing order
        (all prompts share one continuously batched run); closing the iterator aborts the rest.  With
        `max_pending`, prompts are checked and queued as room frees up, at most that many at a time."""
        batch = _as_batch(prompts)
        params_list = _params_list(params, len(batch), constraint, response_format)
        outputs = self.engine.iter_generate(batch, params_list, on_error=on_error, max_pending=max_pending)
        return _iter_with_parsed(outputs, params_list)

    def chat(self, messages: Sequence[Message] | Sequence[Sequence[Message]],
             params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             constraint: Constraint | type | None = None, response_format: ResponseFormat | None = None,
             on_error: Literal["raise", "return"] = "raise") -> list[RequestOutput]:
        """Answer one conversation (OpenAI-style `[{"role": "user", "content": "..."}, ...]`) or a list of
        them, each rendered by the model's chat template up to the assistant's turn; otherwise as `generate`."""
        prompts = [self.render_chat(conversation, where) for where, conversation in _conversations(messages)]
        return self.generate(prompts, params, constraint=constraint, response_format=response_format,
                             on_error=on_error)

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *,
               constraint: Constraint | type | None = None,
               response_format: ResponseFormat | None = None) -> Iterator[str]:
        """Yield the text of one prompt as it is produced; the pieces join to the final `text`.

        A request that fails while running raises RuntimeError with its error after the text so far.
        """
        spec = _one_constraint(constraint, response_format)
        if params is not None and params.n > 1:
            # (the other samples' text would be dropped without a word)
            raise ValueError(f"stream() yields the text of one completion: SamplingParams.n must be 1, got "
                             f"{params.n} (generate() or generate_iter() return every sample)")
        return self.engine.stream(prompt, _with_constraint(params, spec))

    def reset_prefix_cache(self) -> int:
        """Forget the KV blocks cached from earlier prompts; the number of blocks forgotten."""
        return self.engine.reset_prefix_cache()

    def chat_prompt(self, message: str, system: str | None = None) -> str:
        """`message` wrapped in the model's chat template, ready for the assistant's answer."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
        return self.render_chat(messages, "message")

    def render_chat(self, messages: Sequence[Message], where: str = "messages") -> str:
        """`messages` (one conversation) in the model's chat template, ready for the assistant's answer;
        ValueError, naming them by `where`, for a malformed message or one the template refuses."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.path} has no chat template; pass a plain prompt instead")
        try:
            return self.tokenizer.apply_chat_template(_checked_conversation(where, messages), tokenize=False,
                                                      add_generation_prompt=True)
        except TemplateError as exc:      # templates refuse what they cannot render (roles out of turn, ...)
            raise ValueError(f"{where}: the model's chat template refused them: {exc}") from None


def generate(model: LLM | str | Path | None, prompt: Prompt, params: SamplingParams | None = None, *,
             constraint: Constraint | type | None = None, response_format: ResponseFormat | None = None,
             **sampling: Any) -> RequestOutput:
    """One call: load `model` (a path, an `LLM`, or None for the default model) and generate for one prompt.

    Keyword arguments not given as `params` are SamplingParams fields: `generate(None, "Hi", max_tokens=20)`.
    """
    if params is not None and sampling:
        raise ValueError(f"pass either params or SamplingParams keywords, not both (got {sorted(sampling)})")
    llm = model if isinstance(model, LLM) else LLM(model)
    return llm.generate([prompt], params or SamplingParams(**sampling), constraint=constraint,
                        response_format=response_format)[0]


def set_threads(threads: int | None) -> int:
    """Give torch `threads` CPU threads (None: the cores this process may run on); returns the number set.

    torch's default counts every core of the machine; on a shared or containerised machine that
    oversubscribes the cores the process really has, and matmuls slow down by an order of magnitude.
    """
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    elif not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    torch.set_num_threads(threads)
    return threads


def _params_list(params: SamplingParams | Sequence[SamplingParams] | None, count: int,
                 constraint: Constraint | type | None, response_format: ResponseFormat | None) -> list[SamplingParams]:
    """One SamplingParams per prompt (`params` is one for all or one each), carrying its constraint as a spec."""
    spec = _one_constraint(constraint, response_format)
    params_list = list(params) if isinstance(params, (list, tuple)) else [params] * count
    return [_with_constraint(p, spec) for p in params_list]


def _one_constraint(constraint: Constraint | type | None,
                    response_format: ResponseFormat | None) -> Constraint | type | None:
    """`constraint`, or the one `response_format` asks for: two spellings of one setting, so not both."""
    if response_format is None:
        return constraint
    if constraint is not None:
        raise ValueError("pass either constraint= or response_format=, not both")
    return from_response_format(response_format)


def _with_parsed(output: RequestOutput, params: SamplingParams) -> RequestOutput:
    """`output` with each finished completion under a pydantic-model constraint validated into the model
    (`parsed`), or left None where it does not validate (cut off by max_tokens, a validator the schema
    cannot express): a result to inspect, not a reason to lose the batch."""
    model = pydantic_model(params.constraint)
    if model is None:
        return output
    for completion in output.outputs:
        if completion.finish_reason not in (None, "error"):
            try:
                completion.parsed = model.model_validate_json(completion.text)
            except ValueError:           # pydantic's ValidationError is a ValueError
                completion.parsed = None
    return output


def _iter_with_parsed(outputs: Generator[tuple[int, RequestOutput], None, None],
                      params_list: list[SamplingParams]) -> Iterator[tuple[int, RequestOutput]]:
    """The engine's `(index, output)` pairs, each output with `parsed` filled in."""
    try:
        for index, output in outputs:
            yield index, _with_parsed(output, params_list[index])
    finally:
        outputs.close()                  # closing this iterator aborts the requests still running, as the engine's does


def _conversations(messages: Any) -> list[tuple[str, Sequence[Any]]]:
    """`messages` as a batch of conversations, each with its place for errors (`messages[1]`): one
    conversation (a list of messages) or a list of them."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages: expected a non-empty list of messages ({'role': ..., 'content': ...}) "
                         "or of conversations")
    if all(isinstance(conversation, (list, tuple)) for conversation in messages):
        return [(f"messages[{i}]", conversation) for i, conversation in enumerate(messages)]
    return [("messages", messages)]


def _checked_conversation(where: str, conversation: Sequence[Any]) -> list[Message]:
    if not conversation:
        raise ValueError(f"{where}: a conversation needs at least one message")
    for i, message in enumerate(conversation):
        at = f"{where}[{i}]"
        if not isinstance(message, dict):
            raise ValueError(f"{at}: expected a message {{'role': ..., 'content': ...}}, got {type(message).__name__}")
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"{at}.{key}: required")
        if message["role"] not in _ROLES:
            raise ValueError(f"{at}.role: expected 'system', 'user' or 'assistant', got {message['role']!r}")
        if not isinstance(message["content"], str):
            raise ValueError(f"{at}.content: expected a string, got {type(message['content']).__name__}")
    return list(conversation)


def _with_constraint(params: SamplingParams | None, constraint: Constraint | type | None) -> SamplingParams:
    """`params` (default ones when None) carrying its constraint as a spec; `constraint` fills it in."""
    if params is not None and not isinstance(params, SamplingParams):
        raise TypeError(f"params must be leapgen.SamplingParams (or a list of them, one per prompt), got "
                        f"{type(params).__name__}")
    params = params or SamplingParams()
    if constraint is not None:
        if params.constraint is not None and params.constraint != constraint:
            raise ValueError("a constraint was passed both as generate(constraint=...) and in SamplingParams; "
                             "pass it once")
        params = dataclasses.replace(params, constraint=constraint)
    spec = as_constraint(params.constraint)
    return params if spec is params.constraint else dataclasses.replace(params, constraint=spec)


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Iterable) or isinstance(prompts, (bytes, bytearray, dict)):
        raise TypeError(f"prompts must be a string, a list of token ids or a list of those, got "
                        f"{type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(map(is_integer, prompts)):
        return [prompts]              # one prompt given as token ids
    return prompts


def _progress_bar(done: int, total: int) -> None:
    sys.stderr.write(f"\r{done}/{total} requests finished")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
