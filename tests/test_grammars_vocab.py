"""Token bytes of every tokenizer kind round-trip through the tokenizer's own decoder; a Vocabulary
wider than its tokenizer (padded embeddings), with the model's eos ids, shared by grammars and detokenizer."""

import random

import numpy as np
import pytest
import tokenizers_util as tu

from leapgen.grammars import compile_json_schema, compile_lark, compile_regex
from leapgen.grammars.vocab import build_trie, vocabulary_for

TEXTS = [
    "Hello, world! It's 2024-05-01T12:00:00Z.",
    '{"name": "Zoë", "tags": ["naïve", "中文", "😀"], "n": -1.5e+10}\n\t  ',
    "  leading and trailing spaces  \n\nnew\r\nlines ǅ ﬁ \u00a0 \u200b",
    "x" * 50 + " 1234567890 " + "ab" * 20,
]
KINDS = [pytest.param(k, marks=pytest.mark.slow) if k == "o200k" else k for k in sorted(tu.ALL)]  # o200k: ~3 s


@pytest.mark.parametrize("kind", KINDS)
def test_token_bytes_round_trip(kind):
    tok = tu.ALL[kind]()
    vocab = vocabulary_for(tok)
    assert vocabulary_for(tok) is vocab  # cached per tokenizer
    assert vocab.eos_ids == (tok.eos_token_id,)
    assert vocab.token_bytes[tok.eos_token_id] is None
    anchor = [tok.convert_tokens_to_ids("a")]
    for text in TEXTS:
        ids = anchor + tok.encode(text, add_special_tokens=False)
        # decode after a plain token so SentencePiece's strip of one leading space does not apply
        assert b"".join(vocab.token_bytes[i] for i in ids).decode("utf-8") == tok.decode(ids)
        assert vocab.encode(text.encode("utf-8")) and b"".join(
            vocab.token_bytes[i] for i in vocab.encode(text.encode("utf-8"))
        ) == text.encode("utf-8")


def test_sentencepiece_byte_fallback_tokens():
    tok = tu.sentencepiece_bpe()
    vocab = vocabulary_for(tok)
    byte_tokens = {tok.convert_tokens_to_ids(f"<0x{b:02X}>"): b for b in range(256)}
    assert all(vocab.token_bytes[tid] == bytes([b]) for tid, b in byte_tokens.items())


def test_trie_layout():
    tokens = [b"ab", None, b"a", b"abc", b"b", b"ab", b""]
    trie = build_trie(tokens)
    # preorder: root, a, ab, abc, b
    assert trie.byte.tolist() == [0, ord("a"), ord("b"), ord("c"), ord("b")]
    assert trie.depth.tolist() == [0, 1, 2, 3, 1]
    assert trie.end.tolist() == [5, 4, 4, 4, 5]
    ids = [sorted(trie.tok_ids[trie.tok_ptr[i] : trie.tok_ptr[i + 1]].tolist()) for i in range(5)]
    assert ids == [[], [2], [0, 5], [3], [4]]


def test_trie_of_a_large_vocabulary_covers_every_token():
    vocab = vocabulary_for(tu.cl100k())
    trie = vocab.trie
    counted = np.bincount(trie.tok_ids, minlength=vocab.size)
    assert all(counted[i] == (1 if b else 0) for i, b in enumerate(vocab.token_bytes))


@pytest.mark.parametrize("kind, name", [("cl100k", "cl100k_base"), ("o200k", "o200k_base")])
def test_converted_tokenizers_match_tiktoken(kind, name):
    pytest.importorskip("tiktoken")
    enc = tu.tiktoken_encoding(name)
    tok = tu.ALL[kind]()
    for text in TEXTS + ["123456789 12 1234", "it's   we'll\n\n\n  x"]:
        assert tok.encode(text, add_special_tokens=False) == enc.encode(text)


PADDING = 37


@pytest.fixture(scope="module")
def special_tokenizer():
    return tu.byte_level_with_specials()


@pytest.fixture(scope="module")
def padded(special_tokenizer):
    """The model's view: PADDING logit columns past the tokenizer; `<|end|>`, not the tokenizer's eos, ends."""
    end = special_tokenizer.convert_tokens_to_ids("<|end|>")
    return vocabulary_for(special_tokenizer, size=len(special_tokenizer) + PADDING, eos_ids=[end])


def test_vocabulary_cached_per_size_and_eos_sharing_the_trie(special_tokenizer, padded):
    n = len(special_tokenizer)
    assert vocabulary_for(special_tokenizer, size=n + PADDING, eos_ids=padded.eos_ids) is padded
    default = vocabulary_for(special_tokenizer)
    assert (default.size, default.eos_ids) == (n, (special_tokenizer.eos_token_id,))
    assert default.trie is padded.trie
    assert padded.size == len(padded.token_bytes) == n + PADDING
    assert padded.mask_words == -(-(n + PADDING) // 32)
    assert all(b is None for b in padded.token_bytes[n:])


@pytest.mark.parametrize("compile_", [
    lambda v: compile_regex(r"[a-z]{1,6}( [a-z]{1,6}){0,3}", v),
    lambda v: compile_json_schema({"properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                                   "additionalProperties": False}, v),
    lambda v: compile_lark('start: "(" start ")" | "x"', v),
], ids=["regex", "json", "lark"])
def test_masks_cover_the_model_and_never_allow_padding_or_specials(special_tokenizer, padded, compile_):
    n, (end,) = len(special_tokenizer), padded.eos_ids
    grammar = compile_(padded)
    assert grammar.vocabulary is padded
    rng, ended = random.Random(0), 0  # walks end as soon as they may
    for _ in range(5):
        matcher = grammar.matcher()
        for _ in range(40):
            buf = np.zeros(padded.mask_words, np.int32)
            matcher.fill_bitmask(buf)
            allowed = np.flatnonzero(np.unpackbits(buf.view(np.uint8), bitorder="little"))
            assert allowed.tolist() == matcher.allowed_token_ids().tolist()
            assert len(allowed) and allowed.max() < n
            assert all(padded.token_bytes[t] is not None for t in allowed if t != end)
            assert special_tokenizer.eos_token_id not in allowed  # the tokenizer's eos is not the model's
            if end in allowed:
                matcher.advance(end)
                ended += 1
                break
            matcher.advance(int(rng.choice(allowed)))
    assert ended == 5

def test_narrower_model_and_plain_eos_get_their_own_trie(special_tokenizer):
    tok = special_tokenizer
    narrow = vocabulary_for(tok, size=len(tok) // 2)
    assert narrow.trie.tok_ids.max() < narrow.size  # masks are written without bounds checks
    dot = tok.convert_tokens_to_ids(".")
    dot_ends = vocabulary_for(tok, eos_ids=[dot])
    assert dot_ends.token_bytes[dot] is None and dot_ends.special_bytes[dot] == b"."
    assert dot not in compile_regex(r"[a-z.]{1,8}", dot_ends).matcher().allowed_token_ids()
