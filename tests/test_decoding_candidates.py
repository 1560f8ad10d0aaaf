"""The sampler's candidate path: exact top-k, the distribution transformers' warpers define, fallbacks, seeds."""

from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.candidates import candidate_rows, sample_from_candidates, top_candidates
from leapgen.decoding.penalties import RepetitionPenalty
from leapgen.decoding.pipeline import LogitsPipeline, default_processors
from leapgen.decoding.sampler import Sampler, request_generator
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.warpers import Temperature, TopKTopP

VOCAB = 500
GRID = 4096     # uniforms (j + 0.5) / GRID: each token's share of the grid is its probability to within 1 / GRID


@pytest.mark.parametrize("vocab", [4099, 5000, 49157])
@pytest.mark.parametrize("width", [1, 16, 64, 130])
def test_top_candidates_finds_the_topk_values(vocab, width):
    generator = torch.Generator().manual_seed(vocab + width)
    x = (torch.randn(4, vocab, generator=generator) * 2).round() / 2      # many ties
    x[1] = 0.0                                                              # all tied
    x[2, : vocab - 3] = -float("inf")                                       # fewer finite values than width
    values, ids = top_candidates(x, width)
    assert torch.equal(values, x.topk(width).values)
    assert torch.equal(x.gather(1, ids), values)
    assert all(len(set(row)) == width for row in ids.tolist())


def reference_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """transformers' warpers in leapgen's order, as probabilities."""
    chain = [TemperatureLogitsWarper(params.temperature)]
    chain += [TopKLogitsWarper(params.top_k)] if params.top_k else []
    chain += [TopPLogitsWarper(params.top_p)] if params.top_p < 1 else []
    chain += [MinPLogitsWarper(params.min_p)] if params.min_p else []
    scores = logits[None].clone()
    for warper in chain:
        scores = warper(None, scores)
    return scores.softmax(dim=-1)[0].double()


def grid_draw(logits: torch.Tensor, params: list[SamplingParams], window: int):
    """Each row drawn at every grid uniform: (token counts [R, V], covered [R])."""
    rows = [SamplingRow(p) for p in params for _ in range(GRID)]
    batch = SamplingBatch.build(rows, VOCAB)
    uniform = ((torch.arange(GRID, dtype=torch.float64) + 0.5) / GRID).repeat(len(params))
    draw = sample_from_candidates(logits.repeat_interleave(GRID, dim=0), batch, list(range(len(rows))), uniform,
                                  window)
    counts = torch.stack([torch.bincount(t, minlength=VOCAB) for t in draw.token_ids.view(len(params), GRID)])
    return counts.double() / GRID, draw.covered.view(len(params), GRID)


SETTINGS = [
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.8, min_p=0.05),
    SamplingParams(temperature=0.5, top_p=0.95, min_p=0.1),
    SamplingParams(temperature=2.0, top_k=1),
]


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_candidate_draws_follow_the_transformers_distribution(scale):
    generator = torch.Generator().manual_seed(int(scale))
    logits = torch.randn(len(SETTINGS), VOCAB, generator=generator) * scale
    order = logits[1].argsort(descending=True)
    logits[1, order[19:22]] = logits[1, order[19]].item()   # the 20th best ties with the next two: top_k=20 keeps 22
    frequencies, covered = grid_draw(logits, SETTINGS, window=VOCAB)
    assert covered.all()
    assert (frequencies[1] > 0).sum() == 22
    for row, params in enumerate(SETTINGS):
        expected = reference_probs(logits[row], params)
        assert frequencies[row][expected == 0].sum() == 0, f"{params}: drew a token the warpers exclude"
        assert (frequencies[row] - expected).abs().max() <= 1.01 / GRID, params


HALF = torch.full((1,), 0.5, dtype=torch.float64)


def covered(logits: torch.Tensor, params: list[SamplingParams], window: int) -> list[bool]:
    batch = SamplingBatch.build([SamplingRow(p) for p in params], VOCAB)
    uniform = HALF.expand(len(params))
    return sample_from_candidates(logits, batch, list(range(len(params))), uniform, window).covered.tolist()


def test_nucleus_wider_than_the_window_is_left_to_the_full_path():
    flat = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7)) * 0.1
    top_p, top_k = SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.0, top_k=10)
    assert covered(torch.cat([flat, flat * 100, flat]), [top_p, top_p, top_k], window=32) == [False, True, True]


def test_a_nucleus_past_the_first_window_is_found_in_the_second():
    medium = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))     # nucleus of ~220 tokens
    params = [SamplingParams(temperature=0.7, top_p=0.9)]
    assert covered(medium, params, window=300) == [True]
    assert covered(medium, params, window=200) == [False]


def test_top_p_after_top_k_needs_the_whole_top_k_set():
    # The nucleus ends in the top 5, but top-p's mass is relative to the whole top-k set, whose ties at the
    # 20th value run past a 32-token window: not covered there, exact with a window holding them all.
    tied = torch.full((1, VOCAB), -5.0)
    tied[0, :5] = torch.tensor([4.0, 3.5, 3.0, 2.5, 2.0])
    tied[0, 100:160] = 0.0
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.5)
    assert covered(tied, [params], window=32) == [False]
    frequencies, in_window = grid_draw(tied, [params], window=VOCAB)
    assert in_window.all() and (frequencies[0] - reference_probs(tied[0], params)).abs().max() <= 1.01 / GRID


def test_rows_the_candidate_path_takes():
    params = [SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.5, top_k=32),
              SamplingParams(temperature=1.0),                            # neither top-k nor top-p
              SamplingParams(temperature=1.0, top_k=33),                  # top_k beyond the window
              SamplingParams(temperature=1.0, top_p=0.9, typical_p=0.9),  # typical-p needs the whole row
              SamplingParams(top_k=5)]                                    # greedy
    assert candidate_rows(SamplingBatch.build([SamplingRow(p) for p in params], VOCAB), window=32) == [0, 1]


def small_window_sampler(seed: int, **kwargs) -> Sampler:
    processors = [TopKTopP(candidates=16) if isinstance(p, TopKTopP) else p for p in default_processors()]
    return Sampler(LogitsPipeline(processors), seed=seed, **kwargs)


def step_logits(rows: list[SamplingRow], step: int) -> torch.Tensor:
    """Per-row logits that depend only on the row's seed and the step; odd seeds give flat rows."""
    out = []
    for row in rows:
        seed = row.params.seed or 0
        scale = 0.2 if seed % 2 else 8.0
        out.append(torch.randn(VOCAB, generator=torch.Generator().manual_seed(1000 * step + seed)) * scale)
    return torch.stack(out)


def run(rows: list[SamplingRow], sampler: Sampler, steps: int = 6) -> list[list[int]]:
    tokens = [[] for _ in rows]
    for step in range(steps):
        batch = SamplingBatch.build(rows, VOCAB)
        for i, token in enumerate(sampler(step_logits(rows, step), batch).token_ids.tolist()):
            tokens[i].append(token)
            rows[i].output_ids = [*rows[i].output_ids, token]
    return tokens


def seeded(seed: int, **kwargs) -> SamplingRow:
    return SamplingRow(SamplingParams(temperature=0.9, seed=seed, **kwargs), [1, 2], [], request_generator(seed))


def test_seeded_rows_ignore_batch_composition_on_both_paths():
    # Seed 3 gives flat rows (nucleus past the 16-token window: full path), seed 4 peaked ones (candidates);
    # companions widen the candidate search (top_k=15 looks at 30), take the full path (top_k=300), are
    # greedy or penalised.
    mine_rows = [seeded(3, top_p=0.9), seeded(4, top_p=0.9)]
    draw = sample_from_candidates(step_logits(mine_rows, 0), SamplingBatch.build(mine_rows, VOCAB), [0, 1],
                                  torch.zeros(2, dtype=torch.float64), window=16)
    assert draw.covered.tolist() == [False, True]
    for mine in (dict(seed=3, top_p=0.9), dict(seed=4, top_p=0.9), dict(seed=4, top_k=6, min_p=0.05)):
        alone = run([seeded(**mine)], small_window_sampler(0))[0]
        companions = [seeded(10, top_k=15), SamplingRow(SamplingParams(), [3], []),
                      seeded(11, top_p=0.5, repetition_penalty=1.2), seeded(12, top_k=300),
                      SamplingRow(SamplingParams(temperature=0.7, top_p=0.8), [4], [])]
        for position in (0, 2, 5):
            rows = companions[:position] + [seeded(**mine)] + companions[position:]
            assert run(rows, small_window_sampler(position))[position] == alone, (mine, position)


def test_logprobs_mode_does_not_change_the_draw():
    make = lambda: [seeded(s, top_p=0.8, logprobs=3) for s in range(6)] + [seeded(9, top_k=4, logprobs=0)]
    raw = run(make(), Sampler(seed=0, logprobs_mode="raw"))
    processed_rows = make()
    processed = run(processed_rows, Sampler(seed=0, logprobs_mode="processed"))
    assert raw == processed
    out = Sampler(seed=0, logprobs_mode="processed")(step_logits(processed_rows, 9),
                                                     SamplingBatch.build(processed_rows, VOCAB))
    assert torch.isfinite(out.logprobs).all()


def test_pipeline_without_the_standard_warpers_keeps_its_own_semantics():
    # No MinP stage here, so min_p is not applied: tokens below min_p * p_max must still come up.
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(5)).expand(2000, VOCAB)
    rows = [SamplingRow(SamplingParams(temperature=1.0, top_k=50, min_p=0.5))] * 2000
    tokens = Sampler(LogitsPipeline([Temperature(), TopKTopP()]), seed=0)(logits, SamplingBatch.build(rows, VOCAB))
    probs = logits[0].softmax(dim=-1)
    below = probs[tokens.token_ids] < 0.5 * probs.max()
    assert below.any()
    with_min_p = Sampler(seed=0)(logits, SamplingBatch.build(rows, VOCAB)).token_ids
    assert not (probs[with_min_p] < 0.5 * probs.max()).any()


def test_a_row_with_nothing_to_sample_is_named():
    logits = torch.randn(3, VOCAB)
    logits[2] = -float("inf")
    rows = [SamplingRow(SamplingParams(temperature=1.0, top_p=0.9))] * 3
    batch = SamplingBatch.build(rows, VOCAB)
    Sampler(seed=0)(logits, batch)
    assert list(batch.row_errors) == [2] and "no token can be sampled" in str(batch.row_errors[2])
    greedy = SamplingBatch.build([SamplingRow(SamplingParams())] * 3, VOCAB)
    Sampler(seed=0)(logits, greedy)
    assert list(greedy.row_errors) == [2] and "no token can be taken" in str(greedy.row_errors[2])


def test_subset_batch_keeps_rows_settings_and_bitmask():
    rows = [SamplingRow(SamplingParams(temperature=t, repetition_penalty=1.5), [i], []) for i, t in
            enumerate((0.5, 0.0, 1.5))]
    bitmask = torch.arange(3 * 16, dtype=torch.int32).view(3, 16)
    batch = SamplingBatch.build(rows, VOCAB, token_bitmask=bitmask)
    sub = batch.subset([2, 0])
    assert sub.temperature.tolist() == [1.5, 0.5] and torch.equal(sub.token_bitmask, bitmask[[2, 0]])
    logits = torch.randn(3, VOCAB)
    assert torch.equal(RepetitionPenalty()(logits[[2, 0]].clone(), sub),
                       RepetitionPenalty()(logits.clone(), batch)[[2, 0]])
