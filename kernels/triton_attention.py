"""The Triton kernels behind `leapgen.kernels` on CUDA: packed prefill, paged decode, KV-cache store.

Each lives in its own module (`triton_prefill`, `triton_decode`, `triton_cache`); this one gathers the
three entry points that `dispatch` calls.  Importing it needs `triton` installed (it raises ImportError
otherwise).  With `TRITON_INTERPRET=1` set before this import, the kernels run on CPU tensors in
Triton's interpreter (slow; used by the tests).
"""

from __future__ import annotations

from leapgen.kernels.triton_cache import store_kv
from leapgen.kernels.triton_decode import paged_decode_attention
from leapgen.kernels.triton_prefill import flash_attn_varlen

__all__ = ["flash_attn_varlen", "paged_decode_attention", "store_kv"]
