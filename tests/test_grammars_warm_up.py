"""`warm_up` loads every compiled kernel a compile or a mask calls, so that a server's first request does not."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from leapgen.grammars.json_schema_scalars import CHUNK

_FRESH_PROCESS = """
import sys
sys.path.insert(0, {tests!r})
from tokenizers_util import byte_level_bpe
from leapgen.grammars import captured_texts, compile_json_schema, fsm, token_masks, trie_tables, trie_walks
from leapgen.grammars import vocab, warm_up

tokenizer = byte_level_bpe()
warm_up(tokenizer)
# the kernels called from Python (the others are compiled into these)
kernels = [fsm._subset_construction, fsm._minimal, fsm._reachable_in_order, fsm._canonical_ranges,
           fsm._product_pairs, fsm._most_to_accept, fsm._sparse_product, fsm._byte_runs, fsm._plain_runs,
           fsm._chain_tables,
           trie_walks._walk,
           trie_walks._walk_whole, trie_walks.patch_walk, trie_walks.narrow_walk, captured_texts.goes_on,
           captured_texts.descend_texts, captured_texts.clear_below, trie_tables._subtrees, trie_walks.spelled,
           captured_texts.writes_again, captured_texts.reading_nodes, trie_walks._walk_many, trie_walks.row_reach,
           trie_walks.spell_from_root,
           trie_tables._siblings, token_masks._or_chosen, trie_walks._or_words, vocab._build_trie]
print(sorted(kernel.__name__ for kernel in kernels if not kernel.signatures))
# nor does a compile import a module (jsonschema filtering an enum): it would land outside a server's frozen heap
loaded = set(sys.modules)
compile_json_schema({{"$schema": "http://json-schema.org/draft-07/schema#", "enum": ["x", "yy"], "minLength": 2}},
                    tokenizer)
print(sorted(set(sys.modules) - loaded))
"""


def test_warm_up_loads_every_kernel_and_module_a_compile_calls():
    code = _FRESH_PROCESS.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            cwd=tempfile.gettempdir())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "[]"]


_CHUNK_WALKS = """
import sys
sys.path.insert(0, {tests!r})
from tokenizers_util import byte_level_bpe
from leapgen.grammars import compile_json_schema, ir, token_masks, trie_walks, warm_up
from leapgen.grammars.automaton import terminal_for
from leapgen.grammars.json_schema_scalars import CHUNK
from leapgen.grammars.json_strings import ANY_CHARS, Chars

tokenizer = byte_level_bpe()
if {warm}:
    warm_up(tokenizer)
chunk = terminal_for(ir.Terminal(ANY_CHARS, (Chars(CHUNK),)))
walked = []
run, narrowed = trie_walks.run_walk, token_masks.TokenMasks._narrowed_root_walk
token_masks.run_walk = lambda dfa, *rest, **kw: walked.append(dfa is chunk) or run(dfa, *rest, **kw)
token_masks.TokenMasks._narrowed_root_walk = lambda self, dfa, state: walked.append(dfa is chunk) or narrowed(
    self, dfa, state)
matcher = compile_json_schema({{"type": "string", "maxLength": 7 * CHUNK}}, tokenizer).matcher()
assert any(dfa is chunk for _, dfa in matcher.grammar.automaton.terminals)
for token in tokenizer.encode('"' + "q" * (2 * CHUNK + 3), add_special_tokens=False):
    matcher.allowed_token_ids()
    matcher.advance(token)
print(sum(walked))
"""


def test_warm_up_walks_the_chunk_of_long_strings():
    """A string bounded past one chunk meets the chunk automaton's states at every character, each with a walk of
    the whole vocabulary the first time: warm_up takes them, so that a request does not (5-11 ms a mask on
    cl100k).  Without warm_up the same masks walk them."""
    counts = {}
    for warm in (True, False):
        code = _CHUNK_WALKS.format(tests=str(Path(__file__).parent), warm=warm)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            cwd=tempfile.gettempdir())
        assert result.returncode == 0, result.stderr
        counts[warm] = int(result.stdout)
    assert counts[True] == 0
    assert counts[False] >= CHUNK // 2
