"""OpenAI-style `response_format` and pydantic models wherever a constraint is accepted (issue 12, item 2):
parsing, what strict means for the generated output, `parsed` model instances, `LLM.chat`, and the CLI."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

import leapgen
from leapgen import JsonSchema, Regex, SamplingParams, from_response_format
from leapgen.cli import main
from leapgen.constraints import as_constraint
from test_cli import error_line
from test_llm_api import CHAT_TEMPLATE

pydantic = pytest.importorskip("pydantic")

# Bounded (strings and numbers have a maximum size), so a random model's output ends within max_tokens.
PERSON = {"type": "object", "required": ["name"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99},
                         "city": {"type": "string", "maxLength": 6}}}
CLOSED_PERSON = {**PERSON, "additionalProperties": False}


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=99)


CLOSED_PERSON_MODEL = {**Person.model_json_schema(), "additionalProperties": False}


class OpenPerson(Person):
    model_config = pydantic.ConfigDict(extra="allow")


class Picky(Person):
    @pydantic.field_validator("name")
    @classmethod
    def never(cls, value: str) -> str:       # a rule no JSON Schema can state: the text cannot validate
        raise ValueError("no name is good enough")


def json_schema_format(schema: dict, **fields) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, **fields}}


@pytest.fixture(scope="module")
def llm(byte_level_model_dir):
    llm = leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="8MiB", block_size=8)
    llm.tokenizer.chat_template = CHAT_TEMPLATE
    return llm


def sampled(llm, n: int = 4, max_tokens: int = 120) -> SamplingParams:
    """Sampling params under which a random model ends its output: a positive bias on eos, which a
    constraint allows only where the output is complete."""
    eos_bias = {eos: 3.0 for eos in llm.engine.loaded.eos_token_ids}
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1, n=n, logit_bias=eos_bias)


def accepts(llm, spec, text: str) -> bool:
    """Whether the compiled constraint lets the model spell `text` as a whole output."""
    matcher = llm.engine.compile(spec).matcher()
    try:
        for token in llm.tokenizer.encode(text, add_special_tokens=False):
            matcher.advance(token)
    except ValueError:
        return False
    return True


# --- parsing -------------------------------------------------------------------------------------------

def test_every_shape_of_response_format():
    assert from_response_format(json_schema_format(PERSON, strict=True)) == \
        JsonSchema(PERSON, options={"additional_properties": False})
    assert from_response_format(json_schema_format(PERSON, strict=False, description="a person")) == JsonSchema(PERSON)
    assert from_response_format(json_schema_format(PERSON, strict=None)) == JsonSchema(PERSON)     # OpenAI's null
    assert from_response_format(json_schema_format(PERSON)) == JsonSchema(PERSON)
    assert from_response_format({"type": "json_object"}) == JsonSchema({"type": "object"})
    assert from_response_format({"type": "text"}) is None
    assert from_response_format(None) is None
    assert from_response_format(Person) == JsonSchema(Person)


@pytest.mark.parametrize("value,message", [
    ({"type": "xml"}, "response_format.type: expected 'json_schema', 'json_object' or 'text', got 'xml'"),
    ({}, "response_format.type: required"),
    ({"type": "json_schema"}, "response_format.json_schema: required"),
    ({"type": "json_schema", "json_schema": {"name": "p"}}, "response_format.json_schema.schema: required"),
    ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name: required"),
    (json_schema_format(PERSON, extra=1, other=2),
     "response_format.json_schema: unknown keys 'extra', 'other' (expected 'name', 'schema', 'strict', 'description')"),
    ({"type": "json_object", "json_schema": {}}, "response_format: unknown key 'json_schema' (expected 'type')"),
    ({"type": "json_schema", "json_schema": [PERSON]}, "response_format.json_schema: expected an object, got array"),
    ({"type": "json_schema", "json_schema": {"name": "", "schema": PERSON}},
     "response_format.json_schema.name: expected a non-empty string, got ''"),
    (json_schema_format([PERSON]),
     "response_format.json_schema.schema: expected an object (a JSON Schema), got array"),
    (json_schema_format(PERSON, strict="yes"),
     "response_format.json_schema.strict: expected true or false, got string"),
    (json_schema_format(PERSON, description=3),
     "response_format.json_schema.description: expected a string, got number"),
    ("json_object", "response_format: expected an object like {'type': 'json_schema', ...} or a pydantic model "
                    "class, got str"),
])
def test_bad_response_formats_name_the_field(value, message):
    with pytest.raises(ValueError) as caught:
        from_response_format(value)
    assert str(caught.value) == message


def test_a_pydantic_model_compiles_without_undeclared_keys_and_a_stable_key(llm):
    spec = as_constraint(Person)
    assert spec == JsonSchema(Person) and spec.key() == JsonSchema(Person).key()
    # the key says how it compiles, so the bare dict (which allows other keys) never shares its grammar
    assert spec.key() == JsonSchema(Person.model_json_schema(), {"additional_properties": False}).key()
    assert spec.key() != JsonSchema(Person.model_json_schema()).key()
    assert accepts(llm, spec, '{"name":"a","age":1}')
    assert not accepts(llm, spec, '{"name":"a","age":1,"zz":1}')
    assert accepts(llm, JsonSchema(Person.model_json_schema()), '{"name":"a","age":1,"zz":1}')
    assert accepts(llm, as_constraint(OpenPerson), '{"name":"a","age":1,"zz":1}')       # extra="allow" wins


# --- generation ----------------------------------------------------------------------------------------

def test_strict_forbids_undeclared_keys_in_generated_output(llm):
    strict = from_response_format(json_schema_format(PERSON, strict=True))
    assert not accepts(llm, strict, '{"name":"a","zz":1}')
    assert accepts(llm, from_response_format(json_schema_format(PERSON)), '{"name":"a","zz":1}')
    outputs = llm.generate(["a", "bb"], sampled(llm), response_format=json_schema_format(PERSON, strict=True))
    completions = [c for output in outputs for c in output.outputs]
    for completion in completions:
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), CLOSED_PERSON)
    assert any(len(json.loads(c.text)) > 1 for c in completions)          # optional keys were open to it


def test_json_object_output_is_an_object(llm):
    # a random model rarely closes a free-form object; biases on quotes, colons and braces let it
    tokenizer = llm.tokenizer
    closers = {i: 4.0 for token, i in tokenizer.get_vocab().items()
               if set(tokenizer.convert_tokens_to_string([token])) <= set('"}:0')}
    params = sampled(llm, max_tokens=60)
    params = dataclasses.replace(params, logit_bias={**params.logit_bias, **closers})
    outputs = llm.generate(["a", "bb"], params, response_format={"type": "json_object"})
    for completion in (c for output in outputs for c in output.outputs):
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), {"type": "object"})


def test_text_format_is_unconstrained_and_formats_exclude_constraints(llm):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    assert llm.generate("x", params, response_format={"type": "text"})[0].text == llm.generate("x", params)[0].text
    with pytest.raises(ValueError, match="either constraint= or response_format="):
        llm.generate("x", params, constraint=Regex("a"), response_format={"type": "json_object"})
    with pytest.raises(ValueError, match="response_format.type: required"):
        llm.generate("x", params, response_format={"json_schema": {}})
    with pytest.raises(ValueError, match="either constraint= or response_format="):
        next(llm.stream("x", params, constraint=Regex("a"), response_format={"type": "text"}))


@pytest.mark.parametrize("how", ["constraint", "json_schema", "response_format"])
def test_a_pydantic_model_gives_parsed_instances(llm, how):
    params = sampled(llm, n=3)
    given = {"constraint": {"constraint": Person}, "json_schema": {"constraint": JsonSchema(Person)},
             "response_format": {"response_format": Person}}[how]
    for output in llm.generate(["a", "bb"], params, **given):
        for completion in output.outputs:
            assert completion.finish_reason == "stop", completion.text
            jsonschema.validate(json.loads(completion.text), CLOSED_PERSON_MODEL)
            assert isinstance(completion.parsed, Person)
            assert completion.parsed == Person.model_validate_json(completion.text)


def test_formats_only_pydantic_knows_are_enforced_so_the_output_parses(llm):
    # unknown to JSON Schema, "uuid4" and "ipvanyaddress" were annotations: any string, then `parsed` None
    class Host(pydantic.BaseModel):
        id: pydantic.UUID4
        address: pydantic.IPvAnyAddress
        format: str = "x"       # a property named like the keyword

    for output in llm.generate(["a", "bb"], sampled(llm, n=3), response_format=Host):
        for completion in output.outputs:    # (closed within max_tokens, some at its end: finish_reason "length")
            assert isinstance(completion.parsed, Host), completion.text
    # a dict schema keeps JSON Schema's reading: the format is an annotation
    assert "pattern" not in JsonSchema(Host.model_json_schema()).as_dict()["properties"]["id"]


def test_parsed_in_generate_iter_and_none_where_validation_fails(llm):
    params = sampled(llm, n=1)
    seen = dict(llm.generate_iter(["a", "bb"], params, constraint=Person))
    assert sorted(seen) == [0, 1] and all(isinstance(seen[i].outputs[0].parsed, Person) for i in seen)
    picky = llm.generate(["a"], params, constraint=Picky)[0]          # does not raise
    assert picky.finish_reason == "stop" and picky.outputs[0].parsed is None
    jsonschema.validate(json.loads(picky.text), Picky.model_json_schema())
    assert llm.generate(["a"], params, constraint=JsonSchema(PERSON))[0].outputs[0].parsed is None   # no model


def test_closing_generate_iter_aborts_the_rest(llm):
    iterator = llm.generate_iter(["a", "bb", "ccc"], SamplingParams(max_tokens=40, ignore_eos=True))
    next(iterator)
    iterator.close()
    assert not llm.engine.has_unfinished


# --- chat ----------------------------------------------------------------------------------------------

def test_chat_renders_the_template_and_takes_a_response_format(llm):
    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    output, = llm.chat(conversation, sampled(llm, n=1), response_format=Person)
    assert output.prompt == "<system>be brief\n<user>hi\n<assistant>"
    assert isinstance(output.outputs[0].parsed, Person)
    batch = llm.chat([conversation, [{"role": "user", "content": "yo"}]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert [o.prompt for o in batch] == [output.prompt, "<user>yo\n<assistant>"]


@pytest.mark.parametrize("messages,message", [
    ([], "messages: expected a non-empty list"),
    ("hi", "messages: expected a non-empty list"),
    ([{"role": "robot", "content": "x"}], "messages[0].role: expected 'system', 'user' or 'assistant', got 'robot'"),
    ([{"role": "user", "content": "x"}, {"content": "y"}], "messages[1].role: required"),
    ([{"role": "user"}], "messages[0].content: required"),
    ([{"role": "user", "content": ["x"]}], "messages[0].content: expected a string, got list"),
    ([{"role": "user", "content": "x"}, "y"], "messages[1]: expected a message"),
    ([[{"role": "user", "content": "x"}], []], "messages[1]: a conversation needs at least one message"),
    ([[{"role": "user", "content": "x"}], [{"role": "user", "content": 3}]],
     "messages[1][0].content: expected a string, got int"),
])
def test_bad_messages_name_the_place(llm, messages, message):
    with pytest.raises(ValueError) as caught:
        llm.chat(messages)
    assert str(caught.value).startswith(message)


def test_chat_without_a_template_is_refused(llm):
    llm.tokenizer.chat_template = None
    try:
        with pytest.raises(ValueError, match="no chat template"):
            llm.chat([{"role": "user", "content": "hi"}])
    finally:
        llm.tokenizer.chat_template = CHAT_TEMPLATE


# --- the command line ----------------------------------------------------------------------------------

MODELS_PY = """
import pydantic

class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    age: int = pydantic.Field(ge=0, le=99)

NOT_A_MODEL = 3
"""


def run(capsys, byte_level_model_dir, *argv) -> tuple[int, str, str]:
    code = main(["generate", "--model", str(byte_level_model_dir), "--prompt", "a", "--max-tokens", "80", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def models_py(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(MODELS_PY)
    return path


@pytest.mark.parametrize("flag", ["--schema", "--json-schema"])
def test_cli_schema_takes_a_pydantic_model_in_a_py_file(byte_level_model_dir, models_py, capsys, flag):
    code, out, err = run(capsys, byte_level_model_dir, flag, f"{models_py}:Person", "--json")
    assert code == 0, err
    value = json.loads(json.loads(out)["text"])
    jsonschema.validate(value, CLOSED_PERSON_MODEL)


def test_cli_schema_file_and_response_format_inline_or_file(byte_level_model_dir, tmp_path, capsys):
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(CLOSED_PERSON))
    format_file = tmp_path / "format.json"
    format_file.write_text(json.dumps(json_schema_format(PERSON, strict=True)))
    for flags in (["--schema", str(schema_file)], ["--response-format", str(format_file)],
                  ["--response-format", json.dumps(json_schema_format(PERSON, strict=True))]):
        code, out, err = run(capsys, byte_level_model_dir, *flags, "--json")
        assert code == 0, err
        jsonschema.validate(json.loads(json.loads(out)["text"]), CLOSED_PERSON)


@pytest.mark.parametrize("argv,expected", [
    (["--response-format", '{"type": "xml"}'],
     "--response-format: response_format.type: expected 'json_schema', 'json_object' or 'text', got 'xml'"),
    (["--response-format", '{"type": "json_schema", "json_schema": {"name": "p"}}'],
     "--response-format: response_format.json_schema.schema: required"),
    (["--response-format", "{not json"], "--response-format: not valid JSON"),
    (["--response-format", "{FILE}/missing.json"], "--response-format {FILE}/missing.json: no such file"),
    (["--schema", "{FILE}/missing.json"], "--schema {FILE}/missing.json: no such file"),
    (["--schema", "{FILE}/models.py:Nobody"], "--schema {FILE}/models.py:Nobody: module"),
    (["--schema", "{FILE}/models.py:NOT_A_MODEL"], "NOT_A_MODEL is not a pydantic model class"),
    (["--schema", "{FILE}/broken.py:Person"], "--schema {FILE}/broken.py:Person: importing it failed: SyntaxError"),
    (["--schema", "no_such_module_xyz:Person"], "--schema cannot import 'no_such_module_xyz'"),
    (["--schema", "{FILE}/models.py:Person", "--regex", "a"], "not allowed with argument"),
    (["--response-format", '{"type": "text"}', "--json-schema", "x.json"], "not allowed with argument"),
])
def test_cli_bad_input_is_one_line(byte_level_model_dir, models_py, capsys, argv, expected):
    (models_py.parent / "broken.py").write_text("class Person(:\n")
    argv = [a.replace("{FILE}", str(models_py.parent)) for a in argv]
    code, _, err = run(capsys, byte_level_model_dir, *argv)
    assert expected.replace("{FILE}", str(models_py.parent)) in error_line(code, err)


@pytest.mark.slow   # the real SmolLM2-135M-Instruct and its own chat template
def test_chat_with_the_default_model_answers_in_the_model():
    from leapgen.engine.default_model import DefaultModelNotFoundError

    try:
        llm = leapgen.LLM(kv_cache_memory="64MiB")
    except DefaultModelNotFoundError as exc:
        pytest.skip(str(exc))
    messages = [{"role": "user", "content": "Invent a person: a name and an age."}]
    output, = llm.chat(messages, SamplingParams(max_tokens=40), response_format=Person)
    assert "<|im_start|>assistant" in output.prompt
    assert isinstance(output.outputs[0].parsed, Person), output.text
