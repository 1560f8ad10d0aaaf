"""Random walk through the token masks of a lark grammar constraint (no model needed).

    python examples/constrained_lark.py
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tokenizers_util  # noqa: E402  (builds/caches the cl100k tokenizer offline)

from leapgen.grammars import compile_lark, vocabulary_for  # noqa: E402

GRAMMAR = r"""
?start: sum
?sum: product | sum ("+" | "-") product
?product: atom | product ("*" | "/") atom
?atom: NUMBER | NAME | "(" sum ")"
NUMBER: /[0-9]{1,3}/
NAME: /[a-z]{1,4}/
%ignore " "
"""


def main() -> None:
    tokenizer = tokenizers_util.cl100k()
    vocabulary_for(tokenizer)  # the vocabulary index is built once per tokenizer; time the compile alone
    start = time.perf_counter()
    grammar = compile_lark(GRAMMAR, tokenizer)
    print(f"compiled the arithmetic grammar in {1000 * (time.perf_counter() - start):.1f} ms")
    rng = random.Random(0)
    for _ in range(3):
        matcher = grammar.matcher()
        pieces = []
        while not matcher.is_finished():
            allowed = matcher.allowed_token_ids().tolist()
            # end as soon as we may after 12 tokens, so the walk stays short
            if tokenizer.eos_token_id in allowed and (len(pieces) > 12 or rng.random() < 0.1):
                token = tokenizer.eos_token_id
            else:
                token = rng.choice([t for t in allowed if t != tokenizer.eos_token_id])
            matcher.advance(token)
            pieces.append(tokenizer.decode([token]) if token != tokenizer.eos_token_id else "")
        print(repr("".join(pieces)))


if __name__ == "__main__":
    main()
