"""The `leapgen generate` command on a tiny checkpoint."""

from __future__ import annotations

import json

import pytest

from checkpoints import build_checkpoint
from leapgen.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli-llama")
    build_checkpoint(directory, "llama")
    return str(directory)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_lines_with_samples_and_logprobs(model_dir, capsys):
    code, out, err = run(capsys, "--model", model_dir, "--prompt", "w5 w6 w7", "--prompt", "w9", "--max-tokens", "5",
                         "--ignore-eos", "--temperature", "0.9", "--top-p", "0.8", "--seed", "3", "--n", "2",
                         "--logprobs", "1", "--json")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == ["w5 w6 w7", "w9"]
    for record in records:
        assert len(record["outputs"]) == 2
        assert all(len(o["token_ids"]) == 5 and len(o["logprobs"]) == 5 for o in record["outputs"])
    assert "tok/s" in err


def test_beam_search_and_unspellable_constraint(model_dir, capsys):
    code, out, _ = run(capsys, "--model", model_dir, "--prompt", "w3 w4", "--max-tokens", "4", "--num-beams", "3",
                       "--json")
    assert code == 0 and "score" in json.loads(out)
    # the word-level test tokenizer cannot spell arbitrary text: the constraint is refused, clearly
    code, _, err = run(capsys, "--model", model_dir, "--prompt", "w3", "--max-tokens", "8", "--regex", "(w1[0-9]){2}")
    assert code == 2 and "no token in this vocabulary" in err


def test_bad_input_is_one_clear_line(model_dir, capsys):
    code, _, err = run(capsys, "--model", model_dir, "--prompt", "w3", "--temperature", "-1")
    assert code == 2 and "SamplingParams.temperature" in err
    code, _, err = run(capsys, "--model", model_dir + "/missing", "--prompt", "w3")
    assert code == 2 and "missing" in err
    code, _, err = run(capsys, "--model", model_dir, "--prompt", "w3", "--regex", "(?<=a)b")
    assert code == 2 and "position" in err
