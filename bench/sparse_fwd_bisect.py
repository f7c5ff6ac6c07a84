"""What separates the sparse forward's default kernel from TileLang's own V4 example, which runs the
same design (two warpgroups, cp.async one block ahead, cross-warpgroup row reductions) faster.

Variants of ``sparse_fwd_kernel`` that each change one thing, timed interleaved with the default
and with the example (with and without its fast math) on ``bench/attention_prefill.py``'s sparse
inputs, after each variant's bits are compared with the default's:

* ``division``: ``o / l``, a division per value (the contract before d5ab554; other bits);
* ``fastmath``: the default under ``--use_fast_math`` (other bits);
* ``grid``: the two 64-head halves of a token launched next to each other, as the example does;
* ``flags_in_registers``: each slot's validity loaded into a register fragment before the block's
  barrier, not stored to shared memory by 64 threads;
* ``tma_store``: the output through shared memory and one TMA store;
* ``static_shapes``: batch, tokens and keys fixed at the bench's shape, as the example compiles
  them (the default's dynamic shapes give 64-bit index arithmetic: its block loop compiles to
  1134 SASS instructions, 951 with static shapes, the example's to 863; sm_90a, nvcc 13.0).

Then the default, ``division`` and the example at k 2048: a gap that grows with k is in the loop
body, not the epilogue (``static_shapes`` only at the bench's shape). Needs the examples copy (``.tilelang-examples``, see
bench/tilelang_examples.py). ``python3 bench/sparse_fwd_bisect.py`` (one GPU, about 90 s).
"""
# not a benchmark (scripts/gpu-check runs the bench/*.py files without this line): a one-off bisection

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("default", "division", "fastmath", "grid", "flags_in_registers", "tma_store", "static_shapes")


def variant_kernel(variant: str):
    """``sparse_fwd_kernel``'s program with one change (module docstring), as a tlx.jit factory."""
    import tilelang
    import tilelang.language as T

    import tlx
    from bench.attention_prefill import SPARSE_SHAPE
    from kernels.attention import common as C
    from kernels.attention.sparse_fwd import (BLOCK_K, DIM, HEADS_PER_CTA, batch, block_step, gather_slots, n_kv,
                                              n_window_kv, seq)

    extra = {"pass_configs": {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}} if variant == "fastmath" else {}
    static = variant == "static_shapes"
    b_, s_, n_, nw_ = (SPARSE_SHAPE[0], SPARSE_SHAPE[1], SPARSE_SHAPE[3], 1) if static else (batch, seq, n_kv, n_window_kv)
    assume = [] if static else ["1 <= N", "N <= 1073741824", "1 <= NW", "NW <= 1073741824"]

    @tlx.jit(target=C.TARGET, assume=assume, **extra)
    def kernel(heads: int, topk: int, window: int, scale_log2: float, dtype: str = "bfloat16"):
        hb, bk, f32 = HEADS_PER_CTA, BLOCK_K, "float32"
        n_top, n_blocks = topk // bk, (topk + window) // bk
        grid = variant == "grid"

        @T.prim_func
        def main(Q: T.Tensor((b_, s_, heads, DIM), dtype), KV: T.Tensor((b_, n_, DIM), dtype),
                 Idx: T.Tensor((b_, s_, topk), "int32"), Sink: T.Tensor((heads,), f32),
                 WKV: T.Tensor((b_, nw_, DIM), dtype), WIdx: T.Tensor((b_, s_, max(window, 1)), "int32"),
                 O: T.Tensor((b_, s_, heads, DIM), dtype), LSE: T.Tensor((b_, s_, heads), f32)):
            with T.Kernel(heads // hb if grid else s_, s_ if grid else heads // hb, b_, threads=256) as (b0, b1, bz):
                bx, by = (b1, b0) if grid else (b0, b1)
                Q_s = T.alloc_shared((hb, DIM), dtype)
                KV_s = T.alloc_shared((bk, DIM), dtype)
                P_s = T.alloc_shared((hb, bk), dtype)
                valid = T.alloc_shared((bk,), "int32")
                flags = T.alloc_fragment((bk,), "bool")
                acc_s = T.alloc_fragment((hb, bk), f32)
                acc_o = T.alloc_fragment((hb, DIM), f32)
                rows = C.row_state(hb)
                m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = rows
                T.copy(Q[bz, bx, by * hb:(by + 1) * hb, :], Q_s)
                C.init_softmax(m, m_scaled, l, acc_o)
                for kb in T.Pipelined(n_blocks, num_stages=2):
                    if variant == "flags_in_registers":  # the top-k list's blocks only (the bench has no window)
                        for j in T.Parallel(bk):
                            flags[j] = T.And(Idx[bz, bx, kb * bk + j] >= 0, Idx[bz, bx, kb * bk + j] < KV.shape[1])
                        for j, d in T.Parallel(bk, DIM):
                            KV_s[j, d] = KV[bz, T.min(T.max(Idx[bz, bx, kb * bk + j], 0), KV.shape[1] - 1), d]
                        T.gemm(Q_s, KV_s, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                        for i, j in T.Parallel(hb, bk):
                            acc_s[i, j] = T.if_then_else(flags[j], acc_s[i, j], C.neg_inf())
                        C.softmax_step(acc_s, m, m_prev, m_scaled, alpha, l, row_sum, scale_log2, hb, bk)
                        T.copy(acc_s, P_s)
                        C.rescale_rows(acc_o, alpha, hb, DIM)
                        T.gemm(P_s, KV_s, acc_o, policy=T.GemmWarpPolicy.FullCol)
                    else:
                        gather_slots(valid, KV_s, KV, Idx, WKV, WIdx, bz, bx, kb, bk, n_top)
                        block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
                for i in T.Parallel(hb):
                    l[i] = l[i] + T.exp2(T.ieee_fmaf(Sink[by * hb + i], T.float32(C.LOG2E), -m_scaled[i]))
                C.finish_rows(acc_o, l, m_scaled, lse_rows, hb, DIM, reciprocal=variant != "division")
                if variant == "tma_store":
                    O_s = T.alloc_shared((hb, DIM), dtype)
                    T.copy(acc_o, O_s)
                    T.copy(O_s, O[bz, bx, by * hb:(by + 1) * hb, :])
                else:
                    T.copy(acc_o, O[bz, bx, by * hb:(by + 1) * hb, :])
                T.copy(lse_rows, LSE[bz, bx, by * hb:(by + 1) * hb])

        return main

    return kernel


def main():
    import tilelang
    import torch

    from bench.attention_decode import CARRIED_EXAMPLES, load_upstream
    from bench.attention_prefill import sparse_inputs
    from bench.timing import interleaved_ms
    from kernels.attention import common as C
    from kernels.attention.sparse_fwd import DIM, sparse_attention

    scale_log2 = 1 / math.sqrt(DIM) * C.LOG2E
    _, q, kv, idx, sink = sparse_inputs(1)
    b, s, h, _ = q.shape
    window_kv = torch.zeros(1, 1, DIM, dtype=q.dtype, device="cuda")
    window_idx = torch.zeros(1, s, 1, dtype=torch.int32, device="cuda")
    example = load_upstream(str(CARRIED_EXAMPLES / "deepseek_v4/sparse_attn_fwd_sm90.py"), "upstream_sparse_attn_fwd")
    sink_bf16 = sink.to(torch.bfloat16)

    def runs(topk, indices, names):
        fns, outs = {}, {}
        for v in names:
            kernel = variant_kernel(v)(h, topk, 0, scale_log2)
            o, lse = torch.full_like(q, float("nan")), torch.full((b, s, h), float("nan"), device="cuda")
            fns[v] = lambda kernel=kernel, o=o, lse=lse: kernel(q, kv, indices, sink, window_kv, window_idx, o, lse)
            fns[v]()
            outs[v] = (o, lse)
        prim = example.sparse_attn_fwd.get_tir(b, h, s, kv.shape[1], DIM, topk)
        for name, fast in (("example", True), ("example, no fast math", False)):
            built = tilelang.compile(prim, out_idx=[3], target="cuda",
                                     pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: fast})
            fns[name] = lambda built=built: built(q, kv, indices, sink_bf16)
        return fns, outs

    fns, outs = runs(idx.shape[2], idx, VARIANTS)
    shipped, _ = sparse_attention(q, kv, idx, sink)
    print("default bitwise equal to sparse_attention:", torch.equal(outs["default"][0].view(torch.int16), shipped.view(torch.int16)))
    for v in VARIANTS:
        same = all(torch.equal(x.view(torch.int32 if x.dtype == torch.float32 else torch.int16),
                               y.view(torch.int32 if y.dtype == torch.float32 else torch.int16))
                   for x, y in zip(outs[v], outs["default"]))
        print(f"{v}: bits {'equal to' if same else 'differ from'} the default's")
    flops = 4 * b * s * h * idx.shape[2] * DIM
    for name, ms in interleaved_ms(fns, 20).items():
        print(f"| k {idx.shape[2]} | {name} | {ms:.3f} ms | {flops / ms / 1e9:.0f} TFLOP/s |")
    idx2 = torch.randint(0, kv.shape[1], (b, s, 2 * idx.shape[2]), device="cuda", dtype=torch.int32)
    fns2, _ = runs(idx2.shape[2], idx2, ("default", "division"))
    for name, ms in interleaved_ms(fns2, 10).items():
        print(f"| k {idx2.shape[2]} | {name} | {ms:.3f} ms | {2 * flops / ms / 1e9:.0f} TFLOP/s |")


if __name__ == "__main__":
    main()
