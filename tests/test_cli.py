"""The `leapgen generate` command on a tiny checkpoint."""

from __future__ import annotations

import gc
import io
import json
import shutil
import sys

import pytest
import torch

from leapgen.cli import main
from leapgen.cli_common import frozen_startup_heap
from leapgen.cli_inputs import decode_escapes
from leapgen.llm import LLM


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["generate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_line(code: int, err: str, alone: bool = True) -> str:
    """The one `leapgen: error:` line of a refused command (`alone`: stderr holds nothing else)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("leapgen: error: ")]
    assert len(lines) == 1, err
    if alone:
        assert err.strip() == lines[0], err
    return lines[0]


def test_json_lines_with_samples_and_logprobs(cli_model, capsys):
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w5 w6 w7", "--prompt", "w9", "--max-tokens", "5",
                         "--ignore-eos", "--temperature", "0.9", "--top-p", "0.8", "--seed", "3", "--n", "2",
                         "--logprobs", "1", "--json")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == ["w5 w6 w7", "w9"]
    for record in records:
        assert len(record["outputs"]) == 2
        assert all(len(o["token_ids"]) == 5 and len(o["logprobs"]) == 5 for o in record["outputs"])
    assert "tok/s" in err


def test_beam_search_and_unspellable_constraint(cli_model, capsys):
    code, out, _ = run(capsys, "--model", cli_model, "--prompt", "w3 w4", "--max-tokens", "4", "--num-beams", "3",
                       "--json")
    assert code == 0 and "score" in json.loads(out)
    # the word-level test tokenizer's tokens are "w3".."w95": no token starts with "x", so nothing can
    # spell this regex; it is refused before generating, in one line
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "8", "--regex", "xyz")
    line = error_line(code, err, alone=False)
    assert "constraint" in line and "cannot spell" in line
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "8", "--regex", "xyz",
                         "--stream")
    line = error_line(code, err)
    assert "constraint" in line and "cannot spell" in line and out == ""
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--n", "2", "--stream")
    assert "--stream prints the text of one sample, got --n 2" in error_line(code, err) and out == ""


def test_bad_input_is_one_clear_line(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--temperature", "-1")
    assert code == 2 and "SamplingParams.temperature" in err
    code, _, err = run(capsys, "--model", cli_model + "/missing", "--prompt", "w3")
    assert code == 2 and "missing" in err
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--regex", "(?<=a)b")
    assert code == 2 and "position" in err


# --- issue 10 item 6: every bad flag or file is one `leapgen: error:` line and exit status 2 ---------------

def test_argparse_errors_are_one_line(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "many")
    assert "--max-tokens" in error_line(code, err)
    code, _, err = run(capsys, "--model", cli_model)
    assert "--prompt" in error_line(code, err)


def test_logprobs_past_the_cap_names_the_flag(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--logprobs", "100000")
    line = error_line(code, err)
    assert "--logprobs" in line and "100000" in line


@pytest.mark.parametrize("flag", ["--temperature", "--top-p", "--min-p", "--repetition-penalty", "--length-penalty"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_floats_name_the_flag(cli_model, capsys, flag, value):
    # `=`: argparse takes a lone "-inf" for an option
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", f"{flag}={value}")
    line = error_line(code, err)
    assert flag in line and "finite" in line


def test_unknown_device_names_the_flag(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--device", "tpu9")
    line = error_line(code, err)
    assert "--device" in line and "tpu9" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_names_the_flag(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--device", "cuda")
    line = error_line(code, err)
    assert "--device" in line and "CUDA is not available" in line


def test_auto_device_still_runs(cli_model, capsys):
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "2", "--device", "auto",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["prompt"] == "w3"


@pytest.mark.parametrize("keep", [0.5, 10 / 1e9])
def test_truncated_checkpoint_is_one_line(cli_model, tmp_path, capsys, keep):
    broken = tmp_path / "broken-model"
    shutil.copytree(cli_model, broken)
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: max(int(len(data) * keep), 10)])
    code, _, err = run(capsys, "--model", str(broken), "--prompt", "w3")
    line = error_line(code, err)
    assert f"cannot load model {broken}: " in line


def test_deeply_nested_json_schema_is_one_line(cli_model, tmp_path, capsys):
    schema: dict = {"type": "string"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(schema))
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--json-schema", str(path))
    line = error_line(code, err)
    assert f"--json-schema {path}" in line and "nested" in line


def test_undecodable_prompt_is_one_line(cli_model, capsys):
    # what Python makes of the argv bytes b"bad \xff" under a UTF-8 locale
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "bad \udcff")
    line = error_line(code, err)
    assert "--prompt" in line and "not valid UTF-8" in line and "0xff" in line


def test_empty_regex_means_empty_output(cli_model, capsys):
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "8", "--regex", "",
                         "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["text"] == "" and record["finish_reason"] == "stop"


def test_decode_escapes():
    assert decode_escapes(r"\n") == "\n"            # what the shell passes for "\n": a backslash and an n
    assert decode_escapes(r"\n\t\r") == "\n\t\r"
    assert decode_escapes(r"a\\nb") == r"a\nb"      # an escaped backslash, then a plain n
    assert decode_escapes(r"\u00e9t\U0001F600\x41") == "\u00e9t\U0001F600A"
    assert decode_escapes(r"café 日本 \d+ C:\dir") == r"café 日本 \d+ C:\dir"   # unknown escapes stay as typed
    with pytest.raises(ValueError, match="past the last"):
        decode_escapes(r"\U00110000")


def test_stop_escapes_from_the_command_line(cli_model, capsys, monkeypatch):
    seen = []
    original = LLM.generate

    def spy(self, prompts, params=None, **kwargs):
        seen.append(params.stop)
        return original(self, prompts, params, **kwargs)

    monkeypatch.setattr(LLM, "generate", spy)
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "2", "--stop", "\\n",
                       "--stop", "w9\\tw10")
    assert code == 0, err
    assert seen == [["\n", "w9\tw10"]]


def test_system_implies_chat(cli_model, capsys, monkeypatch):
    calls = []

    def chat_prompt(self, message, system=None):
        calls.append((message, system))
        return message

    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--system", "w5")
    line = error_line(code, err)       # the tiny tokenizer has no chat template
    assert "--system" in line and "chat template" in line
    monkeypatch.setattr(LLM, "chat_prompt", chat_prompt)
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "2", "--system", "w5")
    assert code == 0, err
    assert calls == [("w3", "w5")]


def test_threads_kv_cache_memory_and_packing_reach_the_llm(cli_model, capsys, monkeypatch):
    seen = []
    original = LLM.__init__

    def spy(self, *args, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("threads", "kv_cache_memory", "pack_weights")})
        original(self, *args, **kwargs)

    monkeypatch.setattr(LLM, "__init__", spy)
    threads_before = torch.get_num_threads()
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "2", "--threads", "1",
                       "--kv-cache-memory", "4MiB")
    assert code == 0, err
    assert torch.get_num_threads() == 1
    torch.set_num_threads(threads_before)
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "2",
                       "--kv-cache-memory", "1048576", "--no-pack-weights")
    assert code == 0, err
    assert seen == [{"threads": 1, "kv_cache_memory": "4MiB", "pack_weights": True},
                    {"threads": None, "kv_cache_memory": "1048576", "pack_weights": False}]


@pytest.mark.parametrize("flag,value", [("--threads", "0"), ("--threads", "two"), ("--kv-cache-memory", "lots"),
                                        ("--kv-cache-memory", "0MiB"), ("--kv-cache-memory", "16")])
def test_bad_operations_flags_name_the_flag(cli_model, capsys, flag, value):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", flag, value)
    line = error_line(code, err)
    assert flag in line and repr(value) in line


def test_a_schema_file_holding_no_schema_is_one_line(cli_model, tmp_path, capsys):
    """A file holding a JSON string was decoded as a schema's text again ("Expecting value")."""
    for text, kind in (('"person"', "str"), ("[1]", "list")):
        path = tmp_path / f"{kind}.json"
        path.write_text(text)
        code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--schema", str(path))
        assert f"--schema {path}: a JSON Schema is an object or a boolean, not {kind}" in error_line(code, err)


@pytest.mark.parametrize("flag", ["--json-schema", "--grammar"])
def test_missing_or_directory_constraint_file(cli_model, tmp_path, capsys, flag):
    missing = tmp_path / "nowhere.txt"
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", flag, str(missing))
    line = error_line(code, err)
    assert f"{flag} {missing}" in line and "no such file" in line
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", flag, str(tmp_path))
    line = error_line(code, err)
    assert f"{flag} {tmp_path}" in line and "directory" in line


def test_max_tokens_past_the_context_is_one_line(cli_model, capsys):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--max-tokens", "100000")
    line = error_line(code, err)
    assert "prompts[0]" in line and "max_tokens (100000)" in line and "256" in line


def test_speculative_flags_keep_the_output_and_report_metrics(cli_model, capsys):
    base = ["--model", cli_model, "--prompt", "w3 w4 w5 w3 w4 w5 w3 w4", "--max-tokens", "12", "--ignore-eos", "--json"]
    code, plain, err = run(capsys, *base)
    assert code == 0, err
    code, fast, err = run(capsys, *base, "--speculative", "ngram", "--num-speculative-tokens", "3")
    assert code == 0, err
    plain, fast = json.loads(plain), json.loads(fast)
    assert fast["token_ids"] == plain["token_ids"] and plain["metrics"]["drafted_tokens"] == 0
    code, draft, err = run(capsys, *base, "--speculative", f"draft:{cli_model}")   # the model drafts for itself
    assert code == 0, err
    draft = json.loads(draft)
    assert draft["token_ids"] == plain["token_ids"]
    assert draft["metrics"]["accepted_tokens"] == draft["metrics"]["drafted_tokens"] > 0


def test_bad_speculative_flags_are_one_line(cli_model, capsys):
    for argv, flag in ((["--speculative", "medusa"], "--speculative"), (["--speculative", "draft:"], "--speculative"),
                       (["--num-speculative-tokens", "3"], "--num-speculative-tokens"),
                       (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens")):
        code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", *argv)
        assert flag in error_line(code, err), err


def test_a_draft_model_that_does_not_load_is_named_as_the_draft(cli_model, tmp_path, capsys):
    """The main model loaded; the error is the draft's, under the flag that named it (not 'cannot load model')."""
    for path in (tmp_path / "missing", tmp_path):       # tmp_path: a folder with no checkpoint
        code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--speculative", f"draft:{path}")
        line = error_line(code, err)
        assert line.startswith("leapgen: error: --speculative: speculative.model ") and str(path) in line, err


# --- issue 12: many prompts from a file or stdin -------------------------------------------------------------

def prompts_of(out: str) -> list[str]:
    """The prompts of --json's lines, each of which must be a JSON object with the completion's fields."""
    records = [json.loads(line) for line in out.splitlines()]
    assert all({"prompt", "text", "token_ids", "finish_reason", "metrics"} <= set(r) for r in records)
    return [r["prompt"] for r in records]


def test_prompts_file_of_lines_comes_after_the_prompt_flags(cli_model, tmp_path, capsys):
    path = tmp_path / "prompts.txt"
    path.write_text("w3 w4\n\n   \nw5 w6\r\nw7\n", encoding="utf-8")     # blank lines skipped, CRLF too
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w9", "--prompts-file", str(path),
                         "--max-tokens", "2", "--json")
    assert code == 0, err
    assert prompts_of(out) == ["w9", "w3 w4", "w5 w6", "w7"]


def test_prompts_file_of_json_lines(cli_model, tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "w3 w4", "id": 1}\n\n{"prompt": "w5"}\n', encoding="utf-8")
    code, out, err = run(capsys, "--model", cli_model, "--prompts-file", str(path), "--max-tokens", "2", "--json")
    assert code == 0, err
    assert prompts_of(out) == ["w3 w4", "w5"]
    # a line that is not a JSON object makes the whole file plain lines, unless the first is one with a "prompt"
    # (then that line is an error: see test_bad_prompts_file_is_one_line)
    path.write_text('{"text": "w3"}\nw5\n', encoding="utf-8")
    code, out, err = run(capsys, "--model", cli_model, "--prompts-file", str(path), "--max-tokens", "2", "--json")
    assert code == 0, err
    assert prompts_of(out) == ['{"text": "w3"}', "w5"]


@pytest.mark.parametrize("stdin", [lambda text: io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"),
                                   io.StringIO])
def test_prompts_file_dash_reads_stdin(cli_model, capsys, monkeypatch, stdin):
    monkeypatch.setattr(sys, "stdin", stdin("w3\nw4 w5\n"))
    code, out, err = run(capsys, "--model", cli_model, "--prompts-file", "-", "--max-tokens", "2", "--json")
    assert code == 0, err
    assert prompts_of(out) == ["w3", "w4 w5"]


@pytest.mark.parametrize("content,expected", [
    (b'{"prompt": "w3"}\n{"text": "w4"}\n', ':2: the object has no "prompt" field'),
    (b'{"prompt": "w3"}\nw5\n', ':2: not a JSON object (the file reads as JSONL'),
    (b'{"prompt": 3}\n', ':1: "prompt" must be a string'),
    (b'{"prompt": "\\udcff"}\n', ":1: the text is not valid UTF-8"),
    (b"w2\nw3 \xff\n", ":2: not UTF-8 text (byte offset 6)"),
    (b"\n  \n", " has none"),
])
def test_bad_prompts_file_is_one_line(cli_model, tmp_path, capsys, content, expected):
    path = tmp_path / "prompts.txt"
    path.write_bytes(content)
    code, _, err = run(capsys, "--model", cli_model, "--prompts-file", str(path))
    line = error_line(code, err)
    assert f"--prompts-file {path}" in line and expected in line


def test_missing_prompts_file_and_undecodable_stdin(cli_model, tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--prompts-file", str(tmp_path / "no.txt"))
    line = error_line(code, err)
    assert f"--prompts-file {tmp_path / 'no.txt'}: no such file" in line
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"w3 \xff")))
    code, _, err = run(capsys, "--model", cli_model, "--prompts-file", "-")
    line = error_line(code, err)
    assert "--prompts-file -: standard input is not UTF-8 text (byte offset 3)" in line


def test_many_prompts_print_json_lines_in_order_and_a_bar_on_stderr(cli_model, tmp_path, capsys, monkeypatch):
    prompts = [f"w{i} w{i + 1}" for i in range(3, 15)]
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(prompts), encoding="utf-8")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)         # the bar is drawn on terminals only
    code, out, err = run(capsys, "--model", cli_model, "--prompts-file", str(path), "--max-tokens", "3",
                         "--temperature", "0.8", "--seed", "1", "--n", "2", "--json")
    assert code == 0, err
    assert prompts_of(out) == prompts
    assert f"/{len(prompts)}" in err and "req" in err
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--prompt", "w4", "--max-tokens", "2")
    assert code == 0 and "req" not in err                          # a few prompts: no bar


def test_long_commands_freeze_the_startup_heap_and_give_it_back():
    with frozen_startup_heap():
        assert gc.get_freeze_count() > 10_000      # torch, transformers and all loaded so far: out of full collections
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("ending", [["--ignore-eos"], ["--min-tokens", "5"]])
def test_flags_that_hold_the_end_off_are_refused_beside_a_constraint_before_loading(capsys, ending):
    """(no --model: the default model is never read)"""
    code, _, err = run(capsys, "--prompt", "x", "--regex", "[0-9]{3}", *ending)
    assert error_line(code, err).startswith(f"leapgen: error: {ending[0]} cannot be combined with --regex")


def test_samples_past_max_num_seqs_are_refused_before_loading_and_run_when_raised(cli_model, capsys):
    from leapgen.cli_common import DEFAULT_MAX_NUM_SEQS
    from leapgen.engine.llm_engine import EngineConfig

    assert DEFAULT_MAX_NUM_SEQS == EngineConfig.max_num_seqs
    code, _, err = run(capsys, "--prompt", "x", "--n", "300", "--temperature", "1")
    assert error_line(code, err) == ("leapgen: error: --n 300: more than the engine runs at once (--max-num-seqs 256); "
                                     "raise --max-num-seqs to at least 300")
    code, _, err = run(capsys, "--prompt", "x", "--num-beams", "5", "--max-num-seqs", "4")
    assert "--num-beams 5" in error_line(code, err)
    code, out, err = run(capsys, "--model", cli_model, "--prompt", "w3", "--n", "300", "--temperature", "1",
                         "--max-tokens", "2", "--max-num-seqs", "300", "--json")
    assert code == 0, err
    assert len(json.loads(out)["outputs"]) == 300


def test_stream_and_json_together_are_refused(capsys):
    code, _, err = run(capsys, "--prompt", "x", "--stream", "--json")
    assert "--stream" in error_line(code, err) and "--json" in err


@pytest.mark.parametrize("wrote", [False, True])
def test_ctrl_c_is_one_line_and_ends_a_streamed_line(monkeypatch, capsys, wrote):
    """Interrupted while streaming: the text written so far keeps a line of its own (none when nothing came)."""
    class Interrupted:
        def __init__(self, *args, **kwargs):
            pass

        def stream(self, *args, **kwargs):
            if wrote:
                yield "half a sente"
            raise KeyboardInterrupt

    monkeypatch.setattr("leapgen.cli.load_llm", Interrupted)
    code = main(["generate", "--prompt", "x", "--stream"])
    out, err = capsys.readouterr()
    assert code == 130 and err == "leapgen: error: interrupted\n"
    assert out == ("half a sente\n" if wrote else "")


def test_a_warning_is_one_line_of_its_own(monkeypatch, capsys):
    """Python shows a warning with its file, line and source line (the loader's fallback notice printed
    `self.engine = LLMEngine(...)` under it); the command shows its text alone."""
    import warnings

    import leapgen.cli as cli

    def warns(args):
        warnings.warn("running it through the transformers fallback\n", UserWarning, stacklevel=2)
        return 0

    monkeypatch.setattr(cli, "_generate", warns)
    assert main(["generate", "--prompt", "x"]) == 0
    assert capsys.readouterr().err == "leapgen: warning: running it through the transformers fallback\n"
    assert warnings.showwarning is not cli._one_line_warning     # (the process's own way is back)


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(cli_model):
    """`leapgen generate ... | head -1`: the closed pipe was reported as bad input ("leapgen: error: [Errno 32]
    Broken pipe", status 2); it ends as a tool the pipe's signal ends does, saying nothing."""
    import subprocess

    process = subprocess.Popen([sys.executable, "-m", "leapgen.cli", "generate", "--model", cli_model, "--prompt",
                                "w3", "--max-tokens", "4", "--json", "--threads", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()          # before the command writes anything
    _, err = process.communicate(timeout=600)
    assert (process.returncode, err) == (141, b"")
