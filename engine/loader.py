"""Load a checkpoint into leapgen: a local HF directory or a `.gguf` file -> model, configs and tokenizer.

Weights stream from safetensors straight into parameters of the target dtype and device: the
module is built on the meta device, given uninitialised storage, and each checkpoint tensor is
copied into place (one tensor at a time; no full float32 copy of the model ever exists).
Architectures outside leapgen's own model code run through `FallbackModel` (slower).

Every failure a user can cause (a missing or malformed file, a damaged safetensors file, a device
this machine lacks) raises a ValueError or OSError subclass whose one-line message names the file,
field or device, so the CLI and scripts can print it instead of a library traceback.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from leapgen.engine.config import (ConfigError, ModelConfig, UnsupportedConfigError, eos_token_ids, read_json,
                                   resolve_device, resolve_dtype)
from leapgen.engine.fallback import FallbackModel
from leapgen.engine.models import MODEL_CLASSES
from leapgen.engine.models.layers import MergedLinear

SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Tensors some checkpoints carry that the model recomputes or shares.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_HEAD, _EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


class CheckpointError(ValueError):
    """A checkpoint whose files or tensors do not fit the model; the message names the file and tensor."""


@dataclass
class LoadedModel:
    """What `load_model` returns; also unpacks as `model, hf_config, tokenizer = load_model(...)`.

    Native models: `model(input_ids, positions, metadata) -> hidden`, `model.compute_logits(hidden)`,
    and `model.attention_layers` whose `k_cache`/`v_cache` the runner assigns; `config` (leapgen's
    validated view) sizes the cache.  Fallback (`is_fallback`, `config` None): `model.forward_sequences`.
    `eos_token_ids`, `vocab_size` (logit columns; may exceed `len(tokenizer)`) and `max_model_len` are
    set for both kinds.
    """

    model: nn.Module
    hf_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    config: ModelConfig | None
    path: Path
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    max_model_len: int

    @property
    def is_fallback(self) -> bool:
        """True when the model is the slower HF wrapper rather than leapgen's paged model."""
        return isinstance(self.model, FallbackModel)

    def __iter__(self) -> Iterator:
        return iter((self.model, self.hf_config, self.tokenizer))


def load_model(path: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu",
               *, allow_fallback: bool = True) -> LoadedModel:
    """Load a local HF checkpoint directory or a `.gguf` file onto `device` in `dtype` ('auto': the checkpoint's).

    `device` is 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'; it is checked before any file is read, so a
    typo or a machine without a GPU fails at once with a ValueError rather than after a GGUF conversion.
    """
    torch_device = resolve_device(device)
    path = Path(path).expanduser()
    if path.suffix == ".gguf" and not path.is_dir():
        from leapgen.engine.gguf_loader import convert_gguf
        path = convert_gguf(path)
    directory = _checkpoint_dir(path)
    raw = read_json(directory / "config.json")
    generation = _read_generation_config(directory)
    torch_dtype = resolve_dtype(dtype, raw)
    _check_model_type(raw, directory / "config.json")
    try:
        config = ModelConfig.from_dict(raw, str(directory / "config.json"), generation)
    except UnsupportedConfigError as exc:
        if not allow_fallback:
            raise
        warnings.warn(f"{exc}; running it through the transformers fallback, which is much slower "
                      f"(no paged KV cache, recomputation each step)", stacklevel=2)
        return _load_fallback(directory, raw, generation, torch_dtype, torch_device)

    try:
        hf_config = AutoConfig.from_pretrained(directory)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{directory / 'config.json'}: transformers rejects it: {exc}") from exc
    tokenizer = load_tokenizer(directory)
    if config.tie_word_embeddings and _own_output_head(directory):
        config = replace(config, tie_word_embeddings=False)
    with torch.device("meta"):
        model = MODEL_CLASSES[config.model_type](config)
    model = model.to(torch_dtype).to_empty(device=torch_device)
    load_safetensors_weights(model, directory)
    model.eval().requires_grad_(False)
    eos = config.eos_token_ids or _tokenizer_eos(tokenizer)
    return LoadedModel(model, hf_config, tokenizer, config, directory, torch_dtype, torch_device, eos,
                       config.vocab_size, config.max_model_len)


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The HF tokenizer saved in a checkpoint directory."""
    present = [name for name in _TOKENIZER_FILES if (directory / name).is_file()]
    if not present:
        raise CheckpointError(f"{directory}: no tokenizer files (expected one of {', '.join(_TOKENIZER_FILES)})")
    for name in ("tokenizer.json", "tokenizer_config.json"):    # a damaged file, named (transformers does not)
        if name in present:
            read_json(directory / name)
    try:
        return AutoTokenizer.from_pretrained(directory)
    except Exception as exc:    # (transformers raises a different kind for every way a tokenizer is incomplete)
        lines = str(exc).strip().splitlines()
        raise CheckpointError(f"{directory}: cannot load the tokenizer from {', '.join(present)}"
                              f"{' (no tokenizer.json)' if 'tokenizer.json' not in present else ''}: "
                              f"{type(exc).__name__}: {lines[0] if lines else ''}") from exc


def load_safetensors_weights(model: nn.Module, directory: Path) -> None:
    """Copy every checkpoint tensor into `model`'s parameters (already on the target device and dtype)."""
    targets = _checkpoint_targets(model)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded: set[str] = set()
    unexpected: list[str] = []
    for file, names in _weight_files(directory).items():
        with _open_safetensors(file) as handle:
            for name in names if names is not None else handle.keys():
                target = targets.get(name)
                if target is None:
                    if not (name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight")):
                        unexpected.append(name)
                    continue
                tensor = _read_tensor(handle, file, name)
                if tensor.shape != target.shape:
                    raise CheckpointError(f"{file}: tensor '{name}' has shape {tuple(tensor.shape)}, the config "
                                          f"implies {tuple(target.shape)}")
                with torch.no_grad():
                    target.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(targets) - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"{directory}: checkpoint lacks {len(missing)} tensor(s) the model needs: {shown}")
    if unexpected:
        warnings.warn(f"{directory}: ignored {len(unexpected)} checkpoint tensor(s) the model does not use, "
                      f"e.g. {unexpected[0]}", stacklevel=3)


def _open_safetensors(file: Path):
    """`safe_open(file)`; a truncated or corrupted file (safetensors checks the header and that the data
    covers every tensor) becomes a CheckpointError naming it instead of safetensors' own exception."""
    try:
        return safe_open(file, framework="pt", device="cpu")
    except SafetensorError as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file (truncated or corrupted): {exc}") from None


def _read_tensor(handle, file: Path, name: str) -> torch.Tensor:
    """One tensor from an open safetensors file; a name the file lacks (a stale shard index) or a tensor
    that cannot be decoded raises CheckpointError naming the file and the tensor."""
    try:
        return handle.get_tensor(name)
    except SafetensorError as exc:
        raise CheckpointError(f"{file}: cannot read tensor '{name}': {exc}") from None


def _checkpoint_targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the parameter (or merged-parameter rows) it fills."""
    targets: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, MergedLinear):
            parent = module_name.rpartition(".")[0]
            parent = f"{parent}." if parent else ""
            for shard in module.shards:
                for param_name, _ in module.named_parameters(recurse=False):
                    targets[f"{parent}{shard}.{param_name}"] = module.shard(shard, param_name)
        else:
            for param_name, param in module.named_parameters(recurse=False):
                targets[prefix + param_name] = param
    return targets


def _own_output_head(directory: Path) -> bool:
    """Whether a checkpoint whose config ties the output head to the embedding holds an `lm_head.weight` that
    differs from it: transformers then leaves them untied and reads the logits through lm_head, and so does this
    (a warning says so)."""
    where: dict[str, Path] = {}
    for file, names in _weight_files(directory).items():
        with _open_safetensors(file) as handle:
            for name in names if names is not None else handle.keys():
                if name in (_HEAD, _EMBEDDING):
                    where[name] = file
    if len(where) < 2:
        return False
    tensors = {}
    for name, file in where.items():
        with _open_safetensors(file) as handle:
            tensors[name] = _read_tensor(handle, file, name)
    if torch.equal(tensors[_HEAD], tensors[_EMBEDDING]):
        return False
    warnings.warn(f"{directory / 'config.json'}: tie_word_embeddings is true, but the checkpoint's {_HEAD} differs "
                  f"from {_EMBEDDING}; the logits read it, as transformers' do", stacklevel=3)
    return True


def _weight_files(directory: Path) -> dict[Path, list[str] | None]:
    """Safetensors file -> tensor names to read from it (None: all), from the shard index or the single file."""
    index_path = directory / WEIGHTS_INDEX
    if index_path.is_file():
        weight_map = read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{index_path}: field 'weight_map' must be a non-empty object of tensor -> file")
        files: dict[Path, list[str] | None] = {}
        for name, file in weight_map.items():
            shard = directory / str(file)
            if not shard.is_file():
                raise CheckpointError(f"{index_path}: shard '{file}' (holding '{name}') does not exist")
            files.setdefault(shard, []).append(name)
        return files
    if (directory / SINGLE_WEIGHTS).is_file():
        return {directory / SINGLE_WEIGHTS: None}
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt*"))
    hint = f" (found {', '.join(others)}: convert them to safetensors)" if others else ""
    raise CheckpointError(f"{directory}: no weights — expected {SINGLE_WEIGHTS} or {WEIGHTS_INDEX}{hint}")


def _checkpoint_dir(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path}: expected a checkpoint directory (config.json + safetensors) or a .gguf file")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json in the checkpoint directory")
    return path


def _check_model_type(raw: dict, source: Path) -> None:
    """Reject a `model_type` neither leapgen nor transformers knows, before anything heavier runs."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"{source}: field 'model_type' must be a non-empty string, got {model_type!r}")
    if model_type not in MODEL_CLASSES and model_type not in CONFIG_MAPPING:
        raise ConfigError(f"{source}: field 'model_type' is {model_type!r}, which neither leapgen nor the installed "
                          f"transformers knows")


def _read_generation_config(directory: Path) -> dict | None:
    path = directory / "generation_config.json"
    return read_json(path) if path.is_file() else None


def _tokenizer_eos(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    return () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)


def _load_fallback(directory: Path, raw: dict, generation: dict | None, dtype: torch.dtype,
                   device: torch.device) -> LoadedModel:
    """Wrap transformers' own model for an architecture leapgen's model code does not cover."""
    model = FallbackModel.from_pretrained(directory, dtype, device)
    hf_config = model.hf_model.config
    tokenizer = load_tokenizer(directory)
    eos = eos_token_ids(raw, generation, str(directory / "config.json"))
    output_embeddings = model.hf_model.get_output_embeddings()
    vocab_size = hf_config.vocab_size if output_embeddings is None else output_embeddings.weight.shape[0]
    max_len = getattr(hf_config, "max_position_embeddings", None) or tokenizer.model_max_length
    return LoadedModel(model, hf_config, tokenizer, None, directory, dtype, device, eos or _tokenizer_eos(tokenizer),
                       vocab_size, int(max_len))


__all__ = ["CheckpointError", "LoadedModel", "load_model", "load_safetensors_weights", "load_tokenizer"]

