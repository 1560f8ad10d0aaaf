"""`leapgen serve`'s OpenAI-compatible API, driven by the official `openai` client over loopback on a tiny
random model: outputs equal in-process generation, streams join to the same text, constraints validate,
every error is OpenAI-shaped and names its field, and a request that ends early frees what it held."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

import leapgen
from leapgen import SamplingParams
from leapgen.server.app import OpenAIServer
from serving import serving
from test_llm_api import CHAT_TEMPLATE

openai = pytest.importorskip("openai")

MODEL = "tiny"
PERSON = {"type": "object", "required": ["name", "age"], "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 99}}}


def _load(model_dir) -> leapgen.LLM:
    llm = leapgen.LLM(model_dir, dtype="float32", kv_cache_memory="8MiB", block_size=8)
    llm.tokenizer.chat_template = CHAT_TEMPLATE
    return llm


@pytest.fixture(scope="module")
def llm(byte_level_model_dir):
    """The in-process reference; the shared server has an engine of its own (its loop steps whenever its engine
    has work, so an in-process call on the same engine would race with it)."""
    return _load(byte_level_model_dir)


@pytest.fixture(scope="module")
def server(byte_level_model_dir):
    server = OpenAIServer(_load(byte_level_model_dir), MODEL)
    with serving(server) as url:
        server.url = url
        yield server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def eos_bias(llm, amount: float = 4.0) -> dict[str, float]:
    """A random model ends its output only when pushed: a bias on eos (keys as JSON has them, strings)."""
    return {str(eos): amount for eos in llm.engine.loaded.eos_token_ids}


def wait_idle(server: OpenAIServer, timeout: float = 30) -> None:
    """Until the engine runs nothing, every KV block is free again (what an aborted request held) and the
    server counts no request as running."""
    engine = server.engine_loop.engine
    deadline = time.monotonic() + timeout
    while (engine.has_unfinished or engine.block_manager.num_free_blocks != engine.block_manager.num_blocks
           or server.active):
        assert time.monotonic() < deadline, "the engine did not come back to idle"
        time.sleep(0.05)


def error_of(call) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value.status_code, caught.value.body


# --- outputs ----------------------------------------------------------------------------------------------

def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = httpx.get(server.url.removesuffix("/v1") + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_completions_equal_in_process_greedy(llm, client):
    prompts = ["the quick brown", "a b c d"]
    response = client.completions.create(model=MODEL, prompt=prompts, max_tokens=12, temperature=0)
    expected = llm.generate(prompts, SamplingParams(max_tokens=12))
    assert [c.text for c in response.choices] == [o.text for o in expected]
    assert [c.index for c in response.choices] == [0, 1]
    assert {c.finish_reason for c in response.choices} <= {"stop", "length"}
    assert response.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in expected)
    assert response.usage.completion_tokens == sum(len(o.token_ids) for o in expected)
    by_ids = client.completions.create(model=MODEL, prompt=expected[0].prompt_token_ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == expected[0].text


def test_chat_uses_the_template_and_equals_in_process(llm, client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    expected = llm.chat(messages, SamplingParams(max_tokens=10))[0]
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]}]
    joined = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=10, temperature=0)
    assert joined.choices[0].message.content == llm.chat([{"role": "user", "content": "hello there"}],
                                                         SamplingParams(max_tokens=10))[0].text
    # without max_tokens a chat answer may take the rest of the context, as OpenAI's does; the constraint ends it
    open_length = client.chat.completions.create(model=MODEL, messages=messages, extra_body={"regex": "[a-z]{3}"})
    assert len(open_length.choices[0].message.content) == 3 and open_length.choices[0].finish_reason == "stop"
    # and for a beam search, the most each beam's copy of the output fits (the whole context was refused as a
    # max_tokens the client had not sent)
    beams = client.chat.completions.create(model=MODEL, messages=messages, extra_body={"regex": "[a-z]{3}",
                                                                                       "num_beams": 16})
    assert len(beams.choices[0].message.content) == 3


def test_stream_joins_to_the_non_stream_text(llm, client):
    kwargs = dict(model=MODEL, max_tokens=16, temperature=0.8, seed=7, n=2, logit_bias=eos_bias(llm, 1.0))
    whole = client.completions.create(prompt="w x y", **kwargs)
    chunks = list(client.completions.create(prompt="w x y", stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    texts, reasons = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    messages = [{"role": "user", "content": "stream me"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    pieces = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True))
    assert pieces[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in pieces) == chat.choices[0].message.content
    assert pieces[-1].choices[0].finish_reason == chat.choices[0].finish_reason


def test_json_schema_response_format_validates_and_mixes_with_other_constraints(llm, client):
    schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    def person(seed: int) -> str:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"person {seed}"}], max_tokens=60, temperature=1.0,
            seed=seed, logit_bias=eos_bias(llm), response_format=schema_format).choices[0].message.content

    def digits(seed: int) -> str:
        return client.completions.create(model=MODEL, prompt="digits", max_tokens=8, temperature=1.0, seed=seed,
                                         extra_body={"regex": r"\d{3}-\d{2}"}).choices[0].text

    def any_object(seed: int) -> str:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "json"}], max_tokens=30, temperature=1.0, seed=seed,
            logit_bias=eos_bias(llm), response_format={"type": "json_object"}).choices[0].message.content

    with ThreadPoolExecutor(8) as pool:       # requests with different constraints share the batch
        people = list(pool.map(person, range(6)))
        codes = list(pool.map(digits, range(4)))
        objects = list(pool.map(any_object, range(3)))
    for text in people:
        jsonschema.validate(json.loads(text), PERSON)
    assert all(len(code) == 6 and code[3] == "-" and code.replace("-", "").isdigit() for code in codes)
    assert all(isinstance(json.loads(text), dict) for text in objects)


def test_n_and_seed_are_reproducible(llm, client):
    kwargs = dict(model=MODEL, prompt="seeded", max_tokens=10, temperature=1.0, n=3, seed=11)
    first = [c.text for c in client.completions.create(**kwargs).choices]
    again = [c.text for c in client.completions.create(**kwargs).choices]
    assert first == again and len(first) == 3 and len(set(first)) > 1
    other = [c.text for c in client.completions.create(**{**kwargs, "seed": 12}).choices]
    assert other != first


def test_concurrent_requests_each_get_their_own_greedy_answer(llm, client):
    prompts = [f"w{i} w{i + 1}" for i in range(12)]
    expected = [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=10))]

    def ask(prompt: str) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0).choices[0].text

    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(ask, prompts)) == expected


def test_a_speculating_server_gives_the_same_greedy_outputs(llm, byte_level_model_dir):
    """`--speculative` applies to every request; greedy outputs stay token for token those without it."""
    speculating = leapgen.LLM(byte_level_model_dir, dtype="float32", kv_cache_memory="8MiB", block_size=8,
                              speculative={"method": "ngram", "num_speculative_tokens": 4})
    prompts = ["w1 w2 w3 w1 w2 w3 w1 w2", "a b a b a b"]
    expected = [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=16))]
    regex = leapgen.Regex("[a-z0-9 ]{1,40}")
    expected_constrained = llm.generate(prompts[0], SamplingParams(max_tokens=16, constraint=regex))[0].text
    server = OpenAIServer(speculating, MODEL)
    with serving(server) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        response = client.completions.create(model=MODEL, prompt=prompts, max_tokens=16, temperature=0)
        constrained = client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=16, temperature=0,
                                                extra_body={"regex": regex.pattern})
    assert [c.text for c in response.choices] == expected
    assert constrained.choices[0].text == expected_constrained
    assert speculating.engine.proposer is not None


def test_logprobs_in_both_shapes(client):
    response = client.completions.create(model=MODEL, prompt="log", max_tokens=5, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert all(len(top) <= 2 and lp <= 0 for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs))
    assert "".join(logprobs.tokens) == response.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "log"}], max_tokens=5,
                                          temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(len(entry.top_logprobs) == 3 for entry in content)
    assert content[0].top_logprobs[0].logprob == content[0].logprob       # greedy took the best one
    assert bytes(content[0].bytes).decode("utf-8", "replace") == content[0].token


def test_streamed_logprobs_equal_the_whole_response(client):
    """A stream's chunks carry each token's logprobs once, with text offsets going on from chunk to chunk, per
    choice: joined, they are the whole response's."""
    ask = dict(model=MODEL, prompt="offsets", max_tokens=12, temperature=0, logprobs=1, n=2)
    whole = client.completions.create(**ask)
    joined: dict[int, dict[str, list]] = {}
    for chunk in client.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                got = joined.setdefault(choice.index, {"tokens": [], "token_logprobs": [], "text_offset": []})
                for name, values in got.items():
                    values.extend(getattr(choice.logprobs, name))
    for choice in whole.choices:
        assert choice.logprobs.text_offset[-1] > 0
        assert joined[choice.index] == {name: getattr(choice.logprobs, name) for name in joined[choice.index]}


def test_beam_search_as_an_extra(llm, client):
    response = client.completions.create(model=MODEL, prompt="beams", max_tokens=6, temperature=0, n=2,
                                         extra_body={"num_beams": 3})
    expected = llm.generate("beams", SamplingParams(max_tokens=6, n=2, num_beams=3))[0]
    assert [c.text for c in response.choices] == [c.text for c in expected.outputs]
    # without a temperature the search runs (the API's default of 1 would sample)
    response = client.completions.create(model=MODEL, prompt="beams", max_tokens=6, n=2, extra_body={"num_beams": 3})
    assert [c.text for c in response.choices] == [c.text for c in expected.outputs]


# --- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, param, fragment", [
    ({"temperature": "hot"}, "temperature", "expected a finite number"),
    ({"top_p": 1.5}, "top_p", "between 0 and 1"),
    ({"top_p": 0}, "top_p", "top_p: must be in"),
    ({"seed": 2 ** 70}, "seed", "seed: must be an int of 64 bits"),
    ({"temperature": 10 ** 400}, "temperature", "expected a finite number"),
    ({"extra_body": {"repetition_penalty": 1e-300}}, "repetition_penalty", "between 1e-06 and 1e+06"),
    ({"extra_body": {"num_beams": 2, "length_penalty": 1e300}}, "length_penalty", "between -10 and 10"),
    ({"n": 0}, "n", ">= 1"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"logprobs": 50}, "logprobs", "between 0 and 20"),
    ({"stop": [1, 2]}, "stop", "strings"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate", "unrecognized request argument"),
    ({"extra_body": {"regex": "(", "grammar": "start: 'a'"}}, "grammar", "one constraint"),
    ({"echo": True}, "echo", "not supported"),
    ({"prompt": []}, "prompt", "expected a string"),
    ({"prompt": [[5, 999999999]]}, "prompt", "outside the vocabulary"),
    ({"prompt": ["fine", ""]}, "prompt", "prompt[1]: the prompt is empty"),
    ({"max_tokens": 5000}, "max_tokens", "exceeds the model's context"),
    ({"extra_body": {"regex": "("}}, "regex", "regex: invalid regex"),
    ({"extra_body": {"grammar": "start: ("}}, "grammar", "grammar: invalid lark grammar"),
    ({"extra_body": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}}}},
     "response_format", "response_format.json_schema.schema: unknown type 'strin' (at /properties/a/type)"),
    ({"max_tokens": 2, "extra_body": {"response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "p", "schema": PERSON}}}},
     "max_tokens", "too small for the constraint"),
    ({"extra_body": {"response_format": {"type": "json_schema", "json_schema": {"name": "p"}}}},
     "response_format", "response_format.json_schema.schema: required"),
    ({"extra_body": {"num_beams": 2}, "stream": True}, "num_beams", "cannot stream"),
    ({"extra_body": {"num_beams": 2}, "temperature": 0.7}, "num_beams", "beam search (num_beams > 1) is deterministic"),
    ({"n": 100_000}, "n", "n (100000) exceeds the sequences the engine runs at once"),
    ({"n": 100_000, "prompt": ["a", "b"]}, "n", "prompt[0]: n (100000) exceeds"),
    ({"extra_body": {"regex": "[0-9]{4}", "min_tokens": 3}}, "min_tokens", "cannot be combined with a constraint"),
])
def test_bad_completion_fields_are_400s_naming_the_field(client, kwargs, param, fragment):
    request = {"model": MODEL, "prompt": "p", "max_tokens": 4, **kwargs}
    status, body = error_of(lambda: client.completions.create(**request))
    assert status == 400
    assert body["type"] == "invalid_request_error" and fragment in body["message"]
    assert body["param"] == param


@pytest.mark.parametrize("kwargs, param, fragment", [
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool calling"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages", "only text parts"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"max_completion_tokens": 3, "max_tokens": 3}, "max_completion_tokens", "not both"),
    ({"max_completion_tokens": -1}, "max_completion_tokens", ">= 1"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens", "+ max_completion_tokens (5000) exceeds"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "stream: true"),
])
def test_bad_chat_fields_are_400s_naming_the_field(client, kwargs, param, fragment):
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    status, body = error_of(lambda: client.chat.completions.create(**request))
    assert (status, body["param"]) == (400, param) and fragment in body["message"], body


def test_unknown_model_bad_json_and_unknown_route(server, client):
    status, body = error_of(lambda: client.completions.create(model="gpt-9", prompt="p", max_tokens=2))
    assert (status, body["code"], body["param"]) == (404, "model_not_found", "model")
    for body in (b"{not json", b'{"max_tokens": ' + b"9" * 5000 + b"}", b"[" * 100_000):
        raw = httpx.post(server.url + "/completions", content=body, headers={"content-type": "application/json"})
        assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    missing = httpx.get(server.url + "/nothing-here")
    assert missing.status_code == 404 and "error" in missing.json()


def test_bad_requests_do_not_disturb_the_others(llm, client):
    """A stream of good requests runs while bad ones are refused beside it; the good ones are unchanged."""
    expected = llm.generate("steady", SamplingParams(max_tokens=24, logit_bias={e: -100.0 for e in
                                                                                   llm.engine.loaded.eos_token_ids}))
    stream = client.completions.create(model=MODEL, prompt="steady", max_tokens=24, temperature=0, stream=True,
                                       logit_bias=eos_bias(llm, -100))
    text = ""
    for i, chunk in enumerate(stream):
        text += chunk.choices[0].text if chunk.choices else ""
        if i in (2, 5):
            status, _ = error_of(lambda: client.completions.create(model=MODEL, prompt=[[999999999]], max_tokens=2))
            assert status == 400
    assert text == expected[0].text


def test_api_key_body_limit_and_concurrency_limit(llm):
    server = OpenAIServer(llm, MODEL, api_key="sesame", max_concurrent_requests=1, max_body_bytes=2000)
    with serving(server) as url:
        wrong = openai.OpenAI(base_url=url, api_key="guess", max_retries=0)
        status, body = error_of(lambda: wrong.models.list())
        assert (status, body["code"]) == (401, "invalid_api_key")
        right = openai.OpenAI(base_url=url, api_key="sesame", max_retries=0)
        assert right.completions.create(model=MODEL, prompt="p", max_tokens=2, temperature=0).choices
        status, body = error_of(lambda: right.completions.create(model=MODEL, prompt="x" * 5000, max_tokens=2))
        assert (status, body["code"]) == (413, "request_too_large")

        stream = right.completions.create(model=MODEL, prompt="long", max_tokens=200, stream=True,
                                          logit_bias=eos_bias(llm, -100))
        next(iter(stream))                    # the one slot is taken while the stream runs
        status, body = error_of(lambda: right.completions.create(model=MODEL, prompt="p", max_tokens=2))
        assert status == 429 and "limit of 1 concurrent" in body["message"]
        stream.close()
        wait_idle(server)
        assert right.completions.create(model=MODEL, prompt="p", max_tokens=2).choices


def test_a_new_constraint_compiles_while_the_other_streams_go_on(server, client, monkeypatch):
    """The loop compiled each new constraint on its own thread, holding every running stream meanwhile (a schema
    of 100 ms and more stalled them all); now the job joins the batch once its constraint is ready."""
    engine = server.engine_loop.engine
    prepare = engine.prepare

    def slow_prepare(spec):
        time.sleep(1.5)
        prepare(spec)

    monkeypatch.setattr(engine, "prepare", slow_prepare)
    schema = {"type": "object", "properties": {"slowly_compiled": {"type": "integer"}}, "required": ["slowly_compiled"]}
    finished: dict[str, float] = {}

    def constrained() -> None:
        response = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=20, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        assert "slowly_compiled" in json.loads(response.choices[0].message.content)
        finished["constrained"] = time.monotonic()

    def streamed() -> None:
        chunks = client.completions.create(model=MODEL, prompt="the quick", max_tokens=30, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in chunks)
        finished["streamed"] = time.monotonic()

    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(constrained)
        time.sleep(0.2)                        # its compile is under way
        second = pool.submit(streamed)
        first.result(), second.result()
    assert finished["streamed"] < finished["constrained"] and finished["streamed"] - started < 1.5
    wait_idle(server)


def test_a_constraint_whose_client_left_before_its_compile_is_not_compiled(server, monkeypatch):
    """Clients gone while their new schemas waited to compile: those compiles are passed over, not queued one
    after another ahead of the live requests' (the wait for admission did not watch for the client leaving)."""
    engine = server.engine_loop.engine
    prepare, compiled = engine.prepare, []

    def slow_prepare(spec):
        time.sleep(0.6)
        prepare(spec)
        compiled.append(spec)

    monkeypatch.setattr(engine, "prepare", slow_prepare)
    impatient = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=0.2)

    def leaves(i: int) -> None:
        schema = {"type": "object", "properties": {f"left_{i}": {"type": "integer"}}, "required": [f"left_{i}"]}
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model=MODEL, prompt="x", max_tokens=10, temperature=0, extra_body={
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(leaves, range(3)))
    time.sleep(1.0)                             # the compile under way when they left ends
    assert len(compiled) <= 1
    wait_idle(server)


def test_a_dropped_stream_is_aborted_and_frees_its_blocks(llm, server, client):
    stream = client.completions.create(model=MODEL, prompt="drop me", max_tokens=1500, stream=True, n=2,
                                       logit_bias=eos_bias(llm, -100))
    chunks = iter(stream)
    next(chunks), next(chunks)
    assert server.engine_loop.engine.has_unfinished
    stream.close()                            # the client goes away mid-stream
    wait_idle(server)
    assert client.completions.create(model=MODEL, prompt="after", max_tokens=3, temperature=0).choices


def test_a_client_that_gives_up_waiting_is_aborted(llm, server):
    body = {"model": MODEL, "prompt": "slow", "max_tokens": 1500, "logit_bias": eos_bias(llm, -100)}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
    wait_idle(server)


def test_a_client_that_gives_up_waiting_ends_quietly(llm, server, caplog):
    """The cut-off wait ends in the quiet 499, not in an ASGI traceback (the pending wait for the next update
    was once left running while the updates it waited on were closed)."""
    uvicorn_errors = logging.getLogger("uvicorn.error")   # uvicorn's loggers do not reach the root's caplog
    uvicorn_errors.addHandler(caplog.handler)
    try:
        body = {"model": MODEL, "prompt": "give up", "max_tokens": 1500, "logit_bias": eos_bias(llm, -100)}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
        wait_idle(server)
        # the cut-off request logs after it frees its slot: one served after it is served after that too
        assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_a_client_gone_before_its_whole_body_leaves_no_traceback(server, caplog, monkeypatch):
    read = threading.Event()
    original = server._body

    async def body(request):
        try:
            return await original(request)
        finally:
            read.set()

    monkeypatch.setattr(server, "_body", body)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(caplog.handler)
    try:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port)) as half:
            half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"prompt\":")
        assert read.wait(30)
        # (answered on the same event loop, after the cut request's end was handled)
        assert httpx.get(server.url.removesuffix("/v1") + "/health").status_code == 200
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_engine_failure_in_one_request_is_a_500_for_it_alone(llm, server, client, monkeypatch):
    """A request whose constraint fails while running (a matcher raising) gets an OpenAI-shaped 500; the
    requests beside it finish as before."""
    from leapgen.engine.constraint_state import ConstraintState

    original = ConstraintState.admissible
    calls = {"count": 0}

    def flaky(self, token, eos_token_ids):
        calls["count"] += 1
        if calls["count"] > 2:                # after the first tokens: the request fails while it runs
            raise RuntimeError("matcher exploded")
        return original(self, token, eos_token_ids)

    monkeypatch.setattr(ConstraintState, "admissible", flaky)
    request = {"model": MODEL, "prompt": "p", "max_tokens": 60, "extra_body": {"regex": "[a-z]{40}"}}
    status, body = error_of(lambda: client.completions.create(**request))
    assert status == 500 and "matcher exploded" in body["message"] and body["type"] == "server_error"
    calls["count"] = 0
    request = {"model": MODEL, "prompt": "p", "max_tokens": 60, "regex": "[a-z]{40}", "stream": True}
    with httpx.stream("POST", server.url + "/completions", json=request) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]" and "matcher exploded" in json.loads(events[-2])["error"]["message"]
    monkeypatch.setattr(ConstraintState, "admissible", original)
    wait_idle(server)
    assert client.completions.create(model=MODEL, prompt="p", max_tokens=3, temperature=0).choices


def test_a_constraint_whose_compile_hits_a_bug_is_a_500_for_it_alone(server, client, monkeypatch):
    """Not one of the compiler's refusals (a ValueError) but anything else: the engine loop goes on."""
    def broken(spec):
        raise FileNotFoundError("a file the grammar named")

    monkeypatch.setattr(server.engine_loop.engine, "_constraint", broken)
    request = {"model": MODEL, "prompt": "p", "max_tokens": 5, "extra_body": {"regex": "[a-z]{4}"}}
    status, body = error_of(lambda: client.completions.create(**request))
    assert status == 500 and "could not be compiled" in body["message"]
    assert "a file the grammar named" in body["message"]
    monkeypatch.undo()
    assert client.completions.create(model=MODEL, prompt="p", max_tokens=3, temperature=0).choices


def test_a_draining_server_finishes_its_running_requests_and_takes_no_new_ones(byte_level_model_dir):
    """What the first Ctrl-C or SIGTERM does to `leapgen serve`: responses under way complete (they were ended with
    a 503 "shutting down"), health says 503 so that a load balancer looks elsewhere, new requests get 503."""
    server = OpenAIServer(_load(byte_level_model_dir), MODEL)
    engine = server.engine_loop.engine
    with serving(server) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(client.completions.create, model=MODEL, prompt="p", max_tokens=80, temperature=0,
                                  logit_bias=eos_bias(server.llm, -100))
            deadline = time.monotonic() + 60
            while not engine.has_unfinished:
                assert time.monotonic() < deadline and not running.done(), "the request did not start"
                time.sleep(0.01)
            server.engine_loop.drain(60)
            health = httpx.get(url.removesuffix("/v1") + "/health", timeout=30)
            assert health.status_code == 503 and health.json()["status"] == "shutting down"
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model=MODEL, prompt="late", max_tokens=3)
            assert refused.value.status_code == 503 and "shutting down" in refused.value.message
            choice = running.result().choices[0]
    assert choice.finish_reason == "length" and server.llm.tokenizer.encode(choice.text, add_special_tokens=False)


def test_a_draining_server_runs_a_request_it_took_while_its_constraint_compiles(byte_level_model_dir, monkeypatch):
    server = OpenAIServer(_load(byte_level_model_dir), MODEL)
    engine = server.engine_loop.engine
    compiling = threading.Event()
    prepare = engine.prepare

    def slow_prepare(constraint):
        compiling.set()
        time.sleep(1.0)                       # a schema that takes a second to compile
        return prepare(constraint)

    monkeypatch.setattr(engine, "prepare", slow_prepare)
    with serving(server) as url:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        with ThreadPoolExecutor(1) as pool:
            taken = pool.submit(client.chat.completions.create, model=MODEL, max_tokens=30, temperature=0,
                                messages=[{"role": "user", "content": "p"}],
                                response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
            assert compiling.wait(60)
            server.engine_loop.drain(60)
            assert taken.result().choices[0].message.content


def test_the_first_stop_signal_drains_and_the_second_interrupts(capsys):
    from leapgen.cli_serve import _Stopping

    drained = []

    class Loop:
        def drain(self, seconds):
            drained.append(seconds)

    stopping = _Stopping(Loop(), 5)
    stopping(signal.SIGTERM, None)
    assert drained == [5] and "running requests get 5 s to finish" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        stopping(signal.SIGINT, None)
    assert drained == [5]


def _sigint_raises() -> None:
    """Let SIGINT raise KeyboardInterrupt.  A non-interactive shell starts a background job with SIGINT ignored,
    and Python then installs no handler for it: run that way, the suite would see Ctrl-C do nothing, here and in the
    servers it starts."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_ctrl_c_caught_by_another_thread_still_stops_the_engine_loop(llm):
    """The kernel hands a process's SIGINT to any of its threads; Python then only sets a flag, which the main
    thread must wake up to act on (the cause of an intermittent hang of `leapgen serve` on Ctrl-C)."""
    from leapgen.server.engine_loop import EngineLoop

    loop = EngineLoop(llm.engine)
    previous = signal.getsignal(signal.SIGINT)
    _sigint_raises()

    def interrupt_from_here() -> None:
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)   # delivered to this thread, not the main one
        time.sleep(5)
        loop.stop()                            # unblocks a loop that missed it, so a failure is not a hang

    threading.Thread(target=interrupt_from_here, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 3


# --- the command ----------------------------------------------------------------------------------------

def test_the_serve_command_starts_answers_and_refuses_bad_flags(byte_level_model_dir, capsys):
    from leapgen.cli import main
    from test_cli import error_line

    for argv, fragment in ((["--port", "70000"], "--port"), (["--api-key", " "], "--api-key: the key is empty"),
                           (["--max-body-size", "0"], "--max-body-size")):
        line = error_line(main(["serve", "--model", str(byte_level_model_dir), *argv]), capsys.readouterr().err)
        assert fragment in line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = error_line(main(["serve", "--model", str(byte_level_model_dir), "--port", port]),
                          capsys.readouterr().err)
        assert f"--port {port}: cannot listen there" in line

    command = [sys.executable, "-m", "leapgen.cli", "serve", "--model", str(byte_level_model_dir), "--port", "0",
               "--served-model-name", "mine", "--api-key", "k", "--threads", "1"]
    # PYTHONFAULTHANDLER: should it hang, SIGABRT makes it print every thread's stack.  Outside the checkout, as
    # installed: `-m` puts the working directory first on sys.path, where the folder `kernels/` would shadow the HF
    # `kernels` package that transformers (5.25 on) imports with its models
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_raises,
                               env={**os.environ, "PYTHONFAULTHANDLER": "1"}, cwd=tempfile.gettempdir())
    lines: queue.Queue = queue.Queue()
    stderr: list[str] = []

    def read_stderr() -> None:                # the pipe never fills, whatever the server prints
        for line in process.stderr:
            stderr.append(line)
            lines.put(line)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        while not (match := re.search(r"at (http://\S+/v1)", lines.get(timeout=120))):
            pass
        client = openai.OpenAI(base_url=match.group(1), api_key="k", max_retries=5)
        assert [m.id for m in client.models.list().data] == ["mine"]
        assert client.completions.create(model="mine", prompt="hi", max_tokens=3).choices[0].finish_reason
    finally:
        process.send_signal(signal.SIGINT)    # Ctrl-C: a clean shutdown, no traceback
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            process.wait(timeout=30)
            code = None
        reader.join(timeout=5)
    assert code is not None, "`leapgen serve` did not stop on Ctrl-C; its threads:\n" + "".join(stderr)
    assert code == 0, "".join(stderr)
    assert "Traceback" not in "".join(stderr)
