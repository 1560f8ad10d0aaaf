"""The extraction pipeline (`leapgen extract`, `leapgen.extract`): inputs, prompts, output lines, resume.

Outputs come from a tiny random-weight model, so these tests check what the pipeline does with them
(shape, status, resume), not how good they are.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

import leapgen
from leapgen.cli import main
from leapgen.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from leapgen.extraction import extract, extraction_prompt, output_line, prepare, template_fields
from leapgen.extraction_io import InputError, OutputError, OutputWriter, read_records
from tokenizers_util import byte_level_bpe

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}
LINE_KEYS = {"id", "status", "data", "error", "finish_reason", "usage", "latency_s", "time_to_first_token_s"}


@pytest.fixture(scope="module")
def llm(byte_level_model_dir):
    return leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="8MiB", block_size=8, threads=1, max_num_seqs=4)


@pytest.fixture(scope="module")
def eos_bias():
    """A random model rarely ends a string or number on its own; a bias on eos (allowed only where the JSON
    is complete) lets outputs end within max_tokens."""
    return {byte_level_bpe().eos_token_id: 3.0}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


PEOPLE = [{"id": "a", "text": "Alice is 31."}, {"id": "b", "text": "Bob, 45, Berlin."},
          {"id": "c", "text": "Carol, 22."}]


# --- prompts -------------------------------------------------------------------------------------------------

class ChatTokenizer:
    chat_template = "<a template>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return f"<user>{messages[0]['content']}<assistant>"


def test_extraction_prompt_holds_the_schema_and_the_text():
    plain = extraction_prompt(object(), {"text": "Bob is 3"}, {"type": "object"})
    assert '{"type":"object"}' in plain and plain.endswith("Text:\nBob is 3")
    chat = extraction_prompt(ChatTokenizer(), {"text": "Bob is 3"}, {"type": "object"})
    assert chat == f"<user>{plain}<assistant>"
    assert extraction_prompt(object(), {"body": "hi"}, {}, text_field="body").endswith("Text:\nhi")


def test_template_placeholders_are_record_fields():
    record = {"title": "T", "tags": ["x", 1], "text": "body"}
    prompt = extraction_prompt(object(), record, {"type": "object"}, "{title} {tags} {{literal}} {schema}")
    assert prompt == 'T ["x", 1] {literal} {"type":"object"}'
    assert template_fields("{title}: {text} as {schema}") == {"title", "text"}
    for bad, message in (("{", "literal braces"), ("{}", "plain name"), ("{0}", "plain name"),
                         ("{a.b}", "plain name")):
        with pytest.raises(ValueError, match=message):
            template_fields(bad)


# --- inputs --------------------------------------------------------------------------------------------------

def test_jsonl_csv_and_folder_inputs(tmp_path):
    (tmp_path / "with_ids.jsonl").write_text('{"id": "x", "text": "1"}\n\n{"id": 7, "text": "2"}\n')
    assert [(r.id, r.where) for r in read_records(tmp_path / "with_ids.jsonl")] == [
        ("x", f"{tmp_path / 'with_ids.jsonl'}:1"), (7, f"{tmp_path / 'with_ids.jsonl'}:3")]
    (tmp_path / "no_ids.jsonl").write_text('{"text": "1\u2028"}\n\n{"text": "2"}\r\n', encoding="utf-8")
    records = read_records(tmp_path / "no_ids.jsonl")                          # U+2028 ends no JSON line
    assert [(r.id, r.fields["text"]) for r in records] == [(1, "1\u2028"), (3, "2")]     # ids: line numbers
    (tmp_path / "rows.csv").write_text('\ufeffkey,text\nk1,"two\nlines"\nk2,plain\n', encoding="utf-8")
    rows = read_records(tmp_path / "rows.csv", id_field="key")
    assert [(r.id, r.fields["text"]) for r in rows] == [("k1", "two\nlines"), ("k2", "plain")]
    assert [r.id for r in read_records(tmp_path / "rows.csv")] == [2, 4]          # the line a row starts on
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("bee")
    (folder / "a.txt").write_text("ay")
    (folder / "skip.md").write_text("not a record")
    assert [(r.id, r.fields) for r in read_records(folder, text_field="body")] == [("a.txt", {"body": "ay"}),
                                                                                   ("b.txt", {"body": "bee"})]


@pytest.mark.parametrize("name,content,id_field,message", [
    ("dup.jsonl", '{"id": "a"}\n{"id": "b"}\n{"id": "a"}\n', None, r"dup.jsonl:3: duplicate id 'a' \(first at .*:1\)"),
    ("dup.csv", "id,text\n1,x\n1,y\n", None, r"dup.csv:3: duplicate id '1'"),
    ("open_quote.csv", 'id,text\n1,"never closed\n2,x\n3,y\n', None, r"open_quote.csv:4: .* \(in the row from line 2\)"),
    ("after_quote.csv", 'id,text\n1,"quoted"tail\n', None, r"after_quote.csv:2: .*expected after"),
    ("ragged.csv", "id,text\n1,one, two\n", None, r"ragged.csv:2: 3 cells in a row under a header of 2 columns"),
    ("empty.csv", "", None, r"empty.csv: empty; expected a header row"),
    ("bad.jsonl", '{"id": 1}\n{"id": 2,\n', None, r"bad.jsonl:2: not valid JSON"),
    ("array.jsonl", "[1, 2]\n", None, r"array.jsonl:1: expected a JSON object, got an array"),
    ("some_ids.jsonl", '{"id": 1}\n{"text": "x"}\n', None, r"some_ids.jsonl:2: no 'id' field"),
    ("key.jsonl", '{"text": "x"}\n', "key", r"key.jsonl:1: no 'key' field"),
    ("float_id.jsonl", '{"id": 1.5}\n', None, r"float_id.jsonl:1: the id field 'id' must be"),
    ("notes.txt", "x", None, r"expected a .jsonl file, a .csv file or a folder"),
    ("latin1.jsonl", b'{"text": "caf\xe9"}\n', None, r"not UTF-8"),
])
def test_bad_input_names_file_and_line(tmp_path, name, content, id_field, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=message):
        read_records(path, id_field)


def test_folder_input_errors(tmp_path):
    with pytest.raises(InputError, match="no .txt files"):
        read_records(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(InputError, match="ids are the file names|does not apply"):
        read_records(tmp_path, id_field="id")
    with pytest.raises(InputError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")


def test_a_missing_template_field_fails_before_any_work(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "x"}, {"id": 2, "body": "y"}])
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=r"in.jsonl:2: no 'text' field"):
        prepare(data, SCHEMA, out)
    with pytest.raises(ValueError, match=r"in.jsonl:1: no 'body' field"):
        prepare(data, SCHEMA, out, template="Read {body}")
    with pytest.raises(ValueError, match="whitespace"):
        prepare(data, SCHEMA, out, whitespace="pretty")
    with pytest.raises(ValueError, match="max_tokens"):
        prepare(data, SCHEMA, out, max_tokens=0)
    with pytest.raises(ValueError, match="max_string_length"):
        prepare(data, SCHEMA, out, template="Read {id}", max_string_length=0)
    assert not out.exists()


def test_value_caps_reach_the_compiler(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "x"}])
    job = prepare(data, SCHEMA, tmp_path / "out.jsonl", max_string_length=5, max_items=2).job
    options = job.constraint().options
    assert options["max_string_length"] == 5 and options["max_items"] == 2
    assert options["additional_properties"] is False


# --- output lines --------------------------------------------------------------------------------------------

def fake_output(text: str, finish_reason: str = "stop", error: str | None = None) -> RequestOutput:
    metrics = RequestMetrics(forward_passes=4, forced_tokens=2, time_to_first_token=0.01, total_time=0.05)
    return RequestOutput(0, "p", [1, 2, 3], [CompletionOutput(0, text, [5] * len(text), finish_reason)],
                         finished=True, error=error, metrics=metrics)


def test_output_line_status_and_reasons():
    validator = jsonschema.Draft202012Validator(SCHEMA)
    ok = output_line("a", fake_output('{"name":"Al","age":3}'), validator, speculating=False)
    assert set(ok) == LINE_KEYS and ok["status"] == "ok" and ok["data"] == {"name": "Al", "age": 3}
    assert ok["usage"] == {"prompt_tokens": 3, "completion_tokens": 21, "forced_tokens": 2, "forward_passes": 4}
    assert ok["latency_s"] == 0.05 and ok["time_to_first_token_s"] == 0.01 and ok["error"] is None
    closed = output_line("a", fake_output('{"name":"Al","age":3}', "length"), validator, speculating=False)
    assert closed["status"] == "ok" and closed["finish_reason"] == "length"     # closed in time by the budget
    cases = [(fake_output('{"name":"Al"'), "not valid JSON"),
             (fake_output('{"name":"Al","age":300}'), "does not match the schema at /age"),
             (fake_output('{"name":"Al","ag', "length"), "not valid JSON"),
             (fake_output("", "error", "prompts[3]: the prompt has 9000 tokens"), "^the prompt has 9000 tokens$")]
    for output, reason in cases:
        line = output_line("a", output, validator, speculating=True)
        assert line["status"] == "error" and line["data"] is None
        assert set(line["usage"]) >= {"drafted_tokens", "accepted_tokens"}
        assert re.search(reason, line["error"]), line["error"]


def test_extract_writes_one_line_per_record(llm, eos_bias, tmp_path):
    long_text = " ".join(f"word{i}" for i in range(3000))          # past the 2048-token context
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE + [{"id": "long", "text": long_text}])
    out = tmp_path / "out.jsonl"
    summary = extract(data, SCHEMA, out, model=llm, max_tokens=48, progress=False, logit_bias=eos_bias)
    lines = {line["id"]: line for line in read_lines(out)}
    assert set(lines) == {"a", "b", "c", "long"} and summary.ok + summary.error == 4
    assert lines["long"]["status"] == "error" and "context" in lines["long"]["error"]
    for record_id in "abc":
        line = lines[record_id]
        assert set(line) == LINE_KEYS and line["usage"]["prompt_tokens"] > 0
        assert line["usage"]["completion_tokens"] > 0 and line["usage"]["forward_passes"] > 0
        if line["status"] == "ok":
            jsonschema.validate(line["data"], SCHEMA)
            assert set(line["data"]) <= {"name", "age"}               # no invented keys
    assert summary.completion_tokens == sum(line["usage"]["completion_tokens"] for line in lines.values())
    assert summary.error == 1 and "1 error" in str(summary)


def test_speculative_ngram_reports_drafts(byte_level_model_dir, eos_bias, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE[:2])
    out = tmp_path / "out.jsonl"
    extract(data, SCHEMA, out, model=byte_level_model_dir, speculative={"method": "ngram", "num_speculative_tokens": 4},
            llm_options={"threads": 1, "dtype": "float32", "kv_cache_memory": "8MiB"}, max_tokens=48,
            progress=False, logit_bias=eos_bias)
    assert all({"drafted_tokens", "accepted_tokens"} <= set(line["usage"]) for line in read_lines(out))


def test_a_bad_schema_fails_before_any_work(llm, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    unsupported = {"type": "object", "properties": {"tags": {"type": "object", "unevaluatedProperties": False}}}
    with pytest.raises(ValueError, match=r"schema: .*'unevaluatedProperties'.*/properties/tags/unevaluatedProperties"):
        extract(data, unsupported, out, model=llm, progress=False)
    with pytest.raises(ValueError, match=r"schema .*missing.json: cannot read it"):
        extract(data, str(tmp_path / "missing.json"), out, model=llm, progress=False)
    (tmp_path / "true.json").write_text("true", encoding="utf-8")
    with pytest.raises(ValueError, match=r"schema .*true.json: expected a JSON Schema object \(each record is "
                                         r"extracted into an object\), got bool"):
        extract(data, str(tmp_path / "true.json"), out, model=llm, progress=False)
    assert not out.exists()


def test_a_pydantic_model_is_a_schema(llm, eos_bias, tmp_path):
    pytest.importorskip("pydantic")
    (tmp_path / "person_model.py").write_text(textwrap.dedent("""
        from pydantic import BaseModel, Field
        class Person(BaseModel):
            name: str = Field(max_length=10)
            age: int = Field(ge=0, le=120)
    """))
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE[:1])
    out = tmp_path / "out.jsonl"
    extract(data, f"{tmp_path / 'person_model.py'}:Person", out, model=llm, max_tokens=48, progress=False,
            logit_bias=eos_bias)
    (line,) = read_lines(out)
    assert line["id"] == "a" and line["finish_reason"] in ("stop", "length")


# --- resume ---------------------------------------------------------------------------------------------------

def test_rerun_skips_finished_ids_and_repairs_a_torn_line(llm, eos_bias, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    run = dict(model=llm, max_tokens=48, progress=False, logit_bias=eos_bias)
    extract(data, SCHEMA, out, **run)
    first = out.read_bytes()
    whole = first.rstrip(b"\n").rsplit(b"\n", 1)[0] + b"\n"          # all lines but the last
    out.write_bytes(whole + first[len(whole):len(whole) + 25])        # ... and half of the last: a torn write
    again = extract(data, SCHEMA, out, **run)
    assert again.skipped == 2 and again.ok + again.error == 1 and again.repaired_bytes == 25
    assert "torn" in str(again)
    ids = [line["id"] for line in read_lines(out)]
    assert sorted(ids) == ["a", "b", "c"]
    done = extract(data, SCHEMA, out, model=None, progress=False)      # nothing left: no model is loaded
    assert done.skipped == 3 and done.ok + done.error == 0


def test_an_output_that_is_not_ours_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "status": "ok"}\nsome notes\n{"id": "b"}\n')
    with pytest.raises(OutputError, match=r"out.jsonl:2: not a line of leapgen extract's output"):
        prepare(data, SCHEMA, out)


def test_writer_writes_an_id_once_and_locks_the_file(tmp_path):
    out = tmp_path / "out.jsonl"
    with OutputWriter(out) as writer:
        assert writer.write({"id": 1, "status": "ok"})
        assert not writer.write({"id": 1, "status": "error"})
        with pytest.raises(OutputError, match="another run is writing"):
            OutputWriter(out).__enter__()
    with OutputWriter(out) as writer:
        assert writer.finished == {1} and not writer.write({"id": 1})
    assert read_lines(out) == [{"id": 1, "status": "ok"}]


def test_kill_9_then_rerun_loses_nothing_and_writes_no_id_twice(byte_level_model_dir, eos_bias, tmp_path):
    count = 40
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "text": f"Person {i} is {i} years old."}
                                               for i in range(count)])
    out = tmp_path / "out.jsonl"
    script = textwrap.dedent(f"""
        import leapgen
        leapgen.extract({str(data)!r}, {SCHEMA!r}, {str(out)!r}, model={str(byte_level_model_dir)!r}, batch_size=1,
                        llm_options={{"threads": 1, "dtype": "float32", "kv_cache_memory": "8MiB"}},
                        max_tokens=48, progress=False, logit_bias={eos_bias!r})
    """)
    # outside the checkout, whose folders would shadow the installed package mapping
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no output lines within 120 s"
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    written = read_lines(out)
    assert 3 <= len(written) < count, "the run finished before it could be killed"
    summary = extract(data, SCHEMA, out, model=byte_level_model_dir, llm_options={"threads": 1, "dtype": "float32",
                      "kv_cache_memory": "8MiB"}, max_tokens=48, progress=False, logit_bias=eos_bias)
    ids = [line["id"] for line in read_lines(out)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(count)) and len(set(ids)) == count
    assert summary.skipped == len(written)


# --- the command line ------------------------------------------------------------------------------------------

def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main(["extract", *map(str, argv)])
    return code, capsys.readouterr().err


def error_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("leapgen: error: "), err
    return err.strip()


def test_cli_runs_and_resumes(byte_level_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    template = tmp_path / "prompt.txt"
    template.write_text("Fill {schema} from: {text}")
    flags = ["--model", byte_level_model_dir, "--threads", "1", "--dtype", "float32", "--kv-cache-memory", "8MiB",
             "--max-tokens", "32", "--batch-size", "2", "--template", template]
    code, err = run_cli(capsys, data, "--schema", schema, "--output", out, *flags)
    assert code == 0, err
    assert "[leapgen] extract: " in err and "0 skipped" in err
    assert sorted(line["id"] for line in read_lines(out)) == ["a", "b", "c"]
    assert all("drafted_tokens" in line["usage"] for line in read_lines(out))      # prompt lookup by default
    code, err = run_cli(capsys, data, "--schema", schema, "-o", out, *flags, "--quiet")
    assert code == 0 and err == ""
    assert len(read_lines(out)) == 3


def test_cli_without_speculation_gives_the_same_lines(byte_level_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    flags = ["--schema", schema, "--model", byte_level_model_dir, "--threads", "1", "--max-tokens", "32", "--quiet"]
    runs = {}
    for name, extra in (("default", []), ("plain", ["--no-speculative"])):
        out = tmp_path / f"{name}.jsonl"
        assert run_cli(capsys, data, "-o", out, *flags, *extra)[0] == 0
        runs[name] = {line["id"]: line for line in read_lines(out)}
    assert all("drafted_tokens" not in line["usage"] for line in runs["plain"].values())
    for record_id, line in runs["plain"].items():
        assert runs["default"][record_id]["data"] == line["data"]
        assert runs["default"][record_id]["usage"]["completion_tokens"] == line["usage"]["completion_tokens"]
    line = error_line(*run_cli(capsys, data, "-o", tmp_path / "x.jsonl", *flags, "--no-speculative",
                               "--speculative", "ngram"))
    assert "--speculative" in line and "not allowed with" in line


def test_cli_errors_are_one_line(byte_level_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE + [PEOPLE[0]])
    good = write_jsonl(tmp_path / "good.jsonl", PEOPLE)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    unsupported = tmp_path / "unsupported.json"
    unsupported.write_text('{"type": "object", "unevaluatedProperties": false}')
    out = tmp_path / "out.jsonl"
    model = ["--model", byte_level_model_dir, "--threads", "1"]
    cases = [
        ((data, "--schema", schema, "-o", out), "in.jsonl:4: duplicate id 'a'"),
        ((good, "--schema", unsupported, "-o", out, *model), "--schema"),
        ((good, "--schema", tmp_path / "nope.json", "-o", out), "nope.json: cannot read it"),
        ((good, "--schema", "no_such_module_xyz:Model", "-o", out), "no_such_module_xyz"),
        ((good, "--schema", schema, "-o", out, "--template", "{oops"), "template:"),
        ((good, "--schema", schema, "-o", out, "--workers", "2"), "--workers needs --ray"),
        ((good, "--schema", schema, "-o", out, "--batch-size", "0"), "--batch-size"),
        ((good, "--schema", schema, "-o", out, "--whitespace", "pretty"), "--whitespace"),
        ((good, "--schema", schema), "--output"),
        ((good, "--schema", schema, "-o", out, "--model", tmp_path / "missing"), "cannot load model"),
        ((good, "--schema", schema, "-o", out, "--max-tokens", "3", *model),
         "--max-tokens: max_tokens=3 is too small for the schema: its shortest instance takes"),
    ]
    for argv, message in cases:
        line = error_line(*run_cli(capsys, *argv))
        assert message in line, line
    line = error_line(*run_cli(capsys, good, "--schema", unsupported, "-o", out, *model))
    assert "'unevaluatedProperties'" in line and "(at /unevaluatedProperties)" in line
    assert not out.exists()


def test_leapgen_extract_is_the_pipeline_and_importing_it_is_light(tmp_path):
    script = ("import sys, leapgen\n"
              "from leapgen.extraction import extract\n"
              "assert leapgen.extract is extract\n"
              "assert 'torch' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)


def test_a_max_tokens_no_instance_fits_fails_before_any_record(llm, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match="max_tokens=2 is too small for the schema"):
        extract(data, SCHEMA, out, model=llm, max_tokens=2, progress=False)
    assert not out.exists() or not out.read_text()


def test_retry_errors_runs_the_failed_records_again_and_replaces_their_lines(llm, eos_bias, tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    kept = {"id": "a", "status": "ok", "data": {"name": "kept"}, "error": None}
    failed = {"id": "b", "status": "error", "data": None, "error": "something went wrong"}
    out.write_text(json.dumps(kept) + "\n" + json.dumps(failed) + "\n")
    extract(data, SCHEMA, out, model=llm, max_tokens=48, progress=False, logit_bias=eos_bias)
    assert [line["id"] for line in read_lines(out)] == ["a", "b", "c"]
    assert read_lines(out)[1] == failed                                          # without the flag: kept as is
    out.write_text(json.dumps(kept) + "\n" + json.dumps(failed) + "\n")
    summary = extract(data, SCHEMA, out, model=llm, max_tokens=48, progress=False, logit_bias=eos_bias,
                      retry_errors=True)
    lines = read_lines(out)
    assert sorted(line["id"] for line in lines) == ["a", "b", "c"] and lines[0] == kept
    assert next(line for line in lines if line["id"] == "b")["error"] != "something went wrong"
    assert summary.skipped == 1 and not (tmp_path / "out.jsonl.retry").exists()
