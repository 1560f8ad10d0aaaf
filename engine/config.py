"""leapgen's validated view of an HF `config.json` for the natively supported families.

`ModelConfig` holds only what the model code and the runner need (sizes for the paged
cache, RoPE, biases, eos ids).  Every malformed field raises `ConfigError` naming the file
and the field; a well-formed config that uses a feature leapgen's own model code lacks
raises `UnsupportedConfigError`, which the loader answers with the slower HF fallback.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

NATIVE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


class ConfigError(ValueError):
    """A config file that is missing a field or has a malformed one; the message names both."""


class UnsupportedConfigError(ConfigError):
    """A well-formed config using a feature leapgen's own model code does not implement."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: `kind` is 'linear' (uses `factor`) or 'llama3' (uses all fields)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a Llama / Mistral / Qwen2 / Qwen3 checkpoint, validated."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    sliding_window: int | None          # None: full attention at every length leapgen accepts
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool                       # Qwen3: RMSNorm over each head of q and k before RoPE
    eos_token_ids: tuple[int, ...]

    @property
    def max_model_len(self) -> int:
        """Longest sequence this model code computes exactly (sliding window attention is not implemented)."""
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json",
                  generation_config: dict[str, Any] | None = None) -> ModelConfig:
        """Validate an HF config dict; `source` names the file in error messages."""
        fields = _Fields(raw, source)
        model_type = fields.get("model_type", str)
        if model_type not in NATIVE_MODEL_TYPES:
            raise UnsupportedConfigError(
                f"{source}: field 'model_type' is {model_type!r}; leapgen's own model code covers "
                f"{', '.join(NATIVE_MODEL_TYPES)}")
        hidden_act = fields.get("hidden_act", str, default="silu")
        if hidden_act not in ("silu", "swish"):
            raise UnsupportedConfigError(f"{source}: field 'hidden_act' is {hidden_act!r}; only 'silu' is implemented")

        hidden_size = fields.positive_int("hidden_size")
        num_heads = fields.positive_int("num_attention_heads")
        num_kv_heads = fields.positive_int("num_key_value_heads", default=num_heads)
        if num_heads % num_kv_heads:
            raise ConfigError(f"{source}: field 'num_key_value_heads' ({num_kv_heads}) must divide "
                              f"'num_attention_heads' ({num_heads})")
        head_dim = fields.positive_int("head_dim", default=None)
        if head_dim is None:
            if hidden_size % num_heads:
                raise ConfigError(f"{source}: field 'hidden_size' ({hidden_size}) is not divisible by "
                                  f"'num_attention_heads' ({num_heads}) and no 'head_dim' is given")
            head_dim = hidden_size // num_heads
        if head_dim % 2:
            raise ConfigError(f"{source}: field 'head_dim' ({head_dim}) must be even for rotary embeddings")

        rope_theta, rope_scaling = _parse_rope(fields)
        max_positions = fields.positive_int("max_position_embeddings")
        attention_bias = fields.get("attention_bias", bool, default=False)
        return cls(
            model_type=model_type,
            vocab_size=fields.positive_int("vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=fields.positive_int("intermediate_size"),
            num_layers=fields.positive_int("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=fields.positive_float("rms_norm_eps", default=1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            sliding_window=_parse_sliding_window(fields, model_type, max_positions),
            tie_word_embeddings=fields.get("tie_word_embeddings", bool, default=False),
            # Qwen2 always has q/k/v biases; Mistral never has biases; Llama and Qwen3 follow `attention_bias`.
            qkv_bias={"qwen2": True, "mistral": False}.get(model_type, attention_bias),
            o_bias=attention_bias if model_type in ("llama", "qwen3") else False,
            mlp_bias=model_type == "llama" and fields.get("mlp_bias", bool, default=False),
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_token_ids(raw, generation_config, source),
        )


class _Fields:
    """Typed access to a raw config dict; every error names the file and the field."""

    _MISSING = object()

    def __init__(self, raw: dict[str, Any], source: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        self.raw, self.source = raw, source

    def get(self, name: str, kind: type, default: Any = _MISSING) -> Any:
        value = self.raw.get(name, default)
        if value is self._MISSING:
            raise ConfigError(f"{self.source}: required field '{name}' is missing")
        if value is default and default is not self._MISSING:
            return value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{self.source}: field '{name}' must be {kind.__name__}, got {value!r}")
        return value

    def positive_int(self, name: str, default: Any = _MISSING) -> Any:
        value = self.get(name, int, default)
        if value is not None and value is not default and value <= 0:
            raise ConfigError(f"{self.source}: field '{name}' must be a positive integer, got {value!r}")
        return value

    def positive_float(self, name: str, default: Any = _MISSING) -> float:
        value = self.get(name, float, default)
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{self.source}: field '{name}' must be a positive number, got {value!r}")
        return value


def _parse_rope(fields: _Fields) -> tuple[float, RopeScaling | None]:
    """RoPE base and scaling from either `rope_parameters` (transformers 5) or `rope_theta`/`rope_scaling`."""
    field = "rope_parameters" if fields.raw.get("rope_parameters") is not None else "rope_scaling"
    params = fields.raw.get(field) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{fields.source}: field '{field}' must be an object, got {params!r}")
    theta = params.get("rope_theta", fields.raw.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ConfigError(f"{fields.source}: field 'rope_theta' must be a positive number, got {theta!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedConfigError(f"{fields.source}: field '{field}.partial_rotary_factor' != 1 is not implemented")
    if kind in (None, "default"):
        return float(theta), None
    sub = _Fields(params, f"{fields.source} field '{field}'")
    if kind == "linear":
        return float(theta), RopeScaling("linear", sub.positive_float("factor"))
    if kind == "llama3":
        scaling = RopeScaling(
            "llama3", sub.positive_float("factor"), sub.positive_float("low_freq_factor"),
            sub.positive_float("high_freq_factor"),
            sub.positive_int("original_max_position_embeddings"))
        if scaling.high_freq_factor <= scaling.low_freq_factor:
            raise ConfigError(f"{fields.source}: field '{field}.high_freq_factor' must exceed 'low_freq_factor'")
        return float(theta), scaling
    if isinstance(kind, str) and kind in _transformers_rope_types():
        raise UnsupportedConfigError(f"{fields.source}: field '{field}.rope_type' is {kind!r}; leapgen implements "
                                     f"'default', 'linear' and 'llama3'")
    if isinstance(kind, str):   # (no use falling back on transformers: it fails on it with a bare KeyError)
        raise ConfigError(f"{fields.source}: field '{field}.rope_type' is {kind!r}, which neither leapgen nor the "
                          f"installed transformers implements")
    raise ConfigError(f"{fields.source}: field '{field}.rope_type' must be a string, got {kind!r}")


def _transformers_rope_types() -> frozenset[str]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return frozenset(ROPE_INIT_FUNCTIONS)


def _parse_sliding_window(fields: _Fields, model_type: str, max_positions: int) -> int | None:
    """The window, when one applies below `max_position_embeddings`; the model then refuses longer sequences."""
    if model_type in ("qwen2", "qwen3") and not fields.get("use_sliding_window", bool, default=False):
        return None
    if model_type == "llama":
        return None
    window = fields.positive_int("sliding_window", default=None)
    if window is None or window >= max_positions:
        return None
    warnings.warn(f"{fields.source}: sliding window attention ({window} tokens) is not implemented; leapgen "
                  f"limits sequences to {window} tokens, where full attention is exact", stacklevel=3)
    return window


def eos_token_ids(raw: dict[str, Any], generation_config: dict[str, Any] | None, source: str) -> tuple[int, ...]:
    """End-of-sequence ids: generation_config.json's when it names any (as `generate` does), else config.json's."""
    ids = _parse_eos(raw, source)
    if generation_config and generation_config.get("eos_token_id") is not None:
        ids = _parse_eos(generation_config, str(Path(source).with_name("generation_config.json")))
    return ids


def _parse_eos(raw: dict[str, Any], source: str) -> tuple[int, ...]:
    value = raw.get("eos_token_id")
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ConfigError(f"{source}: field 'eos_token_id' must be a token id or a list of them, got {value!r}")
    return tuple(ids)


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON config file; a syntax error becomes a ConfigError naming the file and line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def resolve_dtype(dtype: str | torch.dtype, raw_config: dict[str, Any] | None = None) -> torch.dtype:
    """Map 'auto' (the checkpoint's own dtype, else float32), a name like 'bf16', or a torch dtype to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        return dtype
    if dtype == "auto":
        saved = (raw_config or {}).get("dtype") or (raw_config or {}).get("torch_dtype")
        return _DTYPES.get(saved, torch.float32) if isinstance(saved, str) else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto', one of {sorted(_DTYPES)} or a torch dtype, got {dtype!r}")
    return _DTYPES[dtype]


# Device kinds leapgen's kernels cover: Triton on CUDA, the torch reference elsewhere (MPS runs the reference).
SUPPORTED_DEVICE_TYPES = ("cpu", "cuda", "mps")


def resolve_device(device: str | torch.device) -> torch.device:
    """A torch device leapgen can run on; 'auto' picks CUDA when available.  A bad or unavailable device
    raises ValueError naming it (torch's own error for a bad string is a RuntimeError without the choices)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a valid device ({exc}); use 'auto', 'cpu', 'cuda', 'cuda:N' "
                         f"or 'mps'") from None
    if resolved.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"device {device!r}: leapgen runs on {', '.join(SUPPORTED_DEVICE_TYPES)}, not "
                         f"{resolved.type!r}")
    if resolved.type == "cuda":
        _check_cuda_device(device, resolved)
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available on this machine; use device='cpu'")
    return resolved


def _check_cuda_device(device: str | torch.device, resolved: torch.device) -> None:
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available (no GPU visible, or this torch build has no "
                         f"CUDA support); use device='cpu' or 'auto'")
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise ValueError(f"device {device!r}: only {count} CUDA device(s) are visible "
                         f"({', '.join(f'cuda:{i}' for i in range(count))})")
