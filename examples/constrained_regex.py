"""Random walk through the token masks of a regex constraint (no model needed).

    python examples/constrained_regex.py '[A-Z][a-z]+ \\d{1,3} (apples|pears)'
"""

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tokenizers_util  # noqa: E402  (builds/caches the cl100k tokenizer offline)

from leapgen.grammars import compile_regex, vocabulary_for  # noqa: E402


def main() -> None:
    pattern = sys.argv[1] if len(sys.argv) > 1 else r'\{"city": "[A-Z][a-z]{2,12}", "population": [1-9][0-9]{2,6}\}'
    tokenizer = tokenizers_util.cl100k()
    vocabulary_for(tokenizer)  # the vocabulary index is built once per tokenizer; time the compile alone
    start = time.perf_counter()
    grammar = compile_regex(pattern, tokenizer)
    print(f"compiled {pattern!r} in {1000 * (time.perf_counter() - start):.1f} ms")
    rng = random.Random(0)
    for _ in range(3):
        matcher = grammar.matcher()
        pieces = []
        while not matcher.is_finished():
            forced = matcher.forced_tokens()
            choices = forced[:1] or matcher.allowed_token_ids().tolist()
            token = rng.choice(choices)
            matcher.advance(token)
            pieces.append(tokenizer.decode([token]) if token != tokenizer.eos_token_id else "")
        print(repr("".join(pieces)))


if __name__ == "__main__":
    main()
