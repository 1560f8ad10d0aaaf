"""BeamSearch driven by a tiny random Llama's logits equals transformers' generate(num_beams=...)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from leapgen.decoding.beam_search import BeamSearch

EOS = 3
VOCAB = 48


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=EOS)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # Make eos likely enough that hypotheses finish at different lengths.
        model.lm_head.weight[EOS] *= 4
    return model


def hf_beam_search(model, prompt: list[int], num_beams: int, max_tokens: int, length_penalty: float,
                   early_stopping) -> list[list[int]]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, num_beams=num_beams,
                             num_return_sequences=num_beams, max_new_tokens=max_tokens,
                             length_penalty=length_penalty, early_stopping=early_stopping, pad_token_id=EOS,
                             eos_token_id=EOS)
    results = []
    for row in out[:, len(prompt):].tolist():
        results.append(row[: row.index(EOS) + 1] if EOS in row else row)
    return results


def leapgen_beam_search(model, prompt: list[int], num_beams: int, max_tokens: int, length_penalty: float,
                        early_stopping) -> tuple[list[list[int]], int]:
    search = BeamSearch(num_beams, max_tokens, [EOS], length_penalty, early_stopping)
    finished_early = 0
    while not search.done:
        batch = torch.tensor([prompt + beam.token_ids for beam in search.running])
        with torch.no_grad():
            logits = model(batch).logits[:, -1, :].float()
        step = search.step(logits.log_softmax(dim=-1))
        finished_early += sum(len(h.token_ids) < max_tokens for h in step.newly_finished)
        assert all(0 <= p < batch.shape[0] for p in step.parents)
    return [h.token_ids for h in search.best(num_beams)], finished_early


@pytest.mark.parametrize("num_beams", [2, 3, 5])  # num_beams=1 is plain greedy in transformers
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, -0.5, 2.0])
@pytest.mark.parametrize("early_stopping", [False, True, "never"])
def test_matches_transformers_generate(model, num_beams, length_penalty, early_stopping):
    saw_early_finish = False
    for prompt in ([1, 5, 9, 12], [1, 30, 2, 7, 7, 40]):
        expected = hf_beam_search(model, prompt, num_beams, 10, length_penalty, early_stopping)
        got, finished_early = leapgen_beam_search(model, prompt, num_beams, 10, length_penalty, early_stopping)
        assert got == expected, f"prompt {prompt}"
        saw_early_finish |= finished_early > 0
    assert saw_early_finish, "the test model never produced eos; the finished-hypothesis logic went untested"


def test_parents_describe_the_new_beams(model):
    search = BeamSearch(3, 6, [EOS])
    torch.manual_seed(1)
    previous = [b.token_ids for b in search.running]
    while not search.done:
        step = search.step(torch.randn(len(search.running), VOCAB).log_softmax(dim=-1))
        for beam, parent, token in zip(search.running, step.parents, step.token_ids):
            assert beam.token_ids == previous[parent] + [token]
        previous = [b.token_ids for b in search.running]
    scores = [h.score for h in search.best(3)]
    assert scores == sorted(scores, reverse=True)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="early_stopping"):
        BeamSearch(2, 5, early_stopping="sometimes")
    search = BeamSearch(2, 5)
    with pytest.raises(ValueError, match="1 running beams"):
        search.step(torch.zeros(2, 10))
    with pytest.raises(RuntimeError, match="before the search finished"):
        search.best()
