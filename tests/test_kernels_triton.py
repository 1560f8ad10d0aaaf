"""Triton kernels against the torch reference.

On a machine with CUDA the compiled kernels run on the GPU.  Without one they run on CPU tensors in
Triton's interpreter, which Triton picks when a kernel is *decorated*, i.e. when `leapgen.kernels.triton_*`
is first imported: so this module sets `TRITON_INTERPRET=1` before importing them.  The variable stays set
for the rest of the session, because Triton also reads it on its own lazy imports later (restoring it breaks
them); it only matters to Triton code, which without CUDA can run nowhere else.  If another module imported
the kernels earlier without it, these tests skip.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"

if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton", reason="triton is not installed")
from leapgen.kernels import dispatch, reference, triton_attention  # noqa: E402
from leapgen.kernels.triton_decode import _decode_split_kernel, _tiles as decode_tiles, partition_size  # noqa: E402
from leapgen.kernels.triton_launch import parallel_workers  # noqa: E402

if not ON_GPU:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(_decode_split_kernel, InterpretedFunction):
        pytest.skip("leapgen.kernels.triton_* was imported before TRITON_INTERPRET=1 was set",
                    allow_module_level=True)

BF16 = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not ON_GPU, reason="Triton's interpreter multiplies bfloat16 bit patterns in tl.dot (triton-lang/triton#11584)"))
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def _cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32).to(DEVICE)


def _paged_cache(gen: torch.Generator, lengths: list[int], block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, spare_columns: int = 1):
    """K/V caches with each sequence's blocks scattered in shuffled order, table padded with -1."""
    per_seq = [math.ceil(n / block_size) for n in lengths]
    num_blocks = sum(per_seq) + 2  # spare blocks full of noise that no sequence owns
    k_cache = _randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = _randn(gen, num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lengths), max(per_seq, default=0) + spare_columns), -1, dtype=torch.int32)
    used = 0
    for row, count in enumerate(per_seq):
        table[row, :count] = order[used:used + count]
        used += count
    return k_cache, v_cache, table.to(DEVICE)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


PACKED_CASES = [
    # q_lens, k_lens, q_heads, kv_heads, head_dim
    pytest.param([1], [1], 1, 1, 64, id="single-token"),
    pytest.param([1, 16, 17, 33], [1, 16, 17, 33], 4, 1, 64, id="tile-edges-gqa4"),
    pytest.param([31, 48], [31, 48], 8, 1, 128, id="gqa8-d128"),
    pytest.param([20], [20], 2, 2, 256, id="d256"),
    pytest.param([5, 16, 1], [20, 40, 9], 4, 2, 64, id="queries-end-of-sequence"),
    pytest.param([3, 0, 18], [3, 0, 18], 2, 1, 64, id="empty-sequence-in-batch"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("q_lens,k_lens,q_heads,kv_heads,head_dim", PACKED_CASES)
def test_prefill_packed_matches_reference(q_lens, k_lens, q_heads, kv_heads, head_dim, dtype):
    gen = _gen(sum(q_lens) + head_dim)
    q = _randn(gen, sum(q_lens), q_heads, head_dim, dtype=dtype)
    k = _randn(gen, sum(k_lens), kv_heads, head_dim, dtype=dtype)
    v = _randn(gen, sum(k_lens), kv_heads, head_dim, dtype=dtype)
    args = (q, k, v, _cumulative(q_lens), _cumulative(k_lens), max(q_lens), max(k_lens))
    _assert_close(triton_attention.flash_attn_varlen(*args), reference.flash_attn_varlen(*args))


def test_prefill_non_causal_with_scale_and_strided_inputs():
    gen = _gen(1)
    lengths = [7, 24]
    qkv = _randn(gen, sum(lengths), 4 + 2 * 2, 64, dtype=torch.float32)  # fused projection output
    q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
    args = (q, k, v, _cumulative(lengths), _cumulative(lengths), 24, 24)
    kwargs = dict(causal=False, softmax_scale=0.3)
    _assert_close(triton_attention.flash_attn_varlen(*args, **kwargs),
                  reference.flash_attn_varlen(*args, **kwargs))


def test_prefill_empty_batch():
    q = torch.empty(0, 2, 64, device=DEVICE)
    k = torch.empty(0, 1, 64, device=DEVICE)
    cu = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    assert triton_attention.flash_attn_varlen(q, k, k, cu, cu, 0, 0).shape == (0, 2, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("q_lens,k_lens,block_size,q_heads,kv_heads,head_dim", [
    pytest.param([9, 40], [9, 40], 16, 4, 1, 64, id="full-prefill-bs16"),
    pytest.param([1, 17], [32, 50], 16, 8, 1, 128, id="prefix-hit-bs16"),
    pytest.param([13, 6], [77, 64], 32, 2, 2, 64, id="chunked-bs32"),
    pytest.param([5], [300], 256, 4, 4, 64, id="bs256-across-blocks"),
    pytest.param([4], [21], 16, 2, 1, 256, id="d256-bs16"),
])
def test_prefill_through_block_table(q_lens, k_lens, block_size, q_heads, kv_heads, head_dim, dtype):
    gen = _gen(sum(k_lens) + block_size)
    q = _randn(gen, sum(q_lens), q_heads, head_dim, dtype=dtype)
    k_cache, v_cache, table = _paged_cache(gen, k_lens, block_size, kv_heads, head_dim, dtype)
    args = (q, k_cache, v_cache, _cumulative(q_lens), _cumulative(k_lens), max(q_lens), max(k_lens))
    _assert_close(triton_attention.flash_attn_varlen(*args, block_table=table),
                  reference.flash_attn_varlen(*args, block_table=table))


def _decode_case(seq_lens: list[int], block_size: int, q_heads: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, spare_columns: int = 1):
    gen = _gen(sum(seq_lens) + q_heads + head_dim)
    q = _randn(gen, len(seq_lens), q_heads, head_dim, dtype=dtype)
    k_cache, v_cache, table = _paged_cache(gen, seq_lens, block_size, kv_heads, head_dim, dtype, spare_columns)
    return q, k_cache, v_cache, table, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16])
@pytest.mark.parametrize("seq_lens,block_size,q_heads,kv_heads,head_dim", [
    pytest.param([1], 16, 1, 1, 64, id="length-1"),
    pytest.param([16, 17, 100, 1], 16, 4, 1, 64, id="block-edges-gqa4"),
    pytest.param([33, 64], 32, 8, 1, 128, id="gqa8-d128"),
    pytest.param([70, 5], 64, 2, 2, 256, id="d256-bs64"),
    pytest.param([300], 256, 4, 2, 64, id="bs256"),
])
def test_decode_matches_reference(seq_lens, block_size, q_heads, kv_heads, head_dim, dtype):
    args = _decode_case(seq_lens, block_size, q_heads, kv_heads, head_dim, dtype)
    _assert_close(triton_attention.paged_decode_attention(*args), reference.paged_decode_attention(*args))


def _num_partitions(q: torch.Tensor, k_cache: torch.Tensor, table: torch.Tensor) -> int:
    block_n, min_partition, _, _ = decode_tiles(q.shape[-1], q.dtype, q.device)
    capacity = table.shape[1] * k_cache.shape[1]
    return math.ceil(capacity / partition_size(q.shape[0], k_cache.shape[2], capacity, block_n, min_partition,
                                               parallel_workers(q.device)))


def test_decode_split_over_several_partitions():
    # A short batch over a long context: the split path with its reduce kernel.
    q, k_cache, v_cache, table, lens = _decode_case([1000 if ON_GPU else 150, 3], 16, 4, 1, 64, torch.float32,
                                                    spare_columns=3)
    assert _num_partitions(q, k_cache, table) > 2
    args = (q, k_cache, v_cache, table, lens)
    _assert_close(triton_attention.paged_decode_attention(*args), reference.paged_decode_attention(*args))


def test_decode_single_partition():
    # Enough sequences x KV heads to fill the machine: one partition each, no reduce kernel.
    batch = 4 * parallel_workers(torch.device(DEVICE))
    q, k_cache, v_cache, table, lens = _decode_case([1 + i % 23 for i in range(batch)], 16, 2, 1, 64,
                                                    torch.float32)
    assert _num_partitions(q, k_cache, table) == 1
    args = (q, k_cache, v_cache, table, lens)
    _assert_close(triton_attention.paged_decode_attention(*args), reference.paged_decode_attention(*args))


def test_decode_empty_batch_and_empty_context():
    q, k_cache, v_cache, table, lens = _decode_case([5], 16, 2, 1, 64, torch.float32)
    empty = triton_attention.paged_decode_attention(q[:0], k_cache, v_cache, table[:0], lens[:0])
    assert empty.shape == (0, 2, 64)
    # A sequence with nothing cached attends to nothing: zeros (the reference would give NaN).
    out = triton_attention.paged_decode_attention(q, k_cache, v_cache, table, torch.zeros_like(lens))
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                               (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)])
def test_store_kv_matches_reference(dtype, cache_dtype):
    gen = _gen(7)
    kv = _randn(gen, 7, 2, 3, 64, dtype=dtype)  # one tensor so k and v are strided views, like a fused QKV
    k, v = kv[:, 0], kv[:, 1]
    slots = torch.tensor([3, -1, 15, 16, 79, -1, 40], device=DEVICE)
    caches = [torch.zeros(5, 16, 3, 64, dtype=cache_dtype, device=DEVICE) for _ in range(4)]
    triton_attention.store_kv(k, v, caches[0], caches[1], slots)
    reference.store_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert bool(caches[0].flatten(0, 1)[79].any())


def test_store_kv_nothing_to_store():
    cache = torch.zeros(2, 16, 1, 64, device=DEVICE)
    empty = torch.empty(0, 1, 64, device=DEVICE)
    triton_attention.store_kv(empty, empty, cache, cache.clone(), torch.empty(0, dtype=torch.int64, device=DEVICE))
    skipped = torch.ones(2, 1, 64, device=DEVICE)
    triton_attention.store_kv(skipped, skipped, cache, cache.clone(), torch.full((2,), -1, device=DEVICE))
    assert not bool(cache.any())


def test_bad_inputs_are_named():
    q = torch.zeros(4, 3, 64, device=DEVICE)
    kv = torch.zeros(4, 2, 64, device=DEVICE)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of KV heads \(2\)"):
        triton_attention.flash_attn_varlen(q, kv, kv, cu, cu, 4, 4)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32 or int64"):
        triton_attention.flash_attn_varlen(q[:, :2], kv, kv, cu.float(), cu, 4, 4)
    cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping has 3 slots for 4 tokens"):
        triton_attention.store_kv(kv, kv, cache, cache, torch.zeros(3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="block_table must be"):
        triton_attention.paged_decode_attention(q[:, :2], cache, cache, cu, cu[:1])


def test_dispatch_can_force_triton(monkeypatch):
    args = _decode_case([20, 3], 16, 2, 1, 64, torch.float32)
    monkeypatch.setenv("LEAPGEN_KERNELS", "triton")
    _assert_close(dispatch.paged_decode_attention(*args), reference.paged_decode_attention(*args))
    monkeypatch.setenv("LEAPGEN_KERNELS", "fast")
    with pytest.raises(ValueError, match="LEAPGEN_KERNELS must be"):
        dispatch.paged_decode_attention(*args)
