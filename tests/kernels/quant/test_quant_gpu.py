"""GPU parity of the quantization kernels: TileLang kernel == CUDA baseline == torch reference,
bit for bit, at model shapes; batch invariance; compute-sanitizer memcheck.

Every kernel output is produced twice into buffers poisoned with 0x00 and 0xFF bytes and the
two results must agree, so an element the kernel never writes cannot pass. Inputs are fresh
random data with edge rows planted (zeros, ±inf, NaN, denormals, exact powers of two, e2m1 ties).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.quant import reference as R
from kernels.quant.block_cast import block_cast_kernel, fp4_to_fp8_blocks, per_block_cast
from kernels.quant.channel_cast import channel_cast_kernel, per_channel_cast_transpose
from kernels.quant.dequant import dequant_e2m1, dequant_e4m3, dequant_kernel
from kernels.quant.group_cast import _alloc_scales, group_cast_kernel, mxfp4_cast, per_token_group_cast, swiglu_cast
from tlx.numerics.parity import assert_bitwise, build_baseline

pytestmark = pytest.mark.gpu

QUANT = Path(R.__file__).parent
DT = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
FMT = {"fp32": 0, "ue8m0": 1, "ue8m0_packed": 2}
POISONS = (0x00, 0xFF)


@pytest.fixture(scope="module")
def base():
    return {n: build_baseline(QUANT / f"{n}.cu") for n in ("group_cast", "block_cast", "dequant", "channel_cast")}


def make_input(t: int, h: int, dtype, seed: int) -> torch.Tensor:
    """Random rows of varied magnitude, with edge rows planted when there is room."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, h, device="cuda", generator=g)
    x *= torch.exp2(torch.randint(-12, 12, (t, 1), device="cuda", generator=g).float())
    if t >= 8:
        x[0] = 0.0
        x[0, 1::2] = -0.0
        x[1] = torch.randn(h, device="cuda", generator=g) * 1e-39  # fp32 denormals (bf16 keeps some)
        x[2, 5] = float("inf")
        x[3, 7] = float("nan")
        x[3, 200 % h] = -float("inf")
        x[4] = 0.0
        x[4, ::64] = 448.0 * 2.0**-3  # amax exactly a power of two times 448
        x[4, 1::64] = 7.0
        ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], device="cuda")
        x[5] = ties.repeat(h // 8) * 2.0**3  # e2m1 ties (amax 6 * 2^3 per group of 32)
        x[6] = 1e-6  # below the e4m3 clamp
        x[7] = -x[7].abs()
    return x.to(dtype)


def twice(run, *shapes_dtypes):
    """Run ``run(*outs)`` into outputs poisoned with 0x00, then 0xFF; both must agree."""
    results = []
    for poison in POISONS:
        outs = [torch.empty(s, dtype=d, device="cuda") for s, d in shapes_dtypes]
        for o in outs:
            o.view(torch.uint8).fill_(poison)
        run(*outs)
        results.append(outs)
    torch.cuda.synchronize()
    return results


def scale_views(t, ng, scale_fmt, col_major):
    """(storage shape, storage dtype, view function) of the scale output, as the wrapper builds it."""
    arg, out = _alloc_scales(t, ng, scale_fmt, col_major, "cuda")

    def view(storage):
        if scale_fmt == "ue8m0_packed":
            storage = storage.reshape(storage.shape[0], -1).view(torch.int32)
        return storage.t()[:t] if col_major else storage

    return tuple(arg.shape), arg.dtype, view


def check_group(base, x, group, scale_fmt, col_major, expected):
    t, h = x.shape
    sshape, sdtype, view = scale_views(t, h // group, scale_fmt, col_major)
    kernel = group_cast_kernel(h, group, "plain", DT[x.dtype], "e4m3", scale_fmt, col_major)
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(x, q, s), ((t, h), torch.float8_e4m3fn), (sshape, sdtype))
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(view(s0), view(s1), name="scales (poison)")
    empty = torch.empty(0, device="cuda")
    (bq, bs), _ = twice(lambda q, s: base["group_cast"].group_cast(x, empty, q, s, 0, group, 0, FMT[scale_fmt], int(col_major), 0.0),
                        ((t, h), torch.float8_e4m3fn), (sshape, sdtype))
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(view(s0), view(bs), name="scales vs baseline")
    assert_bitwise(q0, expected[0], name="q vs torch reference")
    assert_bitwise(view(s0), expected[1], name="scales vs torch reference")
    return q0, view(s0)


@pytest.mark.parametrize("h", [2048, 3072, 4096, 7168])
@pytest.mark.parametrize("t", [1, 4001, 16384])
def test_group_cast_model_shapes(base, h, t):
    x = make_input(t, h, torch.bfloat16, seed=h + t)
    check_group(base, x, 128, "fp32", False, R.per_token_group_cast(x, 128, "fp32", False))


@pytest.mark.parametrize(
    "dtype, h, group, scale_fmt, col_major",
    [
        (torch.float32, 7168, 128, "ue8m0", True),
        (torch.bfloat16, 4096, 64, "ue8m0_packed", True),
        (torch.float32, 3072, 32, "fp32", False),
        (torch.bfloat16, 7168, 128, "ue8m0_packed", False),
        (torch.bfloat16, 2048, 32, "ue8m0_packed", True),
        (torch.float32, 640, 128, "ue8m0_packed", True),  # 5 groups: last int32 word half padding
        (torch.bfloat16, 4096, 128, "fp32", True),
    ],
)
@pytest.mark.parametrize("t", [1, 7, 4001])
def test_group_cast_formats(base, dtype, h, group, scale_fmt, col_major, t):
    x = make_input(t, h, dtype, seed=7 * h + t + group)
    check_group(base, x, group, scale_fmt, col_major, R.per_token_group_cast(x, group, scale_fmt, col_major))


def test_group_cast_wrapper_matches_kernel():
    x = make_input(4001, 7168, torch.bfloat16, seed=3)
    q, s = per_token_group_cast(x, 128, "ue8m0_packed", col_major=True)
    eq, es = R.per_token_group_cast(x, 128, "ue8m0_packed", col_major=True)
    assert s.stride() == (1, R.tma_aligned(4001)) and s.data_ptr() % 16 == 0
    assert_bitwise(q, eq, name="q")
    assert_bitwise(s, es, name="scales")


def test_wrappers_match_reference_and_handle_empty_batches():
    x = make_input(4001, 4096, torch.bfloat16, seed=5)
    w = torch.rand(4001, device="cuda")
    q, s = swiglu_cast(x, w, 10.0, 128, "ue8m0_packed", col_major=True)
    eq, es = R.swiglu_cast(x, 10.0, w, 128, "ue8m0_packed", col_major=True)
    assert_bitwise(q, eq, name="swiglu q")
    assert_bitwise(s, es, name="swiglu scales")
    p, c = mxfp4_cast(x.float())
    ep, ec = R.mxfp4_cast(x.float())
    assert_bitwise(p, ep, name="mxfp4 values")
    assert_bitwise(c, ec, name="mxfp4 codes")
    q0, s0 = per_token_group_cast(x[:0], 128, "ue8m0_packed", col_major=True)
    assert q0.shape == (0, 4096) and s0.shape == (0, 8)
    assert per_channel_cast_transpose(x[:0])[0].shape == (4096, 0)


def test_group_cast_batch_invariance():
    """Every row's output is identical whatever T is and wherever the row sits."""
    x = make_input(16384, 7168, torch.bfloat16, seed=11)
    q, s = per_token_group_cast(x, 128, "ue8m0_packed", col_major=True)
    for off, t in ((0, 1), (0, 17), (5, 4001), (12000, 4384)):
        qi, si = per_token_group_cast(x[off : off + t].contiguous(), 128, "ue8m0_packed", col_major=True)
        assert_bitwise(qi, q[off : off + t], name=f"q rows {off}+{t}")
        assert_bitwise(si, s[off : off + t], name=f"scales rows {off}+{t}")


def test_block_and_channel_batch_invariance():
    """Weight blocks do not depend on N, channel blocks of 128 tokens do not depend on T."""
    w = make_input(7168, 4096, torch.bfloat16, seed=13)
    q, s = per_block_cast(w, 128)
    q1, s1 = per_block_cast(w[1024:2048].contiguous(), 128)
    assert_bitwise(q1, q[1024:2048], name="block q rows 1024..2047")
    assert_bitwise(s1, s[8:16], name="block scales")
    x = make_input(16384, 2048, torch.bfloat16, seed=17)
    q, s = per_channel_cast_transpose(x)
    q1, s1 = per_channel_cast_transpose(x[4096:4096 + 4000].contiguous())
    full = 31 * 128  # the slice's last 32 tokens form a partial block of their own
    assert_bitwise(q1[:, :full], q[:, 4096:4096 + full], name="channel q, whole 128-token blocks")
    assert_bitwise(s1[:, :31], s[:, 32:63], name="channel scales (whole 128-token blocks)")


@pytest.mark.parametrize("two_i, weighted, scale_fmt", [(4096, False, "fp32"), (6144, True, "ue8m0")])
@pytest.mark.parametrize("t", [1, 4001, 16384])
def test_swiglu_cast(base, two_i, t, weighted, scale_fmt):
    x = make_input(t, two_i, torch.bfloat16, seed=two_i + t) * 4
    w = torch.rand(t, device="cuda") if weighted else None
    i = two_i // 2
    sshape, sdtype, view = scale_views(t, i // 128, scale_fmt, False)
    kernel = group_cast_kernel(i, 128, "swiglu", "bfloat16", "e4m3", scale_fmt, False, 10.0, weighted)
    wk = w if weighted else torch.empty(t, device="cuda")
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(x, wk, q, s), ((t, i), torch.float8_e4m3fn), (sshape, sdtype))
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(s0, s1, name="scales (poison)")
    aux = w if weighted else torch.empty(0, device="cuda")
    (bq, bs), _ = twice(lambda q, s: base["group_cast"].group_cast(x, aux, q, s, 1, 128, 0, FMT[scale_fmt], 0, 10.0),
                        ((t, i), torch.float8_e4m3fn), (sshape, sdtype))
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(s0, bs, name="scales vs baseline")
    eq, es = R.swiglu_cast(x, 10.0, w, 128, scale_fmt)
    assert_bitwise(q0, eq, name="q vs torch reference (torch.exp on CUDA = expf)")
    assert_bitwise(view(s0), es, name="scales vs torch reference")


@pytest.mark.parametrize("two_i, weighted, scale_fmt, col_major", [(4096, False, "fp32", False), (6144, True, "ue8m0_packed", True)])
def test_swiglu_cast_rows_mask(two_i, weighted, scale_fmt, col_major):
    """With ``rows``, a row of negative entry is neither read nor written: the masked kernel's
    outputs equal the plain kernel's bit for bit on every other row (poisoned outputs: each of
    those elements written), and a masked row keeps each poison."""
    t = 4001
    x = make_input(t, two_i, torch.bfloat16, seed=7 + two_i) * 4
    g = torch.Generator(device="cuda").manual_seed(two_i)
    rows = torch.randint(-3, 3, (t,), device="cuda", generator=g, dtype=torch.int32)  # about half negative
    rows[:8] = torch.arange(8, device="cuda", dtype=torch.int32)  # the planted edge rows stay read
    w = torch.rand(t, device="cuda", generator=g) + 0.5 if weighted else None
    sshape, sdtype, view = scale_views(t, two_i // 2 // 128, scale_fmt, col_major)  # view: past TMA padding
    qshape = ((t, two_i // 2), torch.float8_e4m3fn)
    wk = w if weighted else torch.empty(t, device="cuda")
    masked = group_cast_kernel(two_i // 2, 128, "swiglu", "bfloat16", "e4m3", scale_fmt, col_major, 10.0, weighted, True)
    plain = group_cast_kernel(two_i // 2, 128, "swiglu", "bfloat16", "e4m3", scale_fmt, col_major, 10.0, weighted)
    (q0, s0), (q1, s1) = twice(lambda q, s: masked(x, wk, rows, q, s), qshape, (sshape, sdtype))
    read = rows >= 0
    assert_bitwise(q0[read], q1[read], name="q (poison)")
    assert_bitwise(view(s0)[read], view(s1)[read], name="scales (poison)")
    for q, s, poison in ((q0, s0, POISONS[0]), (q1, s1, POISONS[1])):
        assert (q[~read].view(torch.uint8) == poison).all()
        assert (view(s)[~read].contiguous().view(torch.uint8) == poison).all()
    (eq, es), _ = twice(lambda q, s: plain(x, wk, q, s), qshape, (sshape, sdtype))
    assert_bitwise(q0[read], eq[read], name="q vs plain kernel")
    assert_bitwise(view(s0)[read], view(es)[read], name="scales vs plain kernel")
    q, s = swiglu_cast(x, w, 10.0, 128, scale_fmt, col_major, rows=rows)
    assert_bitwise(q[read], q0[read], name="wrapper q")


@pytest.mark.parametrize("dtype, k, t", [(torch.bfloat16, 2048, 4001), (torch.float32, 7168, 1), (torch.bfloat16, 7168, 16384)])
def test_mxfp4_cast(base, dtype, k, t):
    x = make_input(t, k, dtype, seed=k + t)
    kernel = group_cast_kernel(k, 32, "plain", DT[dtype], "e2m1")
    empty = torch.empty(0, device="cuda")
    shapes = (((t, k // 2), torch.uint8), ((t, k // 32), torch.uint8))
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(x, q, s), *shapes)
    assert_bitwise(q0, q1, name="e2m1 (poison)")
    assert_bitwise(s0, s1, name="codes (poison)")
    (bq, bs), _ = twice(lambda q, s: base["group_cast"].group_cast(x, empty, q, s, 0, 32, 1, 1, 0, 0.0), *shapes)
    assert_bitwise(q0, bq, name="e2m1 vs baseline (CUDA's fp4 conversion)")
    assert_bitwise(s0, bs, name="codes vs baseline")
    eq, es = R.mxfp4_cast(x)
    assert_bitwise(q0, eq, name="e2m1 vs torch reference")
    assert_bitwise(s0, es, name="codes vs torch reference")


@pytest.mark.parametrize("scale_fmt, col_major", [("ue8m0", False), ("ue8m0_packed", True)])
@pytest.mark.parametrize("t", [1, 4001])
def test_fp4_to_fp8(base, scale_fmt, col_major, t):
    k = 7168
    packed, codes = mxfp4_cast(make_input(t, k, torch.bfloat16, seed=t))
    sshape, sdtype, view = scale_views(t, k // 128, scale_fmt, col_major)
    kernel = group_cast_kernel(k, 128, "e2m1", "uint8", "e4m3", scale_fmt, col_major)
    shapes = (((t, k), torch.float8_e4m3fn), (sshape, sdtype))
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(packed, codes, q, s), *shapes)
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(view(s0), view(s1), name="scales (poison)")
    (bq, bs), _ = twice(lambda q, s: base["group_cast"].group_cast(packed, codes, q, s, 2, 128, 0, FMT[scale_fmt], int(col_major), 0.0), *shapes)
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(view(s0), view(bs), name="scales vs baseline")
    eq, es = R.fp4_to_fp8(packed, codes, (1, 128))
    assert_bitwise(q0, eq, name="q vs torch reference")
    if scale_fmt == "ue8m0":
        assert_bitwise(view(s0), es, name="scales vs torch reference")


@pytest.mark.parametrize(
    "dtype, block, pow2, n, k",
    [
        (torch.bfloat16, 128, False, 4096, 7168),
        (torch.float32, 128, True, 7168, 2048),
        (torch.bfloat16, 32, False, 6144, 4096),
        (torch.float32, 32, True, 4096, 7168),
        (torch.bfloat16, 128, True, 7168, 2048),
    ],
)
def test_block_cast(base, dtype, block, pow2, n, k):
    w = make_input(n, k, dtype, seed=n + k + block)
    kernel = block_cast_kernel(k, block, DT[dtype], pow2)
    shapes = (((n, k), torch.float8_e4m3fn), ((n // block, k // block), torch.float32))
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(w, q, s), *shapes)
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(s0, s1, name="scales (poison)")
    (bq, bs), _ = twice(lambda q, s: base["block_cast"].block_cast(w, q, s, block, int(pow2)), *shapes)
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(s0, bs, name="scales vs baseline")
    eq, es = R.per_block_cast(w, block, pow2)
    assert_bitwise(q0, eq, name="q vs torch reference")
    assert_bitwise(s0, es, name="scales vs torch reference")
    wq, ws = per_block_cast(w, block, pow2)
    assert_bitwise(wq, q0, name="wrapper q")


@pytest.mark.parametrize("block", [128, 32])
def test_fp4_to_fp8_blocks(base, block):
    n, k = 4096, 7168
    packed, codes = mxfp4_cast(make_input(n, k, torch.bfloat16, seed=block))
    kernel = block_cast_kernel(k, block, "e2m1", True)
    shapes = (((n, k), torch.float8_e4m3fn), ((n // block, k // block), torch.float32))
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(packed, codes, q, s), *shapes)
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(s0, s1, name="scales (poison)")
    (bq, bs), _ = twice(lambda q, s: base["block_cast"].block_cast_e2m1(packed, codes, q, s, block, 1), *shapes)
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(s0, bs, name="scales vs baseline")
    eq, es = R.fp4_to_fp8(packed, codes, (block, block))
    assert_bitwise(q0, eq, name="q vs torch reference")
    assert_bitwise(s0, es, name="scales vs torch reference")
    wq, ws = fp4_to_fp8_blocks(packed, codes, block)
    assert_bitwise(wq, q0, name="wrapper q")


@pytest.mark.parametrize(
    "out_dtype, block",
    [(torch.bfloat16, (1, 128)), (torch.float32, (128, 128)), (torch.bfloat16, (32, 32)), (torch.float32, (1, 32))],
)
@pytest.mark.parametrize("m", [1, 4001])
def test_dequant_e4m3(base, out_dtype, block, m):
    n = 7168
    x = make_input(m, n, torch.float32, seed=m + block[1]).nan_to_num(0.0, 0.0, 0.0)  # no NaN: bf16 NaN payloads differ
    q = R.cast_e4m3(x / 4)
    g = torch.Generator(device="cuda").manual_seed(m)
    s = torch.rand(((m + block[0] - 1) // block[0], n // block[1]), device="cuda", generator=g) * 1e3
    kernel = dequant_kernel(n, "e4m3", block[0], block[1], DT[out_dtype])
    (y0,), (y1,) = twice(lambda y: kernel(q, s, y), ((m, n), out_dtype))
    assert_bitwise(y0, y1, name="y (poison)")
    (by,), _ = twice(lambda y: base["dequant"].dequant(q, s, y, 0, block[0], block[1]), ((m, n), out_dtype))
    assert_bitwise(y0, by, name="y vs baseline")
    assert_bitwise(y0, R.dequant_e4m3(q, s, block, out_dtype), name="y vs torch reference")
    assert_bitwise(dequant_e4m3(q, s, block, out_dtype), y0, name="wrapper y")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 4001, 16384])
def test_dequant_e2m1(base, out_dtype, m):
    n = 7168
    g = torch.Generator(device="cuda").manual_seed(m)
    packed = torch.randint(0, 256, (m, n // 2), device="cuda", generator=g, dtype=torch.uint8)
    codes = torch.randint(100, 150, (m, n // 32), device="cuda", generator=g, dtype=torch.uint8)
    kernel = dequant_kernel(n, "e2m1", 1, 32, DT[out_dtype])
    (y0,), (y1,) = twice(lambda y: kernel(packed, codes, y), ((m, n), out_dtype))
    assert_bitwise(y0, y1, name="y (poison)")
    (by,), _ = twice(lambda y: base["dequant"].dequant(packed, codes, y, 1, 1, 32), ((m, n), out_dtype))
    assert_bitwise(y0, by, name="y vs baseline")
    assert_bitwise(y0, R.dequant_e2m1(packed, codes, out_dtype), name="y vs torch reference")
    assert_bitwise(dequant_e2m1(packed, codes, out_dtype), y0, name="wrapper y")


@pytest.mark.parametrize("dtype, pow2, h", [(torch.bfloat16, False, 2048), (torch.float32, True, 7168), (torch.bfloat16, True, 7168)])
@pytest.mark.parametrize("t", [16, 4000, 16384])
def test_channel_cast_transpose(base, dtype, pow2, h, t):
    x = make_input(t, h, dtype, seed=h + t)
    kernel = channel_cast_kernel(h, DT[dtype], pow2)
    nb = (t + 127) // 128
    shapes = (((h, t), torch.float8_e4m3fn), ((h, nb), torch.float32))
    x3 = x.view(t // 16, 16, h)
    (q0, s0), (q1, s1) = twice(lambda q, s: kernel(x3, q.view(h, t // 16, 16), s), *shapes)
    assert_bitwise(q0, q1, name="q (poison)")
    assert_bitwise(s0, s1, name="scales (poison)")
    (bq, bs), _ = twice(lambda q, s: base["channel_cast"].channel_cast(x, q, s, int(pow2)), *shapes)
    assert_bitwise(q0, bq, name="q vs baseline")
    assert_bitwise(s0, bs, name="scales vs baseline")
    eq, es = R.per_channel_cast_transpose(x, 128, pow2)
    assert_bitwise(q0, eq, name="q vs torch reference")
    assert_bitwise(s0, es, name="scales vs torch reference")
    wq, _ = per_channel_cast_transpose(x, pow2)
    assert_bitwise(wq, q0, name="wrapper q")


def test_compute_sanitizer_memcheck():
    """Every public operation at tail-heavy shapes under ``compute-sanitizer --tool memcheck``."""
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer not installed")
    script = Path(__file__).with_name("sanitize_quant.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(QUANT.parents[1]), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script)],
                          capture_output=True, text=True, env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "ERROR SUMMARY: 0 errors" in out
    assert "ran 11 operations" in out
