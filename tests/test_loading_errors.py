"""Loading failures a user can cause end in one clear line naming the file or device, not a library traceback.

Each case damages a copy of one tiny saved checkpoint (built once per module) and checks the exception
type (ValueError / OSError subclasses, which the CLI prints as one line), that the message names the
culprit, and that it carries no chained safetensors / torch exception.
"""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import leapgen
from checkpoints import build_checkpoint
from leapgen.engine.config import resolve_device
from leapgen.engine.loader import CheckpointError, load_model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    build_checkpoint(directory, "llama")
    return directory


@pytest.fixture
def checkpoint(pristine, tmp_path):
    """A fresh copy of the tiny checkpoint, for a test to break."""
    return shutil.copytree(pristine, tmp_path / "ckpt")


def assert_one_clean_line(exc: BaseException, *fragments: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    chained = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    assert chained is None, f"the library's exception must not be chained: {chained!r}"


def safetensors_header_length(path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


@pytest.mark.parametrize("damage", ["truncated_data", "truncated_header", "garbage_header", "empty"])
def test_damaged_safetensors_names_the_file(checkpoint, damage):
    weights = checkpoint / "model.safetensors"
    data = weights.read_bytes()
    header = safetensors_header_length(weights)
    weights.write_bytes({
        "truncated_data": data[:len(data) // 2],
        "truncated_header": data[:8 + header // 2],
        "garbage_header": data[:8] + b"x" * header + data[8 + header:],
        "empty": b"",
    }[damage])
    with pytest.raises(CheckpointError) as info:
        load_model(checkpoint)
    assert isinstance(info.value, ValueError)
    assert_one_clean_line(info.value, str(weights), "not a readable safetensors file (truncated or corrupted)")


def test_shard_index_naming_a_tensor_the_shard_lacks(checkpoint):
    # A stale index: it maps lm_head.weight to a second shard that does not hold it.
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00002.safetensors")
    save_file({"unrelated": torch.zeros(1)}, str(checkpoint / "model-00002-of-00002.safetensors"))
    with safe_open(checkpoint / "model-00001-of-00002.safetensors", framework="pt") as handle:
        weight_map = {name: "model-00001-of-00002.safetensors" for name in handle.keys()}
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError) as info:
        load_model(checkpoint)
    assert_one_clean_line(info.value, "model-00002-of-00002.safetensors", "cannot read tensor 'lm_head.weight'")


@pytest.mark.parametrize("device", ["tpu9", "cuda:x", "", "CPU"])
def test_invalid_device_string_lists_the_valid_ones(tmp_path, device):
    # The device is checked before any file is read: the path need not exist.
    with pytest.raises(ValueError) as info:
        load_model(tmp_path / "absent", device=device)
    assert_one_clean_line(info.value, repr(device), "'cpu'", "'cuda'")


def test_device_type_leapgen_does_not_run_on(checkpoint):
    with pytest.raises(ValueError, match="'meta'.*leapgen runs on cpu, cuda"):
        load_model(checkpoint, device="meta")


def test_cuda_without_cuda_says_so(checkpoint, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(ValueError) as info:
            load_model(checkpoint, device=device)
        assert_one_clean_line(info.value, "CUDA is not available", "device='cpu'")


def test_cuda_index_beyond_the_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"'cuda:3': only 1 CUDA device\(s\) are visible \(cuda:0\)"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:0") == torch.device("cuda:0")


def test_auto_and_cpu_devices_resolve(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_public_llm_reports_a_bad_device(checkpoint):
    with pytest.raises(ValueError, match="'tpu9' is not a valid device"):
        leapgen.LLM(str(checkpoint), device="tpu9")


def test_intact_copy_still_loads(checkpoint):
    loaded = load_model(checkpoint, device="cpu")
    assert loaded.device == torch.device("cpu") and not loaded.is_fallback
