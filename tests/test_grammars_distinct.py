"""Texts that must differ: the keys of extras counted by minProperties, the items of uniqueItems string arrays.

The masks are checked against a brute-force oracle over a small vocabulary whose tokens span whole keys and
separators (`"",""`, `a":0,"a"`), so a token that writes one key twice, or completes a key another token of
the same walk wrote, is met; every budgeted walk must end in a valid instance with no repeated key.
"""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from fuzz_checks import has_duplicate_keys, random_walk
from leapgen.grammars import SchemaError, compile_json_schema
from leapgen.grammars.stacks import StackArena
from leapgen.grammars.trie_walks import add_walk
from leapgen.grammars.vocab import Vocabulary, build_trie
from tokenizers_util import accepts, byte_level_bpe, cl100k

_SPANNING = ['""', '"",""', '":0,"', '":', ',"', '"a"', 'a":0,"a"', '"a":0', '"b', 'ab', '"}', '"]', '","',
             '"a","a"', '"","', '0,"', '1,1', '1,2', ',1]', '10', '.5', '[1,', '0]']


def small_vocabulary(spanning: list[str] = _SPANNING) -> Vocabulary:
    """Every printable ASCII byte and the `spanning` tokens (those above by default); the last id is eos."""
    tokens = [bytes((b,)) for b in range(32, 127)] + [t.encode() for t in spanning]
    token_bytes = tokens + [None]
    return Vocabulary(len(token_bytes), token_bytes, {}, (len(tokens),), build_trie(token_bytes))


def _completes(grammar, state) -> bool:
    """Whether `state` has a completion that the grammar itself consumes to the end."""
    data = grammar.completion(state)
    if data is None:
        return False
    end = grammar.step(state, data)
    return end is not None and grammar.closure(end)[1]


def assert_mask_exact(grammar, matcher, text: bytes) -> set[int]:
    """The matcher's mask (less eos) is the set of tokens after which the text can still be completed; returns it."""
    vocab = grammar.vocabulary
    allowed = set(matcher.allowed_token_ids().tolist()) - set(vocab.eos_ids)
    expected = set()
    for tid, data in enumerate(vocab.token_bytes):
        if data is not None:
            nxt = grammar.step(matcher._state, data)
            if nxt is not None and _completes(grammar, nxt):
                expected.add(tid)
    assert allowed == expected, (text, sorted(vocab.token_bytes[t] for t in allowed ^ expected))
    return allowed


def oracle_walk(grammar, schema, rng: random.Random, steps: int) -> str:
    """Random tokens, each mask compared with the tokens after which the text can still be completed; returns
    the text once completed."""
    vocab = grammar.vocabulary
    validator = jsonschema.Draft202012Validator(schema)
    matcher, text = grammar.matcher(), b""
    for _ in range(steps):
        allowed = assert_mask_exact(grammar, matcher, text)
        if not allowed:
            break
        tid = rng.choice(sorted(allowed))
        matcher.advance(tid)
        text += vocab.token_bytes[tid]
    rest = grammar.completion(matcher._state)
    out = (text + rest).decode()
    assert not has_duplicate_keys(out), out
    assert validator.is_valid(json.loads(out)), out
    return out


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 2},
    {"type": "object", "minProperties": 3, "properties": {"a": {"type": "integer"}}},
    {"type": "object", "minProperties": 2, "maxProperties": 3, "additionalProperties": {"type": "integer"}},
    {"type": "object", "minProperties": 2, "propertyNames": {"pattern": "^(a|b|ab)$"}},
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 3},
    {"type": "array", "items": {"type": "string", "pattern": "^a*$"}, "uniqueItems": True, "minItems": 2},
    {"type": "array", "items": {"type": "string", "maxLength": 1, "pattern": "^[ab]*$"}, "uniqueItems": True},
    {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}, "uniqueItems": True},
    {"type": "array", "items": {"type": "number", "multipleOf": 0.5, "not": {"const": 1}}, "uniqueItems": True},
    {"type": "array", "items": {"type": ["integer", "string", "null"], "maximum": 12, "maxLength": 1},
     "uniqueItems": True, "minItems": 2},
], ids=["min2", "min3-declared", "max3", "finite-keys", "unique-strings", "unique-pattern", "unique-finite",
        "unique-integers", "unique-integer-range", "unique-numbers", "unique-scalars"])
def test_masks_refuse_repeated_texts_exactly(schema):
    vocab = small_vocabulary()
    grammar = compile_json_schema(schema, vocab, whitespace="compact")
    for seed in range(6):
        oracle_walk(grammar, schema, random.Random(seed), 14)


@pytest.mark.parametrize("items", [{"type": "string"}, {"type": "integer"}, {"type": "string", "pattern": "^a*$"},
                                   {"type": ["integer", "string", "null"], "maximum": 12, "maxLength": 1}],
                         ids=["strings", "integers", "pattern", "scalars"])
def test_tokens_not_searched_for_a_text_written_again_are_taken_to_write_it(items, monkeypatch):
    """Below a pop point whose trie subtree is too large to search (`writes_again`; on cl100k the root, where a
    number may end before the token), a token is taken to write the text again, and the search goes on with the
    text added: the masks stay exact with every subtree so taken."""
    from leapgen.grammars import token_masks

    monkeypatch.setattr(token_masks, "_SEARCHED_FOR_TEXTS", 0)
    monkeypatch.setattr(token_masks, "writes_again", None)     # never called
    schema = {"type": "array", "items": items, "uniqueItems": True, "minItems": 2}
    grammar = compile_json_schema(schema, small_vocabulary(), whitespace="compact")
    for seed in range(6):
        oracle_walk(grammar, schema, random.Random(seed), 14)


@pytest.mark.parametrize("items, values", [({"type": "string"}, [f"tag {i}" for i in range(24)]),
                                           ({"type": "integer"}, [1000 + 37 * i for i in range(24)])],
                         ids=["strings", "integers"])
def test_what_follows_a_text_is_kept_only_for_stacks_that_outlive_the_mask(items, values):
    """Where a captured text ends and the texts do not matter, what follows is kept per (return state, stack below,
    trie nodes) for the masks after (`TokenMasks._after_text`), only where the stack below is not one the mask made
    (it releases those, and their ids are made again for other stacks): the masks through an array equal those of
    a grammar that keeps nothing, and each kept answer is a fresh search of its key."""
    from leapgen.grammars.trie_walks import NO_POPS, new_walk

    tok = cl100k()
    schema = {"type": "array", "items": items, "uniqueItems": True}
    kept, plain = compile_json_schema(schema, tok), compile_json_schema(schema, tok)

    def searched(s, pops, stacks):
        bits = np.zeros(plain.vocabulary.mask_words, np.uint32)
        plain.masks._search(bits, [(stacks.ret[s], stacks.parent[s], pops, pops.tobytes())], stacks)
        return new_walk(bits, NO_POPS)

    plain.masks._after_text = searched
    a, b = kept.matcher(), plain.matcher()
    for token in tok.encode(json.dumps(values), add_special_tokens=False):
        assert (a.allowed_token_ids() == b.allowed_token_ids()).all()
        a.advance(token)
        b.advance(token)
    masks, stacks = kept.masks, kept.stacks
    assert len(masks._after_texts) >= 10
    for (ret, below, nodes_key), walk in masks._after_texts.items():
        assert below < len(stacks.parent)
        bits, fresh = np.zeros(masks.vocabulary.mask_words, np.uint32), np.zeros(masks.vocabulary.mask_words, np.uint32)
        add_walk(walk, bits)
        masks._search(fresh, [(ret, below, np.frombuffer(nodes_key, np.int32), nodes_key)], stacks)
        assert (bits == fresh).all()


def test_pop_points_below_which_nothing_may_follow_the_text_are_not_searched_with_it():
    """A token that ends a number at a digit's trie node and goes on below it only writes more digits, which no
    separator may begin with: such a pop point is not searched with the text added (`TokenMasks._bytes_after`, the
    bytes that may come first once the text ends).  The masks through arrays equal those of a grammar searching every
    such point, and points were left out."""
    from leapgen.grammars import captured_texts, token_masks

    tok = cl100k()
    left_out = []

    def followed(t_below, nodes, after):
        kept = captured_texts.followed_nodes(t_below, nodes, after)
        left_out.append(len(nodes) - len(kept))
        return kept

    every = np.full(4, np.iinfo(np.uint64).max, np.uint64)
    for items, values in [({"type": "integer"}, [1000 + 37 * i for i in range(12)] + [7, 70, 707]),
                          ({"type": ["integer", "string"]}, [5, "5", 55, "a", 550, "b5"])]:
        schema = {"type": "array", "items": items, "uniqueItems": True}
        pruned, plain = compile_json_schema(schema, tok), compile_json_schema(schema, tok)
        plain.masks._bytes_after = lambda s, stacks: every
        a, b = pruned.matcher(), plain.matcher()
        for token in tok.encode(json.dumps(values), add_special_tokens=False):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(token_masks, "followed_nodes", followed)
                allowed = a.allowed_token_ids()
            assert (allowed == b.allowed_token_ids()).all()
            a.advance(token)
            b.advance(token)
        # inside a number: its digits may go on, a separator or the array's end may follow
        m = pruned.matcher()
        for token in tok.encode("[12", add_special_tokens=False):
            m.advance(token)
        after = _bytes_after(pruned, m)
        assert {ord(","), ord("]")} <= after and not after & set(b"0123456789")
    assert sum(left_out) > 0


def test_the_bytes_after_a_text_pass_a_terminal_that_may_be_empty():
    """After each unique item a terminal that may match nothing (`x*`) comes before the separator: the bytes that may
    follow the text (`TokenMasks._bytes_after`) are its own, the separator's and the close's, and the masks stay exact
    where a token ends an item and writes it again (`1,1,` after `[`: read as the terminal's bytes alone, the pop
    point after the first 1 was left out, and the token allowed)."""
    from leapgen.grammars import compile_grammar, ir

    vocab = small_vocabulary(["2,12", "1,1", "1,1,", "x,12", "2,1", "12"])
    item = ir.Seq((ir.Capture(ir.Terminal("[0-9]+")), ir.Terminal("x*")))
    rules = {"start": ir.Ref("list"),
             "list": ir.Members(open=ir.Lit("["), members=(), separator=ir.Lit(","), close=ir.Lit("]"), extra=item)}
    grammar = compile_grammar(ir.Grammar(rules, "start"), vocab)
    matcher, text = grammar.matcher(), b""
    for byte in b"[12,1":
        assert_mask_exact(grammar, matcher, text)
        matcher.advance(byte - 32)
        text += bytes((byte,))
    assert vocab.token_bytes.index(b"2,12") not in assert_mask_exact(grammar, matcher, text)
    assert _bytes_after(grammar, matcher) == {ord(","), ord("]"), ord("x")}


def _bytes_after(grammar, matcher) -> set[int]:
    """`TokenMasks._bytes_after` of the matcher's one configuration, inside a captured text, as a set of bytes."""
    (_, s), = matcher._state
    after = np.unpackbits(grammar.masks._bytes_after(s, grammar.stacks).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(after).tolist())


def test_repeated_keys_do_not_count_towards_min_properties():
    grammar = compile_json_schema({"minProperties": 2}, byte_level_bpe(), whitespace="compact")
    assert not accepts(grammar, byte_level_bpe(), '{"":0,"":0}')
    assert not accepts(grammar, byte_level_bpe(), '{"a":0,"a":0}')
    assert accepts(grammar, byte_level_bpe(), '{"a":0,"b":0}')


def test_unique_string_items():
    schema = {"type": "array", "items": {"type": "string", "format": "email"}, "uniqueItems": True}
    tok = cl100k()
    grammar = compile_json_schema(schema, tok, whitespace="compact")
    assert accepts(grammar, tok, '["a@b.c","b@b.c"]')
    assert not accepts(grammar, tok, '["a@b.c","a@b.c"]')
    assert not accepts(grammar, tok, '["a@b.c","b@b.c","a@b.c"]')


@pytest.mark.parametrize("items", [{"type": "string"}, {"type": "integer"}], ids=["strings", "integers"])
def test_masks_stay_exact_after_many_items(items):
    """Eighty items written, the texts of the spanning tokens among them: each mask while writing more refuses
    exactly the tokens that would repeat one (the written texts go to the mask kernels packed)."""
    schema = {"type": "array", "items": items, "uniqueItems": True}
    vocab = small_vocabulary()
    grammar = compile_json_schema(schema, vocab, whitespace="compact")
    if items["type"] == "string":
        written = ["", "a", "b", "ab"] + [f"{c}{d}" for c in "cdefghijkl" for d in range(8)][:76]
        more = '"abc","m","zz","c7"]'
        texts = [json.dumps(w) for w in written]
    else:
        texts = [str(n) for n in [0, 1, 2, 10, 12] + list(range(20, 95))]
        more = "11,5,120,1]"
    matcher = grammar.matcher()
    for byte in ("[" + ",".join(texts) + ",").encode():
        matcher.advance(byte - 32)     # the small vocabulary's first tokens are the printable bytes in order
    text = b""
    for byte in more.encode():
        allowed = assert_mask_exact(grammar, matcher, text)
        if byte - 32 not in allowed:
            break
        matcher.advance(byte - 32)
        text += bytes((byte,))
    # "c7" and 1 are written already: the last item is refused at its closing quote, or where it can only end
    assert text in (b'"abc","m","zz","c7', b"11,5,120,1")


def test_finite_strings_run_out():
    """Two strings: an array of them has at most two items, and a separator after both is refused."""
    schema = {"type": "array", "items": {"type": "string", "pattern": "^(x|yy)$"}, "uniqueItems": True}
    vocab = small_vocabulary()
    grammar = compile_json_schema(schema, vocab, whitespace="compact")
    assert accepts_bytes(grammar, b'["x","yy"]')
    assert not accepts_bytes(grammar, b'["x","yy",')
    with pytest.raises(SchemaError, match="unsatisfiable|no "):
        compile_json_schema({**schema, "minItems": 3}, vocab)


def accepts_bytes(grammar, data: bytes) -> bool:
    """Whether `data` is a prefix the grammar allows (byte by byte, not completed)."""
    return grammar.step(grammar.initial, data) is not None


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 4},
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 4},
])
def test_budgets_close_with_texts_not_written(schema):
    """Closing under a budget writes keys (items) of its own, none written before."""
    tok = cl100k()
    grammar = compile_json_schema(schema, tok, whitespace="compact")
    validator = jsonschema.Draft202012Validator(schema)
    for seed in range(8):
        walk = random_walk(grammar, random.Random(seed), slack=3, stop_prob=0.05)
        assert walk.finished and not walk.problem, walk
        text = walk.text.decode()
        assert not has_duplicate_keys(text) and validator.is_valid(json.loads(text)), text
        if schema["type"] == "array":
            assert len(set(json.loads(text))) == len(json.loads(text)), text


def test_uniqueness_needs_scalar_items():
    with pytest.raises(SchemaError, match="uniqueItems is enforced only on strings, numbers") as error:
        compile_json_schema({"type": "array", "items": {"type": ["string", "object"]}, "uniqueItems": True},
                            byte_level_bpe())
    assert error.value.pointer == "/uniqueItems"


@pytest.mark.parametrize("schema, repeated, fresh", [
    ({"items": {"type": ["string", "null"], "minLength": 1, "maxLength": 40}}, '["a",null,null]', '["a",null,"b"]'),
    ({"items": {"type": ["integer", "string"]}}, '[1,"1",1]', '[1,"1",2]'),
    ({"items": {"type": ["number", "boolean"], "minimum": 0}}, '[true,0.5,true]', '[true,0.5,false]'),
    ({"items": {"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "integer", "maximum": 3}]}}, '["ab",3,"ab"]',
     '["ab",3,"a"]'),
    ({"items": {"anyOf": [{"const": None}, {"enum": [None]}]}}, '[null,null]', '[null]'),   # one literal, twice
])
def test_scalars_of_several_types_are_one_captured_terminal(schema, repeated, fresh):
    """A string or null (the winget manifests' tags), a number or string: one automaton for all of them, so the
    array's frame records every text written."""
    tok = byte_level_bpe()
    grammar = compile_json_schema({"type": "array", "uniqueItems": True, **schema}, tok, whitespace="compact")
    assert accepts(grammar, tok, fresh) and not accepts(grammar, tok, repeated)


@pytest.mark.parametrize("schema, repeated, fresh", [
    ({"type": "object", "minProperties": 2, "propertyNames": {"maxLength": 64}}, '{"a":0,"a":0}', '{"a":0,"b":0}'),
    ({"type": "array", "items": {"type": "string", "maxLength": 100}, "uniqueItems": True}, '["a","a"]', '["a","b"]'),
])
def test_long_length_bounds_are_one_captured_terminal(schema, repeated, fresh):
    """Past 32 characters a length bound counts in chunks, several terminals; a captured text is one."""
    tok = byte_level_bpe()
    grammar = compile_json_schema(schema, tok, whitespace="compact")
    assert accepts(grammar, tok, fresh) and not accepts(grammar, tok, repeated)


def test_masks_stay_exact_where_whitespace_and_long_tokens_surround_the_items():
    """Flexible whitespace: an item may start after any run of spaces, and tokens end one item and go on into
    the next, or write it again whole (`", "a"`, ` "a", "a"`): only where a token below can write the ended text
    again is it followed with the text added, and the masks stay those of the brute-force oracle."""
    spanning = ['", "', '", "a"', ' "a", "a"', '"a", "b", "a"', '  "', '   ', ', "', '"b", "', '"ab"', '1, 1', ', 10']
    vocab = small_vocabulary(_SPANNING + spanning)
    for schema in ({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
                   {"type": "array", "items": {"type": "string", "maxLength": 1, "pattern": "^[ab]*$"},
                    "uniqueItems": True},
                   {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 11}, "uniqueItems": True}):
        grammar = compile_json_schema(schema, vocab, whitespace="flexible")
        for seed in range(4):
            oracle_walk(grammar, schema, random.Random(seed), 12)


def test_a_token_ending_an_item_is_followed_with_it_only_where_a_token_may_write_it_again(monkeypatch):
    """Forty ten-digit ids written (JsonSchemaStore's webhook): a mask inside the next one follows the tokens that
    end it (`",`, `"]`...) without adding it to the array's texts, since no token holds it again; it added each
    one and searched on from every trie node where it ended (3-10 ms a mask)."""
    schema = {"type": "array", "items": {"type": "string", "pattern": "^[0-9]+$"}, "uniqueItems": True}
    tok = cl100k()
    grammar = compile_json_schema(schema, tok)
    ids = [str(1234567890 + i) for i in range(40)]
    matcher = grammar.matcher()
    for t in tok.encode("[" + ", ".join(json.dumps(i) for i in ids) + ", ", add_special_tokens=False):
        matcher.advance(t)
    added = []
    pop = StackArena.pop
    monkeypatch.setattr(StackArena, "pop", lambda self, stack, text=None: added.append(text) or pop(self, stack, text))
    quote, one = tok.encode('"', add_special_tokens=False)[0], tok.encode("1", add_special_tokens=False)[0]
    for item, closes in (("1234567999", True), ("1234567890", False)):   # a new id, then one written already
        for t in tok.encode('"' + item, add_special_tokens=False):
            assert t in set(matcher.allowed_token_ids().tolist())
            matcher.advance(t)
        added.clear()
        allowed = set(matcher.allowed_token_ids().tolist())
        assert not added
        assert (quote in allowed) == closes and one in allowed
        if closes:
            for t in tok.encode('", ', add_special_tokens=False):
                matcher.advance(t)
