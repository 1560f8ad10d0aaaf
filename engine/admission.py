"""Request admission: every request is checked against the loaded model before any work is queued.

What can be known up front (token ids, logit_bias ids, logprobs, context length, a constraint
that cannot work with the decoding mode) is refused here with one line naming the field, so the
step loop only meets failures that depend on what the model generates.
"""

from __future__ import annotations

from dataclasses import dataclass

from leapgen.decoding.constraint import ConstraintSpec, TokenConstraint
from leapgen.decoding.sampling_params import SamplingParams, is_integer
from leapgen.engine.block_manager import beam_search_blocks


class RequestError(ValueError):
    """A request the engine refuses; the message starts with `prompts[i]: ` when `index` is known."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message if index is None else f"prompts[{index}]: {message}")
        self.index = index


@dataclass(frozen=True)
class EngineLimits:
    """What a request is checked against."""

    vocab_size: int          # rows of the embedding / columns of the logits
    max_model_len: int       # the context, in tokens
    kv_capacity_tokens: int  # tokens the whole KV cache holds
    kv_block_size: int       # tokens a block of it holds
    max_num_seqs: int        # sequences that run at once
    # the config field the context comes from: a sliding window caps it (leapgen attends to the whole sequence,
    # exact up to the window)
    context_field: str = "max_position_embeddings"


@dataclass
class CheckedRequest:
    """A request that passed admission: its prompt's text (None for token ids) and ids, its params and
    its compiled constraint."""

    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    constraint: TokenConstraint | None = None


def encode_prompt(prompt: object, tokenizer) -> tuple[str | None, list[int]]:
    """The prompt's text (when given as text) and its token ids."""
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"the prompt is not valid UTF-8 text (character {exc.start} is "
                               f"{prompt[exc.start]!r}); decode it with the right encoding first") from None
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("a prompt must be a string or a list of token ids, got bytes: decode it to a string first")
    if isinstance(prompt, (list, tuple)):
        bad = next((j for j, t in enumerate(prompt) if not is_integer(t)), None)
        if bad is None:
            return None, [int(t) for t in prompt]
        raise TypeError(f"a prompt must be a string or a list of token ids, got a {type(prompt).__name__} holding "
                        f"{type(prompt[bad]).__name__} at [{bad}]")
    raise TypeError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")


def check_request(prompt: object, params: SamplingParams, tokenizer, limits: EngineLimits) -> CheckedRequest:
    """Encode and check one request; RequestError / TypeError say what is wrong."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be leapgen.SamplingParams, got {type(params).__name__}")
    params.validate()   # again: a field may have been set since the params were made
    text, ids = encode_prompt(prompt, tokenizer)
    vocab, context = limits.vocab_size, limits.max_model_len
    if not ids:
        raise RequestError("the prompt is empty: at least one token is needed")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"token id {bad} is outside the vocabulary ({vocab})")
    if len(ids) >= context:
        raise RequestError(f"the prompt has {len(ids)} tokens; the model's context is {context} tokens "
                           f"({limits.context_field}), so at most {context - 1} prompt tokens fit")
    if len(ids) + params.max_tokens > context:
        raise RequestError(f"the prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                           f"context of {context} tokens ({limits.context_field}); set max_tokens <= "
                           f"{context - len(ids)}")
    if len(ids) + params.max_tokens > limits.kv_capacity_tokens:
        raise RequestError(f"the prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the KV cache "
                           f"of {limits.kv_capacity_tokens} tokens; raise kv_cache_memory or lower max_tokens")
    # a request's samples (or beams) fork together once its prompt is read, each with a row of logits; past what
    # runs at once they would all be held anyway (n=20000 took the server past 20 GB)
    rows, what = (params.num_beams, "num_beams") if params.num_beams > 1 else (params.n, "n")
    if rows > limits.max_num_seqs:
        raise RequestError(f"{what} ({rows}) exceeds the sequences the engine runs at once (max_num_seqs "
                           f"{limits.max_num_seqs}); lower {what} or raise max_num_seqs")
    if params.num_beams > 1:
        size = limits.kv_block_size
        blocks = beam_search_blocks(len(ids), params.max_tokens, params.num_beams, size)
        if blocks * size > limits.kv_capacity_tokens:
            raise RequestError(f"{params.num_beams} beams of the prompt ({len(ids)} tokens) + max_tokens "
                               f"({params.max_tokens}) need up to {blocks * size} tokens of the KV cache, which holds "
                               f"{limits.kv_capacity_tokens}; raise kv_cache_memory or lower num_beams or max_tokens")
    for name, token_ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids or ())):
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"{name}: token id {bad!r} is outside the vocabulary ({vocab})")
    check_combination(params)
    return CheckedRequest(text, ids, params)


def check_combination(params: SamplingParams) -> None:
    """RequestError / TypeError for settings that cannot work together, whatever the prompt and model."""
    constraint = params.constraint
    if constraint is not None and not isinstance(constraint, ConstraintSpec):
        raise TypeError(f"constraint must be leapgen.JsonSchema, leapgen.Regex, leapgen.Grammar or a pydantic "
                        f"model class, got {type(constraint).__name__}")
    if constraint is not None and params.ignore_eos:
        raise RequestError("ignore_eos cannot be combined with a constraint: the constraint decides where the "
                           "text ends, and eos is the only token allowed there")
    if constraint is not None and params.min_tokens:
        raise RequestError("min_tokens cannot be combined with a constraint: the constraint decides where the "
                           "text ends, and a complete instance may be shorter (eos is then all it allows)")
    if params.num_beams > 1 and (params.stop or params.stop_token_ids or not params.greedy
                                 or params.logprobs is not None):
        raise RequestError("beam search (num_beams > 1) is deterministic: it takes no stop strings or stop token "
                           "ids, temperature or logprobs; use n > 1 with sampling for those")
