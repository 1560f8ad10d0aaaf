"""`leapgen extract --ray`: the same job on a real local Ray cluster (2 workers, a tiny model)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest

from checkpoints import build_checkpoint_for_tokenizer
from leapgen.extraction import LimitError, prepare
from leapgen.extraction_ray import run_on_ray
from tokenizers_util import byte_level_bpe

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}
RAY_TIMEOUT_S = 240


def test_ray_workers_write_every_record_once_and_resume(tmp_path):
    pytest.importorskip("ray.data")
    model = tmp_path / "model"
    build_checkpoint_for_tokenizer(model, byte_level_bpe())
    records = [{"id": f"r{i}", "text": f"Person {i} is {20 + i} years old."} for i in range(5)]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    out = tmp_path / "out.jsonl"
    finished = {"id": "r0", "status": "ok", "data": {"name": "x", "age": 1}, "error": None}   # an earlier run's
    out.write_text(json.dumps(finished) + "\n")
    command = [sys.executable, "-m", "leapgen.cli", "extract", str(data), "--schema", str(schema), "-o", str(out),
               "--model", str(model), "--dtype", "float32", "--kv-cache-memory", "8MiB", "--max-tokens", "32",
               "--ray", "--workers", "2"]
    # its own session, so that a hang can be stopped with the Ray processes it started
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, cwd=tmp_path)      # outside the checkout, as installed
    try:
        _, err = process.communicate(timeout=RAY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"leapgen extract --ray did not finish within {RAY_TIMEOUT_S} s")
    assert "Traceback" not in err and "4 skipped" not in err and "1 skipped" in err, err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert process.returncode == (1 if any(line["status"] == "error" for line in lines[1:]) else 0), err
    assert sorted(line["id"] for line in lines) == [f"r{i}" for i in range(5)]
    assert lines[0] == finished
    for line in lines[1:]:
        assert line["status"] in ("ok", "error") and line["usage"]["completion_tokens"] > 0
        assert line["finish_reason"] in ("stop", "length")


def test_a_bad_schema_fails_on_the_driver_before_ray_starts(tmp_path):
    pytest.importorskip("ray.data")
    model = tmp_path / "model"
    build_checkpoint_for_tokenizer(model, byte_level_bpe())
    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "x"}\n')
    bad = {"type": "object", "unevaluatedProperties": False}
    with pytest.raises(ValueError, match=r"schema: .*'unevaluatedProperties'.*\(at /unevaluatedProperties\)"):
        prepare(data, bad, tmp_path / "out.jsonl")      # (with no model)
    plan = prepare(data, SCHEMA, tmp_path / "out.jsonl")
    plan.job = dataclasses.replace(plan.job, schema=bad)     # (a plan made otherwise: the driver compiles it too)
    with pytest.raises(ValueError, match=r"schema: .*'unevaluatedProperties'.*\(at /unevaluatedProperties\)"):
        run_on_ray(plan, model, workers=2)
    plan = prepare(data, SCHEMA, tmp_path / "out.jsonl", max_tokens=100_000)     # past the model's context
    with pytest.raises(LimitError, match=r"max_tokens=100000 leaves no room for a prompt"):
        run_on_ray(plan, model, workers=2)
    import ray

    assert not ray.is_initialized()


def test_without_ray_the_error_says_what_to_install(tmp_path, monkeypatch):
    data = tmp_path / "in.jsonl"
    data.write_text('{"text": "x"}\n')
    plan = prepare(data, SCHEMA, tmp_path / "out.jsonl")
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'leapgen\[ray\]'"):
        run_on_ray(plan, None)
