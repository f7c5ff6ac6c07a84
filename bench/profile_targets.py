"""The kernels whose targets are furthest off, each run at its benchmark shape, for Nsight
Compute to profile the kernels of one warm call (the benchmarks time them; this says where the
time goes). Profiling is on only around that call (``cudaProfilerStart`` / ``Stop``):

    ncu --profile-from-start off --set full python3 bench/profile_targets.py TARGET

TARGET: ``dense_fwd`` (the default forward, b 8 h 32 s 4096 d 128), ``dense_bwd`` (the
deterministic backward at that shape: delta, dK/dV, dQ), ``mla_h128`` / ``mla_h16`` (MLA decode,
B 128, ctx 8192, T 1, bf16 cache: split, combine), ``mla_h128_overlap`` (its hand-scheduled split), ``mla_h16_e4m3`` (the same with an e4m3 cache), ``mla_h16_e4m3_one_producer`` (its
one-producer split, two CTAs a SM), ``sparse`` / ``sparse_e4m3`` (sparse MLA
decode at the benchmark's shape: B 128, H 128, k 2048, bf16 / e4m3 cache), ``sparse_fwd`` /
``sparse_fwd_producer`` / ``sparse_fwd_independent`` / ``sparse_fwd_alternate`` (the sparse prefill forward at its
benchmark shape, each schedule), ``indexer_h32_d64`` / ``indexer_h64_d128`` (the prefill indexer, S 4096,
N 8192, causal), ``mega_t1`` / ``mega_t4001`` (MegaMoE on one rank, V4-Flash, T 1 / 4001, the default
form: every kernel of one eager call, gating to combine). Inputs are random (never zeros); the first
call's output is checked for finiteness, so a broken launch is not mistaken for the kernel.
"""
# not a benchmark (scripts/gpu-check runs the bench/*.py files without this line)

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _dense(backward: bool):
    import torch

    from kernels.attention.dense_bwd import dense_attention_backward
    from kernels.attention.dense_fwd import dense_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((8, 4096, 32, 128), generator=g, device="cuda").to(torch.bfloat16) for _ in range(4))
    o, lse = dense_attention(q, k, v)
    if not backward:
        return lambda: dense_attention(q, k, v), o
    return lambda: dense_attention_backward(do, q, k, v, o, lse), dense_attention_backward(do, q, k, v, o, lse)[0]


def _mla(heads: int, fp8: bool = False, num_stages: int | None = None, overlap: bool = False):
    import torch

    from bench.attention_decode import BATCH, CTX, mla_case
    from kernels.attention.decode_mla import mla_decode

    g = torch.Generator(device="cuda").manual_seed(heads)
    q, kv, table, sl, scales = mla_case(BATCH, CTX, heads, 1, fp8, g)
    call = lambda: mla_decode(q, kv, table, sl, kv_scales=scales, num_stages=num_stages, overlap=overlap)  # noqa: E731
    return call, call()[0]


def _sparse(fp8: bool):
    import torch

    from bench.attention_decode import SPARSE_TOPK, sparse_case
    from kernels.attention.decode_sparse import sparse_mla_decode

    q, kv, table, sl, idx, sink, scales = sparse_case(fp8, torch.Generator(device="cuda").manual_seed(SPARSE_TOPK))
    call = lambda: sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales)  # noqa: E731
    return call, call()[0]


def _indexer(heads: int, dim: int):
    from bench.attention_decode import indexer_inputs
    from kernels.attention.indexer import indexer_logits

    args = indexer_inputs(4096, 8192, heads, dim, heads + dim)
    call = lambda: indexer_logits(*args)  # noqa: E731
    return call, call()[:, :64]  # keys every query sees (the rest are -inf)


def _mega(tokens: int):
    import torch

    from kernels.moe.mega.layer import mega_moe
    from kernels.moe.pipeline import V4_FLASH
    from kernels.moe.reference import random_layer

    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, V4_FLASH["hidden"], device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, V4_FLASH["n_experts"], device="cuda", generator=g)
    weights = random_layer(V4_FLASH)
    call = lambda: mega_moe(x, logits, *weights, V4_FLASH["cfg"], n_virtual_ranks=1)  # noqa: E731
    return call, call()


def _sparse_fwd(schedule: str):
    from bench.attention_prefill import sparse_inputs
    from kernels.attention.sparse_fwd import sparse_attention

    _, q, kv, idx, sink = sparse_inputs(1)
    call = lambda: sparse_attention(q, kv, idx, sink, schedule=schedule)  # noqa: E731
    return call, call()[0]


TARGETS = {"dense_fwd": lambda: _dense(False), "dense_bwd": lambda: _dense(True),
           "mla_h128": lambda: _mla(128), "mla_h128_overlap": lambda: _mla(128, overlap=True), "mla_h16": lambda: _mla(16),
           "mla_h16_e4m3": lambda: _mla(16, True), "mla_h16_e4m3_one_producer": lambda: _mla(16, True, 1),
           "indexer_h32_d64": lambda: _indexer(32, 64), "indexer_h64_d128": lambda: _indexer(64, 128),
           "sparse": lambda: _sparse(False), "sparse_e4m3": lambda: _sparse(True),
           "sparse_fwd": lambda: _sparse_fwd("pipelined"), "sparse_fwd_producer": lambda: _sparse_fwd("producer"),
           "sparse_fwd_independent": lambda: _sparse_fwd("independent"), "sparse_fwd_alternate": lambda: _sparse_fwd("alternate"),
           "mega_t1": lambda: _mega(1), "mega_t4001": lambda: _mega(4001)}


def main(target: str) -> None:
    import torch

    if target not in TARGETS:
        raise SystemExit(f"target: expected one of {sorted(TARGETS)}, got {target!r}")
    run, first = TARGETS[target]()
    if not bool(torch.isfinite(first.float()).all()):
        raise SystemExit(f"{target}: the first call's output is not finite")
    for _ in range(3):  # warm: caches built, clocks up
        run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{target}: ran")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
