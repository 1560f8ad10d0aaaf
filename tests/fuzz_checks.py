"""The fuzzer's checks: `feed()`, `random_walk()`, `compile_timed()` (each returns what went wrong), and
`Fuzzer`, which takes one drawn schema through all of them, counting outcomes and collecting `Failure`s
(each with a reproducer).
"""

from __future__ import annotations

import functools
import json
import random
import re
import signal
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
from hypothesis import strategies as st
from hypothesis.errors import UnsatisfiedAssumption

from fuzz_oracle import (VALIDATION_EXCEPT_ALLOF, DuplicateKey, Oracle, canonical, dump, exact, invalid_candidates,
                         layouts_for, number_value, parse, same, shuffled)
from fuzz_schemas import valid_instances
from leapgen.grammars import GrammarError, SchemaError, UnsupportedSchemaError, compile_json_schema

COMPILE_BOUND_S = 5.0          # a compile (and its first mask) slower than this is reported as a blowup


# ---- tokenizers ------------------------------------------------------------------------------------

@functools.cache
def smollm2_tokenizer():
    """SmolLM2's tokenizer (49,152 tokens, eos <|im_end|>): from the converted checkpoint in the leapgen
    cache when there is one, else straight from the GGUF file (about 5 s; no weights are converted).
    Raises DefaultModelNotFoundError when the default model is not installed."""
    from transformers import AutoTokenizer

    from leapgen.engine.default_model import default_model_path
    from leapgen.engine.gguf_loader import converted_dir

    path = default_model_path()
    converted = converted_dir(path)
    if (converted / ".complete").is_file():
        return AutoTokenizer.from_pretrained(converted)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def tokenizer_factories() -> dict[str, Callable[[], Any]]:
    from tokenizers_util import cl100k

    return {"cl100k": cl100k, "smollm2": smollm2_tokenizer}


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text`; special-token spellings inside strings stay plain text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


# ---- checks ----------------------------------------------------------------------------------------

class Hang(Exception):
    """A bounded step ran past its time limit."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise Hang in the main thread after `seconds` (SIGALRM; a no-op elsewhere or off Unix)."""
    try:
        previous = signal.signal(signal.SIGALRM, _raise_hang)
    except (ValueError, AttributeError):      # not the main thread, or no SIGALRM
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _raise_hang(signum, frame):
    raise Hang("time limit reached")


@dataclass
class Compiled:
    grammar: Any = None                      # None when refused or crashed
    seconds: float = 0.0
    refusal: SchemaError | None = None
    crash: str | None = None                 # any other exception (a traceback, but for GrammarError), a hang


def compile_timed(schema: Any, tokenizer: Any, whitespace: str, hang_after: float = 4 * COMPILE_BOUND_S,
                  property_order: str = "schema") -> Compiled:
    """Compile, then compute the first mask and a shortest completion (what decoding needs before its
    first token: compile_json_schema itself defers that work), timed together."""
    start = time.perf_counter()
    try:
        with time_limit(hang_after):
            grammar = compile_json_schema(schema, tokenizer, whitespace=whitespace, property_order=property_order)
            matcher = grammar.matcher()
            matcher.allowed_token_ids()
            matcher.completion_tokens()
    except SchemaError as exc:
        return Compiled(seconds=time.perf_counter() - start, refusal=exc)
    except Hang:
        return Compiled(seconds=time.perf_counter() - start, crash=f"Hang: over {hang_after} s")
    except GrammarError as exc:   # a refusal, but not the SchemaError the JSON schema front end promises
        return Compiled(seconds=time.perf_counter() - start, crash=f"{type(exc).__name__}: {exc}")
    except Exception:
        return Compiled(seconds=time.perf_counter() - start, crash=traceback.format_exc(limit=-6))
    return Compiled(grammar, time.perf_counter() - start)


def refusal_keyword(error: SchemaError) -> str:
    """What a refusal is about: the keyword its JSON pointer ends at, or the kind of limit."""
    message = str(error)
    if not isinstance(error, UnsupportedSchemaError):
        return "(unsatisfiable)" if "unsatisfiable" in message else "(malformed)"
    tokens = [t for t in error.pointer.split("/") if t and not t.isdigit()]
    if tokens and tokens[-1] in VALIDATION_EXCEPT_ALLOF | {"allOf", "$ref"}:
        return tokens[-1]
    return "(limit) " + re.sub(r"\d+", "N", message.split(" (at ")[0])[:50]


def _bit(buffer: np.ndarray, token: int) -> bool:
    return bool(buffer.view(np.uint32)[token >> 5] >> np.uint32(token & 31) & 1)


@dataclass
class Feed:
    accepted: bool
    detail: str = ""          # where it was refused
    mismatch: str = ""        # the mask and is_token_allowed disagree


def feed(grammar: Any, ids: list[int]) -> Feed:
    """Feed `ids` through a fresh matcher, checking each against the bitmask and is_token_allowed; accepted
    when every token is allowed and eos is allowed at the end."""
    vocab = grammar.vocabulary
    matcher = grammar.matcher()
    buffer = np.zeros(vocab.mask_words, np.int32)
    for i, token in enumerate(ids):
        matcher.fill_bitmask(buffer)
        in_mask, allowed = _bit(buffer, token), matcher.is_token_allowed(token)
        if in_mask != allowed:
            return Feed(False, mismatch=f"token {i} ({vocab.token_bytes[token]!r}): mask {in_mask}, "
                                        f"is_token_allowed {allowed}")
        if not allowed:
            prefix = b"".join(vocab.token_bytes[t] for t in ids[:i]).decode("utf-8", "replace")
            return Feed(False, f"token {i} {vocab.token_bytes[token]!r} refused after {prefix[-60:]!r}")
        matcher.advance(token)
    matcher.fill_bitmask(buffer)
    eos = [e for e in vocab.eos_ids if matcher.is_token_allowed(e)]
    if any(_bit(buffer, e) for e in vocab.eos_ids) != bool(eos):
        return Feed(False, mismatch="eos: the mask and is_token_allowed disagree at the end")
    return Feed(bool(eos), "" if eos else "eos refused at the end: the text is incomplete")


@dataclass
class Walk:
    text: bytes = b""
    tokens: int = 0
    budget: int = 0
    finished: bool = False
    problem: str = ""        # a mask fault met on the way (empty mask, mask/list disagreement, overrun)


def random_walk(grammar: Any, rng: Any, slack: int, stop_prob: float = 0.1) -> Walk | None:
    """Random allowed tokens under a budget of a shortest completion plus `slack` tokens, until eos or the
    budget; a pick the budget refuses is replaced by the completion's next token, as the engine does.
    None when the vocabulary cannot spell a completion (no budget can be promised)."""
    shortest = grammar.matcher().completion_tokens()
    if shortest is None:
        return None
    budget = len(shortest) + slack
    matcher, vocab = grammar.matcher(budget), grammar.vocabulary
    eos_ids, out = np.array(vocab.eos_ids), Walk(budget=budget)
    buffer = np.zeros(vocab.mask_words, np.int32)
    pieces: list[bytes] = []
    while not matcher.is_finished() and out.tokens <= budget:
        allowed = matcher.allowed_token_ids()
        matcher.fill_bitmask(buffer)
        listed = np.flatnonzero(np.unpackbits(buffer.view(np.uint8), bitorder="little")[:vocab.size])
        if not np.array_equal(listed, allowed):
            out.problem = "fill_bitmask and allowed_token_ids disagree"
            break
        if len(allowed) == 0:
            out.problem = "empty mask before the walk finished"
            break
        others = allowed[~np.isin(allowed, eos_ids)]
        ends = [int(t) for t in allowed[np.isin(allowed, eos_ids)]]
        if ends and (len(others) == 0 or rng.random() < stop_prob):
            matcher.advance(ends[0])
            break
        token = int(others[rng.randrange(len(others))])
        if not matcher.is_token_allowed(token):
            plan = matcher.completion_tokens()
            if not plan:          # complete, and the budget has no room to go on: end here, as the engine does
                if not ends:
                    out.problem = f"token {token} refused, nothing left to complete, yet eos is refused too"
                    break
                matcher.advance(ends[0])
                break
            token = plan[0]
        matcher.advance(token)
        pieces.append(vocab.token_bytes[token])
        out.tokens += 1
    out.text, out.finished = b"".join(pieces), matcher.is_finished()
    if not out.problem and out.tokens > budget:
        out.problem = f"{out.tokens} tokens for a budget of {budget}"
    return out


def has_duplicate_keys(text: str) -> bool:
    try:
        parse(text)
    except DuplicateKey:
        return True
    return False


def walk_problem(walk: Walk, oracle: Oracle) -> str | None:
    """Why a walk's output is not a valid instance, None when it is.  Repeated keys are read the way
    json.loads reads them (the last one wins), then validated."""
    if walk.problem:
        return walk.problem
    if not walk.finished:
        return f"not finished after {walk.tokens} tokens (budget {walk.budget})"
    try:
        value = json.loads(walk.text.decode("utf-8"), parse_float=number_value, parse_int=number_value)
    except (UnicodeDecodeError, ValueError) as exc:
        return f"not JSON: {exc}"
    return oracle.error(value)


# ---- failure reports -------------------------------------------------------------------------------

@dataclass
class Failure:
    kind: str
    schema: Any
    detail: str
    tokenizer: str = ""
    whitespace: str = ""
    text: str | None = None
    extra: dict = field(default_factory=dict)

    def reproducer(self) -> str:
        lines = [f"[{self.kind}] {self.detail}",
                 f"  schema     = {json.dumps(self.schema, ensure_ascii=False)}"]
        if self.tokenizer or self.whitespace:
            lines.append(f"  tokenizer  = {self.tokenizer}, whitespace={self.whitespace!r}")
        if self.text is not None:
            lines.append(f"  text       = {self.text!r}")
        lines += [f"  {k:<10} = {v}" for k, v in self.extra.items()]
        return "\n".join(lines)


# ---- one schema through every check ----------------------------------------------------------------

WALK_LIMIT_S = 60.0      # one instance fed or one walk: far beyond what any takes, so only a hang trips it


class Fuzzer:
    """Runs the checks for schemas drawn by hypothesis (`data` is an st.data() object), counting what it
    sees and collecting a Failure for every unsound answer."""

    def __init__(self, tokenizers: dict[str, Any], compile_bound: float = COMPILE_BOUND_S,
                 property_order: str = "schema"):
        self.tokenizers = tokenizers
        self.compile_bound = compile_bound
        # "any": compile with property_order="any" and write every object's keys in a random order
        self.property_order = property_order
        self.counts: Counter = Counter()
        self.refused: Counter = Counter()
        self.compile_seconds: dict[str, list[float]] = {name: [] for name in tokenizers}
        self.failures: list[Failure] = []

    def fail(self, kind: str, schema: Any, detail: str, **context: Any) -> None:
        self.failures.append(Failure(kind, schema, detail, **context))

    @property
    def pairs(self) -> int:
        """Schema x instance pairs checked so far."""
        return self.counts["valid checked"] + self.counts["invalid checked"]

    # -- compiling --

    def compile(self, schema: dict, whitespace: str) -> dict[str, Any] | SchemaError | None:
        """The schema's grammar per tokenizer, its refusal, or None after a failure (crash, hang, a
        refusal under one tokenizer only)."""
        self.counts["schemas"] += 1
        grammars: dict[str, Any] = {}
        for name, tokenizer in self.tokenizers.items():
            result = compile_timed(schema, tokenizer, whitespace, property_order=self.property_order)
            self.compile_seconds[name].append(result.seconds)
            context = {"tokenizer": name, "whitespace": whitespace}
            if result.seconds > self.compile_bound:
                self.fail("slow compile", schema, f"{result.seconds:.1f} s (bound {self.compile_bound} s)", **context)
            if result.crash is not None:
                kind = {"GrammarError": "refusal not a SchemaError", "Hang": "hang"}.get(
                    result.crash.split(":")[0], "crash")
                self.fail(kind, schema, result.crash.strip(), **context)
                return None
            if result.refusal is not None:
                if grammars:
                    self.fail("inconsistent refusal", schema, str(result.refusal), **context)
                    return None
                self.refused[refusal_keyword(result.refusal)] += 1
                return result.refusal
            grammars[name] = result.grammar
        self.counts["compiled"] += 1
        return grammars

    def check_refusal(self, schema: dict, refusal: SchemaError, data: Any) -> None:
        """A schema refused as unsatisfiable must have no valid instance."""
        if isinstance(refusal, UnsupportedSchemaError) or "unsatisfiable" not in str(refusal):
            return
        strategy = valid_instances(schema)
        if _empty(strategy):
            self.counts["unsatisfiable confirmed"] += 1
            return
        value = self.draw(data, strategy)
        if value is not _NOTHING and Oracle(schema).is_valid(exact(value)):
            self.fail("wrong unsatisfiable", schema, str(refusal), text=json.dumps(value, ensure_ascii=False))

    # -- instances --

    def draw(self, data: Any, strategy: st.SearchStrategy) -> Any:
        """data.draw, with hypothesis-jsonschema's own errors counted rather than raised."""
        try:
            return data.draw(strategy)
        except UnsatisfiedAssumption:
            raise
        except Exception as exc:      # its canonicalisation fails on some schemas: not ours to judge
            self.counts["generator errors"] += 1
            self.counts[f"generator error: {type(exc).__name__}"] += 1
            return _NOTHING

    def valid_values(self, schema: dict, oracle: Oracle, data: Any, most: int) -> list[Any]:
        """Up to `most` instances the oracle confirms valid, exact and laid out for the compiler."""
        strategy = valid_instances(schema)
        if _empty(strategy):
            self.counts["no instance generated"] += 1
            return []
        drawn = self.draw(data, st.lists(strategy, min_size=1, max_size=most))
        out = []
        for value in [] if drawn is _NOTHING else drawn:
            value = exact(value)
            if oracle.is_valid(value):
                out.append(self.laid_out(value, oracle, data))
            else:     # ECMA patterns, the email subset, or hypothesis-jsonschema's own slips
                self.counts["valid discarded by oracle"] += 1
        return out

    def laid_out(self, value: Any, oracle: Oracle, data: Any) -> Any:
        """The instance with its keys where the compiler expects them: in the schema's order, or shuffled."""
        value = canonical(value, oracle)
        return shuffled(value, data.draw(st.randoms(use_true_random=False))) if self.property_order == "any" else value

    def check_valid(self, schema: dict, whitespace: str, grammars: dict[str, Any], oracle: Oracle,
                    values: list[Any], data: Any) -> None:
        for value in values:
            text = dump(value, data.draw(st.sampled_from(layouts_for(whitespace, value))))
            assert same(parse(text), value) and oracle.is_valid(parse(text)), f"harness: bad layout {text!r}"
            self.counts["valid checked"] += 1
            for name, grammar in grammars.items():
                result = self._feed(schema, whitespace, name, grammar, text)
                if result is None:
                    continue
                if result.accepted:
                    self.counts["valid accepted"] += 1
                else:
                    self.counts["valid rejected"] += 1
                    self.fail("valid rejected", schema, result.detail, tokenizer=name, whitespace=whitespace,
                              text=text)

    def check_invalid(self, schema: dict, whitespace: str, grammars: dict[str, Any], oracle: Oracle,
                      values: list[Any], data: Any, most: int) -> None:
        seeds = values or [None]
        for i in range(most):
            candidate = self.draw(data, invalid_candidates(seeds[i % len(seeds)]))
            if candidate is _NOTHING:
                continue
            value = exact(candidate)
            if not oracle.is_invalid(value):
                self.counts["invalid discarded (valid)"] += 1
                continue
            value = self.laid_out(value, oracle, data)
            text = dump(value, data.draw(st.sampled_from(layouts_for(whitespace, value))))
            self.counts["invalid checked"] += 1
            for name, grammar in grammars.items():
                result = self._feed(schema, whitespace, name, grammar, text)
                if result is None:
                    continue
                if result.accepted:
                    self.counts["invalid accepted"] += 1
                    self.fail("invalid accepted", schema, oracle.error(value) or "", tokenizer=name,
                              whitespace=whitespace, text=text)
                else:
                    self.counts["invalid refused"] += 1

    def _feed(self, schema: dict, whitespace: str, name: str, grammar: Any, text: str) -> Feed | None:
        context = {"tokenizer": name, "whitespace": whitespace, "text": text}
        ids = encode(self.tokenizers[name], text)
        if b"".join(grammar.vocabulary.token_bytes[i] or b"" for i in ids) != text.encode():
            # the tokenizer drops bytes it has no token for (SmolLM2 has none for 0xF1/0xF2, the lead bytes
            # of U+40000..U+BFFFF): no token sequence spells this text, so there is nothing to check
            self.counts[f"text not spellable ({name})"] += 1
            return None
        try:
            with time_limit(WALK_LIMIT_S):
                result = feed(grammar, ids)
        except Hang:
            self.fail("hang", schema, f"feeding took over {WALK_LIMIT_S} s", **context)
            return None
        except Exception:
            self.fail("crash", schema, traceback.format_exc(limit=-6).strip(), **context)
            return None
        if result.mismatch:
            self.fail("mask mismatch", schema, result.mismatch, **context)
            return None
        return result

    # -- walks --

    def check_walks(self, schema: dict, whitespace: str, grammars: dict[str, Any], oracle: Oracle,
                    data: Any, walks: int) -> None:
        for name, grammar in grammars.items():
            for _ in range(walks):
                seed, slack = data.draw(st.integers(0, 2 ** 32 - 1)), data.draw(st.integers(0, 40))
                context = {"tokenizer": name, "whitespace": whitespace, "extra": {"seed": seed, "slack": slack}}
                try:
                    with time_limit(WALK_LIMIT_S):
                        walk = random_walk(grammar, random.Random(seed), slack)
                except Hang:
                    self.fail("hang", schema, f"a walk took over {WALK_LIMIT_S} s", **context)
                    continue
                except Exception:
                    self.fail("crash", schema, traceback.format_exc(limit=-6).strip(), **context)
                    continue
                if walk is None:
                    self.counts["walks without a completion"] += 1
                    continue
                self.counts["walks"] += 1
                self.counts["walks finished"] += walk.finished
                problem = walk_problem(walk, oracle)
                text = walk.text.decode("utf-8", "replace")
                if problem is None and has_duplicate_keys(text):
                    self.counts["walks validated with a repeated key"] += 1
                if problem is None:
                    self.counts["walks validated"] += 1
                else:
                    self.fail("walk output invalid", schema, problem, text=text, **context)

    # -- everything --

    def run(self, schema: dict, whitespace: str, data: Any, valid: int = 3, invalid: int = 2, walks: int = 1) -> None:
        """Compile under every tokenizer, then feed valid and invalid instances and walk the masks."""
        compiled = self.compile(schema, whitespace)
        if isinstance(compiled, SchemaError):
            self.check_refusal(schema, compiled, data)
            return
        if compiled is None:
            return
        oracle = Oracle(schema)
        values = self.valid_values(schema, oracle, data, valid) if valid else []
        self.check_valid(schema, whitespace, compiled, oracle, values, data)
        if invalid:
            self.check_invalid(schema, whitespace, compiled, oracle, values, data, invalid)
        if walks:
            self.check_walks(schema, whitespace, compiled, oracle, data, walks)


_NOTHING = object()


def _empty(strategy: st.SearchStrategy) -> bool:
    """Whether hypothesis-jsonschema proved the schema unsatisfiable (it then gives st.nothing())."""
    try:
        return strategy.is_empty
    except Exception:
        return False

