"""`warm_up` loads every compiled kernel a compile or a mask calls, so that a server's first request does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_FRESH_PROCESS = """
import sys
sys.path.insert(0, {tests!r})
from tokenizers_util import byte_level_bpe
from leapgen.grammars import compile_json_schema, fsm, token_masks, vocab, warm_up

tokenizer = byte_level_bpe()
warm_up(tokenizer)
# the kernels called from Python (the others are compiled into these)
kernels = [fsm._subset_construction, fsm._minimal, fsm._reachable_in_order, fsm._product_pairs,
           fsm._sparse_product, fsm._byte_runs, token_masks._walk, token_masks._walk_skipping, token_masks._patch_walk,
           token_masks._narrow_walk, token_masks._goes_on, token_masks._descend_texts, token_masks._clear_below,
           token_masks._subtrees,
           vocab._build_trie]
print(sorted(kernel.__name__ for kernel in kernels if not kernel.signatures))
# nor does a compile import a module (jsonschema filtering an enum): it would land outside a server's frozen heap
loaded = set(sys.modules)
compile_json_schema({{"$schema": "http://json-schema.org/draft-07/schema#", "enum": ["x", "yy"], "minLength": 2}},
                    tokenizer)
print(sorted(set(sys.modules) - loaded))
"""


def test_warm_up_loads_every_kernel_and_module_a_compile_calls():
    code = _FRESH_PROCESS.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "[]"]
