"""Speculative decoding (prompt lookup and a draft model) changes how many forward passes a request takes,
never what it generates: greedy outputs equal plain decoding and transformers token for token, sampled
outputs follow the same distribution, and every KV block (the target's and the draft's) is freed."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import jsonschema
import numpy as np
import pytest
import torch

import leapgen
from checkpoints import build_checkpoint, build_checkpoint_for_tokenizer
from leapgen import JsonSchema, SamplingParams
from leapgen.decoding.speculative import DraftRequest, constrain_draft
from leapgen.engine import llm_engine
from leapgen.engine.admission import RequestError
from leapgen.engine.draft_model import DraftModelProposer
from stats_util import chi_square_critical, homogeneity_statistic
from tokenizers_util import byte_level_bpe

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "city": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "city", "age"],
    "additionalProperties": False,
}
PROMPTS = ["the cat sat on the mat, the cat sat on the", "abc abc abc abc abc", "x",
           "one two three four one two three four one two", "name: Ada; city: Rome; name: Ada; city:"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A byte-level BPE target, a one-layer draft on the same tokenizer, and the target's transformers model."""
    tokenizer = byte_level_bpe()
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    hf = build_checkpoint_for_tokenizer(target, tokenizer)
    build_checkpoint_for_tokenizer(draft, tokenizer, seed=1, layers=1)
    return target, draft, hf


def make_llm(directory, speculative=None, **options):
    return leapgen.LLM(directory, dtype="float32", kv_cache_memory=options.pop("kv_cache_memory", "16MiB"),
                       block_size=8, speculative=speculative, **options)


def configs(dirs) -> dict[str, dict]:
    target, draft, _ = dirs
    return {"ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3},
            "draft": {"method": "draft", "model": str(draft), "num_speculative_tokens": 3},
            "draft-is-target": {"method": "draft", "model": str(target), "num_speculative_tokens": 4}}


@pytest.fixture(scope="module")
def plain(dirs):
    return make_llm(dirs[0])


@pytest.fixture(scope="module", params=["ngram", "draft", "draft-is-target"])
def speculating(request, dirs):
    return make_llm(dirs[0], configs(dirs)[request.param])


def assert_idle(llm) -> None:
    engine = llm.engine
    assert not engine.has_unfinished and not engine.requests
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    draft_cache = getattr(engine.proposer, "block_manager", None)
    if draft_cache is not None:
        assert draft_cache.num_free_blocks == draft_cache.num_blocks and not engine.proposer.mirrors


GREEDY_CASES = {
    "plain": SamplingParams(max_tokens=40),
    "stops-penalties-logprobs": SamplingParams(max_tokens=40, repetition_penalty=1.3, frequency_penalty=0.5,
                                               stop=["e t", "c a"], min_tokens=3, logprobs=2),
    "json-schema": SamplingParams(max_tokens=80, constraint=JsonSchema(SCHEMA, {"whitespace": "compact"})),
    # (a draft ending in eos once a jump has closed the text: the row after the eos allowed nothing, an error)
    "json-schema-flexible": SamplingParams(max_tokens=80, constraint=JsonSchema(SCHEMA, {"whitespace": "flexible"})),
}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_outputs_equal_plain_decoding(plain, speculating, case):
    params = GREEDY_CASES[case]
    expected = plain.generate(PROMPTS, params)
    outputs = speculating.generate(PROMPTS, params)
    for want, got in zip(expected, outputs):
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.finish_reason == want.finish_reason and got.outputs[0].stop_reason == want.outputs[0].stop_reason
        if params.logprobs:
            assert [lp.token_id for lp in got.outputs[0].logprobs] == got.token_ids
            assert np.allclose([lp.logprob for lp in got.outputs[0].logprobs],
                               [lp.logprob for lp in want.outputs[0].logprobs], atol=1e-4)
        if params.constraint is not None:
            jsonschema.validate(json.loads(got.text), SCHEMA)
    drafted = sum(o.metrics.drafted_tokens for o in outputs)
    assert drafted > 0 and sum(o.metrics.accepted_tokens for o in outputs) <= drafted
    assert_idle(speculating)


JSON_PROMPTS = ['{"name":"Ada","city":"Rome","age":36}\n{"name":"Ada","city":"Rome","age":36}\n',
                '{"name": "Bo", "city": "Oslo", "age": 7} and again {"name": "Bo", "city": "Oslo", "age": 7} once more',
                '{"name":"Ada","city":"Rome","age":36}{"name":"Ada","city":"Ro']


@pytest.mark.parametrize("whitespace", ["compact", "dumps", "flexible"])
def test_drafts_through_forced_text_give_the_forced_tokenization(plain, speculating, whitespace):
    """Drafts copied from JSON in the prompt run through keys the schema forces: with forced-token jumps on,
    speculation must append the same forced tokens plain decoding does, not the draft's tokenization."""
    params = SamplingParams(max_tokens=60, constraint=JsonSchema(SCHEMA, {"whitespace": whitespace}))
    expected = plain.generate(JSON_PROMPTS, params)
    outputs = speculating.generate(JSON_PROMPTS, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    assert sum(o.metrics.forced_tokens for o in outputs) == sum(o.metrics.forced_tokens for o in expected) > 0
    assert_idle(speculating)


def test_greedy_equals_transformers(dirs, speculating):
    hf = dirs[2]
    tokenizer = speculating.tokenizer
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        reference = hf.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
        ours = speculating.generate([prompt], SamplingParams(max_tokens=24, min_tokens=24))[0]
        assert ours.token_ids == reference.tolist()


def test_a_draft_equal_to_the_target_accepts_every_token(dirs):
    llm = make_llm(dirs[0], configs(dirs)["draft-is-target"])
    for output in llm.generate(PROMPTS, SamplingParams(max_tokens=30)):
        metrics = output.metrics
        assert metrics.drafted_tokens > 0 and metrics.accepted_tokens == metrics.drafted_tokens
        assert metrics.forward_passes < len(output.token_ids) / 2       # k + 1 tokens per pass
    assert_idle(llm)


def test_the_draft_model_stays_inside_the_constraint(dirs, plain):
    """Masked by the grammar, a draft equal to the target never guesses wrong under a schema either."""
    llm = make_llm(dirs[0], configs(dirs)["draft-is-target"])
    params = GREEDY_CASES["json-schema"]
    for want, got in zip(plain.generate(PROMPTS, params), llm.generate(PROMPTS, params)):
        assert got.token_ids == want.token_ids
        assert got.metrics.accepted_tokens == got.metrics.drafted_tokens > 0
        assert got.metrics.forward_passes < want.metrics.forward_passes
    assert_idle(llm)


def test_preempted_drafts_are_recomputed_without_them(dirs, plain):
    """A cache too small for the batch: sequences holding drafts are preempted, and outputs stay the same."""
    llm = make_llm(dirs[0], configs(dirs)["ngram"], kv_cache_memory="96KiB", max_num_seqs=8)
    prompts = PROMPTS * 4
    params = SamplingParams(max_tokens=40)
    outputs = llm.generate(prompts, params)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in plain.generate(prompts, params)]
    assert_idle(llm)


def test_seeded_sampling_is_reproducible_and_n_samples_speculate(dirs):
    llm = make_llm(dirs[0], configs(dirs)["ngram"])
    params = SamplingParams(max_tokens=30, temperature=0.7, top_k=5, seed=7, n=3)
    first = llm.generate(PROMPTS, params)
    again = llm.generate(PROMPTS, params)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in again]
    assert sum(o.metrics.accepted_tokens for o in first) > 0
    assert_idle(llm)


def test_a_target_behind_its_mirror_drafts_from_its_last_token(dirs):
    """A target that took part of the last draft and no token of its own (a forced-token jump comes next) holds
    no more tokens than its mirror in the draft has computed: the mirror computes the target's last token again
    for the first guess, and drafts what a new mirror would."""
    llm = make_llm(dirs[0], configs(dirs)["draft"])
    proposer = llm.engine.proposer
    tokens = llm.tokenizer.encode(PROMPTS[0])
    first = proposer.propose([DraftRequest(0, tokens, 3)])[0]
    assert len(first) == 3          # the mirror holds the three guesses, the first two computed
    behind = tokens + first[:2]
    assert proposer.propose([DraftRequest(0, behind, 3)]) == proposer.propose([DraftRequest(1, behind, 3)])
    for seq_id in (0, 1):
        proposer.release(seq_id)
    assert proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_a_proposer_failure_ends_only_its_request(dirs, plain, monkeypatch):
    """The draft fails for one sequence of a batch: that request ends with the error, the others decode as
    without speculation."""
    llm = make_llm(dirs[0], configs(dirs)["draft"])
    propose = DraftModelProposer.propose
    poisoned = llm.tokenizer.encode(PROMPTS[2])

    def failing(self, requests):
        if any(list(r.token_ids[:len(poisoned)]) == poisoned for r in requests):
            raise RuntimeError("the draft broke")
        return propose(self, requests)

    monkeypatch.setattr(DraftModelProposer, "propose", failing)
    params = SamplingParams(max_tokens=20)
    outputs = llm.generate(PROMPTS, params, on_error="return")
    expected = plain.generate(PROMPTS, params)
    assert outputs[2].finish_reason == "error" and "the draft broke" in outputs[2].error
    for i in (0, 1, 3, 4):
        assert outputs[i].error is None and outputs[i].token_ids == expected[i].token_ids
    assert_idle(llm)


def test_a_request_whose_second_sample_fails_its_draft_gets_no_more_drafts(dirs, monkeypatch):
    """n=2 under a constraint: the batch fails, the first sample drafts alone, the second fails and ends the
    request; the first sample's draft is then not set on its retired sequence."""
    llm = make_llm(dirs[0], configs(dirs)["draft"])
    propose = DraftModelProposer.propose
    second = 2                                   # (the request's sequence ids: 0 reads the prompt, then 1 and 2)

    def failing(self, requests):
        if len(requests) > 1 or requests[0].seq_id == second and len(requests[0].token_ids) > 30:
            raise RuntimeError("the draft broke")
        return propose(self, requests)

    drafted_after_the_end = []
    set_draft = llm_engine.SequenceState.set_draft

    def watched(state, draft, masks):
        if state.seq.is_finished:
            drafted_after_the_end.append(state.seq.seq_id)
        set_draft(state, draft, masks)

    monkeypatch.setattr(DraftModelProposer, "propose", failing)
    monkeypatch.setattr(llm_engine.SequenceState, "set_draft", watched)
    params = SamplingParams(max_tokens=60, n=2, temperature=0.8, seed=3,
                            constraint=JsonSchema(SCHEMA, {"whitespace": "compact"}))
    outputs = llm.generate([PROMPTS[4], PROMPTS[1]], params, on_error="return")
    assert "the draft broke" in outputs[0].error and drafted_after_the_end == []
    assert_idle(llm)


def test_a_draft_ending_in_eos_leaves_the_row_after_it_open(plain):
    """The verification row after an eos is never sampled from (the sequence ends there if the eos is taken): it is
    left open, where a matcher past its eos allows nothing, which reads as an error; the matcher ends where it began."""
    vocabulary = plain.engine.vocabulary
    matcher = plain.engine.compile(leapgen.Regex("abc")).matcher()
    before = np.zeros(vocabulary.mask_words, dtype=np.int32)
    matcher.fill_bitmask(before)
    tokens = plain.tokenizer.encode("abc") + [vocabulary.eos_ids[0]]
    draft, masks = constrain_draft(matcher, tokens + [5], vocabulary.mask_words, vocabulary.eos_ids)
    assert draft == tokens and len(masks) == len(tokens) + 1
    assert (masks[-1] == -1).all() and all(row.any() for row in masks[:-1])
    after = np.zeros(vocabulary.mask_words, dtype=np.int32)
    matcher.fill_bitmask(after)
    assert (after == before).all()


def test_a_user_processor_failing_on_a_row_verification_throws_away_fails_nothing(dirs, plain):
    """Every verification row runs the user's processors, the rows past a rejected draft token too; an error
    there (a history plain decoding never meets) failed the request.  This processor bans the draft model's first
    guess and refuses any history holding it: plain decoding never shows it one."""
    llm = make_llm(dirs[0], configs(dirs)["draft"])
    prompt = PROMPTS[0]
    draft_model = make_llm(dirs[1])
    banned = draft_model.generate([prompt], SamplingParams(max_tokens=1))[0].token_ids[0]
    start = len(llm.tokenizer.encode(prompt))

    def ban_and_check(input_ids, scores):
        if banned in input_ids[0, start:].tolist():
            raise AssertionError("the banned token reached the processor's history")
        scores = scores.clone()
        scores[:, banned] = -float("inf")
        return scores

    params = SamplingParams(max_tokens=20, logits_processors=[ban_and_check])
    expected, got = plain.generate([prompt], params)[0], llm.generate([prompt], params)[0]
    assert got.error is None and got.token_ids == expected.token_ids and banned not in got.token_ids
    assert got.metrics.drafted_tokens > got.metrics.accepted_tokens     # the banned guess was drafted, and rejected
    # a processor that leaves a row nothing to take, on rows past a rejected draft token: the same
    bans_all_after = [banned]

    def nothing_after_the_guess(input_ids, scores):
        if banned in input_ids[0, start:].tolist():
            return torch.full_like(scores, -float("inf"))
        scores = scores.clone()
        scores[:, bans_all_after] = -float("inf")
        return scores

    params = SamplingParams(max_tokens=20, logits_processors=[nothing_after_the_guess])
    assert llm.generate([prompt], params)[0].token_ids == plain.generate([prompt], params)[0].token_ids
    assert_idle(llm)


def test_the_draft_models_cache_comes_out_of_the_same_budget(dirs):
    """kv_cache_memory bounds both caches (the draft's, as many blocks as the target's, came on top of it)."""
    llm = make_llm(dirs[0], configs(dirs)["draft-is-target"], kv_cache_memory="16MiB")
    caches = (llm.engine.runner.kv_cache, llm.engine.proposer.runner.kv_cache)
    assert 15 * 2**20 < sum(cache.numel() * cache.element_size() for cache in caches) <= 16 * 2**20
    assert llm.engine.block_manager.num_blocks == llm.engine.proposer.block_manager.num_blocks


def test_accepted_tokens_count_only_what_joins_the_output(dirs, plain):
    """A stop inside an accepted draft: the draft tokens past it are not counted as accepted."""
    llm = make_llm(dirs[0], configs(dirs)["draft-is-target"])
    free = plain.generate(PROMPTS[:1], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    output = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=12, stop_token_ids=[free[3]]))[0]
    assert output.token_ids == free[:free.index(free[3]) + 1]
    # the first token from the prompt's pass, the rest from the first draft (4 tokens), cut at the stop
    assert output.metrics.accepted_tokens == len(output.token_ids) - 1 < output.metrics.drafted_tokens


def test_a_request_can_turn_speculation_off(dirs):
    llm = make_llm(dirs[0], configs(dirs)["ngram"])
    output = llm.generate(PROMPTS[:1], SamplingParams(max_tokens=20, speculative=False))[0]
    assert output.metrics.drafted_tokens == 0 and output.metrics.forward_passes == 20


def joint_counts(llm, prompt, params) -> tuple[Counter, leapgen.RequestMetrics]:
    """Counts of the first three sampled tokens over the request's `n` samples, and the request's metrics."""
    output = llm.generate([prompt], params)[0]
    return Counter(tuple(c.token_ids[:3]) for c in output.outputs), output.metrics


SAMPLING = SamplingParams(max_tokens=3, min_tokens=3, temperature=1.0, top_k=3, n=2500, seed=11)
# Every token of the word-level vocabulary once: prompt lookup always finds the last token and drafts.
LOOKUP_PROMPT = [int(t) for t in np.random.default_rng(0).permutation(np.arange(3, 96))]


@pytest.fixture(params=["ngram", "draft-is-target"])
def sampling_pair(request, tmp_path):
    """(plain, speculating) engines on a word-level tiny model: prompt lookup drafts every step (mostly
    rejected); a draft equal to the target drafts its argmax (accepted or rejected about equally)."""
    build_checkpoint(tmp_path, "llama")
    speculative = {"method": "ngram", "num_speculative_tokens": 2} if request.param == "ngram" else \
        {"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 2}
    room = {"kv_cache_memory": "64MiB", "max_num_seqs": SAMPLING.n}     # all the samples of one request at once
    return make_llm(tmp_path, **room), make_llm(tmp_path, speculative, **room)


def test_speculative_sampling_follows_the_plain_distribution(sampling_pair):
    """Chi-square homogeneity of the joint (t1, t2, t3) over 2,500 samples each, top-3 of a tiny model."""
    plain, speculating = sampling_pair
    statistic, df, metrics = compare(plain, speculating)
    assert metrics.drafted_tokens >= SAMPLING.n // 4    # most samples drafted (a full draft cache drafts less)
    if isinstance(speculating.engine.proposer, DraftModelProposer):      # its argmax guesses: both branches ran
        assert 0.2 < metrics.acceptance_rate < 0.8, metrics
    assert statistic < chi_square_critical(df), (statistic, df)
    assert_idle(speculating)


def test_the_distribution_check_catches_a_broken_acceptance_rule(sampling_pair, monkeypatch):
    plain, speculating = sampling_pair
    monkeypatch.setattr(llm_engine, "accepted_length", lambda draft, sampled: len(draft))   # accepts every guess
    statistic, df, _ = compare(plain, speculating)
    assert statistic > chi_square_critical(df), (statistic, df)


def compare(plain, speculating):
    """Homogeneity statistic and degrees of freedom of plain vs speculative samples, and the speculative
    request's metrics."""
    a, _ = joint_counts(plain, LOOKUP_PROMPT, SAMPLING)
    b, metrics = joint_counts(speculating, LOOKUP_PROMPT, dataclasses.replace(SAMPLING, seed=12))
    cells = sorted(set(a) | set(b))
    statistic, df = homogeneity_statistic(np.array([a[c] for c in cells], float),
                                          np.array([b[c] for c in cells], float))
    return statistic, df, metrics


def test_bad_configurations_are_refused_before_any_work(dirs, tmp_path):
    target = dirs[0]
    cases = [({"method": "medusa", "num_speculative_tokens": 2}, "method must be 'ngram' or 'draft'"),
             ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an int >= 1"),
             ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3}, r"unknown key\(s\) \['lookahead'\]"),
             ({"method": "draft", "num_speculative_tokens": 2}, "speculative.model is required"),
             ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5}, "must not exceed"),
             ({"method": "draft", "model": str(dirs[1]), "num_speculative_tokens": 2, "prompt_lookup_max": 3},
              "prompt_lookup_max only go with method 'ngram'")]
    for config, message in cases:
        with pytest.raises(ValueError, match=message):
            make_llm(target, config)
    build_checkpoint(tmp_path, "llama")              # a word-level vocabulary, not the target's
    with pytest.raises(ValueError, match=r"its tokenizer differs from the target's \(\d+ tokens against \d+\)"):
        make_llm(target, {"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 2})


def test_a_draft_larger_than_its_target_is_named(dirs, tmp_path):
    build_checkpoint_for_tokenizer(tmp_path, byte_level_bpe(), seed=2, layers=4)
    with pytest.warns(UserWarning, match="the draft has [0-9,]+ parameters, the target [0-9,]+; a draft larger"):
        make_llm(dirs[0], {"method": "draft", "model": str(tmp_path), "num_speculative_tokens": 2})


def test_beam_requests_run_unspeculated_beside_speculating_ones(plain, speculating):
    """Beams read one token a step on a speculating engine (each step ranks a request's candidates together), in
    the same batch as requests that speculate: both give what a plain engine gives."""
    beams = SamplingParams(max_tokens=8, num_beams=2, n=2)
    greedy = SamplingParams(max_tokens=20)
    outputs = speculating.generate(PROMPTS[:2], [beams, greedy])
    expected = [plain.generate(PROMPTS[0], beams)[0], plain.generate(PROMPTS[1], greedy)[0]]
    assert [[c.token_ids for c in o.outputs] for o in outputs] == [[c.token_ids for c in o.outputs] for o in expected]
    assert outputs[0].metrics.drafted_tokens == 0
    assert_idle(speculating)


def test_ngram_lookup_takes_the_longest_most_recent_match():
    from leapgen.decoding.speculative import ngram_draft

    tokens = np.array([1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3])
    assert ngram_draft(tokens, 3, 1, 3) == [9, 9, 2]           # "1 2 3" matched at 0 beats "2 3" at 5
    assert ngram_draft(tokens, 3, 1, 2) == [7, 8, 1]           # the latest "2 3"
    assert ngram_draft(np.array([4, 5, 6]), 3, 1, 3) == []
    assert ngram_draft(np.array([4, 4, 4, 4]), 5, 1, 2) == [4]  # never reads past the end
    assert ngram_draft(tokens, 0, 1, 3) == []


def test_streaming_a_speculating_request_joins_to_the_plain_text(plain, speculating):
    """Several tokens may be accepted in one step; the streamed deltas still join to the plain output."""
    for params in (SamplingParams(max_tokens=40, stop=["e t"]), GREEDY_CASES["json-schema"]):
        pieces = list(speculating.stream(PROMPTS[0], params))
        assert all(pieces) and "".join(pieces) == plain.generate([PROMPTS[0]], params)[0].text
    assert_idle(speculating)
