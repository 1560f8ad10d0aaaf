"""Per-request decoding parameters, validated when made and again when a request is admitted, so the engine can
trust them."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

from leapgen.decoding.constraint import ConstraintSpec

_GREEDY_BELOW = 1e-5    # temperatures under this decode greedily

SEEDS = range(-2 ** 63, 2 ** 64)    # the seeds torch's generators take (an int; numpy's would be iterated)

_MAX_BIAS = 1e6     # past this a bias pushes a float32 logit towards inf, which leaves nothing to sample

def is_integer(value: object) -> bool:
    """An integer (numpy's too), not a bool: what a token id or a seed may be."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def python_number(value: object) -> object:
    """numpy's (or another library's) integer as an int and real number as a float; anything else as it came, for
    the checks to name (a bool, a string, a real no float holds)."""
    if is_integer(value):
        return value if type(value) is int else int(value)
    if isinstance(value, Real) and type(value) is not float and not isinstance(value, (bool, int)):
        try:
            return float(value)
        except OverflowError:
            pass
    return value


MAX_LOGPROBS = 20   # top alternatives per token; as OpenAI's API, and bounded so a typo cannot sort the vocabulary


# the fields that hold lists, as their refusals describe them
_LISTS = {"stop": "a string or a list of strings", "stop_token_ids": "a list of token ids",
          "logits_processors": "a list of callables"}

@dataclass
class SamplingParams:
    """How one request is decoded.  `temperature=0` (or below 1e-5) is greedy; every bad value raises ValueError
    naming the field."""

    max_tokens: int = 128
    min_tokens: int = 0
    temperature: float = 0.0
    top_k: int = 0                      # 0: disabled
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    logit_bias: dict[int, float] | None = None
    # torch's generators tell 63 bits apart: seeds equal modulo 2**63 draw alike (0 and 2**63, -1 and 2**63 - 1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None         # top-n alternatives per generated token (0: chosen token only)
    prompt_logprobs: int | None = None
    n: int = 1
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    skip_special_tokens: bool = True
    logits_processors: list[Any] = field(default_factory=list)  # extra processors, incl. transformers.LogitsProcessor
    constraint: ConstraintSpec | None = None   # leapgen.JsonSchema / Regex / Grammar: the output stays inside it
    speculative: bool = True            # False: this request does not speculate even when the engine does
    #                                     (beam search never does)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Normalise the fields given in other spellings, then raise ValueError naming the first bad one.  Run at
        construction and again when a request is admitted: a field set after construction (`params.n = 0`,
        `params.stop = "x"`) is read the same way."""
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.logits_processors is None:
            self.logits_processors = []
        for name in _LISTS:
            self._listed(name)
        if is_integer(self.seed):
            self.seed = int(self.seed)      # numpy's integers too
        if self.stop_token_ids is not None:
            self.stop_token_ids = [python_number(t) for t in self.stop_token_ids]
        if isinstance(self.logit_bias, dict):
            self.logit_bias = _logit_bias(self.logit_bias)
        self._check_int("max_tokens", minimum=1)
        self._check_int("min_tokens", minimum=0)
        self._check_int("top_k", minimum=0)
        self._check_int("no_repeat_ngram_size", minimum=0)
        self._check_int("n", minimum=1)
        self._check_int("num_beams", minimum=1)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        self._check_float("temperature", lambda x: x >= 0, "must be >= 0")
        self._check_float("top_p", lambda x: 0 < x <= 1, "must be in (0, 1]")
        self._check_float("min_p", lambda x: 0 <= x <= 1, "must be in [0, 1]")
        self._check_float("typical_p", lambda x: 0 < x <= 1, "must be in (0, 1]")
        # (bounded where the kernels' float32 arithmetic stays finite: 1e-300 was a penalty of 0, a division by zero)
        self._check_float("repetition_penalty", lambda x: 1e-6 <= x <= 1e6, "must be in [1e-6, 1e6] (1: none)")
        self._check_float("frequency_penalty", lambda x: -2 <= x <= 2, "must be in [-2, 2]")
        self._check_float("presence_penalty", lambda x: -2 <= x <= 2, "must be in [-2, 2]")
        # (so that length ** length_penalty stays a Python float: 1e300 overflowed it; the scores it divides may still
        # underflow to ties at lengths of thousands, which a penalty of this size would flatten anyway)
        self._check_float("length_penalty", lambda x: -10 <= x <= 10, "must be in [-10, 10] (0: none)")
        for name in ("logprobs", "prompt_logprobs"):
            value = self._as_number(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise ValueError(f"SamplingParams.{name} must be None or an int in [0, {MAX_LOGPROBS}], got {value!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or self.seed not in SEEDS):
            raise ValueError(f"SamplingParams.seed must be an int of 64 bits or None, got {self.seed!r}")
        if self.stop is not None and not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"SamplingParams.stop must be non-empty strings, got {self.stop!r}")
        if self.stop_token_ids is not None and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids must be token ids >= 0, got {self.stop_token_ids!r}")
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise ValueError(f"SamplingParams.logit_bias must be a dict of token id to bias, got {self.logit_bias!r}")
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or isinstance(token, bool):
                raise ValueError(f"SamplingParams.logit_bias keys must be token ids, got {token!r}")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias or bias > _MAX_BIAS \
                    or isinstance(bias, int) and bias < -1e300:   # (an int no float holds)
                raise ValueError(f"SamplingParams.logit_bias[{token!r}] must be a number up to {_MAX_BIAS:g} (or -inf "
                                 f"to ban the token), got {bias!r}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"SamplingParams.early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        for i, processor in enumerate(self.logits_processors):
            if not callable(processor):
                raise ValueError(
                    f"SamplingParams.logits_processors[{i}] must be callable as (input_ids, scores), got {processor!r}"
                )
        if self.num_beams > 1 and self.n > self.num_beams:
            raise ValueError(f"SamplingParams.n ({self.n}) must not exceed num_beams ({self.num_beams})")

    @property
    def greedy(self) -> bool:
        """True when decoding picks the argmax: temperature 0, or so close to it (below 1e-5, as in vLLM) that
        dividing the logits by it would overflow them to infinity (1e-38 left no token to sample)."""
        return self.temperature < _GREEDY_BELOW

    def _as_number(self, name: str) -> object:
        """The field, a Python int or float where numpy's number was given (a grid from `np.arange` or
        `np.linspace`: a np.int64 `max_tokens` was refused where a np.int64 seed was taken)."""
        value = python_number(getattr(self, name))
        setattr(self, name, value)
        return value

    def _listed(self, name: str) -> None:
        """A list field given as another iterable (a tuple, a generator) kept as a list, read once: checked as it
        came, a generator was used up by the check and the request then read it empty."""
        value = getattr(self, name)
        if value is None or isinstance(value, list):
            return
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
            raise ValueError(f"SamplingParams.{name} must be {_LISTS[name]}, got {value!r}")
        setattr(self, name, list(value))

    def _check_int(self, name: str, minimum: int) -> None:
        value = self._as_number(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"SamplingParams.{name} must be an int >= {minimum}, got {value!r}")

    def _check_float(self, name: str, ok, requirement: str) -> None:
        value = self._as_number(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"SamplingParams.{name} must be a finite number, got {value!r}")
        if not ok(value):
            raise ValueError(f"SamplingParams.{name} {requirement}, got {value!r}")


def _logit_bias(bias: dict) -> dict:
    """`logit_bias` with its token ids as ints where they are given as OpenAI's JSON sends them ("50256") or as
    numpy's integers, and its biases as Python's numbers where numpy's; other keys are left for `validate` to name."""
    out: dict = {}
    for token, value in bias.items():
        if is_integer(token):
            token = int(token)
        elif isinstance(token, str) and re.fullmatch(r"-?[0-9]{1,18}", token.strip()):
            token = int(token)
        if token in out:
            raise ValueError(f"SamplingParams.logit_bias gives token {token!r} twice")
        out[token] = python_number(value)
    return out
