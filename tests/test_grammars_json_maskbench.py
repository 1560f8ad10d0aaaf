"""MaskBench protocol on a fixed sample of ../shared/corpora/maskbench with the cl100k tokenizer.

Valid instances (json.dumps, ensure_ascii=False) must be accepted token by token
to completion, invalid ones must never be; random walks through the masks must
end in text that jsonschema validates.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from leapgen.grammars import UnsupportedSchemaError, compile_json_schema
from tokenizers_util import accepts, cl100k

MASKBENCH = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "maskbench"
SUBSETS = ("Github_easy", "Github_medium", "Glaiveai2K")
PER_SUBSET = 8
# Measured on this sample: every compiled schema passes; this many compile.
COMPILED_FLOOR = 20

pytestmark = pytest.mark.skipif(not MASKBENCH.is_dir(), reason=f"maskbench corpus not found at {MASKBENCH}")


def _sample() -> list[Path]:
    """A fixed, spread-out sample of files that carry tests (every 7th such file of each subset)."""
    out = []
    for subset in SUBSETS:
        files = [p for p in sorted((MASKBENCH / subset).glob("*.json")) if json.loads(p.read_text())["tests"]]
        out += files[::11][:PER_SUBSET]
    return out


@pytest.fixture(scope="module")
def compiled():
    tokenizer = cl100k()
    out = []
    for path in _sample():
        doc = json.loads(path.read_text())
        try:
            out.append((path, doc, compile_json_schema(doc["schema"], tokenizer)))
        except UnsupportedSchemaError:
            continue
    return tokenizer, out


def test_maskbench_sample_valid_accepted_invalid_refused(compiled):
    tokenizer, grammars = compiled
    wrong = []
    for path, doc, grammar in grammars:
        for case in doc["tests"]:
            if accepts(grammar, tokenizer, json.dumps(case["data"], ensure_ascii=False)) != case["valid"]:
                wrong.append((path.name, case["valid"], case["description"]))
    invalid_accepted = [w for w in wrong if not w[1]]
    assert not invalid_accepted, invalid_accepted
    assert not wrong, wrong
    assert len(grammars) >= COMPILED_FLOOR


def _walk(grammar, rng: random.Random, max_tokens: int = 80) -> bytes | None:
    """Random allowed tokens; after a while prefer eos, and tokens that close strings and containers."""
    matcher, vocab, out = grammar.matcher(), grammar.vocabulary, []
    for step in range(max_tokens):
        ids = [int(i) for i in matcher.allowed_token_ids()]
        eos = [i for i in ids if i in vocab.eos_ids]
        pool = [i for i in ids if i not in vocab.eos_ids]
        if eos and (step >= 8 or not pool):     # complete (and only eos may follow, e.g. after `[]`)
            return b"".join(out)
        closing = [i for i in pool if any(c in vocab.token_bytes[i] for c in b'"}]')]
        if closing and rng.random() < step / max_tokens:
            pool = closing
        token = rng.choice(pool)
        matcher.advance(token)
        out.append(vocab.token_bytes[token])
    return None


@pytest.mark.slow
def test_maskbench_random_walks_validate(compiled):
    tokenizer, grammars = compiled
    rng = random.Random(1234)
    finished = 0
    for path, doc, grammar in grammars[::2]:
        validator = jsonschema.validators.validator_for(doc["schema"])(doc["schema"])
        for _ in range(2):
            text = _walk(grammar, rng)
            if text is None:
                continue
            instance = json.loads(text.decode("utf-8"))
            errors = [e.message for e in validator.iter_errors(instance)]
            assert not errors, (path.name, text, errors)
            finished += 1
    assert finished >= 8, finished
