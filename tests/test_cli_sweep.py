"""`leapgen sweep` on tiny checkpoints: the grid's checks, one batch for every cell, the table, the files."""

from __future__ import annotations

import importlib.util
import io
import json

import pytest

import leapgen
from leapgen import SamplingParams
from leapgen.cli import main
from leapgen.llm import LLM
from test_cli import error_line


def sweep(capsys, *argv) -> tuple[int, str, str]:
    code = main(["sweep", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table(out: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = [line.split() for line in out.splitlines()]
    return header, rows


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if a model is loaded: bad flags are refused before that."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(LLM, "__init__", refuse)


@pytest.mark.parametrize("grid,expected", [
    (["topp=0.9"], "--grid topp=0.9: unknown SamplingParams field 'topp'"),
    (["temperature=0.5,warm"], "--grid temperature=0.5,warm: temperature takes a number, got 'warm'"),
    (["top_k=1,2.5"], "--grid top_k=1,2.5: top_k takes an int, got '2.5'"),
    (["ignore_eos=yes"], "--grid ignore_eos=yes: ignore_eos takes true or false, got 'yes'"),
    (["temperature"], "--grid temperature: expected FIELD=V1,V2,..."),
    (["temperature=0.5", "temperature=1"], "--grid temperature=1: temperature is already in the grid"),
    (["temperature=0.5,0.5"], "--grid temperature=0.5,0.5: '0.5' is given twice"),
    (["seed=1,2"], "--grid seed=1,2: seed cannot be swept; use --seed"),
    (["n=1,2"], "--grid n=1,2: n cannot be swept; use --n"),
    (["stop=a"], "--grid stop=a: stop cannot be swept; use --stop"),
    (["constraint=x"], "--grid constraint=x: constraint cannot be swept; use --schema"),
    (["logprobs=1"], "--grid logprobs=1: logprobs cannot be swept"),
    (["top_p=0.5,1.5"], "--grid top_p=0.5,1.5: SamplingParams.top_p must be in (0, 1], got 1.5"),
    (["temperature=nan"], "--grid temperature=nan: SamplingParams.temperature must be a finite number"),
    (["num_beams=1,4"], "--grid num_beams=1,4: num_beams cannot be swept; a sweep compares samples"),
    (["length_penalty=0.5"], "--grid length_penalty=0.5: length_penalty cannot be swept; it ranks beams"),
])
def test_bad_grid_is_one_line_before_the_model_loads(cli_model, capsys, no_model_load, grid, expected):
    argv = ["--model", cli_model, "--prompt", "w3"]
    for spec in grid:
        argv += ["--grid", spec]
    code, out, err = sweep(capsys, *argv)
    assert expected in error_line(code, err) and out == ""


@pytest.mark.parametrize("argv,expected", [
    ([], "no prompt: give --prompt TEXT or --prompts-file FILE"),
    (["--prompt", "w3", "--n", "0"], "--n"),
    (["--prompt", "w3", "--stop", ""], "--stop: SamplingParams.stop must be non-empty strings"),
    (["--prompt", "w3", "--output", "/no/such/dir/out.jsonl"], "--output /no/such/dir/out.jsonl: no such directory"),
    (["--prompt", "w3", "--regex", "(?<=a)b"], "--regex"),
    (["--prompt", "w3", "--regex", "[0-9]{3}", "--grid", "min_tokens=0,2"],
     "--grid min_tokens=0,2: min_tokens cannot be combined with a constraint"),
])
def test_other_bad_flags_are_one_line(cli_model, capsys, argv, expected):
    code, _, err = sweep(capsys, "--model", cli_model, *argv)
    assert expected in error_line(code, err, alone=False)


@pytest.mark.parametrize("flag,path", [("--output", "/proc/leapgen-sweep.jsonl"), ("--plot", "/proc/leapgen.png")])
def test_a_file_the_sweep_cannot_write_is_refused_before_the_model_loads(cli_model, capsys, no_model_load, flag,
                                                                          path):
    """It was found only when the samples were written, after every cell had run: the samples were lost."""
    code, out, err = sweep(capsys, "--model", cli_model, "--prompt", "w3", flag, path)
    assert f"{flag} {path}: cannot write it" in error_line(code, err) and out == ""


def test_the_check_that_a_file_can_be_written_leaves_it_as_it_was(tmp_path):
    from leapgen.cli_sweep import _check_writable

    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    old.write_text("kept\n")
    _check_writable("--output", str(new))
    _check_writable("--output", str(old))
    assert not new.exists() and old.read_text() == "kept\n"


def test_a_2x2_grid_is_four_rows_and_every_sample_in_the_output(cli_model, tmp_path, capsys, monkeypatch):
    calls = []
    original = LLM.generate

    def spy(self, prompts, params=None, **kwargs):
        calls.append((list(prompts), list(params), kwargs))
        return original(self, prompts, params, **kwargs)

    monkeypatch.setattr(LLM, "generate", spy)
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("w5 w6\n\nw7\n", encoding="utf-8")
    output = tmp_path / "samples.jsonl"
    code, out, err = sweep(capsys, "--model", cli_model, "--prompt", "w3 w4", "--prompts-file", str(prompts_file),
                           "--grid", "temperature=0.5,1.0", "--grid", "top-p=0.9,1", "--n", "3", "--max-tokens", "4",
                           "--output", str(output))
    assert code == 0, err
    header, rows = table(out)
    assert header[:3] == ["cell", "temperature", "top_p"] and "distinct-1" in header and "valid%" not in header
    assert [row[:3] for row in rows] == [["0", "0.5", "0.9"], ["1", "0.5", "1.0"], ["2", "1.0", "0.9"],
                                         ["3", "1.0", "1.0"]]
    assert all(row[header.index("samples")] == "9" and row[header.index("errors")] == "0" for row in rows)

    # one batch for the whole sweep: every cell x prompt, n samples each, token logprobs on, a seed per cell
    assert len(calls) == 1
    prompts, params, kwargs = calls[0]
    assert prompts == ["w3 w4", "w5 w6", "w7"] * 4 and kwargs["on_error"] == "return"
    assert all(p.n == 3 and p.logprobs == 0 and p.max_tokens == 4 for p in params)
    assert [(p.temperature, p.top_p) for p in params[::3]] == [(0.5, 0.9), (0.5, 1.0), (1.0, 0.9), (1.0, 1.0)]
    assert len({p.seed for p in params}) == 4 and params[0].seed == params[2].seed

    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 4 * 3 * 3
    first = records[0]
    assert first["settings"] == {"temperature": 0.5, "top_p": 0.9} and first["prompt"] == "w3 w4"
    assert {"cell", "prompt_index", "sample", "text", "token_ids", "finish_reason", "mean_logprob"} <= set(first)
    assert "valid" not in first
    assert sorted({(r["cell"], r["prompt_index"], r["sample"]) for r in records}) == \
        [(c, p, s) for c in range(4) for p in range(3) for s in range(3)]


def test_the_same_seed_writes_the_same_samples(cli_model, tmp_path, capsys):
    def run_with(seed: str) -> str:
        output = tmp_path / f"seed-{seed}.jsonl"
        code, _, err = sweep(capsys, "--model", cli_model, "--prompt", "w3 w4", "--grid", "temperature=0.8,1.2",
                             "--n", "3", "--max-tokens", "6", "--seed", seed, "--output", str(output))
        assert code == 0, err
        return output.read_text(encoding="utf-8")

    first = run_with("7")
    assert run_with("7") == first
    assert run_with("8") != first


def test_a_regex_sweep_is_all_valid(byte_level_model_dir, tmp_path, capsys):
    output = tmp_path / "samples.jsonl"
    code, out, err = sweep(capsys, "--model", str(byte_level_model_dir), "--prompt", "The answer is",
                           "--grid", "temperature=0.7,1.5", "--n", "3", "--max-tokens", "12",
                           "--regex", "[a-z]{1,5}( [a-z]{1,5}){0,2}", "--json", "--output", str(output))
    assert code == 0, err
    cells = [json.loads(line) for line in out.splitlines()]
    assert [c["settings"] for c in cells] == [{"temperature": 0.7}, {"temperature": 1.5}]
    assert all(c["valid_pct"] == 100.0 and c["samples"] == 3 and c["errors"] == 0 for c in cells)
    assert all(0 < c["distinct_1"] <= 1 and c["mean_logprob"] < 0 and c["tokens_per_s"] > 0 for c in cells)
    assert all(json.loads(line)["valid"] is True for line in output.read_text(encoding="utf-8").splitlines())


def test_the_logprob_column_leaves_forced_tokens_out(byte_level_model_dir, tmp_path, capsys):
    output = tmp_path / "samples.jsonl"
    pattern = "the colou?r is (red|blue)"
    code, _, err = sweep(capsys, "--model", str(byte_level_model_dir), "--prompt", "The answer is", "--n", "1",
                         "--max-tokens", "30", "--regex", pattern, "--json", "--output", str(output))
    assert code == 0, err
    llm = LLM(str(byte_level_model_dir), dtype="float32")
    completion = llm.generate(["The answer is"], SamplingParams(max_tokens=30, logprobs=0,
                                                                constraint=leapgen.Regex(pattern)))[0].outputs[0]
    sampled = [lp.logprob for lp in completion.logprobs if not lp.forced]
    assert len(sampled) < len(completion.logprobs)          # (forced tokens have entries of logprob 0)
    sample = json.loads(output.read_text(encoding="utf-8"))
    assert sample["text"] == completion.text and sample["mean_logprob"] == pytest.approx(sum(sampled) / len(sampled))


def test_files_it_writes_are_neither_each_other_nor_its_inputs(cli_model, tmp_path, capsys, no_model_load,
                                                                monkeypatch):
    prompts, module = tmp_path / "prompts.txt", tmp_path / "models.py"
    prompts.write_text("w3\n")
    module.write_text("import pydantic\n\n\nclass Model(pydantic.BaseModel):\n    a: int\n")
    for argv, expected in ((["--prompts-file", str(prompts), "--output", str(prompts)],
                            f"--output {prompts}: the file --prompts-file names"),
                           (["--prompt", "w3", "--output", str(tmp_path / "x"), "--plot", str(tmp_path / "x")],
                            f"--plot {tmp_path / 'x'}: the file --output names"),
                           (["--prompt", "w3", "--schema", f"{module}:Model", "--output", str(module)],
                            f"--output {module}: the file --schema names")):
        code, _, err = sweep(capsys, "--model", cli_model, *argv)
        assert expected in error_line(code, err, alone=False)
    assert prompts.read_text() == "w3\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("w3\n"))
    with pytest.raises(AssertionError, match="the model was loaded"):    # past the checks: standard input is no file
        sweep(capsys, "--model", cli_model, "--prompts-file", "-", "--output", "-")


def test_failed_requests_are_counted_not_measured(cli_model, capsys):
    code, out, err = sweep(capsys, "--model", cli_model, "--prompt", "w3", "--prompt", "w4 w5",
                           "--grid", "max_tokens=4,100000", "--n", "2")
    header, rows = table(out)
    assert [row[header.index("errors")] for row in rows] == ["0", "2"]
    assert rows[1][header.index("distinct-1")] == "-"
    line = error_line(code, err, alone=False)
    assert "2 of 4 requests failed" in line and "cell 1 prompt 0: the prompt" in line and "prompts[" not in line


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_writes_a_png(cli_model, tmp_path, capsys):
    plot = tmp_path / "sweep.png"
    code, _, err = sweep(capsys, "--model", cli_model, "--prompt", "w3", "--grid", "temperature=0.5,1",
                         "--grid", "top_k=0,5", "--n", "2", "--max-tokens", "3", "--plot", str(plot))
    assert code == 0, err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_one_line(cli_model, tmp_path, capsys, monkeypatch, no_model_load):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else
                        find_spec(name, *a))
    code, _, err = sweep(capsys, "--model", cli_model, "--prompt", "w3", "--plot", str(tmp_path / "p.png"))
    assert error_line(code, err) == "leapgen: error: --plot needs matplotlib: pip install 'leapgen[plot]'"
