"""Convert a `.gguf` file into an HF checkpoint directory once, and reuse it from a disk cache.

transformers' GGUF utilities read the metadata into an HF config and tokenizer and dequantise the
tensors with `load_gguf_checkpoint` (undoing llama.cpp's q/k row permutation for Llama), the same
routine behind `from_pretrained(gguf_file=...)`, which here needs neither accelerate nor a full
HF model.  The result is written as config.json + model.safetensors
(float32, the dequantised values unrounded) + tokenizer files under
`$LEAPGEN_CACHE/gguf/<key>/` (default `~/.cache/leapgen`), keyed by the file's path, size and
mtime; later loads read that directory like any other checkpoint.

torch and transformers are imported inside the conversion only: the cache paths (`cache_root`, also
used by `default_model` to keep the default model's GGUF file) are computable without them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
from pathlib import Path

CACHE_ENV = "LEAPGEN_CACHE"
_DONE_MARKER = ".complete"


class GGUFError(ValueError):
    """A .gguf file that cannot be read or converted; the message names the file."""


def cache_root() -> Path:
    """The leapgen disk cache: `$LEAPGEN_CACHE`, else `~/.cache/leapgen`."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "leapgen").expanduser()


def converted_dir(gguf_path: str | Path) -> Path:
    """Where the conversion of this exact file (path, size, mtime) lives in the cache."""
    path = Path(gguf_path).expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{path.stem}-{key}"


def convert_gguf(gguf_path: str | Path) -> Path:
    """The HF checkpoint directory for a .gguf file, converting it on first use."""
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    target = converted_dir(path)
    if (target / _DONE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temporary directory and rename: a crash never leaves a half-written checkpoint.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_checkpoint(path.resolve(), staging)
        (staging / _DONE_MARKER).write_text(f"{path.resolve()}\n")
        if target.exists() and not (target / _DONE_MARKER).is_file():
            shutil.rmtree(target, ignore_errors=True)     # incomplete (its marker was removed): replace it
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        # Renaming onto a non-empty directory fails: another process finished the same conversion first.
        if not (target / _DONE_MARKER).is_file():
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _write_checkpoint(path: Path, out: Path) -> None:
    """config.json, generation_config.json, model.safetensors and tokenizer files for one GGUF file."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError, OSError, struct.error) as exc:
        raise GGUFError(f"{path}: cannot read its GGUF metadata as an HF config ({exc}){_cut_short(path)}") from exc
    # The HF module is built on the meta device only to name the tensors; no weights are allocated.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
    expected = {n for n in skeleton.state_dict() if not (config.tie_word_embeddings and n == "lm_head.weight")}
    missing = sorted(expected - set(tensors))
    if missing:
        raise GGUFError(f"{path}: GGUF file lacks {len(missing)} tensor(s) the {config.model_type} config needs, "
                        f"e.g. {missing[0]}")
    save_file({n: t.contiguous() for n, t in tensors.items() if n in expected}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config.dtype = torch.float32
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def _cut_short(path: Path) -> str:
    """A hint for a file with GGUF's magic bytes that still does not read: the reader maps every tensor while it
    reads the metadata, so a file cut short (an interrupted download) fails there with a numpy or struct error
    that names no file."""
    with open(path, "rb") as f:
        whole = f.read(4) == b"GGUF"
    return "; the file starts as a GGUF file does: is it whole? (an interrupted download is cut short)" if whole else ""
