"""Compiles pause Python's garbage collector and leave it as they found it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
import tokenizers_util as tu

from leapgen.grammars import json_schema
from leapgen.grammars.collector import collector_paused


@pytest.fixture
def collector_state():
    enabled = gc.isenabled()
    yield
    gc.enable() if enabled else gc.disable()


def test_the_collector_is_paused_during_a_compile_and_running_after(collector_state, monkeypatch):
    seen, real = [], json_schema._grammar

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(json_schema, "_grammar", spy)
    gc.enable()
    json_schema.json_schema_to_grammar({"type": "object", "properties": {"a": {"type": "string"}}})
    assert seen == [False] and gc.isenabled()


def test_a_caller_that_turned_the_collector_off_keeps_it_off(collector_state):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_a_failing_compile_restarts_the_collector(collector_state):
    gc.enable()
    with pytest.raises(Exception):
        json_schema.json_schema_to_grammar({"type": "string", "pattern": "(unclosed"})
    assert gc.isenabled()


def test_overlapping_compiles_in_two_threads_restart_it_when_the_last_ends(collector_state):
    gc.enable()
    first_in, second_done, states = threading.Event(), threading.Event(), []

    def first():
        with collector_paused():
            first_in.set()
            second_done.wait(10)
            states.append(gc.isenabled())     # the other thread's block ended while this one runs

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(10)
    with collector_paused():
        pass
    second_done.set()
    thread.join(10)
    assert states == [False] and gc.isenabled()


def test_a_child_forked_during_another_threads_compile_runs_its_collector(collector_state):
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def compiling():
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=compiling)
    thread.start()
    inside.wait(10)
    pid = os.fork()
    if pid == 0:    # the child: the compiling thread does not exist here
        with collector_paused():
            pass
        os._exit(0 if gc.isenabled() else 1)
    release.set()
    thread.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and gc.isenabled()


def _featureful_schemas(tag: str) -> list[dict]:
    """Schemas through the paths that once left reference cycles (`contains` counting, string formulas, counted items), and
    others; `tag` makes their patterns new, so no memo hands back what an earlier compile built."""
    return [
        {"type": "array", "contains": {"type": "string", "pattern": f"^{tag}"}, "minContains": 1, "maxContains": 2},
        {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"const": tag}},
        {"type": "string", "anyOf": [{"pattern": f"^{tag}[a-z]+$"}, {"not": {"pattern": f"{tag}[0-9]"}}]},
        # three negations deep over three branches: one formula (json_schema_string_logic), not 27 alternatives
        {"type": "string", "maxLength": 40,
         "not": {"anyOf": [{"not": {"anyOf": [{"pattern": f"{tag}{k}{j}"} for j in range(3)]}} for k in range(3)]}},
        {"type": "object", "properties": {"a": {"oneOf": [{"type": "string", "pattern": f"^{tag}"}, {"type": "integer"}]},
                                          "b": {"$ref": "#"}}, "patternProperties": {f"^{tag}_": {"type": "boolean"}}},
        {"type": "array", "items": {"enum": [f"{tag}1", f"{tag}2", 3]}, "uniqueItems": True},
        # items counted in base 8 (json_schema_arrays._tail_items): a closure calling itself by name was a cycle
        {"type": "array", "items": {"type": "string", "pattern": f"^{tag}"}, "minItems": 40, "maxItems": 300},
    ]


def test_a_compile_leaves_no_reference_cycles(collector_state, tokenizer):
    # cyclic garbage lives until a full collection, which then frees it inside some later token mask
    for schema in _featureful_schemas("warm"):      # first uses build some classes and caches once
        json_schema.compile_json_schema(schema, tokenizer).matcher().fill_bitmask(_buffer(tokenizer))
    gc.collect()
    gc.disable()
    for schema in _featureful_schemas("fresh"):
        compiled = json_schema.compile_json_schema(schema, tokenizer)
        compiled.matcher().fill_bitmask(_buffer(tokenizer))
        del compiled
    assert gc.collect() == 0


def test_the_collector_stays_paused_from_the_schema_to_the_compiled_grammar(collector_state, monkeypatch, tokenizer):
    # back on in between, the next allocation would run a collection over every object of the IR
    seen, real = [], json_schema.CompiledGrammar.from_ir

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(json_schema.CompiledGrammar, "from_ir", spy)
    gc.enable()
    json_schema.compile_json_schema({"type": "object", "properties": {"a": {"type": "string"}}}, tokenizer)
    assert seen == [False] and gc.isenabled()


_KEPT_BY_A_COMPILE = """
import collections, gc, json, sys
import numpy as np
import tokenizers_util as tu
from leapgen.grammars import json_schema

tokenizer = tu.cl100k()
buffer = np.zeros((len(tokenizer) + 31) // 32, np.int32)

def run(tag):
    schema = {"type": "object", "properties": {
        f"{tag}_{i}": {"type": "string", "pattern": f"^{tag}[0-9a-f]{{{i % 5 + 1}}}$"} for i in range(40)}}
    matcher = json_schema.compile_json_schema(schema, tokenizer).matcher()
    for token in tokenizer.encode(json.dumps({f"{tag}_1": f"{tag}12"}), add_special_tokens=False):
        matcher.fill_bitmask(buffer)
        matcher.advance(token)

run("warm")
run("again")    # (the second grammar holding any JSON value closes its rule, once: `automaton._ClosedRule`)
gc.collect()
gc.collect()
before = set(map(id, gc.get_objects()))
run("fresh")
gc.collect()
gc.collect()
kept = collections.Counter()
for o in gc.get_objects():      # a loop, not a comprehension: one would hold `before` in a new cell
    if id(o) not in before and o is not before and o is not kept:
        kept[type(o).__name__] += 1
print(json.dumps(kept))
"""


def test_what_a_compile_keeps_for_the_collector_is_its_memoised_automata():
    # every object a compile leaves tracked is walked by each later full collection (about half a microsecond
    # each, inside whichever token mask it lands in): memo keys of IR objects or opcodes, instance dicts and
    # nested cached answers once tripled what the memoised automata alone keep.  Counted in a process of its
    # own: threads other tests leave running would allocate objects of their own in between.
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _KEPT_BY_A_COMPILE], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())     # outside the checkout, whose folders shadow
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout.splitlines()[-1])
    assert kept.keys() <= {"DFA", "PatternRegexes"}, kept
    assert kept["DFA"] >= 40            # the new keys' and patterns' automata are memoised


@pytest.fixture(scope="module")
def tokenizer():
    return tu.cl100k()


def _buffer(tokenizer):
    return np.zeros((len(tokenizer) + 31) // 32, np.int32)
