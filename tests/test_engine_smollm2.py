"""Greedy parity on real weights: the embedded SmolLM2-135M-Instruct, leapgen vs transformers."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from leapgen.decoding.sampling_params import SamplingParams
from leapgen.engine.default_model import DefaultModelNotFoundError, default_model_path
from leapgen.engine.gguf_loader import convert_gguf
from leapgen.engine.llm_engine import EngineConfig, LLMEngine
from leapgen.engine.loader import load_model

pytestmark = pytest.mark.slow   # real SmolLM2 weights: the first run converts the GGUF (~30 s)

MAX_TOKENS = 12
TEXTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "List three colours:",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
    "1, 2, 3, 4,",
    "Translate to French: The weather is nice today because the sun is shining and the birds are singing in "
    "the trees near the river. " * 3,
    "Q: What is 12 times 7?\nA:",
]


@pytest.fixture(scope="module")
def converted():
    try:
        return convert_gguf(default_model_path())
    except DefaultModelNotFoundError as exc:
        pytest.skip(str(exc))


def test_smollm2_greedy_batch_matches_transformers(converted):
    loaded = load_model(converted, "float32")
    tokenizer = loaded.tokenizer
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Name a planet."}], tokenize=False,
                                         add_generation_prompt=True)
    prompts = [tokenizer.encode(t) for t in TEXTS + [chat]]
    assert len({len(p) for p in prompts}) >= 8                  # very different lengths, submitted together
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory="256MiB", max_num_batched_tokens=64, max_num_seqs=16))
    outputs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))

    hf = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs):
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                               eos_token_id=None, pad_token_id=tokenizer.pad_token_id or 0)[0, len(prompt):]
        assert output.token_ids == expected.tolist(), tokenizer.decode(prompt)
        assert output.text == tokenizer.decode(output.token_ids)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_smollm2_drafting_itself_under_a_schema_decodes_as_without(converted):
    """A draft model under a JSON schema on real weights, where drafts end before keys the schema forces (the
    target then takes part of a draft and no token of its own): the same outputs as without speculation, in
    one batch with an unconstrained request."""
    import leapgen

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "city": {"type": "string"}},
              "required": ["name", "age", "city"], "additionalProperties": False}
    plain = leapgen.LLM(converted, dtype="float32", kv_cache_memory="128MiB")
    drafting = leapgen.LLM(converted, dtype="float32", kv_cache_memory="128MiB", speculative={
        "method": "draft", "model": str(converted), "num_speculative_tokens": 4})
    prompts = [plain.chat_prompt("Extract: Tom Jones, 52 years old, lives in Hamburg."),
               plain.chat_prompt("Extract: Ana Silva is 31 and lives in Lisbon."), plain.chat_prompt("Say hi")]
    constrained = SamplingParams(max_tokens=40, constraint=leapgen.JsonSchema(schema))
    params = [constrained, constrained, SamplingParams(max_tokens=12)]
    expected = plain.generate(prompts, params)
    outputs = drafting.generate(prompts, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert all(o.error is None for o in outputs) and sum(o.metrics.drafted_tokens for o in outputs) > 0
