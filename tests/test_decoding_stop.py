"""Incremental detokenizer and stop criteria against real byte-level BPE and SentencePiece tokenizers."""

from __future__ import annotations

import random

import pytest

from leapgen.decoding.detokenizer import IncrementalDetokenizer
from leapgen.decoding.sampling_params import SamplingParams
from leapgen.decoding.stop import StopChecker
from leapgen.grammars.vocab import vocabulary_for
from tokenizers_util import byte_level_bpe, byte_level_with_specials, cl100k, sentencepiece_bpe, training_text

TEXTS = [
    "hello world json name café naïve 中文 字符 😀 x {\"a\": 1}\n",
    "😀😀 字符中文 café key items [1, 2.5]",
    "alpha\nbeta\tgamma  spaces   and ümlauts 🎉✨",
]


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def tokenizer(request):
    return {"byte_level": byte_level_bpe, "sentencepiece": sentencepiece_bpe}[request.param]()


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def stream(tokenizer, prompt_ids, output_ids) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.add([t]) for t in output_ids] + [detok.flush()]


def check_continuation(tokenizer, prompt_text: str, output_text: str) -> None:
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    output = tokenizer.encode(output_text, add_special_tokens=False)
    deltas = stream(tokenizer, prompt, output)
    assert "".join(deltas) == decode(tokenizer, prompt + output)[len(decode(tokenizer, prompt)):]
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_matches_full_decode(tokenizer, text):
    check_continuation(tokenizer, "The answer: ", text)


def test_detokenizer_matches_full_decode_on_generated_corpus(tokenizer):
    lines = training_text(40, seed=7)
    for prompt, output in zip(lines[::2], lines[1::2]):
        check_continuation(tokenizer, prompt, output)


def byte_tokens(tokenizer, text: str) -> list[int]:
    """Ids of single-byte tokens spelling `text`, so every multi-byte character is split across tokens."""
    by_bytes = {}
    for token_id, data in enumerate(vocabulary_for(tokenizer).token_bytes):
        by_bytes.setdefault(data, token_id)
    return [by_bytes[bytes([b])] for b in text.encode()]


def test_partial_utf8_is_held_until_the_character_completes(tokenizer):
    deltas = stream(tokenizer, [], byte_tokens(tokenizer, "a😀é"))
    assert deltas == ["a", "", "", "", "😀", "", "é", ""]


def test_prompt_ending_inside_a_character(tokenizer):
    ids = byte_tokens(tokenizer, "中")
    assert stream(tokenizer, ids[:1], ids[1:]) == ["", "中", ""]


def test_unfinished_character_at_the_end_becomes_a_replacement_char(tokenizer):
    # (SentencePiece's decoder writes one U+FFFD per stray byte, Python's UTF-8 decoder one per broken character.)
    ids = byte_tokens(tokenizer, "😀")[:2]
    assert stream(tokenizer, [], ids) == ["", "", "\ufffd"]


@pytest.mark.slow
def test_detokenizer_on_cl100k():
    for text in TEXTS:
        check_continuation(cl100k(), "Prompt: ", text)


@pytest.mark.parametrize("skip", [True, False])
def test_detokenizer_shows_special_tokens_only_when_asked(skip):
    tok = byte_level_with_specials()
    # a model with 37 padding logit columns that ends on <|end|>: the engine's Vocabulary
    vocabulary = vocabulary_for(tok, size=len(tok) + 37, eos_ids=[tok.convert_tokens_to_ids("<|end|>")])
    ids = tok.encode("héllo<|tool|> wörld 😀<|end|>", add_special_tokens=False)
    detok = IncrementalDetokenizer(vocabulary, skip_special_tokens=skip)
    text = "".join(detok.add([t]) for t in ids + [len(tok) + 3]) + detok.flush()  # a padding id spells nothing
    assert text == tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    assert ("<|tool|>" in text and "<|end|>" in text) is not skip

def generate(tokenizer, text: str, params: SamplingParams, prompt: str = "Q: ") -> tuple[StopChecker, str, int]:
    """Feed `text`'s tokens (then eos) until the checker stops.

    Returns the checker, the full decoded continuation (SentencePiece gives it a leading space) and the tokens used.
    """
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    output_ids = tokenizer.encode(text, add_special_tokens=False)
    full = decode(tokenizer, prompt_ids + output_ids)[len(decode(tokenizer, prompt_ids)):]
    checker = StopChecker(params, [tokenizer.eos_token_id], IncrementalDetokenizer(tokenizer, prompt_ids))
    pieces, used = [], 0
    for token in output_ids + [tokenizer.eos_token_id]:
        pieces.append(checker.append(token))
        used += 1
        if checker.finished:
            break
    assert "".join(pieces) == checker.text
    return checker, full, used


def test_stop_string_spanning_tokens_is_cut(tokenizer):
    text = "hello world json name value"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) >= 4
    checker, full, _ = generate(tokenizer, text, SamplingParams(stop=["ld js"], max_tokens=100))
    assert (checker.text, checker.finish_reason, checker.stop_reason) == (full[: full.find("ld js")], "stop", "ld js")
    assert checker.text.endswith("hello wor")
    checker, full, _ = generate(tokenizer, text, SamplingParams(stop=["ld js"], include_stop_str_in_output=True))
    assert checker.text == full[: full.find("ld js") + 5]


def test_stop_string_inside_one_token_drops_the_rest_of_the_token(tokenizer):
    checker, full, _ = generate(tokenizer, "hello world", SamplingParams(stop=["ell"]))
    assert checker.text == full[: full.find("ell")]


def test_earliest_stop_string_wins(tokenizer):
    checker, full, _ = generate(tokenizer, "alpha beta gamma", SamplingParams(stop=["a gam", "ta", "pha b"]))
    assert (checker.text, checker.stop_reason) == (full[: full.find("pha b")], "pha b")


def test_streaming_never_emits_text_that_a_stop_string_removes(tokenizer):
    rng = random.Random(0)
    for line in training_text(60, seed=3):
        start = rng.randrange(len(line) - 4)
        stop = line[start: start + rng.randint(2, 6)]
        checker, full, _ = generate(tokenizer, line, SamplingParams(stop=[stop], max_tokens=500))
        assert checker.text == full[: full.find(stop)], (line, stop)
        assert checker.stop_reason == stop


def test_eos_stop_token_and_length(tokenizer):
    checker, full, used = generate(tokenizer, "hello world", SamplingParams(max_tokens=100))
    assert (checker.finish_reason, checker.stop_reason, checker.text) == ("stop", None, full)
    world = tokenizer.encode("hello world", add_special_tokens=False)[-1]
    checker, _, _ = generate(tokenizer, "hello world x", SamplingParams(stop_token_ids=[world]))
    assert (checker.finish_reason, checker.stop_reason) == ("stop", world)
    assert "world" not in checker.text
    checker, _, used = generate(tokenizer, "hello world json name value", SamplingParams(max_tokens=3))
    assert (checker.finish_reason, used) == ("length", 3)
    checker, _, _ = generate(tokenizer, "hello world", SamplingParams(ignore_eos=True, max_tokens=100))
    assert checker.finish_reason is None


def test_min_tokens_delays_every_stop(tokenizer):
    text = "hello world json name value"
    n = len(tokenizer.encode(text, add_special_tokens=False))
    checker, _, used = generate(tokenizer, text, SamplingParams(stop=["hel", "name"], min_tokens=2))
    assert checker.stop_reason == "name" and checker.text.endswith("json ")
    # eos as token n + 1 < min_tokens (the MinTokens processor would have banned it) does not stop.
    checker, _, used = generate(tokenizer, text, SamplingParams(min_tokens=n + 2, max_tokens=n + 5))
    assert used == n + 1 and not checker.finished


def test_bad_use_is_named():
    with pytest.raises(ValueError, match="need a detokenizer"):
        StopChecker(SamplingParams(stop=["x"]))
    checker = StopChecker(SamplingParams(max_tokens=1))
    checker.append(5)
    with pytest.raises(RuntimeError, match="after the sequence finished"):
        checker.append(6)
