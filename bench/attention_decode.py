"""Attention for decode on one GPU (issue 23), side by side with its anchors in one run.

Rows (printed as they are measured, so a timeout still leaves the earlier ones):
* copy: torch ``copy_`` of 2 GiB (``bench.timing.large_copy_ms``), the bandwidth yardstick;
* top-k (``kernels/attention/topk.py``) next to ``torch.topk`` on the same fp32 logits, 64 rows,
  N 32768 / 65536 / 131072, k 512 / 2048 (target: >= 3x at N 65536, k 2048), a row per variant
  (one CTA per row, a 2-CTA cluster per row), each checked against a stable sort first;
* dense FP8 GEMM ``torch._scaled_mm`` (4096 x 4096 x 7168, per-tensor scales): the FP8 rate the
  indexer's percentage is read against;
* FP8 lightning indexer, prefill form, S 4096, N 8192 (causal, query s sees keys <= N - S + s)
  at H 64 D 128 (the model) and H 32 D 64 (the upstream example's anchor shape), TFLOP/s =
  2 H D x visible (query, key) pairs; next to the upstream TileLang example
  (``examples/deepseek_v32/fp8_lighting_indexer.py``, loaded from ``--upstream-indexer PATH`` or
  ``$TLX_UPSTREAM_INDEXER``, else from the git-ignored examples copy a GPU run carries
  (``.tilelang-examples/checkout``, see bench/tilelang_examples.py), never part of this project;
  given ks = 0, ke = pos + 1: the same
  pairs) when given (target: >= 4x its rate);
* FP8 lightning indexer, paged decode form, batch 64, context 8192, T 1 / 2: GB/s of k cache
  (values + scales) read, next to the copy's;
* MLA decode (``kernels/attention/decode_mla.py``), batch 128, context 8192, bf16 and e4m3
  caches: 16 heads, T 1 (memory bound: GB/s of cache read, values + scales, target >= 85% of
  the copy's) and 128 heads, T 1 / 2 (compute bound: TFLOP/s = 2 B T H ctx (576 + 512), target
  >= 550);
* the key-major MLA split kernel (``mla_decode(key_major=1 or 2)``: the keys as the products' M
  side, for 16 or 32 query rows, one or two consumer warpgroups; one over e4m3 is the kernel
  whose producer warpgroups dequantize) beside the row-major one at 16 heads, T 1 / 2, bf16 and
  e4m3, interleaved on the same inputs, calls queued, each checked, and bit for bit against the
  row-major one;
* TileLang's own MLA decode examples (``examples/deepseek_mla/example_mla_decode.py`` and its
  warp-specialized form, from the carried examples copy) at the 128-head shape, interleaved with ``mla_decode`` on the same
  values: what the same two-warpgroup design reaches with TileLang's choices (an anchor);
* sparse MLA decode (``kernels/attention/decode_sparse.py``), batch 128, context 8192, k 2048,
  128 heads, T 1, bf16 / e4m3, with a sink, each consumer schedule: TFLOP/s per selected key
  (2 B T H k (576 + 512)), and its ratio to the rate per key of dense decode over the same cache,
  timed interleaved with it (target >= 80%).

Timing: ``bench.timing.interleaved_ms`` for candidates side by side, ``median_ms`` otherwise
(CUDA events, warm-up, median); inputs random, fresh per row, rotated over 2 sets. Before timing,
each tlx kernel writes into outputs poisoned with NaN (top-k: -1) and the result is checked:
top-k equal to a stable sort's first k; indexer within the tests' tolerance of the fp64
reference (sampled queries, every element written); MLA and sparse decode within the tests'
tolerance of the fp32 reference for every sequence of the batch, no NaN. A failed check is
reported in the row and the row is not timed.

Every kernel configuration the run uses is compiled first, in parallel processes, so that the
timed part never waits for a compile (about a minute per configuration on one core).

Usage: python bench/attention_decode.py [--out FILE.json] [--reps N] [--upstream-indexer PATH] [--only-mla | --only-indexer | --only-key-major | --only-overlap | --only-sparse]
       python bench/attention_decode.py --precompile [WORKERS]   (no GPU needed: compiles every
       kernel configuration of this benchmark and of the decode GPU tests, and the tests' CUDA
       baselines where the CUDA driver library is installed, WORKERS processes at once, into
       $TLX_CACHE_DIR, so that a fresh GPU machine spends its time running)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.attention.decode_sparse import CONSUMERS as SPARSE_CONSUMERS, finishes, splits_of  # noqa: E402  (no CUDA context: fork stays safe)
from kernels.attention.topk import CTAS_PER_ROW  # noqa: E402
from kernels.device import sm_count  # noqa: E402

ROWS = []
TOL = 2.0**-9  # the indexer tests' tolerance (tests/kernels/attention/test_indexer.py)
BATCH, CTX = 128, 8192  # MLA and sparse decode
MLA_SHAPES = [(16, 1), (128, 1), (128, 2)]  # heads, tokens
# (e4m3, pages in flight, pages per split) of each MLA row: the default split, then shorter and longer ones
MLA_VARIANTS = [(False, 1, 64), (False, 2, 64), (True, 1, 64), (True, 2, 64), (False, 2, 16), (False, 2, 128), (True, 2, 128)]
# (heads, tokens, e4m3) of the key-major split kernel's rows, each timed beside the default
KEY_MAJOR_CASES = [(16, 1, False), (16, 1, True), (16, 2, False), (16, 2, True)]
KEY_MAJOR_STAGES = (1, 2)  # pages in flight of its e4m3 rows (bf16: 2, mla_decode's default)
SPARSE_HEADS, SPARSE_TOPK = 128, 2048
# (consumer schedule, slots per split, who dequantizes e4m3, finish) of the sparse rows, each timed
# beside dense decode (the consumers' dequant: e4m3 rows only); finish False: the one-split default's
# partials through mla_combine_kernel, as before the split kernel finished its rows
SPARSE_VARIANTS = ([(c, n, "producer", True) for n in (1024, 2048) for c in SPARSE_CONSUMERS]
                   + [("shared", 2048, "consumers", True)] + [("shared", 2048, d, False) for d in ("producer", "consumers")])


def sparse_variants(fp8: bool) -> list:
    """The sparse rows' variants for a cache of that dtype (the consumers' dequant is e4m3's only)."""
    return [v for v in SPARSE_VARIANTS if fp8 or v[2] == "producer"]


def sparse_configs(tokens, heads, topk, kv, consumers="shared", split_slots=2048, dequant_by="producer", sinks=(False, True),
                   finish=True):
    """The kernels ``sparse_mla_decode`` compiles for one call shape and schedule (its ``finish``),
    with and/or without a sink: the finishing split kernel, or the split kernel and its combine."""
    split = ("sparse", tokens, heads, topk, kv, consumers, split_slots, dequant_by)
    if finish and finishes(topk, consumers, split_slots):
        return [(*split, True, sink) for sink in sinks]
    return [split] + [("combine", tokens, heads, splits_of(topk, split_slots), sink) for sink in sinks]

KV_DTYPES = ("bfloat16", "float8_e4m3")
TOPK_SHAPES = [(32768, 2048), (65536, 2048), (131072, 2048), (65536, 512)]  # N, k (64 rows)
INDEXER_SHAPES = [(64, 128), (32, 64)]  # heads, dim
INDEXER_DECODE_TOKENS = (1, 2)


# ---- the kernels the run and the decode GPU tests compile ---------------------------------------
# the key-major rows' kernels (--only-key-major compiles these alone): both consumer counts, and
# the row-major split (consumers 0) and the combine they are timed against
KEY_MAJOR_CONFIGS = ([("mla_keys", t, h, KV_DTYPES[fp8], st, c) for h, t, fp8 in KEY_MAJOR_CASES
                      for c in (1, 2) for st in (KEY_MAJOR_STAGES if fp8 and (c == 2 or h * t == 16) else (2,))]
                     + [("mla_keys", t, h, KV_DTYPES[fp8], None, 1) for h, t, fp8 in KEY_MAJOR_CASES if fp8]
                     + [("mla_keys", t, h, KV_DTYPES[fp8], 1 if fp8 else 2, 0) for h, t, fp8 in KEY_MAJOR_CASES]
                     + [("combine", t, h, 0, False, 64) for h, t, _ in KEY_MAJOR_CASES])
# the overlap rows' kernels (--only-overlap compiles these alone): the hand-scheduled row-major
# split beside the default it is timed against, at the compute-bound shapes (bf16)
OVERLAP_SHAPES = [(128, 1), (128, 2)]  # heads, tokens
OVERLAP_CONFIGS = ([("mla_overlap", t, h) for h, t in OVERLAP_SHAPES] + [("mla", t, h, "bfloat16", 2, 64) for h, t in OVERLAP_SHAPES]
                   + [("combine", t, h, 0, False, 64) for h, t in OVERLAP_SHAPES])
# the sparse rows' kernels (--only-sparse compiles these alone): both consumer schedules, and the
# dense split (either page count in flight) whose rate per key they are compared with
SPARSE_CONFIGS = ([c for kv in KV_DTYPES for v in sparse_variants(kv == "float8_e4m3")
                   for c in sparse_configs(1, SPARSE_HEADS, SPARSE_TOPK, kv, *v[:3], sinks=(True,), finish=v[3])]
                  + [("mla", 1, SPARSE_HEADS, kv, st, 64) for kv in KV_DTYPES for st in (1, 2)]
                  + [("combine", 1, SPARSE_HEADS, 0, False, 64)])
BENCH_CONFIGS = ([("topk", k, ctas) for k in sorted({k for _, k in TOPK_SHAPES}) for ctas in CTAS_PER_ROW]
                 + [("indexer", h, d) for h, d in INDEXER_SHAPES]
                 + [("indexer_paged", t) for t in INDEXER_DECODE_TOKENS]
                 # each variant, and with two pages in flight its one-page twin (the rows compare their bits)
                 + sorted({("mla", t, h, KV_DTYPES[fp8], st, split) for h, t in MLA_SHAPES
                           for fp8, stages, split in MLA_VARIANTS for st in {1, stages}})
                 + [("combine", t, h, 0, False, split) for h, t in MLA_SHAPES for split in sorted({v[2] for v in MLA_VARIANTS})]
                 + KEY_MAJOR_CONFIGS + OVERLAP_CONFIGS
                 + SPARSE_CONFIGS)
MLA_KINDS = ("mla", "mla_keys", "mla_overlap", "combine", "sparse")  # the configurations of --only-mla
INDEXER_KINDS = ("indexer", "indexer_paged")  # the configurations of --only-indexer
TEST_CONFIGS = ([("topk", k, ctas) for k in (512, 1024, 2048) for ctas in CTAS_PER_ROW]
                + [("indexer_paged", t) for t in (1, 2, 4)]
                + [("mla", t, h, kv, 1) for t, h in ((1, 128), (2, 16)) for kv in KV_DTYPES]
                + [("mla", t, h, kv, st) for t, h in ((1, 16), (2, 128)) for kv in KV_DTYPES for st in (1, 2)]
                + [("combine", t, h, 0, False) for t, h in ((1, 128), (2, 128), (2, 16))]
                + [("mla", 1, h, "bfloat16", 2, split) for h, split in ((128, 16), (16, 128))] + [("mla", 2, 16, "float8_e4m3", 1, 32)]
                + [("mla_keys", t, h, kv, None, c) for t, h, kv in ((1, 16, "bfloat16"), (1, 16, "float8_e4m3"),
                                                                     (2, 16, "bfloat16"), (1, 32, "float8_e4m3"))
                   for c in (1, 2)]
                + [("mla", 1, 32, "float8_e4m3", 1), ("combine", 1, 32, 0, False), ("mla_keys", 1, 16, "bfloat16", 2, 0)]
                + [("combine", 1, h, 0, False, split) for h, split in ((128, 16), (16, 128))] + [("combine", 2, 16, 0, False, 32)]
                + [c for t, h, k in ((1, 128, 2048), (2, 16, 512)) for kv in KV_DTYPES for cons in SPARSE_CONSUMERS
                   for dequant in (("producer", "consumers") if kv == "float8_e4m3" and cons == "shared" else ("producer",))
                   for c in sparse_configs(t, h, k, kv, cons, 2048, dequant)]
                # test_finishing_split_same_bits_as_combine: the finishing kernel and the split it finishes, combined
                + [c for kv, dequant in (("bfloat16", "producer"), ("float8_e4m3", "consumers"))
                   for c in sparse_configs(2, 128, 512, kv, "shared", 2048, dequant)
                   + sparse_configs(2, 128, 512, kv, "shared", 2048, dequant, finish=False)])


def baseline_configs():
    """The CUDA baselines of the bitwise GPU tests (tests/kernels/attention/conftest.py builds
    them the same way), where the CUDA driver library is installed: linking needs it. Built
    once here, the test workers load them instead of building the same files at once."""
    import ctypes.util

    return [("baseline", name) for name in ("decode_mla", "indexer", "sparse_fwd")] if ctypes.util.find_library("cuda") else []


def compile_config(cfg) -> str:
    """Compile (or load from the disk cache) the kernels of one configuration; runs in a worker
    process. The arguments are those the wrappers pass, so the wrappers then hit the cache."""
    from kernels.attention.decode_mla import D_QK, SPLIT_PAGES, mla_combine_kernel, split_kernel

    t0 = time.time()
    kind, args = cfg[0], cfg[1:]
    scale = float(D_QK ** -0.5)  # the wrappers' default softmax scale
    if kind == "topk":
        from kernels.attention.topk import topk_kernel

        topk_kernel(*args)
    elif kind == "indexer":
        from kernels.attention.indexer import PREFILL_OPTIONS, indexer_kernel

        indexer_kernel(*args, **PREFILL_OPTIONS[args[1]])
    elif kind == "indexer_paged":
        from kernels.attention.indexer import indexer_paged_kernel

        indexer_paged_kernel(args[0], 128)
    elif kind == "mla":  # the split kernel mla_decode picks by default
        split_kernel(*args[:3], scale, *args[3:])
    elif kind == "mla_keys":  # mla_decode(key_major=consumers): 0 the row-major kernel
        tokens, heads, kv, stages, consumers = args
        split_kernel(tokens, heads, kv, scale, stages, SPLIT_PAGES, consumers)
    elif kind == "mla_overlap":  # mla_decode(overlap=True)
        split_kernel(*args, "bfloat16", scale, None, SPLIT_PAGES, None, True)
    elif kind == "combine":  # MLA decode's (fixed_splits 0, no sink) and sparse decode's
        mla_combine_kernel(*args)
    elif kind == "baseline":
        import kernels.attention
        from tlx.numerics.parity import build_baseline

        build_baseline(Path(kernels.attention.__file__).parent / f"{args[0]}.cu", with_cutlass=True)
    else:
        from kernels.attention.decode_sparse import sparse_split_kernel

        sparse_split_kernel(*args[:4], scale, *args[4:])  # tokens, heads, topk, kv, consumers, split_slots, dequant_by[, finish, with_sink]
    return f"{cfg}: {time.time() - t0:.1f} s"


def precompile(configs, workers: int) -> None:
    from bench.precompile import compile_in_processes

    compile_in_processes(compile_config, sorted(set(configs), key=str), workers)


# ---- rows ---------------------------------------------------------------------------------------
def emit(**row):
    ROWS.append(row)
    print("| " + " | ".join(f"{k}={v}" for k, v in row.items()) + " |", flush=True)


def args_parse():
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--only-mla", action="store_true",
                        help="only the copy, MLA and sparse decode rows (and only their kernels compiled)")
    parser.add_argument("--only-key-major", action="store_true",
                        help="only the copy and the key-major MLA rows (and only their kernels compiled)")
    parser.add_argument("--only-overlap", action="store_true",
                        help="only the copy and the hand-scheduled MLA split rows (and only their kernels compiled)")
    parser.add_argument("--only-sparse", action="store_true",
                        help="only the copy and the sparse decode rows (and only their kernels compiled)")
    parser.add_argument("--only-indexer", action="store_true",
                        help="only the copy, FP8 matmul and indexer rows (and only the indexer kernels compiled)")
    parser.add_argument("--upstream-indexer", default=os.environ.get("TLX_UPSTREAM_INDEXER", _carried_upstream_indexer()),
                        help="path of TileLang's examples/deepseek_v32/fp8_lighting_indexer.py")
    args = parser.parse_args()
    # NVML's device count, not the CUDA runtime's: the precompile workers are forked after this
    # check, and a CUDA context in the parent would be unusable in them
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if not torch.cuda.is_available():
        sys.exit("bench/attention_decode.py needs a CUDA GPU")
    return args


def topk_rows(reps):
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.topk import topk_indices, topk_kernel
    from tests.kernels.attention.test_topk import reference_topk

    for n, k in TOPK_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        xs = [torch.randn(64, n, device="cuda", generator=g) for _ in range(2)]
        for ctas in CTAS_PER_ROW:  # a row per variant: one CTA per row, a 2-CTA cluster per row
            what = f"top-k ({ctas} CTA{'s' if ctas > 1 else ''} per row)"
            out = torch.full((64, k), -1, dtype=torch.int32, device="cuda")
            topk_kernel(k, ctas)(xs[0].view(64, n // 4, 4), out)
            if not torch.equal(out, reference_topk(xs[0], k)):
                emit(what=what, shape=f"64 x {n}, k {k}", check="FAILED")
                continue
            ms = interleaved_ms(
                {"tlx": lambda i=iter(range(1 << 30)), c=ctas: topk_indices(xs[next(i) % 2], k, c),
                 "torch": lambda i=iter(range(1 << 30)): torch.topk(xs[next(i) % 2], k, dim=-1)}, reps)
            emit(what=what, shape=f"64 x {n}, k {k}", tlx_us=round(ms["tlx"] * 1e3, 1),
                 torch_topk_us=round(ms["torch"] * 1e3, 1), speedup=round(ms["torch"] / ms["tlx"], 2), check="ok")


def scaled_mm_row(reps):
    import torch

    from bench.timing import median_ms
    from kernels.attention.indexer import E4M3

    m, n, k = 4096, 4096, 7168
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn(m, k, device="cuda", generator=g).to(E4M3)
    b = torch.randn(n, k, device="cuda", generator=g).to(E4M3)
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps)
    tf = 2 * m * n * k / ms / 1e9
    emit(what="dense FP8 _scaled_mm", shape=f"{m} x {n} x {k}", ms=round(ms, 3), TFLOPs=round(tf))
    return tf


CARRIED_EXAMPLES = Path(__file__).resolve().parents[1] / ".tilelang-examples/checkout/examples"


def _carried_upstream_indexer() -> str | None:
    """The upstream indexer in the carried examples copy, when this checkout has one."""
    path = CARRIED_EXAMPLES / "deepseek_v32/fp8_lighting_indexer.py"
    return str(path) if path.is_file() else None


def load_upstream(path, name="upstream_fp8_indexer"):
    """The upstream example module, imported from its own directory (it imports ``utils``)."""
    if not path:
        return None
    sys.path.insert(0, str(Path(path).resolve().parent))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def indexer_inputs(s, n, h, d, seed):
    import torch

    from kernels.attention.indexer import E4M3

    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(s, h, d, device="cuda", generator=g) * 2).to(E4M3)
    k = (torch.randn(n, d, device="cuda", generator=g) * 2).to(E4M3)
    ks = torch.rand(n, device="cuda", generator=g) + 0.01
    w = torch.randn(s, h, device="cuda", generator=g)
    pos = (torch.arange(s, device="cuda") + n - s).to(torch.int32)
    return q, k, ks, w, pos


def within_reference(got, q, k, ks, w, visible) -> bool:
    """Every logit written (no NaN), -inf exactly where not visible, the rest within the tests'
    tolerance of the fp64 reference."""
    import torch

    from kernels.attention.indexer import reference_logits

    ref, bound = reference_logits(q, k, ks, w, visible)
    got = got.double()
    return (not bool(torch.isnan(got).any()) and torch.equal(torch.isinf(got), ~visible)
            and bool(((got - ref).abs()[visible] <= TOL * bound[visible] + 1e-30).all()))


def indexer_rows(reps, upstream, fp8_tflops):
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.indexer import PREFILL_OPTIONS, indexer_kernel, indexer_logits

    s, n = 4096, 8192
    for h, d in INDEXER_SHAPES:
        shape = f"S {s} N {n} H {h} D {d}"
        sets = [indexer_inputs(s, n, h, d, seed) for seed in range(2)]
        q, k, ks, w, pos = sets[0]
        got = torch.full((s, n), float("nan"), device="cuda")
        indexer_kernel(h, d, **PREFILL_OPTIONS[d])(q, k, ks, w, pos, got)
        sample = slice(0, s, 97)  # a sample of queries against the fp64 reference
        visible = torch.arange(n, device="cuda")[None, :] <= pos[sample, None].long()
        if bool(torch.isnan(got).any()) or not within_reference(got[sample], q[sample], k, ks, w[sample], visible):
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
            theirs = up().double()  # set 0 (and the upstream kernel's compile, before any timing)
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
    import torch

    from bench.timing import median_ms
    from kernels.attention.indexer import E4M3, PAGE, indexer_logits_paged, indexer_paged_kernel

    b, ctx = 64, 8192
    mp = ctx // PAGE
    for t in INDEXER_DECODE_TOKENS:
        shape = f"B {b} ctx {ctx} T {t}"
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
        got = torch.full((b, t, ctx), float("nan"), device="cuda")
        indexer_paged_kernel(t, 128)(q, kc, ksc, table, sl, w, got)
        visible = torch.arange(ctx, device="cuda")[None, :] <= (torch.arange(t, device="cuda") + ctx - t)[:, None]
        ok = not bool(torch.isnan(got).any())
        for i in (0, b // 2, b - 1):  # a sample of sequences against the fp64 reference
            pages = table[i].long()
            ok = ok and within_reference(got[i], q[i], kc[pages].reshape(-1, 128), ksc[pages].reshape(-1), w[i], visible)
        if not ok:
            emit(what="indexer decode", shape=shape, check="FAILED")
            continue
        ms = median_ms([lambda s=st: indexer_logits_paged(*s) for st in sets], reps)
        moved = b * ctx * (128 + 4)
        gbps = moved / ms / 1e6
        emit(what="indexer decode", shape=shape, tlx_us=round(ms * 1e3, 1), GBps=round(gbps),
             pct_of_copy=round(100 * gbps / copy_gbps, 1), check="ok")


def mla_case(b, ctx, heads, tokens, fp8, g):
    """Random q, a paged cache of ``b`` full sequences of ``ctx`` tokens (e4m3 with its scales
    when ``fp8``), a shuffled block table, the lengths."""
    import torch

    from kernels.attention.decode_mla import D_QK, GROUP, PAGE
    from kernels.attention.indexer import E4M3

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


def sparse_case(fp8, g):
    """The sparse rows' inputs: ``mla_case``'s at ``SPARSE_HEADS``, each sequence's top-k a random
    ``SPARSE_TOPK`` of its keys, a random sink: (q, kv, table, seq_lens, indices, sink, scales)."""
    import torch

    q, kv, table, sl, scales = mla_case(BATCH, CTX, SPARSE_HEADS, 1, fp8, g)
    idx = torch.argsort(torch.rand(BATCH, 1, CTX, device="cuda", generator=g), dim=-1)[..., :SPARSE_TOPK]
    sink = torch.randn(SPARSE_HEADS, device="cuda", generator=g)
    return q, kv, table, sl, idx.to(torch.int32).contiguous(), sink, scales


def checked(o, lse, ref_o, ref_lse) -> str:
    """The decode tests' check (``check_close`` of tests/kernels/attention/test_decode_mla.py)."""
    from tests.kernels.attention.test_decode_mla import check_close

    try:
        check_close(o, lse, ref_o, ref_lse)
    except AssertionError as e:  # the message, or else the failing assert's own line
        import traceback

        return "FAILED: " + (" ".join(str(e).split())[:200] or traceback.extract_tb(e.__traceback__)[-1].line)
    return "ok"


def mla_rows(reps, copy_gbps):
    """MLA decode rows."""
    import torch

    from bench.timing import median_ms
    from kernels.attention.decode_mla import D_QK, D_V, GROUP, key_major_default, mla_decode, reference_mla_decode
    from tests.kernels.attention.test_decode_mla import poisoned_outputs

    for heads, tokens in MLA_SHAPES:
        for fp8, stages, split in MLA_VARIANTS:
            shape = f"B {BATCH} ctx {CTX} H {heads} T {tokens} {'e4m3' if fp8 else 'bf16'}"
            what = (("MLA decode" if stages == 1 else f"MLA decode, {stages} pages in flight") + f", {split}-page splits"
                    + (", key-major" if key_major_default(heads * tokens) else ""))
            g = torch.Generator(device="cuda").manual_seed(heads + tokens)
            sets = [mla_case(BATCH, CTX, heads, tokens, fp8, g) for _ in range(2)]
            q, kv, table, sl, scales = sets[0]
            o, lse = mla_decode(q, kv, table, sl, kv_scales=scales, out=poisoned_outputs(q), num_stages=stages,
                                split_pages=split)
            check = checked(o, lse, *reference_mla_decode(q, kv, table, sl, kv_scales=scales))
            if check == "ok" and stages > 1:  # the same products in the same order: the same bits
                o1, lse1 = mla_decode(q, kv, table, sl, kv_scales=scales, num_stages=1, split_pages=split)
                if not (torch.equal(o.view(torch.int16), o1.view(torch.int16))
                        and torch.equal(lse.view(torch.int32), lse1.view(torch.int32))):
                    check = "FAILED: not bitwise equal to one page in flight"
            if check != "ok":
                emit(what=what, shape=shape, check=check)
                continue
            del o, lse
            ms = median_ms([lambda s=st: mla_decode(s[0], s[1], s[2], s[3], kv_scales=s[4], num_stages=stages,
                                                    split_pages=split) for st in sets], reps)
            moved = BATCH * CTX * (D_QK + (D_QK // GROUP) * 4 if fp8 else D_QK * 2)
            flops = 2 * BATCH * tokens * heads * CTX * (D_QK + D_V)
            emit(what=what, shape=shape, tlx_us=round(ms * 1e3, 1), GBps=round(moved / ms / 1e6),
                 pct_of_copy=round(100 * moved / ms / 1e6 / copy_gbps, 1), TFLOPs=round(flops / ms / 1e9), check="ok")
            del sets
            torch.cuda.empty_cache()


def key_major_rows(reps, copy_gbps):
    """The key-major split kernel (``mla_decode(key_major=1 or 2)``: one or two consumer warpgroups;
    e4m3: one is the kernel whose producers dequantize, two also with each of ``KEY_MAJOR_STAGES``
    pages in flight) beside the row-major one at
    ``KEY_MAJOR_CASES``, interleaved on the same inputs, calls queued (the GPU's time, not the
    wrapper's host path): each checked against the reference, and bit for bit against the row-major one."""
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.decode_mla import D_QK, GROUP, SPLIT_PAGES, key_major_default, mla_decode, reference_mla_decode
    from tests.kernels.attention.test_decode_mla import poisoned_outputs
    from tlx.numerics.sweep import same_bits

    for heads, tokens, fp8 in KEY_MAJOR_CASES:
        # (key_major, pages in flight): the row-major kernel (its default stages) first (one
        # consumer over e4m3: pages in flight are its producers; by default at 16 rows one with
        # the next page staged by TMA, else two; one, at 16 rows: two CTAs a SM; two)
        staged = fp8 and heads * tokens == 16
        variants = ([(0, None), (1, None)] + [(1, 1), (1, 2)] * staged
                    + [(2, st) for st in (KEY_MAJOR_STAGES if fp8 else (None,))])
        shape = f"B {BATCH} ctx {CTX} H {heads} T {tokens} {'e4m3' if fp8 else 'bf16'}"
        g = torch.Generator(device="cuda").manual_seed(heads + tokens + 7)
        q, kv, table, sl, scales = mla_case(BATCH, CTX, heads, tokens, fp8, g)
        ref = reference_mla_decode(q, kv, table, sl, kv_scales=scales)

        def call(v, out=None):
            return mla_decode(q, kv, table, sl, kv_scales=scales, out=out, key_major=v[0], num_stages=v[1])

        outs = {v: call(v, poisoned_outputs(q)) for v in variants}
        checks = {v: checked(*outs[v], *ref) for v in variants}
        for v in variants[1:]:
            checks[v] += ", bits same" if all(same_bits(a, b) for a, b in zip(outs[variants[0]], outs[v])) else ", bits DIFFER"
        del outs, ref
        ms = interleaved_ms({v: (lambda v=v: call(v)) for v in variants}, reps, queued=True)
        moved = BATCH * CTX * (D_QK + (D_QK // GROUP) * 4 if fp8 else D_QK * 2)
        # mla_decode's staged split takes two splits a CTA (two producers) where B x splits exceeds the SMs
        paired = BATCH * -(-table.shape[1] // SPLIT_PAGES) > sm_count(q.device.index)
        for v in variants:
            what = ("row-major split" if v[0] == 0 else f"key-major split, {v[0]} consumer warpgroups" if v[0] == 2 or not fp8
                    else "key-major split, staged, two splits a CTA, two producers dequantize" if v[1] is None and staged and paired
                    else "key-major split, one producer dequantizes the page TMA staged" if v[1] is None and staged
                    else "key-major split, two producers dequantize" if v[1] in (None, 2)
                    else "key-major split, one producer dequantizes (two CTAs a SM)")
            default = v == (key_major_default(heads * tokens), None)
            pages = f", {v[1]} pages in flight" if v[1] and v[0] != 1 else ""
            emit(what=f"MLA decode, {what}" + pages + (" (default)" if default else ""),
                 shape=shape, tlx_us=round(ms[v] * 1e3, 1), vs_row_major=round(ms[variants[0]] / ms[v], 3),
                 pct_of_copy=round(100 * moved / ms[v] / 1e6 / copy_gbps, 1), check=checks[v])
        del q, kv, table, sl, scales
        torch.cuda.empty_cache()


def overlap_rows(reps):
    """The hand-scheduled row-major split (``mla_decode(overlap=True)``) beside the default at
    ``OVERLAP_SHAPES``, interleaved on the same inputs, calls queued (the GPU's time): each
    checked against the reference, and bit for bit against the default."""
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.decode_mla import D_QK, D_V, mla_decode, reference_mla_decode
    from tests.kernels.attention.test_decode_mla import poisoned_outputs
    from tlx.numerics.sweep import same_bits

    for heads, tokens in OVERLAP_SHAPES:
        shape = f"B {BATCH} ctx {CTX} H {heads} T {tokens} bf16"
        g = torch.Generator(device="cuda").manual_seed(heads + tokens + 11)
        q, kv, table, sl, _ = mla_case(BATCH, CTX, heads, tokens, False, g)
        ref = reference_mla_decode(q, kv, table, sl)
        outs = {v: mla_decode(q, kv, table, sl, out=poisoned_outputs(q), overlap=v) for v in (False, True)}
        check = checked(*outs[True], *ref)
        check += ", bits same" if all(same_bits(a, b) for a, b in zip(outs[False], outs[True])) else ", bits DIFFER"
        del outs, ref
        ms = interleaved_ms({v: (lambda v=v: mla_decode(q, kv, table, sl, overlap=v)) for v in (False, True)}, reps, queued=True)
        flops = 2 * BATCH * tokens * heads * CTX * (D_QK + D_V)
        for v in (False, True):
            emit(what="MLA decode, " + ("hand-scheduled split (overlap)" if v else "row-major split (default)"), shape=shape,
                 tlx_us=round(ms[v] * 1e3, 1), TFLOPs=round(flops / ms[v] / 1e9), vs_default=round(ms[False] / ms[v], 3),
                 check=check if v else "ok")
        del q, kv, table, sl
        torch.cuda.empty_cache()


UPSTREAM_MLA = {  # TileLang's MLA decode examples: file, whether its kernel takes glse and the partials
    "example": ("example_mla_decode.py", False),
    "warp-specialized example": ("example_mla_decode_ws.py", True),
}


def upstream_mla_rows(reps):
    """TileLang's own MLA decode examples (``examples/deepseek_mla/`` of the carried checkout,
    never part of this project) at the MLA rows' 128-head shape, each timed interleaved with
    ``mla_decode`` on the same values: what the same two-warpgroup design reaches in TileLang
    with the examples' choices (contiguous fp16 KV, no pages, fast math, no split). Each output
    is checked against ours first (fp16 against bf16 rounding: 2e-2 of the largest value)."""
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.decode_mla import D_QK, D_V, PAGE, mla_decode

    heads = max(h for h, t in MLA_SHAPES if t == 1)
    shape = f"B {BATCH} ctx {CTX} H {heads} T 1 bf16"
    g = torch.Generator(device="cuda").manual_seed(heads)
    q, kv, table, sl, _ = mla_case(BATCH, CTX, heads, 1, False, g)
    cont = kv[table.long()].view(BATCH, CTX, 1, D_QK).half()  # each sequence's keys in order
    qh = q[:, 0].half()
    args = (qh[..., :D_V].contiguous(), qh[..., D_V:].contiguous(), cont[..., :D_V].contiguous(), cont[..., D_V:].contiguous())
    del cont
    ours = mla_decode(q, kv, table, sl)[0][:, 0].float()
    flops = 2 * BATCH * heads * CTX * (D_QK + D_V)
    for name, (file, partials) in UPSTREAM_MLA.items():
        what = f"MLA decode, upstream {name} (contiguous fp16, fast math)"
        path = CARRIED_EXAMPLES / "deepseek_mla" / file
        if not path.is_file():
            emit(what=what, check="not run: no carried TileLang examples")
            continue
        try:
            up = load_upstream(str(path), f"upstream_{path.stem}")
            kernel = up.flashattn(BATCH, heads, 1, CTX, D_V, D_QK - D_V, PAGE, 64, 1, D_QK**-0.5)
            extra = ((torch.empty(BATCH, heads, 1, device="cuda", dtype=torch.half),
                      torch.empty(BATCH, heads, 1, D_V, device="cuda", dtype=torch.half)) if partials else ())
            theirs = kernel(*args, *extra).float()
        except Exception as e:  # noqa: BLE001 - an anchor that cannot run says why; ours are measured
            emit(what=what, shape=shape, check=f"not run: {type(e).__name__}: {str(e)[:200]}")
            continue
        err = ((theirs - ours).abs().max() / ours.abs().max()).item()
        if not err <= 2e-2:
            emit(what=what, shape=shape, check=f"FAILED: differs from ours by {err:.3g}")
            continue
        ms = interleaved_ms({"upstream": lambda: kernel(*args, *extra), "tlx": lambda: mla_decode(q, kv, table, sl)}, reps)
        emit(what=what, shape=shape, upstream_us=round(ms["upstream"] * 1e3, 1),
             upstream_TFLOPs=round(flops / ms["upstream"] / 1e9), tlx_us=round(ms["tlx"] * 1e3, 1),
             tlx_TFLOPs=round(flops / ms["tlx"] / 1e9), check="ok")


def sparse_rows(reps):
    """Sparse decode with each consumer schedule, split length and (e4m3) dequantizing side
    beside dense decode over the same cache (all keys, the same dtype), interleaved, calls queued
    (the GPU's time); each sparse output checked against the reference first, the consumers'
    dequant bit for bit against the producer's. The rate per key is compared with the dense call's."""
    import torch

    from bench.timing import interleaved_ms
    from kernels.attention.decode_mla import D_QK, D_V, mla_decode
    from kernels.attention.decode_sparse import reference_sparse_mla_decode, sparse_mla_decode
    from tests.kernels.attention.test_decode_mla import poisoned_outputs
    from tlx.numerics.sweep import same_bits

    for fp8 in (False, True):
        shape = f"B {BATCH} ctx {CTX} H {SPARSE_HEADS} T 1 k {SPARSE_TOPK} {'e4m3' if fp8 else 'bf16'}"
        g = torch.Generator(device="cuda").manual_seed(SPARSE_TOPK)
        q, kv, table, sl, idx, sink, scales = sparse_case(fp8, g)
        ref = reference_sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales)
        variants = sparse_variants(fp8)
        checks = {v: checked(*sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales, out=poisoned_outputs(q),
                                                consumers=v[0], split_slots=v[1], dequant_by=v[2], finish=v[3]), *ref)
                  for v in variants}
        del ref
        calls = {v: (lambda v=v: sparse_mla_decode(q, kv, table, sl, idx, sink=sink, kv_scales=scales, consumers=v[0],
                                                   split_slots=v[1], dequant_by=v[2], finish=v[3]))
                 for v in variants if checks[v] == "ok"}
        # the same dequantized values, the combine's arithmetic: the same bits as the first-named variant
        for v, like, says in ((("shared", 2048, "consumers", True), ("shared", 2048, "producer", True), "the producer's dequant"),
                              (("shared", 2048, "producer", False), ("shared", 2048, "producer", True), "the finished rows"),
                              (("shared", 2048, "consumers", False), ("shared", 2048, "consumers", True), "the finished rows")):
            if v in calls and like in calls:
                same = all(same_bits(a, b) for a, b in zip(calls[like](), calls[v]()))
                checks[v] += f", bits same as {says}" if same else ", bits DIFFER"
        calls["dense"] = lambda: mla_decode(q, kv, table, sl, kv_scales=scales)
        ms = interleaved_ms(calls, reps, queued=True)
        dense_tf = 2 * BATCH * SPARSE_HEADS * CTX * (D_QK + D_V) / ms["dense"] / 1e9
        emit(what="MLA decode (dense anchor, every key)", shape=f"B {BATCH} ctx {CTX} H {SPARSE_HEADS} T 1",
             tlx_us=round(ms["dense"] * 1e3, 1), TFLOPs=round(dense_tf), check="-")
        for v in variants:
            what = (f"sparse MLA decode, {v[0]} consumers, {v[1]}-slot splits" + (", consumers dequantize" if v[2] == "consumers" else "")
                    + ("" if v[3] or not finishes(SPARSE_TOPK, v[0], v[1]) else ", combined by mla_combine_kernel"))
            if v not in ms:
                emit(what=what, shape=shape, check=checks[v])
                continue
            tf = 2 * BATCH * SPARSE_HEADS * SPARSE_TOPK * (D_QK + D_V) / ms[v] / 1e9
            emit(what=what, shape=shape, tlx_us=round(ms[v] * 1e3, 1), TFLOPs=round(tf),
                 pct_of_dense_per_key=round(100 * tf / dense_tf, 1), check=checks[v])
        del q, kv, table, sl, idx, calls
        torch.cuda.empty_cache()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--precompile":
        precompile(BENCH_CONFIGS + TEST_CONFIGS + baseline_configs(),
                   int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1)
        return
    args = args_parse()
    configs = [c for c in BENCH_CONFIGS if (not args.only_mla or c[0] in MLA_KINDS)
               and (not args.only_indexer or c[0] in INDEXER_KINDS)]
    if args.only_key_major:
        configs = KEY_MAJOR_CONFIGS
    if args.only_overlap:
        configs = OVERLAP_CONFIGS
    if args.only_sparse:
        configs = SPARSE_CONFIGS
    precompile(configs, os.cpu_count() or 1)  # no CUDA context yet: the forked workers only compile

    import torch

    from bench.timing import large_copy_ms

    print(f"GPU: {torch.cuda.get_device_name()}", flush=True)
    reps = args.reps
    copy_ms, copy_bytes = large_copy_ms(reps)
    copy_gbps = copy_bytes / copy_ms / 1e6
    emit(what="copy 2 GiB", ms=round(copy_ms, 3), GBps=round(copy_gbps))
    if args.only_key_major:
        key_major_rows(reps, copy_gbps)
    elif args.only_overlap:
        overlap_rows(reps)
    elif args.only_sparse:
        sparse_rows(reps)
    elif not args.only_mla:
        if not args.only_indexer:
            topk_rows(reps)
        fp8 = scaled_mm_row(reps)
        upstream = None
        try:
            upstream = load_upstream(args.upstream_indexer)
        except Exception as e:  # noqa: BLE001 - the row says why the anchor is missing
            emit(what="upstream indexer", check=f"not loaded: {type(e).__name__}: {e}")
        indexer_rows(reps, upstream, fp8)
        indexer_decode_rows(reps, copy_gbps)
    if not (args.only_indexer or args.only_key_major or args.only_overlap or args.only_sparse):
        key_major_rows(reps, copy_gbps)
        overlap_rows(reps)
        mla_rows(reps, copy_gbps)
        sparse_rows(reps)
        upstream_mla_rows(reps)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
