"""Attention for decode on one GPU (issue 23), side by side with its anchors in one run.

Rows (printed as they are measured, so a timeout still leaves the earlier ones):
* copy: torch ``copy_`` of 2 GiB (``bench.timing.large_copy_ms``), the bandwidth yardstick;
* top-k (``kernels/attention/topk.py``) next to ``torch.topk`` on the same fp32 logits, 64 rows,
  N 32768 / 65536 / 131072, k 512 / 2048 (target: >= 3x at N 65536, k 2048);
* dense FP8 GEMM ``torch._scaled_mm`` (4096 x 4096 x 7168, per-tensor scales): the FP8 rate the
  indexer's percentage is read against;
* FP8 lightning indexer, prefill form, S 4096, N 8192 (causal, query s sees keys <= N - S + s)
  at H 64 D 128 (the model) and H 32 D 64 (the upstream example's anchor shape), TFLOP/s =
  2 H D x visible (query, key) pairs; next to the upstream TileLang example
  (``examples/deepseek_v32/fp8_lighting_indexer.py``, loaded from ``--upstream-indexer PATH`` or
  ``$TLX_UPSTREAM_INDEXER``, never copied; given ks = 0, ke = pos + 1: the same pairs) when given
  (target: >= 4x its rate);
* FP8 lightning indexer, paged decode form, batch 64, context 8192, T 1 / 2: GB/s of k cache
  (values + scales) read, next to the copy's;
* MLA decode (``kernels/attention/decode_mla.py``), batch 128, context 8192, bf16 and e4m3
  caches: 16 heads, T 1 (memory bound: GB/s of cache read, target >= 85% of the copy's) and
  128 heads, T 1 / 2 (compute bound: TFLOP/s = 2 B T H ctx (576 + 512), target >= 550);
* sparse MLA decode (``kernels/attention/decode_sparse.py``), batch 128, context 8192, k 2048,
  128 heads, T 1, bf16 / e4m3, with a sink: TFLOP/s per selected key (2 B T H k (576 + 512)),
  and its ratio to the dense row's rate per key (target >= 80%).

Timing: ``bench.timing.interleaved_ms`` for candidates side by side, ``median_ms`` otherwise
(CUDA events, warm-up, median); inputs random, fresh per row, rotated over 2 sets. Each tlx
result is checked first (top-k: equal to torch's stable sort's first k; indexer: equal to the
fp64 reference within the tests' tolerance, output poisoned with NaN before); a failed check is
reported in the row and the row is not timed.
Usage: python bench/attention_decode.py [--out FILE.json] [--reps N] [--upstream-indexer PATH]
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_ms, large_copy_ms, median_ms  # noqa: E402
from kernels.attention.decode_mla import D_QK, D_V, GROUP, mla_decode, reference_mla_decode  # noqa: E402
from kernels.attention.decode_sparse import reference_sparse_mla_decode, sparse_mla_decode  # noqa: E402
from kernels.attention.indexer import E4M3, PAGE, indexer_logits, indexer_logits_paged, reference_logits  # noqa: E402
from kernels.attention.topk import topk_indices  # noqa: E402

ROWS = []
TOL = 2.0**-9  # the indexer tests' tolerance (tests/kernels/attention/test_indexer.py)


def emit(**row):
    ROWS.append(row)
    print("| " + " | ".join(f"{k}={v}" for k, v in row.items()) + " |", flush=True)


def args_parse():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--upstream-indexer", default=os.environ.get("TLX_UPSTREAM_INDEXER"),
                        help="path of TileLang's examples/deepseek_v32/fp8_lighting_indexer.py")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention_decode.py needs a CUDA GPU")
    return args


def topk_rows(reps):
    for n, k in [(32768, 2048), (65536, 2048), (131072, 2048), (65536, 512)]:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        xs = [torch.randn(64, n, device="cuda", generator=g) for _ in range(2)]
        ref = torch.sort(torch.sort(xs[0], dim=-1, descending=True, stable=True).indices[:, :k], dim=-1).values
        if not torch.equal(topk_indices(xs[0], k), ref.to(torch.int32)):
            emit(what="top-k", shape=f"64 x {n}, k {k}", check="FAILED")
            continue
        it = iter(range(1 << 30))
        ms = interleaved_ms({"tlx": lambda: topk_indices(xs[next(it) % 2], k),
                             "torch": lambda: torch.topk(xs[next(it) % 2], k, dim=-1)}, reps)
        emit(what="top-k", shape=f"64 x {n}, k {k}", tlx_us=round(ms["tlx"] * 1e3, 1),
             torch_topk_us=round(ms["torch"] * 1e3, 1), speedup=round(ms["torch"] / ms["tlx"], 2), check="ok")


def scaled_mm_row(reps):
    m, n, k = 4096, 4096, 7168
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(m, k, device="cuda", generator=g).to(E4M3)
    b = torch.randn(n, k, device="cuda", generator=g).to(E4M3)
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps)
    tf = 2 * m * n * k / ms / 1e9
    emit(what="dense FP8 _scaled_mm", shape=f"{m} x {n} x {k}", ms=round(ms, 3), TFLOPs=round(tf))
    return tf


def load_upstream(path):
    """The upstream example module, imported from its own directory (it imports ``utils``)."""
    if not path:
        return None
    sys.path.insert(0, str(Path(path).resolve().parent))
    spec = importlib.util.spec_from_file_location("upstream_fp8_indexer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def indexer_inputs(s, n, h, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(s, h, d, device="cuda", generator=g) * 2).to(E4M3)
    k = (torch.randn(n, d, device="cuda", generator=g) * 2).to(E4M3)
    ks = torch.rand(n, device="cuda", generator=g) + 0.01
    w = torch.randn(s, h, device="cuda", generator=g)
    pos = (torch.arange(s, device="cuda") + n - s).to(torch.int32)
    return q, k, ks, w, pos


def indexer_rows(reps, upstream, fp8_tflops):
    s, n = 4096, 8192
    for h, d in [(64, 128), (32, 64)]:
        shape = f"S {s} N {n} H {h} D {d}"
        sets = [indexer_inputs(s, n, h, d, seed) for seed in range(2)]
        q, k, ks, w, pos = sets[0]
        got = indexer_logits(q, k, ks, w, pos)
        rows = slice(0, s, 97)  # a sample of queries against the fp64 reference
        visible = torch.arange(n, device="cuda")[None, :] <= pos[rows, None].long()
        ref, bound = reference_logits(q[rows], k, ks, w[rows], visible)
        sub = got[rows].double()
        ok = torch.equal(torch.isinf(sub), ~visible) and bool(((sub - ref).abs()[visible] <= TOL * bound[visible] + 1e-30).all())
        if not ok:
            emit(what="indexer prefill", shape=shape, check="FAILED")
            continue
        pairs = int((pos.long() + 1).clamp(0, n).sum())
        flops = 2 * h * d * pairs
        fns = {"tlx": lambda i=iter(range(1 << 30)): indexer_logits(*sets[next(i) % 2])}
        note = "no upstream path given"
        if upstream is not None:
            zero = torch.zeros(s, dtype=torch.int32, device="cuda")

            def up(i=iter(range(1 << 30))):
                qq, kk, kss, ww, pp = sets[next(i) % 2]
                return upstream.mqa_attn_return_logits_interface(q=qq, kv=kk, kv_scales=kss, weights=ww,
                                                                  cu_seqlen_ks=zero, cu_seqlen_ke=pp + 1)
            theirs = up().double()
            fin = torch.isfinite(theirs)
            agree = torch.equal(fin, torch.isfinite(got)) and bool(
                ((theirs - got.double()).abs()[fin] <= 1e-2 * (got.double().abs()[fin] + 1)).all())
            note = "upstream agrees" if agree else "upstream output differs"
            fns["upstream"] = up
        ms = interleaved_ms(fns, reps)
        row = dict(what="indexer prefill", shape=shape, tlx_ms=round(ms["tlx"], 3),
                   tlx_TFLOPs=round(flops / ms["tlx"] / 1e9), pct_of_fp8_mm=round(100 * flops / ms["tlx"] / 1e9 / fp8_tflops, 1))
        if "upstream" in ms:
            row.update(upstream_ms=round(ms["upstream"], 3), upstream_TFLOPs=round(flops / ms["upstream"] / 1e9),
                       speedup=round(ms["upstream"] / ms["tlx"], 2))
        emit(**row, check="ok", note=note)


def indexer_decode_rows(reps, copy_gbps):
    b, ctx = 64, 8192
    mp = ctx // PAGE
    for t in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(t)
        sets = []
        for _ in range(2):
            q = (torch.randn(b, t, 64, 128, device="cuda", generator=g) * 2).to(E4M3)
            kc = (torch.randn(b * mp, PAGE, 128, device="cuda", generator=g) * 2).to(E4M3)
            ksc = torch.rand(b * mp, PAGE, device="cuda", generator=g) + 0.01
            table = torch.randperm(b * mp, device="cuda", generator=g).to(torch.int32).view(b, mp)
            sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
            w = torch.randn(b, t, 64, device="cuda", generator=g)
            sets.append((q, kc, ksc, table, sl, w))
        q, kc, ksc, table, sl, w = sets[0]
        got = indexer_logits_paged(*sets[0])
        keys = kc[table[0].long()].reshape(-1, 128)
        visible = torch.arange(ctx, device="cuda")[None, :] <= (torch.arange(t, device="cuda") + ctx - t)[:, None]
        ref, bound = reference_logits(q[0], keys, ksc[table[0].long()].reshape(-1), w[0], visible)
        sub = got[0].double()
        if not (torch.equal(torch.isinf(sub), ~visible) and bool(((sub - ref).abs()[visible] <= TOL * bound[visible] + 1e-30).all())):
            emit(what="indexer decode", shape=f"B {b} ctx {ctx} T {t}", check="FAILED")
            continue
        ms = median_ms([lambda s=st: indexer_logits_paged(*s) for st in sets], reps)
        moved = b * ctx * (128 + 4)
        gbps = moved / ms / 1e6
        emit(what="indexer decode", shape=f"B {b} ctx {ctx} T {t}", tlx_us=round(ms * 1e3, 1), GBps=round(gbps),
             pct_of_copy=round(100 * gbps / copy_gbps, 1), check="ok")


def mla_case(b, ctx, heads, tokens, fp8, g):
    """Random q, a paged cache of ``b`` full sequences of ``ctx`` tokens (e4m3 with its scales
    when ``fp8``), a shuffled block table, the lengths."""
    mp = ctx // PAGE
    q = torch.randn(b, tokens, heads, D_QK, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.randn(b * mp, PAGE, D_QK, device="cuda", generator=g)
    scales = None
    if fp8:
        grp = kv.view(b * mp, PAGE, D_QK // GROUP, GROUP)
        scales = grp.abs().amax(-1).clamp_min(1e-4) / 448.0
        kv = (grp / scales[..., None]).view(b * mp, PAGE, D_QK).to(E4M3)
    else:
        kv = kv.to(torch.bfloat16)
    table = torch.randperm(b * mp, device="cuda", generator=g).to(torch.int32).view(b, mp)
    sl = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    return q, kv, table, sl, scales


def mla_rows(reps, copy_gbps):
    """MLA decode rows; returns {(heads, tokens, fp8): TFLOP/s} for the sparse rows' ratio."""
    b, ctx = 128, 8192
    rates = {}
    for heads, tokens in [(16, 1), (128, 1), (128, 2)]:
        for fp8 in (False, True):
            shape = f"B {b} ctx {ctx} H {heads} T {tokens} {'e4m3' if fp8 else 'bf16'}"
            g = torch.Generator(device="cuda").manual_seed(heads + tokens)
            sets = [mla_case(b, ctx, heads, tokens, fp8, g) for _ in range(2)]
            q, kv, table, sl, scales = sets[0]
            o, lse = mla_decode(q, kv, table, sl, kv_scales=scales)
            ref_o, _ = reference_mla_decode(q[:2], kv, table[:2], sl[:2], kv_scales=scales)
            if torch.isnan(o).any() or not torch.allclose(o[:2].float(), ref_o, rtol=2e-2, atol=2e-2):
                emit(what="MLA decode", shape=shape, check="FAILED")
                continue
            del o, lse
            ms = median_ms([lambda s=st: mla_decode(s[0], s[1], s[2], s[3], kv_scales=s[4]) for st in sets], reps)
            moved = b * ctx * D_QK * (1 if fp8 else 2) + (b * ctx * (D_QK // GROUP) * 4 if fp8 else 0)
            flops = 2 * b * tokens * heads * ctx * (D_QK + D_V)
            emit(what="MLA decode", shape=shape, tlx_us=round(ms * 1e3, 1), GBps=round(moved / ms / 1e6),
                 pct_of_copy=round(100 * moved / ms / 1e6 / copy_gbps, 1), TFLOPs=round(flops / ms / 1e9), check="ok")
            rates[heads, tokens, fp8] = flops / ms / 1e9
            del sets
            torch.cuda.empty_cache()
    return rates


def sparse_rows(reps, dense_rates):
    b, ctx, heads, topk = 128, 8192, 128, 2048
    for fp8 in (False, True):
        shape = f"B {b} ctx {ctx} H {heads} T 1 k {topk} {'e4m3' if fp8 else 'bf16'}"
        g = torch.Generator(device="cuda").manual_seed(topk)
        sets = []
        for _ in range(2):
            q, kv, table, sl, scales = mla_case(b, ctx, heads, 1, fp8, g)
            idx = torch.argsort(torch.rand(b, 1, ctx, device="cuda", generator=g), dim=-1)[..., :topk].to(torch.int32)
            sink = torch.randn(heads, device="cuda", generator=g)
            sets.append((q, kv, table, sl, idx, sink, scales))
        q, kv, table, sl, idx, sink, scales = sets[0]
        o, lse = sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales)
        ref_o, _ = reference_sparse_mla_decode(q[:2], kv, table[:2], sl[:2], idx[:2], sink=sink, kv_scales=scales)
        if torch.isnan(o).any() or not torch.allclose(o[:2].float(), ref_o, rtol=2e-2, atol=2e-2):
            emit(what="sparse MLA decode", shape=shape, check="FAILED")
            continue
        del o, lse
        ms = median_ms([lambda s=st: sparse_mla_decode(*s[:4], s[4], sink=s[5], kv_scales=s[6]) for st in sets], reps)
        tf = 2 * b * heads * topk * (D_QK + D_V) / ms / 1e9
        dense = dense_rates.get((heads, 1, fp8))
        emit(what="sparse MLA decode", shape=shape, tlx_us=round(ms * 1e3, 1), TFLOPs=round(tf),
             pct_of_dense_per_key=round(100 * tf / dense, 1) if dense else "-", check="ok")
        del sets
        torch.cuda.empty_cache()


def main():
    args = args_parse()
    reps = args.reps
    copy_ms, copy_bytes = large_copy_ms(reps)
    copy_gbps = copy_bytes / copy_ms / 1e6
    emit(what="copy 2 GiB", ms=round(copy_ms, 3), GBps=round(copy_gbps))
    topk_rows(reps)
    fp8 = scaled_mm_row(reps)
    upstream = None
    try:
        upstream = load_upstream(args.upstream_indexer)
    except Exception as e:  # noqa: BLE001 - the row says why the anchor is missing
        emit(what="upstream indexer", check=f"not loaded: {type(e).__name__}: {e}")
    indexer_rows(reps, upstream, fp8)
    indexer_decode_rows(reps, copy_gbps)
    sparse_rows(reps, mla_rows(reps, copy_gbps))
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
