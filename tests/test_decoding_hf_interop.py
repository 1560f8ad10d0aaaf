"""transformers processors inside leapgen's pipeline, and leapgen grammars inside transformers' generate()."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from leapgen.decoding.batch import SamplingBatch, SamplingRow
from leapgen.decoding.hf_interop import GrammarLogitsProcessor
from leapgen.decoding.pipeline import LogitsPipeline
from leapgen.decoding.sampling_params import SamplingParams
from tokenizers_util import byte_level_bpe

VOCAB = 64


def test_transformers_processors_apply_to_their_own_row_with_its_ids():
    ngram, penalty, suppress = NoRepeatNGramLogitsProcessor(2), RepetitionPenaltyLogitsProcessor(1.7), \
        SuppressTokensLogitsProcessor([5, 6])
    rows = [
        SamplingRow(SamplingParams(logits_processors=[ngram, penalty]), [1, 2, 3], [1, 2]),
        SamplingRow(SamplingParams(), [1, 2], [1]),
        SamplingRow(SamplingParams(temperature=0.5, logits_processors=[suppress]), [4], []),
    ]
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    got = LogitsPipeline()(logits.clone(), SamplingBatch.build(rows, VOCAB))
    ids0 = torch.tensor([[1, 2, 3, 1, 2]])
    torch.testing.assert_close(got[0:1], penalty(ids0, ngram(ids0, logits[0:1].clone())))
    torch.testing.assert_close(got[1], logits[1])
    torch.testing.assert_close(got[2:3], suppress(torch.tensor([[4]]), logits[2:3].clone()) / 0.5)
    assert torch.isinf(got[0, 3]) and torch.isinf(got[2, [5, 6]]).all()


def test_a_failing_processor_fails_its_row_alone_and_is_named():
    def broken(input_ids, scores):
        return scores[:, :10]

    rows = [SamplingRow(SamplingParams()), SamplingRow(SamplingParams(logits_processors=[broken]))]
    batch = SamplingBatch.build(rows, VOCAB)
    logits = torch.randn(2, VOCAB)
    got = LogitsPipeline()(logits.clone(), batch)
    assert list(batch.row_errors) == [1]
    assert re.search(r"logits processor .*broken.* returned \(1, 10\)", str(batch.row_errors[1]))
    torch.testing.assert_close(got, logits)
    with pytest.raises(ValueError, match="logits_processors\\[0\\] must be callable"):
        SamplingParams(logits_processors=["not a processor"])


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_bpe()


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("do_sample, num_beams", [(False, 1), (True, 1), (False, 3)])
def test_grammar_processor_constrains_transformers_generate(tokenizer, tiny_model, do_sample, num_beams):
    grammars = pytest.importorskip("leapgen.grammars")
    if not hasattr(grammars, "compile_regex"):
        pytest.skip("leapgen.grammars.compile_regex is not available yet")
    pattern = r"(yes|no), [0-9]{2}( items)?"
    grammar = grammars.compile_regex(pattern, tokenizer)
    prompts = torch.tensor([tokenizer.encode("answer: ", add_special_tokens=False)] * 3)
    processor = GrammarLogitsProcessor(grammar, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(1)
    with torch.no_grad():
        out = tiny_model.generate(prompts, attention_mask=torch.ones_like(prompts), logits_processor=[processor],
                                  do_sample=do_sample, num_beams=num_beams, num_return_sequences=num_beams,
                                  max_new_tokens=30, pad_token_id=tokenizer.eos_token_id,
                                  eos_token_id=tokenizer.eos_token_id)
    for row in out[:, prompts.shape[1]:].tolist():
        assert tokenizer.eos_token_id in row, "generation must end with eos once the pattern is complete"
        text = tokenizer.decode(row[: row.index(tokenizer.eos_token_id)])
        assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("do_sample, num_beams", [(False, 1), (True, 1), (False, 2)])
def test_grammar_processor_with_the_token_budget_completes_every_row_within_it(tokenizer, tiny_model, do_sample,
                                                                                num_beams):
    """A random model writes long free text: cut by max_new_tokens alone its rows ended mid-pattern."""
    from leapgen import grammars

    pattern = r"[a-z ]{1,60}(, [0-9]{1,20})?\."
    prompts = torch.tensor([tokenizer.encode("say: ", add_special_tokens=False)] * 2)
    for budget in (4, 9):
        processor = GrammarLogitsProcessor(grammars.compile_regex(pattern, tokenizer), tokenizer.eos_token_id,
                                           max_new_tokens=budget)
        torch.manual_seed(2)
        with torch.no_grad():
            out = tiny_model.generate(prompts, attention_mask=torch.ones_like(prompts), logits_processor=[processor],
                                      do_sample=do_sample, num_beams=num_beams, max_new_tokens=budget,
                                      pad_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
        for row in out[:, prompts.shape[1]:].tolist():
            text = tokenizer.decode([t for t in row if t != tokenizer.eos_token_id])
            assert re.fullmatch(pattern, text), (budget, text)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        GrammarLogitsProcessor(grammars.compile_regex(pattern, tokenizer), tokenizer.eos_token_id, max_new_tokens=0)


@pytest.mark.parametrize("checked_at_most", [1024, 8])
def test_grammar_processor_keeps_json_rows_within_a_tight_budget(tokenizer, tiny_model, monkeypatch, checked_at_most):
    """The grammar's mask offers whitespace and string contents after which `}` no longer fits: a row that took
    one was dead (all -inf: greedy wrote token 0 on, sampling raised).  Each allowed token is checked now (past
    `checked_at_most`, the best-scored ones and the shortest completion's)."""
    from leapgen import grammars
    from leapgen.constraints import JsonSchema, is_valid

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array",
              "items": {"type": "string"}}}, "required": ["name", "tags"]}
    grammar = grammars.compile_json_schema(schema, tokenizer)
    shortest = len(grammar.matcher().completion_tokens())
    monkeypatch.setattr(GrammarLogitsProcessor, "checked_at_most", checked_at_most, raising=False)
    prompts = torch.tensor([tokenizer.encode("json: ", add_special_tokens=False)] * 3)
    for budget, do_sample, num_beams in ((shortest + 2, False, 1), (shortest + 2, True, 1), (shortest + 4, True, 1),
                                         (shortest, False, 1), (shortest + 5, False, 2)):
        torch.manual_seed(budget)
        processor = GrammarLogitsProcessor(grammar, tokenizer.eos_token_id, max_new_tokens=budget)
        with torch.no_grad():
            out = tiny_model.generate(prompts, attention_mask=torch.ones_like(prompts), logits_processor=[processor],
                                      do_sample=do_sample, temperature=1.5 if do_sample else None,
                                      num_beams=num_beams, max_new_tokens=budget,
                                      pad_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
        for row in out[:, prompts.shape[1]:].tolist():
            text = tokenizer.decode([t for t in row if t != tokenizer.eos_token_id])
            assert is_valid(JsonSchema(schema), text), (budget, do_sample, text)
    with pytest.raises(ValueError, match=f"max_new_tokens={shortest - 1} is too small for the constraint: its "
                                         f"shortest output takes {shortest} tokens"):
        GrammarLogitsProcessor(grammar, tokenizer.eos_token_id, max_new_tokens=shortest - 1)


def test_grammar_processor_follows_prompt_lookup_decoding(tokenizer, tiny_model):
    # candidate tokens are scored in one pass and the rejected ones taken back: the rows grow by several tokens and
    # shrink again within one generate() call, which is not another call's
    from leapgen import grammars

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    grammar = grammars.compile_json_schema(schema, tokenizer)
    prompt = torch.tensor([tokenizer.encode('json: {"name": "ab"} json: ', add_special_tokens=False)])
    outputs = []
    for lookup in ({}, {"prompt_lookup_num_tokens": 3}):
        processor = GrammarLogitsProcessor(grammar, tokenizer.eos_token_id, max_new_tokens=20)
        with torch.no_grad():
            out = tiny_model.generate(prompt, attention_mask=torch.ones_like(prompt), logits_processor=[processor],
                                      do_sample=False, max_new_tokens=20, pad_token_id=tokenizer.eos_token_id,
                                      eos_token_id=tokenizer.eos_token_id, **lookup)
        outputs.append(tokenizer.decode([t for t in out[0, prompt.shape[1]:].tolist() if t != tokenizer.eos_token_id]))
    assert outputs[0] == outputs[1] and json.loads(outputs[0])["name"] is not None


def test_past_checked_at_most_a_complete_text_keeps_eos(tokenizer, monkeypatch):
    # a complete text where more tokens are allowed than are checked: its shortest completion is eos, kept beside
    # the best-scored (the union of those with it took float ids and raised)
    from leapgen import grammars

    monkeypatch.setattr(GrammarLogitsProcessor, "checked_at_most", 8)
    processor = GrammarLogitsProcessor(grammars.compile_regex(r"a[\s\S]*", tokenizer), tokenizer.eos_token_id,
                                       max_new_tokens=6)
    a = tokenizer.encode("a", add_special_tokens=False)[0]
    processor(torch.tensor([[5]]), torch.zeros(1, len(tokenizer)))
    scores = processor(torch.tensor([[5, a]]), torch.arange(len(tokenizer), dtype=torch.float)[None])
    kept = set(torch.isfinite(scores[0]).nonzero().flatten().tolist())
    best = set(range(len(tokenizer) - 8, len(tokenizer)))      # the highest scores
    assert tokenizer.eos_token_id in kept and kept - {tokenizer.eos_token_id} <= best and len(kept) >= 8


def test_grammar_processor_follows_rows_that_beam_search_reorders(tokenizer):
    grammars = pytest.importorskip("leapgen.grammars")
    grammar = grammars.compile_regex("(ab|ba)c", tokenizer)
    processor = GrammarLogitsProcessor(grammar, eos_token_id=tokenizer.eos_token_id)
    a, b, c = (tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "abc")
    prompt = [c, c]

    def masked(rows):
        scores = processor(torch.tensor([prompt + row for row in rows]), torch.zeros(len(rows), len(tokenizer)))
        return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in scores]

    def allowed(row):
        matcher = grammar.matcher()
        for token in row:
            matcher.advance(token)
        return set(matcher.allowed_token_ids().tolist())

    assert masked([[], []]) == [allowed([]), allowed([])]
    assert masked([[a], [b]]) == [allowed([a]), allowed([b])]
    # beams swapped rows and one of them forked into both
    for rows in ([[b, a], [a, b]], [[a, b], [a, b]], [[b, a], [b, a]]):
        assert masked(rows) == [allowed(row) for row in rows]
    # a candidate the mask had given -inf (beam search keeps some): its row stays masked whole
    assert masked([[a, b, c], [b, b, c]]) == [allowed([a, b, c]), set()]


def test_a_reused_grammar_processor_is_refused(tokenizer):
    grammars = pytest.importorskip("leapgen.grammars")
    processor = GrammarLogitsProcessor(grammars.compile_regex("a+", tokenizer), eos_token_id=tokenizer.eos_token_id)
    scores = torch.zeros(2, len(tokenizer))
    processor(torch.zeros(2, 3, dtype=torch.long), scores)
    with pytest.raises(ValueError, match="started on 2 rows.*fresh processor"):
        processor(torch.zeros(4, 4, dtype=torch.long), torch.zeros(4, len(tokenizer)))
    # as many rows, another prompt: its tokens past the first prompt's length were read as output (greedy wrote ''
    # for `(yes|no)`, sampling raised on all -inf)
    with pytest.raises(ValueError, match="another generate\\(\\) call's"):
        processor(torch.ones(2, 6, dtype=torch.long), scores)
    # ...or the last output fed back as the prompt: it begins as the first call's did, and is longer
    with pytest.raises(ValueError, match="last saw them 3 tokens long; these 2 rows of length 9"):
        processor(torch.zeros(2, 9, dtype=torch.long), scores)


def test_the_processors_eos_ids_are_checked(tokenizer):
    grammars = pytest.importorskip("leapgen.grammars")
    grammar = grammars.compile_regex("a+", tokenizer)
    eos = tokenizer.eos_token_id
    for given in (eos, [eos], (eos, eos + 1), torch.tensor([eos]), torch.tensor(eos), np.int64(eos)):
        assert GrammarLogitsProcessor(grammar, given).eos_token_ids >= {eos}    # a tensor's ids were never matched
    for given in (None, "</s>", [], [eos, "x"], True):
        with pytest.raises(TypeError, match="eos_token_id must be a token id or a non-empty sequence"):
            GrammarLogitsProcessor(grammar, given)
    # generate would not stop where the grammar ends the text: the row went on past it, dead
    with pytest.raises(ValueError, match=f"holds none of the grammar's end-of-text tokens \\[{eos}\\]"):
        GrammarLogitsProcessor(grammar, eos + 5)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        GrammarLogitsProcessor(grammar, eos, max_new_tokens=True)
    # a grammar that may also end on a token generate does not stop on: that one leaves the masks (the row took it
    # and was dead)
    two_ends = grammars.compile_regex("yes|no", grammars.vocabulary_for(tokenizer, eos_ids=[eos, 7]))
    processor = GrammarLogitsProcessor(two_ends, eos)
    prompt = [5]
    processor(torch.tensor([prompt]), torch.zeros(1, len(tokenizer)))
    for token in tokenizer.encode("yes", add_special_tokens=False):
        prompt.append(token)
        scores = processor(torch.tensor([prompt]), torch.zeros(1, len(tokenizer)))
    assert torch.isfinite(scores[0]).nonzero().flatten().tolist() == [eos]


def test_logits_narrower_than_the_tokenizer_are_masked(tokenizer):
    # a model with fewer logits than the tokenizer has tokens (the bitmask was the logits' width, too narrow)
    grammars = pytest.importorskip("leapgen.grammars")
    processor = GrammarLogitsProcessor(grammars.compile_regex("a+", tokenizer), tokenizer.eos_token_id)
    a = tokenizer.encode("a", add_special_tokens=False)[0]
    scores = processor(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, len(tokenizer) - 100))
    assert scores.shape == (1, len(tokenizer) - 100) and bool(torch.isfinite(scores[0, a]))