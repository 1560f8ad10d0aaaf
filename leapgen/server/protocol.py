"""OpenAI request bodies read into leapgen requests, field by field, with errors that name the field.

A body is checked whole before any work is queued: a wrong type, a value out of range, an unknown field
or a feature leapgen does not serve is one `ApiError` (HTTP 400) naming the field as OpenAI's API does
(`param`).  Fields the API defines but that change nothing here (`user`, `metadata`, ...) are accepted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from leapgen.constraints import Grammar, Regex, from_response_format, json_type_name
from leapgen.decoding.constraint import ConstraintSpec
from leapgen.decoding.sampling_params import MAX_LOGPROBS, SamplingParams

Prompt = str | list[int]

# Defined by the API but without effect on what leapgen generates.
_IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")
# Sampling fields both endpoints share; the leapgen extras come in the body the way vLLM takes its own.
_SAMPLING = ("model", "max_tokens", "temperature", "top_p", "n", "seed", "stop", "presence_penalty",
             "frequency_penalty", "logit_bias", "stream", "stream_options", "response_format")
_EXTRAS = ("top_k", "min_p", "repetition_penalty", "min_tokens", "regex", "grammar", "num_beams", "length_penalty")
_COMPLETION_FIELDS = frozenset(("prompt", "logprobs", "echo", "suffix", "best_of", *_SAMPLING, *_EXTRAS, *_IGNORED))
_CHAT_FIELDS = frozenset(("messages", "logprobs", "top_logprobs", "max_completion_tokens", "parallel_tool_calls",
                          "tools", "tool_choice", "functions", "function_call", *_SAMPLING, *_EXTRAS, *_IGNORED))
_MAX_STOP_STRINGS = 16
_CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An OpenAI-shaped error: HTTP `status`, and the body's `message`, `type`, `param` and `code`."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}



@dataclass(frozen=True)
class RequestFields:
    """Where a request's parts came from, to name them when the engine refuses one: the prompt's field, the
    length's (`max_tokens` or `max_completion_tokens`) and the constraint's (`response_format.json_schema.schema`,
    `regex`, ...; None without one)."""

    prompt: str
    length: str
    constraint: str | None = None
    several_prompts: bool = False             # errors about one of them say which: `prompt[2]: ...`

    def constraint_error(self, message: str) -> ApiError:
        """The constraint's compiler refused it."""
        message = message.removeprefix("constraint: ")
        return ApiError(f"{self.constraint}: {message}", param=self.constraint.split(".")[0])

    def refusal(self, message: str, index: int) -> ApiError:
        """The engine's admission refused prompt `index`: the field its message is about, else the prompt."""
        message = re.sub(r"^prompts\[\d+\]: ", "", message)
        lead = re.match(r"(logit_bias|stop_token_ids|logprobs|min_tokens|num_beams|n)\b", message)
        param = "num_beams" if message.startswith("beam search") else lead.group(1) if lead else self.prompt
        if self.several_prompts:
            message = f"{self.prompt}[{index}]: {message}"
        if "max_tokens" in message:
            return ApiError(message.replace("max_tokens", self.length), param=self.length)
        return ApiError(message, param=param)


@dataclass(frozen=True)
class LogprobsRequest:
    """What a request wants reported per token: `top` alternatives; `chat` picks the chat endpoint's shape."""

    top: int
    chat: bool


@dataclass(frozen=True)
class ParsedRequest:
    """One HTTP request as leapgen requests: its prompts (chat: the rendered conversation), shared params.

    `max_tokens_given` is False when the body left the length open: the engine loop then gives each prompt
    the rest of the context, as OpenAI's chat endpoint does.
    """

    model: str | None
    prompts: list[Prompt]
    params: SamplingParams
    fields: RequestFields
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    logprobs: LogprobsRequest | None


def parse_completion(body: Any) -> ParsedRequest:
    """A POST /v1/completions body."""
    fields = _fields(body, _COMPLETION_FIELDS)
    prompts = _prompts(_required(fields, "prompt"))
    if fields.get("echo"):
        raise ApiError("echo: not supported (the response holds the completion only)", param="echo")
    if fields.get("suffix") is not None:
        raise ApiError("suffix: not supported (no insertion mode)", param="suffix")
    top = _optional_int(fields, "logprobs", 0, MAX_LOGPROBS)
    n = _optional_int(fields, "n", 1, None)
    best_of = _optional_int(fields, "best_of", 1, None)
    if best_of is not None and best_of != (n or 1):
        raise ApiError("best_of: only best_of == n is served; use num_beams for a search", param="best_of")
    logprobs = None if top is None else LogprobsRequest(top, chat=False)
    names = RequestFields("prompt", "max_tokens", several_prompts=len(prompts) > 1)
    return _parsed(fields, prompts, names, logprobs, default_max_tokens=16)


def parse_chat(body: Any, render: Callable[[list[dict[str, str]]], str]) -> ParsedRequest:
    """A POST /v1/chat/completions body; `render` puts the checked messages in the model's chat template
    (ValueError when the template refuses them)."""
    fields = _fields(body, _CHAT_FIELDS)
    for name in ("tools", "functions"):
        if fields.get(name):
            raise ApiError(f"{name}: tool calling is not supported", param=name)
    for name in ("tool_choice", "function_call"):
        if fields.get(name) not in (None, "none"):
            raise ApiError(f"{name}: tool calling is not supported", param=name)
    messages = _messages(_required(fields, "messages"))
    try:
        prompt = render(messages)
    except ValueError as exc:
        raise ApiError(str(exc), param="messages") from None
    logprobs = _boolean(fields, "logprobs")
    top = _optional_int(fields, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and not logprobs:
        raise ApiError("top_logprobs: needs logprobs: true", param="top_logprobs")
    if "max_tokens" in fields and "max_completion_tokens" in fields:
        raise ApiError("max_completion_tokens: give it or max_tokens, not both", param="max_completion_tokens")
    length_field = "max_completion_tokens" if "max_completion_tokens" in fields else "max_tokens"
    return _parsed(fields, [prompt], RequestFields("messages", length_field),
                   LogprobsRequest(top or 0, chat=True) if logprobs else None, default_max_tokens=None)


def _parsed(fields: dict, prompts: list[Prompt], names: RequestFields, logprobs: LogprobsRequest | None,
            default_max_tokens: int | None) -> ParsedRequest:
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(f"model: expected a string, got {json_type_name(model)}", param="model")
    stream = _boolean(fields, "stream")
    include_usage = _stream_options(fields.get("stream_options"), stream)
    max_tokens = _optional_int(fields, names.length, 1, None)
    if max_tokens is None:
        max_tokens = default_max_tokens
    # SamplingParams needs a number; an open length is filled in per prompt by the engine loop.
    values: dict[str, Any] = {"max_tokens": max_tokens or 1}
    for name, low, high, default in (("temperature", 0.0, None, 1.0), ("top_p", 0.0, 1.0, 1.0),
                                     ("presence_penalty", -2.0, 2.0, 0.0), ("frequency_penalty", -2.0, 2.0, 0.0),
                                     ("min_p", 0.0, 1.0, 0.0), ("repetition_penalty", 1e-6, 1e6, 1.0),
                                     ("length_penalty", -10.0, 10.0, 1.0)):
        values[name] = _number(fields, name, low, high, default)
    for name, low in (("n", 1), ("top_k", 0), ("num_beams", 1), ("min_tokens", 0)):
        value = _optional_int(fields, name, low, None)
        if value is not None:
            values[name] = value
    values["seed"] = _optional_int(fields, "seed", None, None)
    values["stop"] = _stop(fields.get("stop"))
    values["logit_bias"] = _logit_bias(fields.get("logit_bias"))
    values["constraint"], constraint_field = _constraint(fields)
    if logprobs is not None:
        values["logprobs"] = logprobs.top
    if values.get("num_beams", 1) > 1:
        if stream:
            raise ApiError("num_beams: beam search ranks whole beams at the end, so it cannot stream; "
                           "set stream: false", param="num_beams")
        if "temperature" not in fields:     # (the API's default of 1 samples, and a search is deterministic)
            values["temperature"] = 0.0
    try:
        params = SamplingParams(**values)
    except ValueError as exc:
        raise _sampling_error(str(exc), names.length) from None
    names = dataclasses.replace(names, constraint=constraint_field)
    return ParsedRequest(model, prompts, params, names, max_tokens is not None, stream, include_usage, logprobs)


# --- field readers: each error names the field -----------------------------------------------------------

def _fields(body: Any, known: frozenset[str]) -> dict:
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {json_type_name(body)}")
    unknown = sorted(key for key in body if key not in known)
    if unknown:
        raise ApiError(f"{unknown[0]}: unrecognized request argument", param=unknown[0])
    return {key: value for key, value in body.items() if value is not None}   # null means the default


def _required(fields: dict, name: str) -> Any:
    if fields.get(name) is None:
        raise ApiError(f"{name}: required", param=name)
    return fields[name]


def _boolean(fields: dict, name: str) -> bool:
    value = fields.get(name, False)
    if not isinstance(value, bool):
        raise ApiError(f"{name}: expected true or false, got {json_type_name(value)}", param=name)
    return value


def _optional_int(fields: dict, name: str, low: int | None, high: int | None) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(f"{name}: expected an integer, got {json_type_name(value)}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise ApiError(f"{name}: must be {bounds}, got {value}", param=name)
    return value


def _number(fields: dict, name: str, low: float | None, high: float | None, default: float) -> float:
    value = fields.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise ApiError(f"{name}: expected a finite number, got {json_type_name(value)}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low:g}" if high is None else f"between {low:g} and {high:g}"
        raise ApiError(f"{name}: must be {bounds}, got {value}", param=name)
    return float(value)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:       # an int no float holds
        return False


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise ApiError("stream_options: only allowed with stream: true", param="stream_options")
    if not isinstance(value, dict) or any(key != "include_usage" for key in value):
        raise ApiError("stream_options: expected {\"include_usage\": true|false}", param="stream_options")
    include = value.get("include_usage", False)
    if not isinstance(include, bool):
        raise ApiError("stream_options.include_usage: expected true or false", param="stream_options.include_usage")
    return include


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("stop: expected a string or an array of strings", param="stop")
    if len(stops) > _MAX_STOP_STRINGS:
        raise ApiError(f"stop: at most {_MAX_STOP_STRINGS} stop strings, got {len(stops)}", param="stop")
    return [s for s in stops if s] or None


def _logit_bias(value: Any) -> dict[int, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError(f"logit_bias: expected an object mapping token ids to biases, got {json_type_name(value)}",
                       param="logit_bias")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        where = f"logit_bias.{key}"
        if not re.fullmatch(r"[0-9]{1,18}", str(key)):     # (ASCII digits: \d would read "٣" as 3)
            raise ApiError(f"{where}: the keys are token ids (non-negative integers)", param="logit_bias")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not -100 <= amount <= 100:
            raise ApiError(f"{where}: expected a number between -100 and 100, got {amount!r}", param="logit_bias")
        if int(key) in bias:
            raise ApiError(f"{where}: token {int(key)} is given twice", param="logit_bias")
        bias[int(key)] = float(amount)
    return bias


def _constraint(fields: dict) -> tuple[ConstraintSpec | None, str | None]:
    """The one constraint among response_format and the `regex` / `grammar` extras, and the field that gave it."""
    given = [name for name in ("response_format", "regex", "grammar") if name in fields]
    if len(given) > 1:
        raise ApiError(f"{given[1]}: give one constraint; {given[0]} is already set", param=given[1])
    if not given:
        return None, None
    name, value = given[0], fields[given[0]]
    if name == "response_format":
        try:
            spec = from_response_format(value)
        except ValueError as exc:
            raise ApiError(str(exc), param="response_format") from None
        if spec is None:                      # {"type": "text"}
            return None, None
        return spec, "response_format.json_schema.schema" if value.get("type") == "json_schema" else name
    if not isinstance(value, str):
        raise ApiError(f"{name}: expected a string, got {json_type_name(value)}", param=name)
    return (Regex(value) if name == "regex" else Grammar(value)), name


def _prompts(value: Any) -> list[Prompt]:
    """`prompt` as OpenAI takes it: a string, an array of strings, an array of token ids, or of such arrays."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(_is_token(t) for t in value):
            return [list(value)]
        if all(isinstance(p, str) for p in value):
            return list(value)
        if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in value):
            return [list(p) for p in value]
    raise ApiError("prompt: expected a string, an array of strings, an array of token ids or an array of "
                   "token-id arrays (none empty)", param="prompt")


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _messages(value: Any) -> list[dict[str, str]]:
    """The messages as leapgen's chat templates take them: system, user and assistant turns with text content
    (a `developer` turn is a system turn; text parts are joined)."""
    if not isinstance(value, list) or not value:
        raise ApiError("messages: expected a non-empty array of messages", param="messages")
    messages = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(f"{where}: expected an object with role and content", param="messages")
        role = message.get("role")
        if role not in _CHAT_ROLES:
            raise ApiError(f"{where}.role: expected 'system', 'developer', 'user' or 'assistant', got {role!r}"
                           + (" (tool calling is not supported)" if role in ("tool", "function") else ""),
                           param="messages")
        if message.get("tool_calls"):
            raise ApiError(f"{where}.tool_calls: tool calling is not supported", param="messages")
        messages.append({"role": _CHAT_ROLES[role], "content": _content(message.get("content"), where)})
    return messages


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else json_type_name(part)
                raise ApiError(f"{where}.content[{j}]: only text parts are supported, got {kind!r}",
                               param="messages")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"{where}.content: expected a string or an array of text parts, got {json_type_name(content)}",
                   param="messages")


def _sampling_error(message: str, length_field: str) -> ApiError:
    """SamplingParams' refusal ("SamplingParams.n (3) must not exceed num_beams ...") in the API's words."""
    field = re.search(r"SamplingParams\.(\w+)", message)
    names = {field.name for field in dataclasses.fields(SamplingParams)}
    name = field.group(1) if field else next((n for n in names if re.search(rf"\b{n}\b", message)), None)
    param = length_field if name == "max_tokens" else name
    text = message.replace("SamplingParams.", "").replace("max_tokens", length_field)
    if param is not None and text.startswith(param + " must "):    # "top_p must be ..." as the parser words it
        text = f"{param}: {text[len(param) + 1:]}"
    return ApiError(text, param=param)
