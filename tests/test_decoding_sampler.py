"""The sampler draws from the distribution its settings define, seeds ignore batch composition, logprobs are right."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.candidates import torch_row_logsumexp
from leapgen.decoding.sampler import Sampler, _argmax, prompt_logprobs, request_generator
from leapgen.kernels.cpu_rows import row_logsumexp as compiled_row_logsumexp
from leapgen.decoding.sampling_params import SamplingParams
from stats_util import chi_square_critical

VOCAB = 12
DRAWS = 20000
# The sampler's whole-row normalisers: torch's (any device) and the compiled one the engine uses on CPU.
ROW_LOGSUMEXP = {"torch": torch_row_logsumexp, "compiled": compiled_row_logsumexp}


def draw(params: SamplingParams, logits: torch.Tensor, seed: int, normaliser: str = "torch") -> np.ndarray:
    rows = [SamplingRow(params)] * DRAWS
    batch = SamplingBatch.build(rows, VOCAB)
    sampler = Sampler(seed=seed, row_logsumexp=ROW_LOGSUMEXP[normaliser])
    tokens = sampler(logits.expand(DRAWS, VOCAB), batch).token_ids
    return np.bincount(tokens.numpy(), minlength=VOCAB)


def base_logits() -> torch.Tensor:
    return torch.tensor([[2.0, 1.6, 1.3, 1.0, 0.8, 0.5, 0.2, 0.0, -0.3, -0.6, -1.0, -1.5]])


CASES = {
    "temperature": (SamplingParams(temperature=0.6), [TemperatureLogitsWarper(0.6)]),
    "top_k": (SamplingParams(temperature=1.0, top_k=5), [TopKLogitsWarper(5)]),
    "top_p": (SamplingParams(temperature=1.0, top_p=0.7), [TopPLogitsWarper(0.7)]),
    "min_p": (SamplingParams(temperature=1.0, min_p=0.2), [MinPLogitsWarper(0.2)]),
    "all": (SamplingParams(temperature=1.4, top_k=9, top_p=0.9, min_p=0.1),
            [TemperatureLogitsWarper(1.4), TopKLogitsWarper(9), TopPLogitsWarper(0.9), MinPLogitsWarper(0.1)]),
}


@pytest.mark.parametrize("normaliser", sorted(ROW_LOGSUMEXP))
@pytest.mark.parametrize("name", sorted(CASES))
def test_samples_follow_the_defined_distribution(name, normaliser):
    params, reference = CASES[name]
    logits = base_logits()
    expected_logits = logits.clone()
    for warper in reference:
        expected_logits = warper(torch.zeros(1, 1, dtype=torch.long), expected_logits)
    expected = expected_logits.softmax(dim=-1)[0].double().numpy() * DRAWS
    observed = draw(params, logits, seed=1234, normaliser=normaliser)
    allowed = expected > 0
    assert observed[~allowed].sum() == 0, "sampled a token the settings exclude"
    assert allowed.sum() >= 4 and expected[allowed].min() >= 5   # chi-square needs enough cells and counts
    statistic = float((((observed - expected) ** 2)[allowed] / expected[allowed]).sum())
    assert statistic < chi_square_critical(int(allowed.sum()) - 1), (statistic, observed, expected.round())


def test_chi_square_check_rejects_a_wrong_distribution():
    # The same statistic must notice temperature 0.6 samples when temperature 1.0 is expected.
    logits = base_logits()
    expected = logits.softmax(dim=-1)[0].double().numpy() * DRAWS
    observed = draw(SamplingParams(temperature=0.6), logits, seed=1234)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    assert statistic > chi_square_critical(VOCAB - 1)


def run_steps(rows: list[SamplingRow], steps: int, sampler: Sampler) -> list[list[int]]:
    """Several decode steps with per-row logits that depend only on the row's params and step."""
    out = [[] for _ in rows]
    for step in range(steps):
        logits = torch.stack([
            torch.randn(500, generator=torch.Generator().manual_seed(1000 * step + (r.params.seed or 0))) * 2
            for r in rows
        ])
        batch = SamplingBatch.build(rows, 500)
        for i, token in enumerate(sampler(logits, batch).token_ids.tolist()):
            out[i].append(token)
            rows[i].output_ids = [*rows[i].output_ids, token]
    return out


def seeded_row(seed: int, **kwargs) -> SamplingRow:
    params = SamplingParams(temperature=1.0, seed=seed, **kwargs)
    return SamplingRow(params, [1, 2, 3], [], request_generator(seed))


def test_seeded_request_ignores_batch_composition():
    alone = run_steps([seeded_row(42, top_p=0.95)], 8, Sampler(seed=0))[0]
    others = [seeded_row(s, top_k=20) for s in range(7)]
    others += [SamplingRow(SamplingParams(temperature=0.8, top_p=0.5), [5], []) for _ in range(5)]
    others += [SamplingRow(SamplingParams(), [5], []) for _ in range(4)]
    for position in (0, 9, 16):
        rows = others[:position] + [seeded_row(42, top_p=0.95)] + others[position:]
        assert run_steps(rows, 8, Sampler(seed=position))[position] == alone


def test_seeds_and_sample_indices_give_different_streams():
    a = run_steps([seeded_row(1)], 10, Sampler(seed=0))[0]
    b = run_steps([seeded_row(2)], 10, Sampler(seed=0))[0]
    assert a != b
    first = torch.empty(4).uniform_(generator=request_generator(5, 0))
    second = torch.empty(4).uniform_(generator=request_generator(5, 1))
    assert not torch.equal(first, second)


def test_greedy_rows_take_the_argmax_next_to_sampled_rows():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    rows = [SamplingRow(SamplingParams(temperature=0.0 if i % 2 == 0 else 1.5, top_k=3)) for i in range(6)]
    tokens = Sampler(seed=0)(logits, SamplingBatch.build(rows, 300)).token_ids
    assert tokens[::2].tolist() == logits[::2].argmax(dim=-1).tolist()
    top3 = logits[1::2].topk(3).indices
    assert all(t in allowed for t, allowed in zip(tokens[1::2].tolist(), top3.tolist()))


def test_temperatures_too_small_to_divide_by_decode_greedily():
    """Logits over 1e-38 overflow to infinity (no token could be sampled); under 1e-5 a row is greedy, as in vLLM."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(4)) * 30
    rows = [SamplingRow(SamplingParams(temperature=t, top_p=0.9)) for t in (1e-38, 1e-10, 9e-6, 0.0)]
    tokens = Sampler(seed=0)(logits, SamplingBatch.build(rows, 300)).token_ids
    assert tokens.tolist() == logits.argmax(dim=-1).tolist()
    assert not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize("normaliser", sorted(ROW_LOGSUMEXP))
@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_logprobs_of_chosen_and_top_tokens(mode, normaliser):
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(4))
    rows = [SamplingRow(SamplingParams(temperature=0.8, top_k=10, logprobs=5)),
            SamplingRow(SamplingParams(logprobs=0)),
            SamplingRow(SamplingParams(temperature=1.0))]
    batch = SamplingBatch.build(rows, 300)
    out = Sampler(logprobs_mode=mode, seed=0, row_logsumexp=ROW_LOGSUMEXP[normaliser])(logits, batch)
    if mode == "raw":
        reference = logits.log_softmax(dim=-1)
    else:
        reference = torch.cat([TopKLogitsWarper(10)(None, TemperatureLogitsWarper(0.8)(None, logits[:1])),
                               logits[1:]]).log_softmax(dim=-1)
    torch.testing.assert_close(out.logprobs, reference.gather(1, out.token_ids[:, None])[:, 0])
    torch.testing.assert_close(out.top_logprobs, reference.topk(5).values)
    assert torch.equal(out.top_logprob_ids, reference.topk(5).indices)


def test_the_compiled_normaliser_draws_what_torch_s_does():
    generator = torch.Generator().manual_seed(7)
    ranked = -1.1 * torch.log(torch.arange(1, 5001, dtype=torch.float32))
    logits = torch.stack([ranked[torch.randperm(5000, generator=generator)] for _ in range(64)])
    logits[::5, ::3] = -float("inf")                                    # masked tokens, as a constraint leaves them
    params = [SamplingParams(temperature=0.7, top_p=0.9, logprobs=3, seed=i, repetition_penalty=1.1)
              for i in range(64)]
    outputs = []
    for normaliser in ROW_LOGSUMEXP.values():
        rows = [SamplingRow(p, [1, 2, 3], [4, 5], request_generator(p.seed)) for p in params]
        outputs.append(Sampler(row_logsumexp=normaliser)(logits, SamplingBatch.build(rows, 5000)))
    torch_out, compiled_out = outputs
    assert torch.equal(torch_out.token_ids, compiled_out.token_ids)
    assert torch.equal(torch_out.top_logprob_ids, compiled_out.top_logprob_ids)
    torch.testing.assert_close(torch_out.logprobs, compiled_out.logprobs, rtol=0, atol=2e-6)
    torch.testing.assert_close(torch_out.top_logprobs, compiled_out.top_logprobs, rtol=0, atol=2e-6)


def test_no_logprobs_requested_means_none_computed():
    out = Sampler(seed=0)(torch.randn(2, 50), SamplingBatch.build([SamplingRow(SamplingParams())] * 2, 50))
    assert out.logprobs is None and out.top_logprobs is None


def test_prompt_logprobs():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(5))
    ids = [3, 7, 1, 30, 2]
    result = prompt_logprobs(logits, ids, top_n=3)
    logp = logits.log_softmax(dim=-1)
    torch.testing.assert_close(result.logprobs, torch.stack([logp[i - 1, ids[i]] for i in range(1, 5)]))
    assert torch.equal(result.top_ids, logp[:-1].topk(3).indices)
    with pytest.raises(ValueError, match="len\\(prompt\\)=4"):
        prompt_logprobs(logits, ids[:4])


def test_caller_logits_are_not_modified():
    logits = torch.randn(2, 50)
    before = logits.clone()
    rows = [SamplingRow(SamplingParams(temperature=0.5, top_p=0.5, repetition_penalty=2.0), [1, 2], [3])] * 2
    Sampler(seed=0)(logits, SamplingBatch.build(rows, 50))
    assert torch.equal(logits, before)


def test_greedy_takes_the_first_of_tied_maxima():
    """As `argmax` and transformers' greedy search do, in an all-greedy batch and in a mixed one."""
    logits = torch.zeros(2, 12)
    logits[:, 3] = logits[:, 7] = 5.0
    greedy = SamplingRow(SamplingParams())
    assert Sampler(seed=0)(logits, SamplingBatch.build([greedy, greedy], 12)).token_ids.tolist() == [3, 3]
    mixed = SamplingBatch.build([greedy, SamplingRow(SamplingParams(temperature=1.0))], 12)
    assert Sampler(seed=0)(logits, mixed).token_ids[0].item() == 3


@pytest.mark.parametrize("vocab", [100, 2048, 2049, 49152, 100003])
def test_greedy_picks_the_first_maximum_like_argmax(vocab):
    """The chunked argmax against torch's: many ties, a NaN inside the chunks and in the tail, an all -inf row,
    and a tail value above every chunk."""
    generator = torch.Generator().manual_seed(vocab)
    for trial in range(20):
        x = torch.randint(-3, 3, (6, vocab), generator=generator).float()
        x[1, int(torch.randint(0, vocab, (1,), generator=generator))] = float("nan")
        x[2, -1] = float("nan")
        x[3] = float("-inf")
        x[4, -1] = 10.0
        assert torch.equal(_argmax(x), x.argmax(dim=-1)), trial
