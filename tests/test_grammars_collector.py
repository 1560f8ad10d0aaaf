"""Compiles pause Python's garbage collector and leave it as they found it."""

from __future__ import annotations

import gc
import os
import threading

import pytest

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
