"""Each leapgen processor on random logits equals the transformers processor of the same name, per row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.bitmask import allocate_token_bitmask
from leapgen.decoding.penalties import FrequencyPresencePenalty, RepetitionPenalty
from leapgen.decoding.pipeline import LogitsPipeline
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.warpers import TopKTopP, TypicalP

VOCAB = 300
EOS = 7


def random_logits(batch: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, VOCAB, generator=generator) * scale


def run(rows: list[SamplingRow], logits: torch.Tensor, **build) -> torch.Tensor:
    batch = SamplingBatch.build(rows, VOCAB, eos_token_ids=[EOS], **build)
    return LogitsPipeline()(logits.clone(), batch)


def histories(batch: int, seed: int) -> list[tuple[list[int], list[int]]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        prompt = torch.randint(0, 40, (int(torch.randint(1, 12, (1,), generator=generator)),), generator=generator)
        output = torch.randint(0, 40, (int(torch.randint(0, 12, (1,), generator=generator)),), generator=generator)
        out.append((prompt.tolist(), output.tolist()))
    return out


def per_row_reference(logits: torch.Tensor, ids: list[list[int]], processors_per_row) -> torch.Tensor:
    """Apply transformers processors to each row alone, with that row's input_ids."""
    rows = []
    for i, processors in enumerate(processors_per_row):
        scores = logits[i: i + 1].clone()
        input_ids = torch.tensor([ids[i]], dtype=torch.long)
        for processor in processors:
            scores = processor(input_ids, scores)
        rows.append(scores)
    return torch.cat(rows)


# (leapgen SamplingParams kwargs, transformers processor) per setting; sampled rows use temperature 1
# so that only the processor under test acts.
CASES = {
    "temperature": [({"temperature": t}, TemperatureLogitsWarper(t)) for t in (0.3, 0.7, 1.5, 2.0)],
    "top_k": [({"temperature": 1.0, "top_k": k}, TopKLogitsWarper(k)) for k in (1, 5, 40, 299)],
    "top_p": [({"temperature": 1.0, "top_p": p}, TopPLogitsWarper(p)) for p in (0.05, 0.5, 0.9, 0.99)],
    "min_p": [({"temperature": 1.0, "min_p": p}, MinPLogitsWarper(p)) for p in (0.01, 0.1, 0.5, 1.0)],
    "typical_p": [({"temperature": 1.0, "typical_p": p}, TypicalLogitsWarper(p)) for p in (0.2, 0.5, 0.9, 0.95)],
    "repetition_penalty": [({"repetition_penalty": r}, RepetitionPenaltyLogitsProcessor(r)) for r in (0.5, 1.1, 1.5, 3.0)],
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_transformers_with_one_setting_per_row(name, seed):
    cases = CASES[name]
    hist = histories(len(cases), seed)
    rows = [SamplingRow(SamplingParams(**kwargs), p, o) for (kwargs, _), (p, o) in zip(cases, hist)]
    logits = random_logits(len(cases), seed)
    expected = per_row_reference(logits, [p + o for p, o in hist], [[proc] for _, proc in cases])
    torch.testing.assert_close(run(rows, logits), expected, rtol=1e-6, atol=1e-6)


def test_warpers_chain_in_transformers_order():
    settings = [(0.7, 20, 0.9, 0.05), (1.3, 0, 0.8, 0.0), (0.5, 3, 1.0, 0.2), (1.0, 50, 0.95, 0.1)]
    logits = random_logits(len(settings), 5)
    rows, reference = [], []
    for temperature, top_k, top_p, min_p in settings:
        rows.append(SamplingRow(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)))
        chain = [TemperatureLogitsWarper(temperature)]
        chain += [TopKLogitsWarper(top_k)] if top_k else []
        chain += [TopPLogitsWarper(top_p)] if top_p < 1 else []
        chain += [MinPLogitsWarper(min_p)] if min_p else []
        reference.append(chain)
    expected = per_row_reference(logits, [[0]] * len(settings), reference)
    torch.testing.assert_close(run(rows, logits), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_transformers(size):
    generator = torch.Generator().manual_seed(size)
    # Two distinct ids, so repeated n-grams really occur.
    hist = [(torch.randint(0, 2, (6,), generator=generator).tolist(),
             torch.randint(0, 2, (n,), generator=generator).tolist()) for n in (0, 3, 9, 20)]
    rows = [SamplingRow(SamplingParams(no_repeat_ngram_size=size), p, o) for p, o in hist]
    logits = random_logits(len(rows), size)
    expected = per_row_reference(logits, [p + o for p, o in hist], [[NoRepeatNGramLogitsProcessor(size)]] * 4)
    got = run(rows, logits)
    torch.testing.assert_close(got, expected)
    assert torch.isinf(got).any()


def test_min_tokens_matches_transformers_min_new_tokens():
    hist = [([1, 2, 3], list(range(n))) for n in (0, 2, 4, 5, 9)]
    rows = [SamplingRow(SamplingParams(min_tokens=5), p, o) for p, o in hist]
    logits = random_logits(len(rows), 3)
    reference = [[MinNewTokensLengthLogitsProcessor(len(p), 5, EOS)] for p, _ in hist]
    expected = per_row_reference(logits, [p + o for p, o in hist], reference)
    torch.testing.assert_close(run(rows, logits), expected)


def test_min_tokens_also_bans_stop_token_ids_and_respects_ignore_eos():
    rows = [SamplingRow(SamplingParams(min_tokens=2, stop_token_ids=[11, 12])),
            SamplingRow(SamplingParams(min_tokens=2, ignore_eos=True)),
            SamplingRow(SamplingParams(min_tokens=2, stop_token_ids=[11]), output_ids=[4, 4])]
    got = run(rows, torch.zeros(3, VOCAB))
    assert torch.isinf(got[0, [EOS, 11, 12]]).all() and torch.isfinite(got[0]).sum() == VOCAB - 3
    assert torch.isfinite(got[1]).all()
    assert torch.isfinite(got[2]).all()


def test_frequency_and_presence_penalties_count_output_tokens_only():
    rows = [SamplingRow(SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), [9, 9, 9], [4, 4, 4, 5]),
            SamplingRow(SamplingParams(), [1], [4])]
    logits = random_logits(2, 4)
    expected = logits.clone()
    expected[0, 4] -= 0.5 * 3 + 1.0
    expected[0, 5] -= 0.5 * 1 + 1.0
    torch.testing.assert_close(run(rows, logits), expected)


def test_compiled_penalties_equal_the_torch_forms_to_the_bit():
    generator = torch.Generator().manual_seed(5)
    settings = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.35),
                SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.4), SamplingParams(),
                SamplingParams(presence_penalty=1.5), SamplingParams(repetition_penalty=1.1, frequency_penalty=0.1)]
    rows = []
    for i, params in enumerate(settings * 3):
        # Few distinct ids, so every row repeats some; ids past the logits (padded embeddings) are skipped.
        prompt = torch.randint(0, 40, (int(torch.randint(0, 60, (1,), generator=generator)),), generator=generator)
        output = torch.randint(0, 40, (int(torch.randint(0, 60, (1,), generator=generator)),), generator=generator)
        rows.append(SamplingRow(params, prompt.tolist() + [VOCAB + i, VOCAB - 1 - i % 3], output.tolist() + [-1]))
    logits = random_logits(len(rows), 11)
    logits[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    # A batch whose vocabulary is narrower than the logits skips the ids past it on both paths.
    for vocab in (VOCAB, VOCAB - 2):
        batch = SamplingBatch.build(rows, vocab)
        for processor in (RepetitionPenalty(), FrequencyPresencePenalty()):
            assert processor.is_active(batch)
            compiled, reference = processor(logits.clone(), batch), processor.with_torch(logits.clone(), batch)
            assert not torch.equal(compiled[1:], logits[1:])             # row 0 holds a NaN
            torch.testing.assert_close(compiled, reference, rtol=0, atol=0, equal_nan=True)
            # Logits that are not contiguous take the torch form.
            strided = torch.empty(VOCAB, len(rows)).t().copy_(logits)
            torch.testing.assert_close(processor(strided.clone(memory_format=torch.preserve_format), batch), reference,
                                       rtol=0, atol=0, equal_nan=True)


def test_logit_bias_and_bad_token_id():
    rows = [SamplingRow(SamplingParams(logit_bias={3: 2.5, 10: -100.0})), SamplingRow(SamplingParams())]
    logits = random_logits(2, 6)
    expected = logits.clone()
    expected[0, 3] += 2.5
    expected[0, 10] -= 100.0
    torch.testing.assert_close(run(rows, logits), expected)
    with pytest.raises(ValueError, match="row 1: logit_bias token id 300"):
        SamplingBatch.build([rows[0], SamplingRow(SamplingParams(logit_bias={VOCAB: 1.0}))], VOCAB)


def test_mixed_rows_equal_each_row_alone():
    settings = [
        {},                                                             # greedy
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.2, "top_k": 10, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
        {"temperature": 0.9, "min_p": 0.1, "typical_p": 0.8, "presence_penalty": 0.4, "logit_bias": {1: 1.0}},
        {"temperature": 1.0, "frequency_penalty": -0.5, "min_tokens": 3},
    ]
    hist = histories(len(settings), 9)
    rows = [SamplingRow(SamplingParams(**s), p, o) for s, (p, o) in zip(settings, hist)]
    logits = random_logits(len(rows), 9)
    together = run(rows, logits)
    for i, row in enumerate(rows):
        torch.testing.assert_close(together[i: i + 1], run([row], logits[i: i + 1]))


def test_histories_given_as_int64_arrays_process_like_lists():
    # The engine passes views of each sequence's id array; every processor that reads the history must agree.
    settings = [{"repetition_penalty": 1.3, "no_repeat_ngram_size": 2, "min_tokens": 20},
                {"frequency_penalty": 0.6, "presence_penalty": 0.2, "repetition_penalty": 0.9},
                {"no_repeat_ngram_size": 3, "frequency_penalty": -0.3}, {}]
    hist = histories(len(settings), 12)
    lists = [SamplingRow(SamplingParams(**s), p, o) for s, (p, o) in zip(settings, hist)]
    arrays = []
    for s, (p, o) in zip(settings, hist):
        ids = np.array(p + o + [EOS, EOS], dtype=np.int64)     # ids past the history, as a longer buffer holds
        arrays.append(SamplingRow(SamplingParams(**s), ids[:len(p)], ids[len(p):len(p) + len(o)]))
    logits = random_logits(len(settings), 12)
    torch.testing.assert_close(run(arrays, logits), run(lists, logits), rtol=0, atol=0)
    from_arrays, from_lists = SamplingBatch.build(arrays, VOCAB), SamplingBatch.build(lists, VOCAB)
    for processor in (RepetitionPenalty(), FrequencyPresencePenalty()):     # the torch forms read padded histories
        torch.testing.assert_close(processor.with_torch(logits.clone(), from_arrays),
                                   processor.with_torch(logits.clone(), from_lists), rtol=0, atol=0)


def test_unused_features_leave_logits_untouched():
    rows = [SamplingRow(SamplingParams(), [1, 2], [3]), SamplingRow(SamplingParams(temperature=1.0), [4], [])]
    logits = random_logits(2, 10)
    assert torch.equal(run(rows, logits), logits)


def test_constraint_bitmask_masks_disallowed_tokens():
    bitmask = allocate_token_bitmask(2, VOCAB)
    bitmask[0, :] = 0
    bitmask[0, 0] = 1 << 5                    # row 0: only token 5
    bitmask[0, 8] = -(1 << 31)                # and token 8 * 32 + 31 (the sign bit)
    rows = [SamplingRow(SamplingParams()), SamplingRow(SamplingParams())]
    got = run(rows, random_logits(2, 11), token_bitmask=torch.from_numpy(bitmask))
    assert torch.isfinite(got[0]).nonzero().flatten().tolist() == [5, 8 * 32 + 31]
    assert torch.isfinite(got[1]).all()


def test_top_k_top_p_past_the_candidate_window_matches_transformers():
    # With 16 candidates, flat rows have nuclei wider than the window (full-sort path), peaked rows do not,
    # and top_k = 40 widens the window for the whole batch.
    settings = [(0, 0.9), (0, 0.5), (0, 0.9), (40, 0.95), (0, 1.0), (5, 0.3)]
    logits = random_logits(len(settings), 12, scale=0.5)
    logits[2] *= 30
    rows = [SamplingRow(SamplingParams(temperature=1.0, top_k=k, top_p=p)) for k, p in settings]
    reference = [([TopKLogitsWarper(k)] if k else []) + ([TopPLogitsWarper(p)] if p < 1 else []) for k, p in settings]
    expected = per_row_reference(logits, [[0]] * len(settings), reference)
    batch = SamplingBatch.build(rows, VOCAB)
    got = LogitsPipeline([TopKTopP(candidates=16)])(logits.clone(), batch)
    torch.testing.assert_close(got, expected)
    kept = torch.isfinite(got).sum(dim=1).tolist()
    assert kept[0] > 16 and kept[2] < 16 and kept[4] == VOCAB


def test_penalties_on_the_first_step_before_any_history():
    # The first decode step has no generated ids (and a row may have no prompt ids either).
    rows = [SamplingRow(SamplingParams(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.4), [], []),
            SamplingRow(SamplingParams(frequency_penalty=0.5), [3, 4], [])]
    logits = random_logits(2, 13)
    torch.testing.assert_close(run(rows, logits), logits)    # nothing seen yet, nothing penalised


def test_typical_p_past_the_candidate_window_matches_transformers():
    # A 20k vocabulary with 64 candidates: peaked rows find their typical set among the candidates, flat rows
    # need more than 64 tokens and take the full sort; a typical_p = 1 row is left alone.
    vocab, masses = 20_000, [0.2, 0.9, 0.95, 0.5, 1.0]
    generator = torch.Generator().manual_seed(14)
    logits = torch.randn(len(masses), vocab, generator=generator)
    logits[:2] *= 12                                    # peaked: a handful of tokens hold the mass
    rows = [SamplingRow(SamplingParams(temperature=1.0, typical_p=m)) for m in masses]
    reference = [[TypicalLogitsWarper(m)] if m < 1 else [] for m in masses]
    expected = per_row_reference(logits, [[0]] * len(masses), reference)
    batch = SamplingBatch.build(rows, vocab)
    got = LogitsPipeline([TypicalP(candidates=64)])(logits.clone(), batch)
    torch.testing.assert_close(got, expected)
    kept = torch.isfinite(got).sum(dim=1).tolist()
    assert kept[0] < 64 and kept[1] < 64 and kept[2] > 64 and kept[4] == vocab
