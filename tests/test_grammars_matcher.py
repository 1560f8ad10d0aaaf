"""Token-level matchers for regexes and IR grammars, with real tokenizers."""

import random
import re

import numpy as np
import pytest
import tokenizers_util as tu

from leapgen.grammars import compile_grammar, compile_regex, fsm, ir
from leapgen.grammars.errors import GrammarError, RegexError
from leapgen.grammars.regex import regex_dfa
from test_grammars_regex import _dfa_samples

PATTERNS = [
    r'\{"name": "[^"\\]{1,12}", "age": (0|[1-9]\d{0,2})\}',
    r"(true|false|null)",
    r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?",
    r"[a-zé中😀 ]{2,10}",
    r"\d{3}-\d{4}",
    r"(?i)yes|no",
]
KINDS = ["byte_level", "sentencepiece", "cl100k"]


@pytest.fixture(scope="module", params=KINDS)
def tokenizer(request):
    return tu.ALL[request.param]()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_matching_string_is_reachable_token_by_token(tokenizer, pattern):
    g = compile_regex(pattern, tokenizer)
    rng = random.Random(pattern)
    for data in _dfa_samples(regex_dfa(pattern), rng, 25):
        m = g.matcher()
        for tid in g.vocabulary.encode(data):
            assert tid in set(m.allowed_token_ids().tolist()), (data, tid)
            m.advance(tid)
        eos = g.vocabulary.eos_ids[0]
        assert eos in m.allowed_token_ids()
        m.advance(eos)
        assert m.is_finished()


@pytest.mark.parametrize("pattern", PATTERNS)
def test_random_walks_through_masks_fullmatch(tokenizer, pattern):
    g = compile_regex(pattern, tokenizer)
    rng = random.Random(1)
    done = 0
    for _ in range(15):
        data = tu.random_walk(g.matcher(), g.vocabulary, rng)
        if data is not None:
            done += 1
            assert re.fullmatch(pattern, data.decode("utf-8")), data
    assert done >= 10


def test_compile_regex_makes_a_grammar_of_its_own_each_time():
    """A grammar is used by one thread at a time: a pattern compiled again got the same grammar back (kept among
    the last 64 patterns), shared unknowingly by callers on two threads."""
    tok = tu.byte_level_bpe()
    first, again = compile_regex("a+b", tok), compile_regex("a+b", tok)
    assert first is not again and first.stacks is not again.stacks
    assert np.array_equal(first.matcher().allowed_token_ids(), again.matcher().allowed_token_ids())


def test_eos_only_when_complete_and_other_specials_never():
    tok = tu.cl100k()
    g = compile_regex(r"ab(cd)?", tok)
    m = g.matcher()
    specials = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    eos = tok.eos_token_id
    for piece, complete in [("a", False), ("b", True), ("c", False), ("d", True)]:
        m.advance(tok.convert_tokens_to_ids(piece))
        allowed = set(m.allowed_token_ids().tolist())
        assert (eos in allowed) == complete
        assert not (allowed & (specials - {eos}))
    assert m.is_finished() is False or m.allowed_token_ids().tolist() == [eos]
    assert m.allowed_token_ids().tolist() == [eos]
    assert m.is_finished()


def test_fill_bitmask_layout():
    tok = tu.byte_level_bpe()
    g = compile_regex(r"[0-9]{1,3}|abc", tok)
    m = g.matcher()
    buf = np.full(g.vocabulary.mask_words + 2, -7, np.int32)
    m.fill_bitmask(buf)
    allowed = set(m.allowed_token_ids().tolist())
    bits = [(int(buf[i // 32]) >> (i % 32)) & 1 for i in range(len(tok))]
    assert {i for i, b in enumerate(bits) if b} == allowed
    assert buf[-1] == -7 and len(buf[: g.vocabulary.mask_words]) == (len(tok) + 31) // 32
    with pytest.raises(ValueError, match="int32"):
        m.fill_bitmask(np.zeros(g.vocabulary.mask_words, np.int64))


def test_advance_refuses_disallowed_and_rollback_restores():
    tok = tu.byte_level_bpe()
    g = compile_regex(r"(ab|ac)+", tok)
    m = g.matcher()
    with pytest.raises(ValueError, match="not allowed"):
        m.advance(tok.convert_tokens_to_ids("x"))
    ids = [tok.convert_tokens_to_ids(c) for c in "abac"]
    masks = []
    for tid in ids:
        masks.append(m.allowed_token_ids().tolist())
        m.advance(tid)
    m.advance(tok.eos_token_id)
    assert m.is_finished()
    m.rollback(3)
    assert m.allowed_token_ids().tolist() == masks[2] and not m.is_finished()
    m.rollback(2)
    assert m.allowed_token_ids().tolist() == masks[0]
    with pytest.raises(ValueError, match="roll back"):
        m.rollback(1)


@pytest.mark.parametrize("kind", KINDS)
def test_forced_tokens_hold_back_the_last_token(kind):
    tok = tu.ALL[kind]()
    g = compile_regex(r'\{"name": "[a-z]+", "id": [0-9]\}', tok)
    m = g.matcher()
    assert m.forced_bytes() == b'{"name": "'
    forced = m.forced_tokens()
    text = b"".join(g.vocabulary.token_bytes[i] for i in forced)
    assert forced and b'{"name": "'.startswith(text) and len(text) < len(b'{"name": "')
    assert forced == g.vocabulary.encode(b'{"name": "')[:-1]
    for tid in forced:
        m.advance(tid)
    for tid in g.vocabulary.encode(m.forced_bytes() + b"bob"):
        m.advance(tid)
    assert m.forced_tokens() == []  # more letters or the closing quote: a choice
    m.advance(g.vocabulary.encode(b'"')[0])
    rest = b"".join(g.vocabulary.token_bytes[i] for i in m.forced_tokens())
    assert b', "id": '.startswith(rest)


def test_forced_tokens_up_to_the_end_keep_the_last_token():
    tok = tu.cl100k()
    g = compile_regex(r"hello world", tok)
    m = g.matcher()
    forced = m.forced_tokens()
    assert forced == tok.encode("hello world", add_special_tokens=False)
    for tid in forced:
        m.advance(tid)
    assert m.is_finished() and m.forced_tokens() == []


def test_forced_tokens_never_split_a_character():
    tok = tu.byte_level_bpe()
    g = compile_regex(r"x[éè]", tok)  # both start with byte 0xC3
    m = g.matcher()
    assert m.forced_bytes() == b"x\xc3"
    assert m.forced_tokens() == []  # "x" is held back, the partial character is never forced


def _grammar_accepts(g, text: str) -> bool:
    state = g.step(g.initial, text.encode("utf-8"))
    return state is not None and g.closure(state)[1]


def test_a_repetition_opening_a_choice_branch_does_not_leak_into_the_others():
    rules = {"start": ir.Choice((ir.Seq((ir.Repeat(ir.Seq((ir.Lit("a"), ir.Terminal("[0-9]"))), 0, None), ir.Lit("b"))),
                                 ir.Lit("c")))}
    g = compile_grammar(ir.Grammar(rules, "start"), tu.byte_level_bpe())
    for text in ("b", "a1b", "a1a2b", "c"):
        assert _grammar_accepts(g, text), text
    for text in ("a1c", "a1", "cb"):
        assert not _grammar_accepts(g, text), text


def test_recursive_ir_grammar_nests_without_unrolling():
    rules = {
        "value": ir.Choice((ir.Terminal(r"[0-9]+"), ir.Ref("list"))),
        "list": ir.Seq((ir.Lit("["), ir.Repeat(ir.Seq((ir.Ref("value"), ir.Lit(","))), 0, None), ir.Lit("]"))),
    }
    g = compile_grammar(ir.Grammar(rules, "value"), tu.byte_level_bpe())
    deep = "[" * 60 + "1," + "]," * 59 + "]"
    assert _grammar_accepts(g, deep)
    assert not _grammar_accepts(g, deep[:-1]) and not _grammar_accepts(g, "[1]")
    rng = random.Random(3)
    shape = re.compile(r"[\[\],0-9]*")
    for _ in range(20):
        data = tu.random_walk(g.matcher(), g.vocabulary, rng, max_tokens=30, stop_prob=0.5)
        if data is not None:
            assert shape.fullmatch(data.decode()) and _grammar_accepts(g, data.decode())
            assert data.count(b"[") == data.count(b"]")


def test_call_only_rules_inside_recursive_rules_are_built():
    # r is recursive, so its body is only ever called; the call-only chain t -> u inside it must still be built
    tok = tu.byte_level_bpe()
    rules = {"start": ir.Ref("r"),
             "r": ir.Seq((ir.Lit("("), ir.Repeat(ir.Ref("r"), 0, 1), ir.Ref("t", call=True), ir.Lit(")"))),
             "t": ir.Seq((ir.Repeat(ir.Lit("a"), 0, 1), ir.Ref("u", call=True))),
             "u": ir.Repeat(ir.Lit("b"), 0, 1)}
    grammar = compile_grammar(ir.Grammar(rules), tok)
    for text, ok in [("()", True), ("(ab)", True), ("((a)b)", True), ("(ba)", False), ("((a)", False)]:
        state = grammar.step(grammar.initial, text.encode())
        assert (state is not None and grammar.closure(state)[1]) == ok, text


def test_ir_grammar_errors():
    tok = tu.byte_level_bpe()
    with pytest.raises(GrammarError, match="undefined rule 'nope'"):
        compile_grammar(ir.Grammar({"start": ir.Ref("nope")}), tok)
    with pytest.raises(GrammarError, match="no rules"):
        compile_grammar(ir.Grammar({}), tok)
    with pytest.raises(GrammarError, match="left-recursive"):
        compile_grammar(ir.Grammar({"start": ir.Choice((ir.Seq((ir.Ref("start"), ir.Lit("a"))), ir.Lit("b")))}), tok)
    # only what the rules on a reference cycle call is searched for left recursion: here a cycle the start reaches
    # through a rule outside it, which may match nothing first
    pair = {"a": ir.Seq((ir.Ref("b"), ir.Lit("x"))), "b": ir.Choice((ir.Ref("a"), ir.Lit("y"))),
            "maybe": ir.Repeat(ir.Lit("z"), 0, 1)}
    with pytest.raises(GrammarError, match="left-recursive"):
        compile_grammar(ir.Grammar({"start": ir.Seq((ir.Lit("("), ir.Ref("a", call=True))), **pair}), tok)
    after_maybe = ir.Choice((ir.Seq((ir.Ref("maybe", call=True), ir.Ref("a"))), ir.Lit("y")))
    with pytest.raises(GrammarError, match="left-recursive"):
        compile_grammar(ir.Grammar({"start": ir.Ref("a", call=True), **pair, "b": after_maybe}), tok)
    fine = compile_grammar(ir.Grammar({"start": ir.Ref("a", call=True), **pair,
                                       "b": ir.Choice((ir.Seq((ir.Lit("("), ir.Ref("a"))), ir.Lit("y")))}), tok)
    assert fine.step(fine.initial, b"((yxx") is not None
    with pytest.raises(GrammarError, match="matches no string"):
        compile_grammar(ir.Grammar({"start": ir.Terminal("[a-c]", excluding=("[a-c]",))}), tok)
    with pytest.raises(RegexError, match="lookahead is not supported at position 1"):
        compile_regex("a(?=b)", tok)


LARK_JSON = r"""
?start: value
?value: object | array | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
array  : "[" [value ("," value)*] "]"
object : "{" [ESCAPED_STRING ":" value ("," ESCAPED_STRING ":" value)*] "}"
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""


# objects inside objects and arrays: guarded call edges (members claimed, counts) under frames of every depth,
# whose masks are searched one frame at a time and kept per frame (TokenMasks._in_frame)
NESTED_OBJECTS = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/item"}, "maxItems": 3},
        "meta": {"$ref": "#/$defs/item"},
    },
    "required": ["id"],
    "additionalProperties": False,
    "$defs": {"item": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "yy"]}},
                       "required": ["b"], "minProperties": 1, "maxProperties": 2, "additionalProperties": False}},
}


def _stepped(g, state) -> set[int]:
    """The tokens whose bytes the parser steps through from `state`, one by one, and eos where the text is complete:
    what the trie walks of a mask must allow."""
    allowed = {t for t, b in enumerate(g.vocabulary.token_bytes) if b and g.step(state, b) is not None}
    return allowed | set(g.vocabulary.eos_ids) if g.closure(state)[1] else allowed


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
@pytest.mark.parametrize("which", ["regex", "lark_json", "nested", "objects", "objects_any_order"])
def test_masks_equal_brute_force_stepping(kind, which):
    """The trie walks (pop points, shared terminal walks, continuations, answers kept per frame) agree with
    stepping every token's bytes through the parser one by one."""
    from leapgen.grammars import compile_json_schema, compile_lark

    tok = tu.ALL[kind]()
    if which.startswith("objects"):
        order = "any" if which.endswith("any_order") else "schema"
        g = compile_json_schema(NESTED_OBJECTS, tok, property_order=order)
    elif which == "regex":
        g = compile_regex(r'\{"k": "([^"\\]|\\.)*", "n": [0-9]{1,3}\}', tok)
    elif which == "lark_json":
        g = compile_lark(LARK_JSON, tok)
    else:
        rules = {"v": ir.Choice((ir.Terminal(r'"[^"]*"'), ir.Seq((ir.Lit("["), ir.Ref("v"), ir.Lit("]")))))}
        g = compile_grammar(ir.Grammar(rules, "v"), tok)
    rng = random.Random(which)
    for _ in range(4):
        m = g.matcher()
        for _ in range(40 if which.startswith("objects") else 12):
            allowed = set(m.allowed_token_ids().tolist())
            assert allowed == _stepped(g, m._state)
            choices = sorted(allowed - set(g.vocabulary.eos_ids))
            if not choices:
                break
            m.advance(rng.choice(choices))


# objects whose claims are taken together (token_masks._Claims, here from four members on), with required members, a
# dependency (an optional trigger), a count bound, extras and another such object inside
LARGE_OBJECT = {
    "type": "object",
    "properties": {**{key: {"type": "integer"} for key in "acdfghij"}, "b": {"type": "boolean"},
                   "e": {"type": "object", "properties": {key: {"enum": [1, 22]} for key in "klmnopqrs"},
                         "required": ["p"], "additionalProperties": False}},
    "required": ["c", "f"],
    "dependentRequired": {"b": ["h"]},
    "maxProperties": 7,
    "additionalProperties": {"type": "integer"},
}


def _member_vocabulary(keys: str):
    """Every byte, and tokens that hold a whole member and go on past it (its frame returns inside the token), a key
    with its colon and values, a separator with the next key; in a shuffled order, so that a member's tokens lie
    in words all over the mask and some of its walks are kept whole (dense)."""
    pieces = {bytes([b]) for b in range(256)}
    for key in keys:
        pieces |= {f'"{key}":1,'.encode(), f'"{key}":22}}'.encode(), f'"{key}":'.encode(), f', "{key}'.encode(),
                   f'{{"{key}":true,'.encode(), f'"{key}":1, "'.encode()}
        pieces |= {f'"{key}":{n}'.encode() for n in range(10)}
    pieces = sorted(pieces)
    random.Random(0).shuffle(pieces)
    return _vocabulary_of(pieces)


def _walk_by_long_tokens(g, vocabulary, rng: random.Random, walks: int, steps: int) -> None:
    """Random walks through `g`, mostly by tokens of several bytes, each mask allowing what stepping allows."""
    for _ in range(walks):
        m = g.matcher()
        for _ in range(steps):
            allowed = set(m.allowed_token_ids().tolist())
            assert allowed == _stepped(g, m._state)
            long_ones = [t for t in allowed if t not in vocabulary.eos_ids and len(vocabulary.token_bytes[t]) > 1]
            choices = long_ones if long_ones and rng.random() < 0.7 else sorted(allowed - set(vocabulary.eos_ids))
            if not choices:
                break
            m.advance(rng.choice(choices))


@pytest.mark.parametrize("order", ["schema", "any"])
def test_masks_of_large_objects_equal_brute_force_stepping(order, monkeypatch):
    """Where a member of a large object comes next, the claimable members' answers taken together allow what
    stepping every token's bytes through the parser allows."""
    from leapgen.grammars import compile_json_schema, token_masks

    monkeypatch.setattr(token_masks, "_CLAIMS_TOGETHER", 4)
    vocabulary = _member_vocabulary("abcdefghijklmnopqrs")
    g = compile_json_schema(LARGE_OBJECT, vocabulary, whitespace="flexible", property_order=order)
    _walk_by_long_tokens(g, vocabulary, random.Random(order), walks=12, steps=60)
    tables = g.masks._claims.values()
    assert any(table.returns for table in tables) and any(table.dense for table in tables)  # both kinds were met
    assert len(token_masks._or_chosen.signatures) == 1      # the kernel warm_up loads, never compiled again


@pytest.mark.parametrize("order", ["schema", "any"])
def test_members_keys_spelled_apart_allow_what_their_frame_searches_allow(order, monkeypatch):
    """Where a member of a large object may come next, the members whose frames begin with their keys have the keys
    spelled in one pass (`TokenMasks._keys_apart`), and those whose keys some token writes whole and goes on past
    are searched as before: masks equal those of a frame search per member, along random walks that take tokens
    ending a member and starting the next key, and tokens writing a whole key and its value."""
    from leapgen.grammars import compile_json_schema, token_masks, trie_walks

    monkeypatch.setattr(token_masks, "_CLAIMS_TOGETHER", 4)
    vocabulary = _member_vocabulary("abcdefghijkl")
    schema = {"type": "object", "properties": {key: {"type": "integer"} for key in "abcdefghijkl"},
              "required": ["b", "k"], "additionalProperties": False}
    apart, searched = [], []    # (table, members) joined each way
    spelled, add = token_masks._Claims.add_spelled, token_masks._Claims.add
    monkeypatch.setattr(token_masks._Claims, "add_spelled",
                        lambda table, members, *rest: apart.append((table, members)) or spelled(table, members, *rest))
    monkeypatch.setattr(token_masks._Claims, "add",
                        lambda table, member, answer: searched.append((table, member)) or add(table, member, answer))
    g = compile_json_schema(schema, vocabulary, whitespace="flexible", property_order=order)
    one_by_one = compile_json_schema(schema, vocabulary, whitespace="flexible", property_order=order)
    one_by_one.masks._keys_apart = lambda g, edges, table, missing, nodes: missing
    rng = random.Random(order)
    for _ in range(12):
        m, other = g.matcher(), one_by_one.matcher()
        for _ in range(50):
            allowed = set(m.allowed_token_ids().tolist())
            assert allowed == set(other.allowed_token_ids().tolist())
            long_ones = [t for t in allowed if t not in vocabulary.eos_ids and len(vocabulary.token_bytes[t]) > 1]
            choices = long_ones if long_ones and rng.random() < 0.7 else sorted(allowed - set(vocabulary.eos_ids))
            if not choices:
                break
            token = rng.choice(choices)
            m.advance(token)
            other.advance(token)
    tables = [id(table) for table in g.masks._claims.values()]
    assert sum(bin(members).count("1") for table, members in apart if id(table) in tables) > 50
    assert sum(id(table) in tables for table, _ in searched) > 5    # both ways were taken
    assert len(trie_walks.spelled_apart.signatures) == 1     # the kernel warm_up loads, never compiled again


@pytest.mark.parametrize("order", ["schema", "any"])
def test_keys_spelled_together_allow_what_stepping_allows(order, monkeypatch):
    """A parser state of many key states (after `{"` in an object of many optional members, here from two on) has
    its keys spelled from the root in one pass (`spell_from_root`): keys that are prefixes of others, tokens ending
    inside a key, at its end and past it (into the colon and the value) are allowed as stepping allows them."""
    from leapgen.grammars import compile_json_schema, token_masks

    monkeypatch.setattr(token_masks, "_KEYS_TOGETHER", 2)
    keys = ["na", "name", "names", "nan", "type", "typed", "t", "id", "ids", "a_b", "x"]
    pieces = {bytes([b]) for b in range(256)}
    for key in keys:
        pieces |= {f'{{"{key}'.encode(), f'"{key}":'.encode(), f'{key}":1'.encode(), f'{key[1:]}":1'.encode(),
                   f'{key[1:]}":'.encode(), f'{key[2:]}",'.encode(), f', "{key[:2]}'.encode(), key[1:].encode()}
    vocabulary = _vocabulary_of(sorted(pieces))
    schema = {"type": "object", "properties": {key: {"type": "integer"} for key in keys},
              "required": ["id"], "additionalProperties": False}
    g = compile_json_schema(schema, vocabulary, property_order=order)
    _walk_by_long_tokens(g, vocabulary, random.Random(order), walks=12, steps=40)
    assert g.masks._chains is not None and len(g.masks._chains[0])     # the keys were spelled together


@pytest.mark.parametrize("order", ["schema", "any"])
def test_keys_stepped_together_reach_the_states_stepped_one_by_one(order, monkeypatch):
    """A parser step from many configurations moves those in key states over the byte at once
    (`TokenMasks.keys_stepped`): every token's bytes reach the state they reach with each configuration stepped on
    its own, along random walks through an object of many optional members."""
    from leapgen.grammars import compile_json_schema, token_masks

    keys = ["na", "name", "names", "nan", "type", "typed", "t", "id", "ids", "a_b", "x", "é", "n\"q"]
    vocabulary = tu.byte_level_bpe()
    g = compile_json_schema({"type": "object", "properties": {key: {"type": "integer"} for key in keys}}, vocabulary,
                            property_order=order)
    rng, together = random.Random(order), 0
    for m, allowed in _walk_states(g, rng, walks=8, steps=40):
        for token in rng.sample(allowed, min(len(allowed), 40)):
            data = g.vocabulary.token_bytes[token]
            monkeypatch.setattr(token_masks, "_KEYS_TOGETHER", 2)
            stepped = g.step(m._state, data)
            monkeypatch.setattr(token_masks, "_KEYS_TOGETHER", 10 ** 9)
            assert stepped == g.step(m._state, data) and stepped is not None, data
            together += len(g.closure(m._state)[0]) >= 2
    assert together > 100


def test_steps_inside_one_terminal_reach_the_states_of_byte_by_byte_steps():
    """`step` moves a state of one terminal that cannot end yet (a string's inside, a key) along its row, without a
    closure: every token, allowed or not, reaches the state (or None) that `_step_byte` reaches over its bytes, along
    random walks (inside strings, keys, numbers, captured texts, which record each byte, and parallel branches)."""
    from leapgen.grammars import compile_json_schema

    schemas = [{"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z ]+$"},
                                                 "n": {"type": "number"}}},
               {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
               {"anyOf": [{"type": "object", "properties": {"key": {"type": "string", "maxLength": 9}}},
                          {"type": "object", "properties": {"key": {"type": "string", "format": "date"}}}]}]
    rng, inside, branched = random.Random(0), 0, 0
    for schema in schemas:
        g = compile_json_schema(schema, tu.byte_level_bpe())
        for m, allowed in _walk_states(g, rng, walks=6, steps=30):
            tokens = rng.sample(allowed, min(len(allowed), 20)) + rng.sample(range(g.vocabulary.size), 20)
            for data in filter(None, (g.vocabulary.token_bytes[token] for token in tokens)):
                state = m._state
                for b in data:
                    state = g._step_byte(state, b) if state is not None else None
                assert g.step(m._state, data) == state, data
            first = m._state[0][0]
            inside += (len(m._state) == 1 and first >= g.automaton.first_terminal and not g.masks.accepting[first]
                       and not g.stacks.captures)
            branched += len(m._state) > 1
    assert inside > 10 and branched > 10


def _walk_states(g, rng: random.Random, walks: int, steps: int):
    """Random walks through `g`'s masks: yields each matcher at each state with its allowed tokens but eos, then
    advances it by one of them."""
    for _ in range(walks):
        m = g.matcher()
        for _ in range(steps):
            allowed = sorted(set(m.allowed_token_ids().tolist()) - set(g.vocabulary.eos_ids))
            if not allowed:
                break
            yield m, allowed
            m.advance(rng.choice(allowed))


def test_members_passed_over_leave_a_large_objects_masks(monkeypatch):
    """In schema order, once `c` is written `b` may not follow, though it could after `a`: neither its key's tokens
    (kept whole, dense) nor the tokens that write it whole and go on (its frame returns inside them) are allowed."""
    from leapgen.grammars import compile_json_schema, token_masks

    monkeypatch.setattr(token_masks, "_CLAIMS_TOGETHER", 4)
    vocabulary = _member_vocabulary("abcde")
    g = compile_json_schema({"type": "object", "properties": {key: {"type": "integer"} for key in "abcde"},
                             "additionalProperties": False}, vocabulary)
    m = g.matcher()
    for byte in b'{"a":1, "c":1, "d":2}':
        assert set(m.allowed_token_ids().tolist()) == _stepped(g, m._state)
        m.advance(vocabulary.token_bytes.index(bytes([byte])))
    tables = g.masks._claims.values()
    assert any(table.dense for table in tables) and any(table.returns for table in tables)


@pytest.mark.parametrize("order", ["schema", "any"])
def test_a_large_objects_claims_open_as_a_byte_picks_them(order, monkeypatch):
    """The closure leaves a large object's claims closed (the object's state stands for them among the ready
    configurations), and a step opens only those of the members that may read its byte: every step, next bytes,
    forced bytes and end are those of the same grammar with its claims opened in the closure, with fewer stacks."""
    from leapgen.grammars import compile_json_schema, token_masks

    vocabulary = _member_vocabulary("abcdefghijklmnopqrs")

    def compiled(claims_together: int):
        monkeypatch.setattr(token_masks, "_CLAIMS_TOGETHER", claims_together)
        return compile_json_schema(LARGE_OBJECT, vocabulary, whitespace="flexible", property_order=order)

    eager, lazy = compiled(1000), compiled(4)
    assert lazy.masks.large_objects and not eager.masks.large_objects
    rng, closed = random.Random(order), 0
    for _ in range(6):
        ml, me = lazy.matcher(), eager.matcher()
        for _ in range(40):
            closed += any(g < lazy.automaton.first_terminal for g, _ in lazy.closure(ml._state)[0])
            allowed = _stepped(lazy, ml._state)
            assert allowed == _stepped(eager, me._state) == set(ml.allowed_token_ids().tolist())
            assert lazy.next_bytes(ml._state).tolist() == eager.next_bytes(me._state).tolist()
            assert ml.forced_bytes() == me.forced_bytes() and ml.is_finished() == me.is_finished()
            choices = sorted(allowed - set(vocabulary.eos_ids))
            if not choices:
                break
            token = rng.choice(choices)
            ml.advance(token)
            me.advance(token)
    assert closed >= 5

    def closure_stacks(grammar) -> int:
        """The stacks the closure of the state after a separator makes (in any order a claim of each member left,
        three stacks each; in schema order only `c`'s, which is required next)."""
        m = grammar.matcher()
        for token in (b"{", b'"a":1,'):
            m.advance(vocabulary.token_bytes.index(token))
        made = len(grammar.stacks.parent)
        grammar.closure(m._state)
        return len(grammar.stacks.parent) - made

    assert closure_stacks(compiled(4)) * 4 < closure_stacks(compiled(1000))


def test_a_closure_takes_call_edges_as_the_search_does():
    """`StackArena.calls`, the closure's one pass over a state's call edges (claims closed once their member is
    written, extras, retagged frames, pushed and tail calls, captured texts), makes the configurations that `edge`
    and `made`, the mask search's steps, make one edge at a time."""
    from leapgen.grammars import compile_json_schema

    schema = {"type": "object", "required": ["c", "f"], "dependentRequired": {"b": ["h"]},
              "properties": {**{key: {"type": "integer"} for key in "acdfghij"}, "b": {"type": "boolean"},
                             "t": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
              "additionalProperties": {"type": "integer"}}
    vocabulary = _member_vocabulary("abcdefghijt")
    g = compile_json_schema(schema, vocabulary, whitespace="flexible", property_order="any")
    stacks, call_edges, first_terminal = g.stacks, g.masks.call_edges, g.automaton.first_terminal
    compared, kinds = 0, set()
    m = g.matcher()
    for byte in b'{"a": 1, "t": ["x", "yy", "x1"], "b": true, "h": 2, "zz": 5, "c": 3, "f": 4}':
        seen, todo = set(m._state), list(m._state)
        while todo:     # every configuration the closure meets, structural ones included
            state, s = todo.pop()
            nexts = []
            if state < first_terminal:
                edges = [stacks.edge(s, c) for c in call_edges[state]]
                nexts = stacks.calls(s, call_edges[state])
                assert nexts == [(edge[0], stacks.made(s, edge)) for edge in edges if edge is not None]
                compared += len(edges)
                kinds.update("closed" if edge is None else "captured" if edge[4] == b"" else "retagged"
                             if edge[2] != stacks.tag[s] else "pushed" if edge[3] else "tail" for edge in edges)
            popped = stacks.pop(s) if g.masks.accepting[state] and s else None
            nexts += [popped] if popped is not None else []
            todo += [cfg for cfg in nexts if cfg not in seen]
            seen.update(nexts)
        m.advance(vocabulary.token_bytes.index(bytes([byte])))
    assert g.closure(m._state)[1]   # the whole document was read
    assert compared > 200 and kinds == {"closed", "captured", "retagged", "pushed", "tail"}


def test_frames_past_the_nesting_bound_are_searched_inside_their_caller(monkeypatch):
    """Masks are the same whether pushed frames are answered on their own (and kept) or searched inside the
    frame that pushed them, as they are past `_MAX_FRAME_NESTING`."""
    from leapgen.grammars import compile_json_schema, token_masks

    tok = tu.byte_level_bpe()
    nested = compile_json_schema(NESTED_OBJECTS, tok, property_order="any")
    monkeypatch.setattr(token_masks, "_MAX_FRAME_NESTING", 0)
    inline = compile_json_schema(NESTED_OBJECTS, tok, property_order="any")
    rng = random.Random(0)
    for _ in range(6):
        a, b = nested.matcher(), inline.matcher()
        for _ in range(40):
            monkeypatch.setattr(token_masks, "_MAX_FRAME_NESTING", 48)
            allowed = a.allowed_token_ids().tolist()
            monkeypatch.setattr(token_masks, "_MAX_FRAME_NESTING", 0)
            assert b.allowed_token_ids().tolist() == allowed
            choices = [t for t in allowed if t not in nested.vocabulary.eos_ids]
            if not choices:
                break
            token = rng.choice(choices)
            a.advance(token)
            b.advance(token)


def test_shared_walks_evict_the_least_recently_used(monkeypatch):
    """The walks shared by every grammar stay within their bound, and a walk asked for again (the inside of a JSON
    string, which every grammar needs) outlives walks asked for once since."""
    import weakref

    from leapgen.grammars import compile_regex, token_masks, trie_walks

    monkeypatch.setattr(token_masks, "_SHARED_WALKS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(token_masks, "_SHARED_WALKS_LIMIT", 3)
    masks = compile_regex("[a-z]+", tu.byte_level_bpe()).masks
    dfas = [regex_dfa(p) for p in ("a[bc]*", "b[cd]*", "c[de]*", "d[ef]*")]
    root, key = trie_walks.ROOT, trie_walks.ROOT_KEY
    first = masks._shared_walk(dfas[0], 0, root, key)
    for dfa in dfas[1:3]:
        masks._shared_walk(dfa, 0, root, key)
    assert masks._shared_walk(dfas[0], 0, root, key) is first     # a hit: now the most recently used
    masks._shared_walk(dfas[3], 0, root, key)                       # evicts dfas[1]'s, the least recently used
    assert len(masks._shared) == 3
    assert masks._shared_walk(dfas[0], 0, root, key) is first
    assert masks._shared_walk(dfas[1], 0, root, key) is not None    # walked again
    assert len(masks._shared) == 3


def test_dense_walks_below_other_nodes_outlive_narrow_ones(monkeypatch):
    """A dense walk below trie nodes other than the root (a long string's first chunk, after every token that opens
    it) costs as much as a wide state's: kept with those, walks of narrow states do not push it out."""
    import weakref

    from leapgen.grammars import token_masks, trie_tables, trie_walks

    monkeypatch.setattr(token_masks, "_SHARED_WALKS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(token_masks, "_SHARED_WALKS_LIMIT", 2)
    masks = compile_regex("[a-z]+", tu.byte_level_bpe()).masks
    nodes = trie_tables.root_children(masks.vocabulary)
    dense = masks._shared_walk(regex_dfa("(?s:.*)"), 0, nodes, nodes.tobytes())
    assert dense[0] is None     # (words: none where the bitmask is whole)
    root, key = trie_walks.ROOT, trie_walks.ROOT_KEY
    narrow = [masks._shared_walk(regex_dfa(p), 0, root, key) for p in ("ab", "cd", "ef", "gh")]
    assert all(walk[0] is not None for walk in narrow)
    assert masks._shared_walk(regex_dfa("(?s:.*)"), 0, nodes, nodes.tobytes()) is dense
    assert masks._shared_walk(regex_dfa("ab"), 0, root, key) is not narrow[0]     # pushed out, walked again


def test_large_automata_skip_main_paths_once_their_walks_pay_for_it(monkeypatch):
    """A wide walk of a DFA with many states reads the trie plainly until its walks have cost about what the
    byte runs cost to compute; then it skips.  Both walks find what reading each token through the DFA finds."""
    from leapgen.grammars import token_masks, trie_walks
    from leapgen.grammars.json_strings import Length

    rng = random.Random(7)
    pieces = {bytes([b]) for b in range(256)} | {"".join(rng.choices('ab@x" é', k=rng.randint(2, 9))).encode()
                                                  for _ in range(2000)}
    vocabulary = _vocabulary_of(sorted(pieces))
    masks = compile_regex("[a-z]+", vocabulary).masks
    monkeypatch.setattr(token_masks, "_SIGNED_WALK_NODES", 0)     # a small vocabulary: every state counts as wide
    dfa = Length(2, 40).intersect(regex_dfa(r'"[^"\\ ]+@[^"\\ ]+"'), 1 << 20)
    monkeypatch.setattr(token_masks, "_SKIPPING_STATES", dfa.num_states // 2 + 1)
    states = [1, int(dfa.trans[1, ord("a")])]
    walks = []
    for skipped, state in enumerate(states):
        walks.append(masks._shared_walk(dfa, state, trie_walks.ROOT, trie_walks.ROOT_KEY))
        assert dfa.has_byte_runs == bool(skipped)
    for state, walk in zip(states, walks):
        allowed, pops, _, _ = _walk_by_tokens(dfa, vocabulary, state)
        assert _walk_tokens(walk, vocabulary) == allowed and set(walk[2].tolist()) == pops


def test_rules_every_grammar_reads_alike_share_their_frame_answers(monkeypatch):
    """Inside a rule that reads the same in every grammar holding it (any JSON value), a grammar takes the answers
    other grammars found, of its own schema or another; where the rule reads otherwise (numbers capped to two
    digits), it finds its own.  Either way the masks along an instance are those of a grammar that shares nothing."""
    import weakref

    from leapgen.grammars import compile_json_schema, token_masks

    tok = tu.byte_level_bpe()
    array, text = {"type": "array", "items": {}}, b'[[1, {"x": [true, 12, "a"]}], [[2]], {}]'
    record = {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}}
    record_text = b'{"a": [1, {"x": [true, 12]}], "b": 3}'
    searched = []   # per frame searched, whether inside such a rule
    search = token_masks.TokenMasks._frame_search

    def counted(masks, g, *args):
        searched.append(g in masks._portable)
        return search(masks, g, *args)

    def masks_along(schema, data, fresh=False, **options) -> tuple[list[list[int]], int]:
        if fresh:
            monkeypatch.setattr(token_masks, "_SHARED_FRAMES", weakref.WeakKeyDictionary())
        searched.clear()
        g = compile_json_schema(schema, tok, **options)
        m, masks = g.matcher(), []
        for tid in g.vocabulary.encode(data):
            masks.append(m.allowed_token_ids().tolist())
            m.advance(tid)
        return masks, sum(searched)

    monkeypatch.setattr(token_masks.TokenMasks, "_frame_search", counted)
    alone, own = masks_along(array, text, fresh=True)
    record_alone, record_own = masks_along(record, record_text, fresh=True)
    assert own > 0 and record_own > 0
    capped, _ = masks_along(array, text, fresh=True, max_number_digits=2)
    assert capped != alone
    after_other, own = masks_along(array, text)
    assert after_other == alone and own > 0
    again, own = masks_along(array, text)
    assert again == alone and own == 0     # every answer inside the rule taken from the grammar before
    record_after, own = masks_along(record, record_text)
    assert record_after == record_alone and own < record_own     # another schema's grammar takes some of them


def test_portable_rules_are_keyed_by_their_group_and_the_groups_they_reach():
    """Rules that reach each other share one group number, a rule calling them is named with that number among the
    groups it calls, a rule that reaches one not kept across grammars is not portable, and an equal grammar gets the
    same numbers (a long recursion is one group: one number, not a set of its reach per rule).  What names a group
    holds the automata's numbers, not the automata: it keeps none of them alive, and drops out of the garbage
    collector's scans (it kept two thirds of a long run's tracked objects, each full collection a 10-20 ms pause)."""
    import gc
    import weakref

    from leapgen.grammars import automaton

    def rule(*labels, shared=True):
        return fsm.CallDFA([False, True], [tuple((label, 1) for label in labels), ()], shared=shared)

    rules = {"a": rule("b", "<terminal 1>"), "b": rule("a"), "c": rule("a"), "d": rule("e"), "e": rule(shared=False)}
    keys = automaton._portable_rules(rules)
    assert sorted(keys) == ["a", "b", "c"]
    assert keys["a"] == ("a", keys["a"][1]) and keys["a"][1] == keys["b"][1] != keys["c"][1]
    named = {number: name for name, number in automaton._PORTABLE_KEYS.items()}
    assert named[keys["c"][1]] == ((("c", rules["c"].uid),), (keys["a"][1],))    # its members, the groups it calls
    assert automaton._portable_rules(dict(rules)) == keys
    rebuilt = dict(rules, c=rule("a"))      # the same calls in another automaton: another rule
    assert automaton._portable_rules(rebuilt)["c"][1] != keys["c"][1]
    ring = {f"r{i}": rule(f"r{(i + 1) % 2000}") for i in range(2000)}
    assert len({number for _, number in automaton._portable_rules(ring).values()}) == 1
    gone = weakref.ref(ring.pop("r0"))
    del ring
    for _ in range(3):      # nested tuples leave the collector's lists one level per collection
        gc.collect()
    assert gone() is None
    assert not any(gc.is_tracked(name) for name in automaton._PORTABLE_KEYS)


def test_rules_in_order_are_found_productive_in_one_pass_as_by_the_work_list():
    """Where every rule refers only to rules defined before it, the productive rules are found in one pass in that
    order, an object's own parts (`owner<k>` rules, made after it) first: the same rules, and the same members found
    writable, as the work list finds in any order; here a member whose value matches nothing, and an extra."""
    from leapgen.grammars import automaton

    never = ir.Terminal("a", also=("b",))
    rules = {
        "value": ir.Choice((ir.Lit("1"), ir.Lit("2"))),
        "none": ir.Seq((ir.Lit("x"), never)),
        "obj": ir.Members(ir.Lit("{"), tuple(ir.Seq((ir.Lit(f'"{key}":'), ir.Ref(value)))
                                             for key, value in (("a", "value"), ("b", "none"), ("c", "value"))),
                          ir.Lit(","), ir.Lit("}"), extra=ir.Seq((ir.Lit('"d":'), ir.Ref("value"))),
                          required=frozenset({0})),
        "start": ir.Choice((ir.Ref("obj"), ir.Ref("none"))),
    }
    grammar = ir.Grammar(rules, "start")
    compiler = automaton._Compiler(grammar)
    assert compiler.in_order
    built = {name: compiler.rule_dfa(name) for name in [grammar.start] + sorted(compiler.called - {grammar.start})}
    known = {label for label, dfa in compiler.terminal_rules.items() if not dfa.matches_nothing}
    one_pass = automaton._productive(built, known, compiler)
    compiler.in_order = False
    assert automaton._productive(built, known, compiler) == one_pass
    productive, live = one_pass
    assert {"obj", "obj<1>", "obj<3>", "start"} <= productive and "obj<2>" not in productive and live["obj"] == 0b101
    g = compile_grammar(grammar, tu.byte_level_bpe())
    assert _grammar_accepts(g, '{"a":1,"d":2}') and _grammar_accepts(g, '{"c":2,"a":1}')
    assert g.step(g.initial, b'{"a":1,"b"') is None and not _grammar_accepts(g, '{"d":1}')


def test_a_closed_rule_is_taken_whole_by_the_grammars_holding_its_body(monkeypatch):
    """Any JSON value calls only itself and its terminals, and the JSON-schema compiler keeps its body as one object:
    the second grammar holding it closes the rule (`automaton._ClosedRule`), and the grammars after take its automaton
    whole, its terminals labelled first, instead of building and checking it again.  The masks along an instance are
    those of the grammar that built it, here where a recursion of the schema's own calls it too."""
    from leapgen.grammars import automaton, automaton_shapes, compile_json_schema

    tok = tu.byte_level_bpe()
    schema = {"type": "object",
              "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"$ref": "#"}}}}
    monkeypatch.setattr(automaton_shapes, "MAX_SHAPED_RULES", 0)    # compiled whole each time, not taken by shape
    text = b'{"a": 1, "b": [{"a": 2, "x": {"y": [null, 1.5, "s"]}}, {"b": []}], "z": [true, {}]}'

    def masks_along() -> tuple[list[list[int]], automaton.Automaton]:
        g = compile_json_schema(schema, tok)
        m, masks = g.matcher(), []
        for tid in g.vocabulary.encode(text):
            masks.append(m.allowed_token_ids().tolist())
            m.advance(tid)
        assert m.is_finished()
        return masks, g.automaton

    monkeypatch.setattr(automaton, "_RULE_DFAS", {})
    monkeypatch.setattr(automaton, "_CLOSED_RULES", {})
    built, _ = masks_along()
    assert not automaton._CLOSED_RULES      # built here, kept in _RULE_DFAS
    reused, _ = masks_along()
    (closed,) = automaton._CLOSED_RULES.values()
    assert closed.name == "any_value" and reused == built
    relabelled = automaton._Compiler._relabelled

    def not_the_closed_one(compiler, body, built):
        assert body is not closed.body, "the closed rule was built again"
        return relabelled(compiler, body, built)

    monkeypatch.setattr(automaton._Compiler, "_relabelled", not_the_closed_one)
    taken, taken_automaton = masks_along()
    assert taken == built
    first_terminals = [dfa for _, dfa in taken_automaton.terminals[:len(closed.terminals)]]
    assert first_terminals == [dfa for _, dfa in closed.terminals]
    assert any(key == closed.portable for _, _, key in taken_automaton.portable)


def test_closed_rules_closed_over_another_dfa_of_a_shared_terminal_are_built_again(monkeypatch):
    """Two closed rules share a terminal, the second closed after the terminal memo built that terminal again: a
    grammar holding both gives the terminal the first one's label, so the second, whose automaton calls the other
    DFA's label, is built as any rule (taken whole, the call would be trimmed away as calling nothing, and its rule
    would match nothing); its next grammar closes it again over the grammar's own DFA."""
    from leapgen.grammars import automaton, automaton_shapes, regex

    monkeypatch.setattr(automaton, "_RULE_DFAS", {})
    monkeypatch.setattr(automaton, "_CLOSED_RULES", {})
    monkeypatch.setattr(automaton_shapes, "MAX_SHAPED_RULES", 0)    # compiled whole each time, not taken by shape
    first = ir.Choice((ir.Seq((ir.Lit("a"), ir.Ref("r1"))), ir.Lit(";")))
    second = ir.Choice((ir.Seq((ir.Lit("b"), ir.Ref("r2"))), ir.Lit(";")))
    both = ir.Grammar({"r1": first, "r2": second, "start": ir.Seq((ir.Ref("r1"), ir.Ref("r2")))}, "start")
    alone = ir.Grammar({"r2": second, "start": ir.Seq((ir.Lit("x"), ir.Ref("r2")))}, "start")
    for _ in range(2):
        automaton.compile_automaton(both)
    del automaton._CLOSED_RULES[id(second)], automaton._RULE_DFAS[second]
    for memo in (regex.literal_dfa, regex.literals_dfa):
        memo.cache_clear()
    for _ in range(2):
        automaton.compile_automaton(alone)

    def semicolon(body: ir.Expr) -> fsm.DFA:
        return next(dfa for expr, dfa in automaton._CLOSED_RULES[id(body)].terminals if expr == ir.Lit(";"))

    assert semicolon(first) is not semicolon(second)
    for _ in range(2):
        g = compile_grammar(both, tu.byte_level_bpe())
        assert _grammar_accepts(g, "aa;b;") and _grammar_accepts(g, ";;") and not _grammar_accepts(g, "a;")
    assert semicolon(first) is semicolon(second)


def _vocabulary_of(token_bytes: list[bytes]):
    """A vocabulary of `token_bytes` (in this order) and eos after them."""
    from leapgen.grammars.vocab import Vocabulary, build_trie

    return Vocabulary(len(token_bytes) + 1, [*token_bytes, None], {}, (len(token_bytes),), build_trie(token_bytes))


def _key_vocabulary(keys: list[str]):
    """Every byte, and every end of each key with its closing quote and what may follow the quote (a token that
    completes a declared key is what a walk inside an extra key must refuse), and the middles of the keys."""
    pieces = {bytes([b]) for b in range(256)}
    for key in keys:
        data = key.encode()
        for i in range(len(data)):
            pieces |= {data[i:] + b'"', data[i:] + b'":', data[i:] + b'", "', data[i:-1], data[i:i + 2]}
    return _vocabulary_of(sorted(piece for piece in pieces if piece))


def _assert_patched_walks_are_whole_walks(masks, vocabulary, dfas) -> int:
    from leapgen.grammars import trie_walks

    patched = 0
    for dfa in dfas:
        for state in range(dfa.num_states):
            walk = masks._patched_root_walk(dfa, state, 0)
            if walk is None:
                continue
            patched += 1
            plain = trie_walks.run_walk(dfa, vocabulary, state, trie_walks.ROOT)
            expected, found = np.zeros(vocabulary.mask_words, np.uint32), np.zeros(vocabulary.mask_words, np.uint32)
            trie_walks.add_walk(plain, expected)
            trie_walks.add_walk(walk, found)
            assert np.array_equal(found, expected), state
            assert walk[2].tolist() == plain[2].tolist(), state
    return patched


@pytest.mark.parametrize("kind", ["keys", "cl100k"])
def test_patched_walks_equal_walking_the_whole_trie(kind):
    """A whole-vocabulary walk patched from a neighbouring state's (inside an extra key, a prefix of declared keys)
    allows the same tokens and stops at the same trie nodes as walking the trie from the state itself."""
    from leapgen.grammars import compile_json_schema

    keys = ["servicename", "server", "service", "serial", "s", "port", "ports", "porta\u00e9", "x\"q", "a\\b", "my_"]
    vocabulary = _key_vocabulary(keys) if kind == "keys" else tu.cl100k()
    g = compile_json_schema({"type": "object", "properties": {k: {"type": "integer"} for k in keys}}, vocabulary)
    patched = _assert_patched_walks_are_whole_walks(g.masks, g.vocabulary, [dfa for _, dfa in g.automaton.terminals])
    assert patched >= len("servicename")    # every proper prefix of a key beside the others, at least


def test_patched_walks_where_acceptance_parts():
    """Patched walks of states whose successors accept where their neighbour's do not, and the other way round
    (a pop point that comes or goes under a patched byte), over tokens that run through several patched levels."""
    rng = random.Random(7)
    pieces = {bytes([b]) for b in range(256)} | {bytes(rng.choices(b"abcdxy01", k=rng.randint(2, 6)))
                                                  for _ in range(600)}
    token_bytes = sorted(pieces)
    vocabulary = _vocabulary_of(token_bytes)
    masks = compile_regex("[a-z]+", vocabulary).masks
    dfas = [regex_dfa(p) for p in (r"(?s:.*abc)", r"(?s:.*ab(c|dd)x?)", r"(?s:(.*[^a])?)", r"(?s:.*(ab|b)y?)",
                                   r"(?s:[^a]*a[^b]*b?.*)", r"(?s:(.*x)?y.*)", r"(?s:.*a.?b)",
                                   r"(?s:.*[^a]b|b)",      # after "a", "b" no longer ends it: a pop point goes
                                   # after "a", "b" leaves only digits: below it the walk starts afresh
                                   r"(?s:(?:[^a]|a+[^ab])*a*(?:ab[0-9](?:[^a]|a+[^ab])*a*)*)",
                                   # accepting nearly everywhere: the old walk's pop points are most of the trie
                                   r"(?s:[^x]*(x[^y][^x]*)*x?)")]
    assert _assert_patched_walks_are_whole_walks(masks, vocabulary, dfas) >= 10


def test_patched_walks_below_pattern_keys():
    """Keys other than [a-z]+ part from any string on 26 bytes at every level of the lowercase tokens: the patch
    reaches ~33k trie nodes of cl100k (its pop points then merged by marks on the trie, not by sorting)."""
    from leapgen.grammars import compile_json_schema

    g = compile_json_schema({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}}}, tu.cl100k())
    assert _assert_patched_walks_are_whole_walks(g.masks, g.vocabulary, [dfa for _, dfa in g.automaton.terminals])


def test_pop_points_merged_by_sorting_and_by_marks_agree():
    from numba.typed import List

    from leapgen.grammars import trie_walks

    rng = random.Random(3)
    vocabulary = _vocabulary_of(sorted({bytes(rng.choices(b"abcxyz", k=rng.randint(1, 8))) for _ in range(3000)}))
    t_end = vocabulary.trie.end
    assert len(t_end) >> 5 > 81     # few enough changes for _merge_pops to sort them
    inner = [node for node in range(len(t_end)) if t_end[node] > node + 1]
    for _ in range(50):
        base = np.array(sorted(rng.sample(inner, rng.randint(0, len(inner) // 2))), np.int32)
        dropped = List([(0, 1)])
        for node in rng.sample(range(len(t_end)), rng.randint(0, 40)):
            dropped.append((node, int(t_end[node])) if rng.random() < 0.3 else (node, node + 1))
        added = List([0])
        for node in rng.sample(range(len(t_end)), rng.randint(0, 40)):
            added.append(node)
        sorted_pops = trie_walks._merge_pops(base, dropped, added, t_end)
        assert sorted_pops.tolist() == trie_walks._marked_pops(base, dropped, added, t_end).tolist()


def _walk_tokens(walk, vocabulary) -> set[int]:
    """The ids of the tokens a walk allows."""
    from leapgen.grammars import trie_walks

    bits = np.zeros(vocabulary.mask_words, np.uint32)
    trie_walks.add_walk(walk, bits)
    return set(np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little")).tolist())


def _walk_by_tokens(dfa, vocabulary, state: int) -> tuple[set[int], set[int], int, int]:
    """What a whole-vocabulary walk from `state` must find, token by token: the tokens the DFA reads to the end
    and the trie nodes (with something below them) where it may stop; and how many of the nodes it reaches are
    roots of subtrees a skipping walk leaves out (`walk_nodes`), and how many of those only a plain run does."""
    from leapgen.grammars import trie_tables

    t = vocabulary.trie
    heights, below = trie_tables.subtree_tables(vocabulary)
    runs, run_bytes, plain_runs = dfa.byte_runs
    plain_bytes = fsm.PLAIN_WORDS
    allowed, pops, skipped, plain = set(), {0} if dfa.accept[state] else set(), set(), set()
    for tid, data in enumerate(vocabulary.token_bytes):
        q, node = state, 0
        for byte in data or b"":
            q, node = int(dfa.trans[q, byte]), int(trie_tables.child(t.byte, t.end, node, byte))
            if q < 0:
                break
            if dfa.accept[q] and t.end[node] > node + 1:
                pops.add(node)
            if t.end[node] > node + 1 and 0 < heights[node]:
                by_main = heights[node] <= runs[q] and not (below[node] & ~run_bytes[q]).any()
                by_plain = heights[node] <= plain_runs[q] and not (below[node] & ~plain_bytes).any()
                if by_main or by_plain:
                    skipped.add(node)
                if by_plain and not by_main:
                    plain.add(node)
        else:
            if data:
                allowed.add(tid)
    return allowed, pops, len(skipped), len(plain)


# words searched for in a JSON string: present, absent, one of two and not both
_WORD_SEARCHES = (r'"[^"\\]*(?:ab|mx)[^"\\]*"', r'"(?:[^"\\m]|m[^"\\x])*m?"', r'"[^"\\]*[0-9a-f]{4}[^"\\]*"',
                  r'"(?:[^"\\a]|a[^"\\b])*(?:a|ab(?:[^"\\a]|a[^"\\b])*a?)?"')


@pytest.mark.parametrize("pattern", [
    r'"[^"\\]*"', r'"(?:[^"\\]|\\.){0,40}"', r'"[a-z]{0,5}"', r'(?s:.*(customer|maker).*)', r'[0-9]+',
    r'"[a-zé中😀 ]{2,10}"', r'(?s:(ab)*a?)', r'"(?:[^"\\]|\\.){3,}x"', r'(?s:[^x]*(x[^y][^x]*)*x?)',
    # the main path narrows after a byte (a run must not go on into it), and loops of two states
    r'"[a-z][a-c]*"', r'"(?:[0-9a-f]{2})*"', r'"(?:[a-z ]{2})*"',
    *_WORD_SEARCHES])
def test_walks_skipping_subtrees_find_what_each_token_reads(pattern):
    """Walks that leave out the trie subtrees whose bytes all keep to a state's main path, or are all plain text
    within the state's plain run (`DFA.byte_runs`), allow the same tokens and stop at the same trie nodes as
    reading every token through the DFA, from every state, over a vocabulary of quotes, escapes, UTF-8 and long
    runs of letters; where words are searched for, plain runs leave out subtrees main paths do not."""
    from leapgen.grammars import trie_walks

    rng = random.Random(3)
    alphabet = 'abcmxy"\\ é中'
    pieces = {bytes([b]) for b in range(256)} | {"".join(rng.choices(alphabet, k=rng.randint(2, 12))).encode()
                                                  for _ in range(3000)}
    token_bytes = sorted(pieces)
    vocabulary = _vocabulary_of(token_bytes)
    dfa = regex_dfa(pattern)
    skipped = plain = 0
    for state in range(dfa.num_states):
        walk = trie_walks.run_walk(dfa, vocabulary, state, trie_walks.ROOT, wide=True, skipping=True)
        found = _walk_tokens(walk, vocabulary)
        allowed, pops, skips, plain_skips = _walk_by_tokens(dfa, vocabulary, state)
        assert found == allowed, (state, sorted(found ^ allowed)[:5])
        assert set(walk[2].tolist()) == pops, state
        skipped += skips
        plain += plain_skips
    assert skipped or pattern in (r'[0-9]+', r'(?s:(ab)*a?)', r'(?s:[^x]*(x[^y][^x]*)*x?)')   # accepting runs
    assert plain or pattern not in _WORD_SEARCHES


@pytest.mark.parametrize("bounds", [(0, 5), (2, 6), (0, 1), (3, 9), (0, 20), ("end", 0, 4), ("end", 2, 7),
                                    ("chars", 4), ("chars", 32)])
def test_narrowed_walks_of_length_bounded_strings_find_what_each_token_reads(bounds, monkeypatch):
    """A length-bounded string's walks, narrowed from any string's (`DFA.like`), allow the same tokens and stop at
    the same trie nodes as reading every token through the DFA: tokens longer than the characters left, ending on
    the bound, running through a closing quote, mid-character and escaped; from every state the kernel narrows
    (at any depth), and as the masks take them (narrowed only where the two read alike for long enough)."""
    from leapgen.grammars import token_masks, trie_walks
    from leapgen.grammars.json_strings import chars_dfa, length_dfa, string_end_dfa

    rng = random.Random(5)
    alphabet = 'abx"\\ é中😀u0aF'
    pieces = {bytes([b]) for b in range(256)} | {"".join(rng.choices(alphabet, k=rng.randint(2, 12))).encode()
                                                  for _ in range(3000)}
    pieces |= {piece[:cut] for piece in list(pieces) for cut in (1, 2, 3) if len(piece) > cut}  # mid-character
    vocabulary = _vocabulary_of(sorted(pieces))
    masks = compile_regex("[a-z]+", vocabulary).masks
    monkeypatch.setattr(token_masks, "_SIGNED_WALK_NODES", 0)     # a small vocabulary: every state counts as wide
    dfa = {"end": string_end_dfa, "chars": chars_dfa}.get(bounds[0], length_dfa)(
        *[b for b in bounds if not isinstance(b, str)])
    # every state of the small automata; of the large ones, each character's start and a spread of the others
    first = 0 if isinstance(bounds[0], str) else 1     # the first character's start (after the opening quote)
    states = set(range(0, dfa.num_states, 1 + dfa.num_states // 60)) | set(
        np.flatnonzero(dfa.like_states == dfa.like_states[first]).tolist())
    narrowed = 0
    for state in sorted(states):
        allowed, pops, _, _ = _walk_by_tokens(dfa, vocabulary, state)
        walks = [masks._shared_walk(dfa, state, trie_walks.ROOT, trie_walks.ROOT_KEY)]
        if dfa.like_depths[state] > 0:
            walks.append(masks._narrowed_root_walk(dfa, state))
        narrowed += dfa.like_depths[state] >= token_masks._NARROWED_DEPTH
        for walk in walks:
            found = _walk_tokens(walk, vocabulary)
            assert found == allowed, (state, sorted(found ^ allowed)[:5])
            assert set(walk[2].tolist()) == pops, state
    assert narrowed or max(b for b in bounds if not isinstance(b, str)) < token_masks._NARROWED_DEPTH


def test_walks_do_not_skip_where_the_main_path_narrows():
    """After `x` any letter, then only a-c: a subtree below `x` of letters as deep as three holds tokens the DFA
    refuses (`xmm`), so a run from after `x` must stop where the next state's bytes no longer hold its own."""
    from leapgen.grammars import trie_walks

    token_bytes = sorted({bytes([b]) for b in range(256)} | {b"xab", b"xabc", b"xmm", b"xmab", b"xa"})
    vocabulary = _vocabulary_of(token_bytes)
    dfa = regex_dfa(r"x[a-z][a-c]*y")
    walk = trie_walks.run_walk(dfa, vocabulary, 0, trie_walks.ROOT, wide=True, skipping=True)
    found = {token_bytes[t] for t in _walk_tokens(walk, vocabulary)}
    assert found == {b"x", b"xa", b"xab", b"xabc", b"xmab"}
