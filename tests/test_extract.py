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
from types import SimpleNamespace

import jsonschema
import pytest

import leapgen
from leapgen.cli import main
from leapgen.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from leapgen.extraction import (LimitError, check_limits, extract, extraction_prompt, output_line, prepare,
                                template_fields, write_lines)
from leapgen.extraction_io import InputError, OutputError, OutputWriter, read_records
from leapgen.grammars.json_validation import schema_validator
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


def result(record_id, status: str = "ok") -> dict:
    """An output line as extract writes it, with the keys a resumed run checks."""
    return {"id": record_id, "status": status, "data": {"name": "x", "age": 1} if status == "ok" else None,
            "error": None if status == "ok" else "failed"}


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
                         ("{a.b}", "plain name"), ('Like {"color": "red"}: {text}', r"\{\"color\"\.\.\.\} reads as a"),
                         ("Like {'a.b': 1}", r"write \{\{ and \}\} for the braces"),
                         ('{\n "a": 1}', r"\{\"a\"\.\.\.\}")):
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
    (tmp_path / "rows.csv").write_text('\ufeffkey,text\nk1,"two\nlines"\nk2,plain,,\n', encoding="utf-8")
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
    ("header.csv", "id,text\n\n", None, r"header.csv: no records; expected a row per record under the header"),
    ("empty.jsonl", "", None, r"empty.jsonl: no records; expected a JSON object per line"),
    ("blank.jsonl", "\n  \n", None, r"blank.jsonl: no records; expected a JSON object per line"),
    ("bad.jsonl", '{"id": 1}\n{"id": 2,\n', None, r"bad.jsonl:2: not valid JSON"),
    ("open.jsonl", '{"id": "a\n', None, r"open.jsonl:1: not valid JSON \(Unterminated string starting at column 8\)"),
    ("array.jsonl", "[1, 2]\n", None, r"array.jsonl:1: expected a JSON object, got an array"),
    ("some_ids.jsonl", '{"id": 1}\n{"text": "x"}\n', None, r"some_ids.jsonl:2: no 'id' field"),
    ("key.jsonl", '{"text": "x"}\n', "key", r"key.jsonl:1: no 'key' field"),
    ("float_id.jsonl", '{"id": 1.5}\n', None, r"float_id.jsonl:1: the id field 'id' must be"),
    ("notes.txt", "x", None, r"expected a .jsonl file, a .csv file or a folder"),
    ("latin1.jsonl", b'{"text": "x"}\n{"text": "caf\xe9"}\n', None, r"latin1.jsonl:2: not UTF-8"),
    ("twice.csv", "id,text,text\n1,a,b\n", None, r"twice.csv:1: the header names the column 'text' twice"),
    ("unnamed.csv", "id,text,,\n1,a,,\n2,b,c,d\n", None, r"unnamed.csv:3: cells under columns 3 and 4, which the header"),
    ("surrogate.jsonl", '{"id": "a\\udc80b", "text": "x"}\n', None,
     r"surrogate.jsonl:1: the id 'a\\udc80b' holds a lone surrogate"),
])
def test_bad_input_names_file_and_line(tmp_path, name, content, id_field, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(InputError, match=message):
        read_records(path, id_field)


def test_folder_input_errors(tmp_path):
    with pytest.raises(InputError, match="no .txt files"):
        read_records(tmp_path)
    latin1 = tmp_path / "latin1"
    latin1.mkdir()
    (latin1 / os.fsdecode(b"caf\xe9.txt")).write_text("x")     # (its id could not be written to the output)
    with pytest.raises(InputError, match=r"caf\\xe9.txt: the file name, its record's id, is not UTF-8"):
        read_records(latin1)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(InputError, match="ids are the file names|does not apply"):
        read_records(tmp_path, id_field="id")
    with pytest.raises(InputError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")


def test_a_missing_template_field_fails_before_any_work(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "x"}, {"id": 2, "body": "y"}])
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=r"in.jsonl:2: no value for 'text' \(the template uses it\)"):
        prepare(data, SCHEMA, out)
    with pytest.raises(ValueError, match=r"in.jsonl:1: no value for 'body'"):
        prepare(data, SCHEMA, out, template="Read {body}")
    nulls = write_jsonl(tmp_path / "nulls.jsonl", [{"id": 1, "text": None}])
    with pytest.raises(ValueError, match=r"nulls.jsonl:1: no value for 'text'"):
        prepare(nulls, SCHEMA, out)
    (tmp_path / "cells.csv").write_text("id,text\n1,x\n2,\n")       # an empty cell
    with pytest.raises(ValueError, match=r"cells.csv:3: no value for 'text'"):
        prepare(tmp_path / "cells.csv", SCHEMA, out)
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"id": 1, "text": "x"}, {"id": 2, "text": " \n"}])
    with pytest.raises(ValueError, match=r"blank.jsonl:2: the 'text' field is empty: nothing to extract from"):
        prepare(blank, SCHEMA, out)
    prepare(blank, SCHEMA, out, template="Record {id}: {text}")      # a field that is not blank is enough
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


def test_a_template_that_names_no_field_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=r"^template: names no field of the records"):
        prepare(data, SCHEMA, out, template="./prompts/extract.txt")        # a missing file's name, as text
    (tmp_path / "fixed.txt").write_text("Extract the contact as JSON: {schema}")
    with pytest.raises(ValueError, match=r"^template .*fixed.txt: names no field of the records"):
        prepare(data, SCHEMA, out, template=tmp_path / "fixed.txt")
    assert prepare(data, SCHEMA, out, template="{schema} {text}").job.template == "{schema} {text}"


def test_options_extract_cannot_use_are_value_errors(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    for options, message in (({"foo": 1}, r"^foo: not an option of extract"),
                             ({"n": 2}, r"^n=2: not for extraction"),
                             ({"constraint": leapgen.Regex("a")}, r"^constraint=.*: not for extraction"),
                             ({"ignore_eos": True}, r"^ignore_eos=True: not for extraction"),
                             ({"stop": ["}"]}, r"^stop=\['}'\]: not for extraction"),
                             ({"min_tokens": 3}, r"^min_tokens=3: not for extraction")):
        with pytest.raises(ValueError, match=message):
            extract(data, SCHEMA, out, progress=False, **options)             # before any model loads
    assert prepare(data, SCHEMA, out, n=1, ignore_eos=False, temperature=0.5).job.params().n == 1
    assert prepare(data, SCHEMA, out, stop=[], stop_token_ids=[]).job.params().stop == []     # none: fine
    assert not out.exists()


def test_a_schema_module_that_fails_or_has_no_json_schema_is_one_error(tmp_path, capsys):
    pytest.importorskip("pydantic")
    (tmp_path / "syntax.py").write_text("def f(:\n")
    (tmp_path / "raises.py").write_text("import pydantic\nclass P(pydantic.BaseModel):\n    name: str\n"
                                        "raise RuntimeError('boom')\n")
    (tmp_path / "arbitrary.py").write_text(textwrap.dedent("""
        import pydantic
        class Foo: pass
        class P(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
            x: Foo
    """))
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    out = tmp_path / "out.jsonl"
    cases = (("syntax.py", r"syntax.py:P: importing it failed: SyntaxError"),
             ("raises.py", r"raises.py:P: importing it failed: RuntimeError: boom"),
             ("arbitrary.py", r"arbitrary.py:P: pydantic model P has no JSON Schema: Cannot generate a JsonSchema"))
    for name, message in cases:
        with pytest.raises(ValueError, match=message):
            prepare(data, f"{tmp_path / name}:P", out)
        line = error_line(*run_cli(capsys, data, "--schema", f"{tmp_path / name}:P", "-o", out))
        assert re.search(message, line), line
    sys.path.insert(0, str(tmp_path))                   # the model class itself, as the API takes it
    try:
        from arbitrary import P
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(ValueError, match=r"^schema: pydantic model P has no JSON Schema"):
        prepare(data, P, out)
    with pytest.raises(ValueError, match=r"^pydantic model P has no JSON Schema"):
        leapgen.JsonSchema(P).as_dict()                 # what `leapgen generate --schema` compiles
    assert not out.exists()


# --- output lines --------------------------------------------------------------------------------------------

def fake_output(text: str, finish_reason: str = "stop", error: str | None = None) -> RequestOutput:
    metrics = RequestMetrics(forward_passes=4, forced_tokens=2, time_to_first_token=0.01, total_time=0.05)
    return RequestOutput(0, "p", [1, 2, 3], [CompletionOutput(0, text, [5] * len(text), finish_reason)],
                         finished=True, error=error, metrics=metrics)


def test_output_line_status_and_reasons():
    validator = schema_validator(SCHEMA)
    ok = output_line("a", fake_output('{"name":"Al","age":3}'), validator, speculating=False)
    assert set(ok) == LINE_KEYS and ok["status"] == "ok" and ok["data"] == {"name": "Al", "age": 3}
    assert ok["usage"] == {"prompt_tokens": 3, "completion_tokens": 21, "forced_tokens": 2, "forward_passes": 4}
    assert ok["latency_s"] == 0.05 and ok["time_to_first_token_s"] == 0.01 and ok["error"] is None
    closed = output_line("a", fake_output('{"name":"Al","age":3}', "length"), validator, speculating=False)
    # closed in time by the budget, but its values may be the shortest that close it: not ok, kept to look at
    assert closed["status"] == "error" and closed["finish_reason"] == "length"
    assert "cut at max_tokens" in closed["error"]
    assert closed["data"] == {"name": "Al", "age": 3}
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
    assert lines["long"]["usage"]["prompt_tokens"] > 2048                # counted, though it never ran
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
                                         r"extracted into the properties it declares\), got bool"):
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

def test_an_output_resumes_only_with_the_input_and_schema_that_wrote_it(tmp_path):
    """A second input's records under the same ids would be skipped, and lines of another schema kept: the input
    and schema are kept beside the output (OUTPUT.run.json), and another one is refused before any work."""
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    other_input = write_jsonl(tmp_path / "more.jsonl", PEOPLE)
    other_schema = {**SCHEMA, "required": ["name"]}
    out = tmp_path / "out.jsonl"
    plan = prepare(data, SCHEMA, out)
    validator = schema_validator(SCHEMA)
    write_lines([output_line("a", fake_output('{"name":"Al","age":3}'), validator, speculating=False)], plan)
    assert json.loads((tmp_path / "out.jsonl.run.json").read_text())["schema"] == SCHEMA
    assert [r.id for r in prepare(data, SCHEMA, out, max_tokens=64, retry_errors=True).pending] == ["b", "c"]
    with pytest.raises(OutputError, match=r"out.jsonl: its lines came from another schema \(.*out.jsonl.run.json"):
        prepare(data, other_schema, out)
    with pytest.raises(OutputError, match=r"out.jsonl: its lines came from another input"):
        prepare(other_input, SCHEMA, out)
    (tmp_path / "out.jsonl.run.json").unlink()         # an output written before runs were recorded
    older = prepare(other_input, other_schema, out)
    assert len(older.pending) == 2
    write_lines([], older)                             # vouches for no input: nothing recorded
    assert not (tmp_path / "out.jsonl.run.json").exists()
    out.unlink()                                       # no lines: any run may start it again
    assert len(prepare(other_input, other_schema, out).pending) == 3
    # the schema as JSON has it (a tuple is a list there), and an input path JSON cannot spell in UTF-8
    odd = write_jsonl(tmp_path / "caf\udce9.jsonl", PEOPLE)
    listed = {**SCHEMA, "examples": ({"name": "Al", "age": 3},)}
    plan = prepare(odd, listed, tmp_path / "odd.jsonl")
    write_lines([output_line("a", fake_output('{"name":"Al","age":3}'), validator, speculating=False)], plan)
    assert [r.id for r in prepare(odd, listed, tmp_path / "odd.jsonl").pending] == ["b", "c"]


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
    for lines, number in (([json.dumps(result("a")), "some notes"], 2),
                          ([json.dumps(result("a")), '{"id": "b"}'], 2),                # an input record
                          (['{"id": "a", "status": "done", "data": null, "error": null}'], 1)):
        out.write_text("\n".join(lines) + "\n")
        with pytest.raises(OutputError, match=rf"out.jsonl:{number}: not a line of leapgen extract's output"):
            prepare(data, SCHEMA, out)
    out.write_text(json.dumps(result("a")) + "\n" + json.dumps(result("b", "error")) + "\n")
    assert prepare(data, SCHEMA, out).skipped == 2 and prepare(data, SCHEMA, out, retry_errors=True).skipped == 1


def test_a_bad_schema_is_refused_by_prepare_with_no_model(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    with pytest.raises(ValueError, match=r"schema: unknown type 'strin' \(at /properties/a/type\)"):
        prepare(data, {"type": "object", "properties": {"a": {"type": "strin"}}}, tmp_path / "out.jsonl")
    with pytest.raises(ValueError, match=r"unsatisfiable.*\(extract generates only the properties the schema"):
        prepare(data, {"type": "object", "properties": {"a": {}}, "minProperties": 2}, tmp_path / "out.jsonl")


def test_an_output_that_is_no_regular_file_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)                  # (reading it back to resume would wait for a writer forever)
    for output, message in ((fifo, "pipe: not a regular file"), (Path("/dev/null"), "/dev/null: not a regular file"),
                            (Path("-"), "-: the output is appended to and read back")):
        with pytest.raises(OutputError, match=message):
            prepare(data, SCHEMA, output)


def test_the_input_as_the_output_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(data)
    for output in (data, tmp_path / "sub" / ".." / "in.jsonl", tmp_path / "link.jsonl"):
        with pytest.raises(OutputError, match=r"this is the input file .*in.jsonl; choose another output file"):
            prepare(data, SCHEMA, output)
    assert read_lines(data) == PEOPLE


def test_writer_writes_an_id_once_and_locks_the_file(tmp_path):
    out = tmp_path / "out.jsonl"
    with OutputWriter(out) as writer:
        assert writer.write(result(1))
        assert not writer.write(result(1, "error"))
        with pytest.raises(OutputError, match="another run is writing"):
            OutputWriter(out).__enter__()
        with pytest.raises(OutputError, match="another run is writing"):     # (before any model loads)
            prepare(write_jsonl(tmp_path / "in.jsonl", PEOPLE), SCHEMA, out)
    with OutputWriter(out) as writer:
        assert writer.finished == {1} and not writer.write(result(1))
    assert read_lines(out) == [result(1)]


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


def write_schema(folder: Path) -> Path:
    path = folder / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    return path


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
    # (a budget every output closes within: one cut at max_tokens would be an error, and exit status 1)
    flags = ["--model", byte_level_model_dir, "--threads", "1", "--dtype", "float32", "--kv-cache-memory", "8MiB",
             "--max-tokens", "200", "--batch-size", "2", "--template", template]
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
        ((good, "--schema", tmp_path / "nomod.py:Contact", "-o", out),
         f"--schema {tmp_path / 'nomod.py'}: no such file"),
        ((good, "--schema", schema, "-o", out, "--template", "{oops"), "template:"),
        ((good, "--schema", schema, "-o", out, "--template", "./prompts/extract.txt"),
         "--template ./prompts/extract.txt: no such file, and as the prompt's text it names no record field"),
        ((good, "--schema", schema, "-o", good), "good.jsonl: this is the input file"),
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


class CharTokenizer:
    """A token a character: prompt lengths a test can count."""

    def encode(self, text):
        return [0] * len(text)


def fake_llm(context: int, kv_tokens: int):
    limits = SimpleNamespace(max_model_len=context, kv_capacity_tokens=kv_tokens)
    return SimpleNamespace(engine=SimpleNamespace(limits=limits), tokenizer=CharTokenizer())


def test_limits_no_record_can_run_with_are_refused_up_front(tmp_path):
    data = write_jsonl(tmp_path / "in.jsonl", [{"id": "short", "text": "x" * 10}, {"id": "long", "text": "y" * 500}])
    plan = prepare(data, SCHEMA, tmp_path / "out.jsonl", template="{text}", max_tokens=100)   # prompts: 10, 500
    with pytest.raises(LimitError, match=r"max_tokens=2000 leaves no room .* context of 2000 tokens") as info:
        check_limits(fake_llm(2000, 10**6), prepare(data, SCHEMA, tmp_path / "out.jsonl", template="{text}",
                                                    max_tokens=2000))
    assert info.value.option == "max_tokens"
    with pytest.raises(LimitError, match=r"holds 100 tokens, too few for any record: the shortest prompt \(10 "
                                         r"tokens\) \+ max_tokens \(100\) needs 110") as info:
        check_limits(fake_llm(2000, 100), plan)
    assert info.value.option == "kv_cache_memory"
    check_limits(fake_llm(2000, 110), plan)             # the short record fits: the long one's line says why
    check_limits(fake_llm(105, 10), plan)               # none fits the context: each record's own error line


def test_cli_refuses_job_wide_limits_and_exits_1_when_a_record_fails(byte_level_model_dir, tmp_path, capsys):
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE[:1] + [{"id": "long", "text": "w " * 3000}])
    out = tmp_path / "out.jsonl"
    flags = ["--schema", write_schema(tmp_path), "-o", out, "--model", byte_level_model_dir, "--threads", "1",
             "--dtype", "float32", "--max-tokens", "32"]
    line = error_line(*run_cli(capsys, data, *flags, "--max-tokens", "100000"))
    assert line.endswith("--max-tokens: max_tokens=100000 leaves no room for a prompt in the model's context of "
                         "2048 tokens; at most 2047"), line
    line = error_line(*run_cli(capsys, data, *flags, "--kv-cache-memory", "16KiB"))
    assert "--kv-cache-memory: the KV cache holds 32 tokens, too few for any record" in line, line
    assert not out.exists()
    code, err = run_cli(capsys, data, *flags, "--kv-cache-memory", "8MiB")
    lines = {line["id"]: line for line in read_lines(out)}
    assert lines["long"]["status"] == "error" and lines["long"]["usage"]["prompt_tokens"] > 2048
    assert code == 1 and "exit status 1: records ended in error" in err, err
    code, err = run_cli(capsys, data, *flags, "--quiet")               # nothing left to run, nothing failed now
    assert code == 0 and err == ""


def test_a_batch_past_the_engine_step_budget_runs(byte_level_model_dir, tmp_path, capsys):
    """More records in flight than the engine's default 2048 tokens a step (it failed to load the model)."""
    data = write_jsonl(tmp_path / "in.jsonl", PEOPLE[:1])
    out = tmp_path / "out.jsonl"
    code, err = run_cli(capsys, data, "--schema", write_schema(tmp_path), "-o", out, "--model", byte_level_model_dir,
                        "--threads", "1", "--dtype", "float32", "--kv-cache-memory", "8MiB", "--max-tokens", "32",
                        "--batch-size", "3000", "--quiet")
    assert code in (0, 1) and [line["id"] for line in read_lines(out)] == ["a"], err


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


def test_a_long_inline_template_is_text_not_a_file_name():
    """Longer than a file name may be (ENAMETOOLONG from the file check): taken as the text."""
    from leapgen.cli_extract import _template

    text = "Read the record below with care. " * 10 + "Text: {text}"
    assert _template(text) == text
