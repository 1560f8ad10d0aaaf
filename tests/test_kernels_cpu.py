"""The compiled CPU decode kernel against the torch reference."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from leapgen.kernels import cpu_decode, cpu_exp, cpu_rows, cpu_threads, dispatch, reference


@pytest.mark.parametrize("num_heads,num_kv_heads,dim", [(4, 4, 64), (8, 2, 128), (16, 2, 32)])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_cpu_decode_matches_reference(num_heads, num_kv_heads, dim, block_size):
    generator = torch.Generator().manual_seed(block_size + dim)
    lengths = torch.tensor([1, block_size, block_size + 1, 3 * block_size - 1, 70])
    blocks_per_seq = (int(lengths.max()) + block_size - 1) // block_size
    num_blocks = len(lengths) * blocks_per_seq + 3
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, dim, generator=generator)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, dim, generator=generator)
    table = torch.randperm(num_blocks, generator=generator)[: len(lengths) * blocks_per_seq]
    table = table.view(len(lengths), blocks_per_seq).to(torch.int32)
    q = torch.randn(len(lengths), num_heads, dim, generator=generator)
    expected = reference.paged_decode_attention(q, k_cache, v_cache, table, lengths, softmax_scale=0.3)
    got = cpu_decode.paged_decode_attention(q, k_cache, v_cache, table, lengths, softmax_scale=0.3)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_vectorizable_exp_error_is_a_few_ulps_of_its_argument():
    x = np.concatenate([np.linspace(-87.0, 0.0, 100_001), -np.logspace(-8, 1.9, 2001), [0.0, -1e-30]])
    x = x.astype(np.float32)
    got = np.array([cpu_exp.exp_nonpositive(np.float32(v)) for v in x], dtype=np.float64)
    # Rounding x * log2(e) to float32 costs relative error in proportion to |x|.
    relative = np.abs(got / np.exp(x.astype(np.float64)) - 1)
    assert (relative / np.maximum(1.0, np.abs(x))).max() < 1.5e-7


def test_row_logsumexp_matches_float64_and_gives_empty_rows_their_limits():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3000, generator=generator) * 4
    x[1, ::2] = -float("inf")
    x[2] = -float("inf")
    x[3, 17] = float("nan")
    scale = torch.tensor([1.0, 1 / 0.7, 2.0, 1.0, 0.5, 1.0])
    got = cpu_rows.row_logsumexp(x, x.amax(dim=-1), scale)
    expected = torch.logsumexp(x.double() * scale.double()[:, None], dim=-1)
    assert got.dtype == torch.float64 and got[2] == -float("inf") and got[3].isnan()
    finite = [0, 1, 4, 5]
    torch.testing.assert_close(got[finite], expected[finite], rtol=0, atol=1e-6)


def test_dispatch_uses_cpu_kernel_for_float32_only(monkeypatch):
    q32, cache32 = torch.zeros(1, 2, 8), torch.zeros(1, 4, 2, 8)
    assert cpu_decode.supports(q32, cache32)
    assert not cpu_decode.supports(q32.bfloat16(), cache32.bfloat16())
    monkeypatch.setenv("LEAPGEN_KERNELS", "reference")
    calls = []
    monkeypatch.setattr(cpu_decode, "paged_decode_attention", lambda *a, **k: calls.append(1))
    dispatch.paged_decode_attention(q32, cache32, cache32, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([1]))
    assert not calls            # forcing the reference is honoured


def test_empty_batch():
    out = cpu_decode.paged_decode_attention(torch.zeros(0, 2, 8), torch.zeros(1, 4, 2, 8), torch.zeros(1, 4, 2, 8),
                                            torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    assert out.shape == (0, 2, 8)


def test_a_batch_cut_across_threads_gives_the_same_outputs(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    lengths = torch.randint(200, 600, (12,), generator=generator)
    k_cache, v_cache = (torch.randn(12 * 40, 16, 2, 32, generator=generator) for _ in range(2))
    table = torch.randperm(12 * 40, generator=generator).view(12, 40).to(torch.int32)
    q = torch.randn(12, 8, 32, generator=generator)
    outputs = []
    for split in (False, True):
        threads = cpu_threads.Threads(cpu_decode._decode, min_part_work=1000)
        threads.split = split
        monkeypatch.setattr(cpu_decode, "_THREADS", threads)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
        outputs.append(cpu_decode.paged_decode_attention(q, k_cache, v_cache, table, lengths))
        assert (threads.pool is not None) == split
    assert torch.equal(*outputs)


def test_a_forked_child_cuts_across_threads_of_its_own(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    done = []
    threads = cpu_threads.Threads(lambda i: done.append(i), min_part_work=1)
    threads.split = True
    threads.run(4, lambda count: [(i,) for i in range(count)])          # the parent's pool now exists
    assert threads.pool is not None and sorted(done) == [0, 1]
    pid = os.fork()
    if pid == 0:                                                       # the child: exit 0 once its work ran
        threads.run(4, lambda count: [(i,) for i in range(count)])
        os._exit(0 if sorted(done) == [0, 0, 1, 1] else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung on the parent's thread pool")


def test_threads_trial_both_ways_then_keep_the_faster(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    threads = cpu_threads.Threads(lambda: None, min_part_work=100)
    work = 1000
    assert threads.count(100) == 1      # too little work to cut
    seen = []
    while threads.split is None:
        count = threads.count(work)
        seen.append(count)
        threads.observe(count, work, 1.0 if count == 1 else 0.6)
    assert seen.count(1) == seen.count(2) == cpu_threads.Threads.TRIALS
    assert threads.split and threads.count(work) == 2


def naive_causal_attention(q, k, v, scale):
    """Bottom-right causal attention of `q [lq, hq, d]` over `k, v [lk, hkv, d]`, written out in full."""
    lq, lk, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    allowed = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v.double()).float()


@pytest.mark.parametrize("lq, lk", [(1100, 1100), (1100, 1500), (300, 2000), (1, 40)])
def test_chunk_attention_after_a_cached_prefix(lq, lk):
    """A prefill chunk after cached positions: from 1024 queries the CPU path takes the earlier positions and
    the chunk's own in two flash calls merged by log-sum-exp; below, one masked call. Both equal the naive
    formula."""
    torch.manual_seed(0)
    q, k, v = torch.randn(lq, 4, 16), torch.randn(lk, 2, 16), torch.randn(lk, 2, 16)
    out = reference._attend(q, k, v, causal=True, scale=0.25)
    torch.testing.assert_close(out, naive_causal_attention(q, k, v, 0.25), atol=2e-5, rtol=1e-4)
