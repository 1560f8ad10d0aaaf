"""Token bytes of every tokenizer kind round-trip through the tokenizer's own decoder."""

import numpy as np
import pytest
import tokenizers_util as tu

from leapgen.grammars.vocab import build_trie, vocab_for

TEXTS = [
    "Hello, world! It's 2024-05-01T12:00:00Z.",
    '{"name": "Zoë", "tags": ["naïve", "中文", "😀"], "n": -1.5e+10}\n\t  ',
    "  leading and trailing spaces  \n\nnew\r\nlines ǅ ﬁ \u00a0 \u200b",
    "x" * 50 + " 1234567890 " + "ab" * 20,
]


@pytest.mark.parametrize("kind", sorted(tu.ALL))
def test_token_bytes_round_trip(kind):
    tok = tu.ALL[kind]()
    vocab = vocab_for(tok)
    assert vocab_for(tok) is vocab  # cached per tokenizer
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
    vocab = vocab_for(tok)
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
    vocab = vocab_for(tu.cl100k())
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
