"""What separates the sparse forward's default kernel from TileLang's own V4 example, which runs the
same design (two warpgroups, cp.async one block ahead, cross-warpgroup row reductions) faster.

Variants of ``sparse_fwd_kernel`` that each change one thing, timed interleaved with the default
and with the example (with and without its fast math) on ``bench/attention_prefill.py``'s sparse
inputs, after each variant's bits are compared with the default's:

* ``division``: ``o / l``, a division per value (the contract before d5ab554; other bits);
* ``fastmath``: the default under ``--use_fast_math`` (other bits);
* ``static_shapes``: batch, tokens and keys fixed at the bench's shape, as the example compiles
  them (no view, no clamp bound: what dynamic shapes still cost);
* ``one_loop`` (with a 128-slot window only): the top-k and the window blocks in one loop, the
  copies under a branch on the block (the default before two loops: TileLang then issues them as
  synchronous loads, not cp.async).

Earlier rounds' variants are in the default now (2026-12-03, H200): the head groups of a token
next to each other in the grid (+1%), the output through one TMA store (+2%), and 32-bit gather
offsets from per-token views (``slot_views``; static shapes had measured +4% over 64-bit ones:
the block loop is 1007 SASS instructions, was 1134; 951 with static shapes, the example's 863).
Keeping the slot flags in registers measured 0%.

Then the default, ``division`` and the example at k 2048: a gap that grows with k is in the loop
body, not the epilogue (``static_shapes`` only at the bench's shape). Needs the examples copy (``.tilelang-examples``, see
bench/tilelang_examples.py). ``python3 bench/sparse_fwd_bisect.py`` (one GPU, about 90 s).
"""
# not a benchmark (scripts/gpu-check runs the bench/*.py files without this line): a one-off bisection

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("default", "division", "fastmath", "static_shapes")  # "one_loop": the window case only


def variant_kernel(variant: str):
    """``sparse_fwd_kernel``'s program with one change (module docstring), as a tlx.jit factory."""
    import tilelang
    import tilelang.language as T

    import tlx
    from bench.attention_prefill import SPARSE_SHAPE
    from kernels.attention import common as C
    from kernels.attention.sparse_fwd import (BLOCK_K, DIM, HEADS_PER_CTA, ROWS_ASSUME, batch, block_step, gather_block,
                                              n_kv, n_window_kv, seq, slot_views, write_rows)

    @T.macro
    def gather_slots(valid, KV_s, KVb, Ib, WKVb, WIb, kb, bk: int, n_top: int):
        """``one_loop``'s gather: block ``kb`` of the top-k list, or of the window from block ``n_top`` on."""
        if kb < n_top:
            gather_block(valid, KV_s, KVb, Ib, kb, bk)
        else:
            gather_block(valid, KV_s, WKVb, WIb, T.max(kb - n_top, 0), bk)

    extra = {"pass_configs": {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}} if variant == "fastmath" else {}
    static = variant == "static_shapes"
    b_, s_, n_, nw_ = (SPARSE_SHAPE[0], SPARSE_SHAPE[1], SPARSE_SHAPE[3], 1) if static else (batch, seq, n_kv, n_window_kv)

    @tlx.jit(target=C.TARGET, assume=[] if static else ROWS_ASSUME, **extra)
    def kernel(heads: int, topk: int, window: int, scale_log2: float, dtype: str = "bfloat16"):
        hb, bk, f32 = HEADS_PER_CTA, BLOCK_K, "float32"
        n_top, n_blocks = topk // bk, (topk + window) // bk

        @T.prim_func
        def main(Q: T.Tensor((b_, s_, heads, DIM), dtype), KV: T.Tensor((b_, n_, DIM), dtype),
                 Idx: T.Tensor((b_, s_, topk), "int32"), Sink: T.Tensor((heads,), f32),
                 WKV: T.Tensor((b_, nw_, DIM), dtype), WIdx: T.Tensor((b_, s_, max(window, 1)), "int32"),
                 O: T.Tensor((b_, s_, heads, DIM), dtype), LSE: T.Tensor((b_, s_, heads), f32)):
            with T.Kernel(heads // hb, s_, b_, threads=256) as (by, bx, bz):
                Q_s = T.alloc_shared((hb, DIM), dtype)
                KV_s = T.alloc_shared((bk, DIM), dtype)
                P_s = T.alloc_shared((hb, bk), dtype)
                O_s = T.alloc_shared((hb, DIM), dtype)
                valid = T.alloc_shared((bk,), "int32")
                acc_s = T.alloc_fragment((hb, bk), f32)
                acc_o = T.alloc_fragment((hb, DIM), f32)
                rows = C.row_state(hb)
                KVb, Ib, WKVb, WIb = slot_views(KV, Idx, WKV, WIdx, bz, bx)
                T.copy(Q[bz, bx, by * hb:(by + 1) * hb, :], Q_s)
                C.init_softmax(rows[0], rows[2], rows[4], acc_o)
                if variant == "one_loop":
                    for kb in T.Pipelined(n_blocks, num_stages=2):
                        gather_slots(valid, KV_s, KVb, Ib, WKVb, WIb, kb, bk, n_top)
                        block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
                else:
                    for kb in T.Pipelined(n_top, num_stages=2):
                        gather_block(valid, KV_s, KVb, Ib, kb, bk)
                        block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
                    for kb in T.Pipelined(n_blocks - n_top, num_stages=2):
                        gather_block(valid, KV_s, WKVb, WIb, kb, bk)
                        block_step(Q_s, KV_s, KV_s, valid, None, acc_s, P_s, acc_o, rows, scale_log2, True)
                if variant == "division":
                    m, m_prev, m_scaled, alpha, l, row_sum, lse_rows = rows
                    for i in T.Parallel(hb):
                        l[i] = l[i] + T.exp2(T.ieee_fmaf(Sink[by * hb + i], T.float32(C.LOG2E), -m_scaled[i]))
                    C.finish_rows(acc_o, l, m_scaled, lse_rows, hb, DIM, reciprocal=False)
                    T.copy(acc_o, O_s)
                    T.copy(lse_rows, LSE[bz, bx, by * hb:(by + 1) * hb])
                else:
                    write_rows(acc_o, rows, Sink, by * hb, O_s, LSE[bz, bx, by * hb:(by + 1) * hb])
                T.copy(O_s, O[bz, bx, by * hb:(by + 1) * hb, :])

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
    # the window branch (128 slots into a 4096-row window_kv, some masked): the top-k and window
    # lists as two loops (the default) or as one loop whose copies sit under a branch
    wkv = torch.randn(b, 4096, DIM, device="cuda").to(q.dtype)
    widx = torch.randint(-1, 4096, (b, s, 128), device="cuda", dtype=torch.int32)
    wins = {}
    for v in ("default", "one_loop"):
        kernel = variant_kernel(v)(h, idx.shape[2], 128, scale_log2)
        o, lse = torch.full_like(q, float("nan")), torch.full((b, s, h), float("nan"), device="cuda")
        wins[v] = (lambda kernel=kernel, o=o, lse=lse: kernel(q, kv, idx, sink, wkv, widx, o, lse), o, lse)
        wins[v][0]()
    shipped, _ = sparse_attention(q, kv, idx, sink, window_kv=wkv, window_indices=widx)
    print("window: default bitwise equal to sparse_attention:", torch.equal(wins["default"][1].view(torch.int16), shipped.view(torch.int16)),
          "; one_loop equal to the default:", all(torch.equal(x, y) for x, y in zip(wins["default"][1:], wins["one_loop"][1:])))
    wflops = 4 * b * s * h * (idx.shape[2] + 128) * DIM
    for name, ms in interleaved_ms({v: f for v, (f, _, _) in wins.items()}, 20).items():
        print(f"| k {idx.shape[2]} + window 128 | {name} | {ms:.3f} ms | {wflops / ms / 1e9:.0f} TFLOP/s |")
    idx2 = torch.randint(0, kv.shape[1], (b, s, 2 * idx.shape[2]), device="cuda", dtype=torch.int32)
    fns2, _ = runs(idx2.shape[2], idx2, ("default", "division"))
    for name, ms in interleaved_ms(fns2, 10).items():
        print(f"| k {idx2.shape[2]} | {name} | {ms:.3f} ms | {2 * flops / ms / 1e9:.0f} TFLOP/s |")


if __name__ == "__main__":
    main()
