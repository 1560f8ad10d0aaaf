"""The step profile: each phase of the engine's steps timed while a profile is active, nothing otherwise."""

from __future__ import annotations

import pytest

from checkpoints import build_checkpoint_for_tokenizer
from leapgen.constraints import Regex
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model
from leapgen.engine.step_profile import StepProfile, phase
from tokenizers_util import byte_level_bpe


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("profiled")
    build_checkpoint_for_tokenizer(directory, byte_level_bpe())
    return LLMEngine(load_model(directory, "float32"), EngineConfig(kv_cache_memory="16MiB", block_size=8))


def test_profile_times_every_phase_of_every_step(engine):
    profile = StepProfile()
    params = SamplingParams(max_tokens=6, constraint=Regex("[a-z]{6}"))
    steps_before = engine.num_steps
    with profile.active():
        outputs = engine.generate(["hello", "a longer prompt"], params)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outputs)
    assert profile.steps == engine.num_steps - steps_before
    for name in ("step", "schedule", "forward", "inputs", "attention", "lm_head", "masks ahead", "masks", "sampling",
                 "accept"):
        assert profile.seconds[name] > 0, name
    # Nested phases fit inside their parents, and the named ones inside the step.
    assert profile.seconds["attention"] + profile.seconds["lm_head"] <= profile.seconds["forward"]
    assert profile.seconds["masks ahead"] <= profile.seconds["forward"]      # the pass waits for its worker
    rows = {name.strip(): (ms, share) for name, ms, share in profile.rows()}
    assert rows["step"][1] == pytest.approx(1.0)
    top_level = ("schedule", "forward", "masks", "sampling", "accept", "propose", "other")
    assert sum(rows[name][1] for name in top_level) == pytest.approx(1.0, abs=1e-6)
    table = profile.table()
    assert table.splitlines()[0].startswith(f"| phase ({profile.steps} steps)") and "attention (in forward)" in table


def test_nothing_is_recorded_without_an_active_profile(engine):
    idle = StepProfile()
    engine.generate(["hello"], SamplingParams(max_tokens=3))
    assert idle.steps == 0 and not idle.seconds
    with pytest.raises(ValueError, match="unknown profile phase 'forwrd'"):
        with idle.active(), phase("forwrd"):
            pass
