"""CPU checks of the quantization kernels (run in CI, no GPU): every kernel compiles for
sm_90a through ``@tlx.jit`` with 16-byte vector accesses, every CUDA baseline compiles, CUDA's
own conversions agree with the torch reference's rules, and bad input raises a clear error.
"""

import re
from pathlib import Path

import pytest
import torch

from kernels.quant import reference as R
from kernels.quant.block_cast import block_cast_kernel, fp4_to_fp8_blocks, per_block_cast
from kernels.quant.channel_cast import channel_cast_kernel, per_channel_cast_transpose
from kernels.quant.dequant import dequant_e2m1, dequant_e4m3, dequant_kernel
from kernels.quant.group_cast import fp4_to_fp8, group_cast_kernel, mxfp4_cast, per_token_group_cast, swiglu_cast

QUANT = Path(R.__file__).parent
# a vector access of buffer NAME, or of a uint32 view of it (printed ``((uint*)NAMEw)``)
VEC = r"\*\((?:uint4|float4|fp8_e4_16_t|fp8_e4_8_t|uint2|uint1|uint)\*\)\((?:\(\(uint\*\))?{}\w*\)? \+"

# (name, factory, args, buffer read with vector loads, buffer written with vector stores)
KERNELS = [
    ("group bf16 1x128 fp32", group_cast_kernel, (7168, 128, "plain", "bfloat16"), "X", "Q"),
    ("group fp32 1x32 packed col", group_cast_kernel, (3072, 32, "plain", "float32", "e4m3", "ue8m0_packed", True), "X", "Q"),
    ("swiglu weighted ue8m0", group_cast_kernel, (2048, 128, "swiglu", "bfloat16", "e4m3", "ue8m0", False, 10.0, True), "X", "Q"),
    ("swiglu rows mask", group_cast_kernel, (2048, 128, "swiglu", "bfloat16", "e4m3", "fp32", False, 10.0, False, True), "X", "Q"),
    ("mxfp4", group_cast_kernel, (4096, 32, "plain", "bfloat16", "e2m1"), "X", "Q"),
    ("fp4->fp8", group_cast_kernel, (7168, 128, "e2m1", "uint8", "e4m3", "ue8m0"), "X", "Q"),
    ("block 128 bf16", block_cast_kernel, (7168, 128, "bfloat16"), "X", "Q"),
    ("fp4->fp8 32x32", block_cast_kernel, (7168, 32, "e2m1", True), "X", "Q"),
    ("dequant e4m3 128x128", dequant_kernel, (7168, "e4m3", 128, 128, "bfloat16"), "Q", "Y"),
    ("channel transpose bf16", channel_cast_kernel, (4096, "bfloat16"), "cp.async X", "Q"),
]
ASYNC = r"cp_async_gs\w*<16>\(.*&\({}\["  # a 16-byte cp.async from the buffer into shared memory


@pytest.mark.parametrize("name, factory, args, load, store", KERNELS, ids=[k[0] for k in KERNELS])
def test_kernel_compiles_with_vector_accesses(name, factory, args, load, store):
    src = factory(*args).device_source
    if load.startswith("cp.async "):
        assert re.search(ASYNC.format(load.split()[1]), src), f"{name}: no 16-byte cp.async from {load}"
    else:
        assert re.search(VEC.format(load), src), f"{name}: no vector load from {load}"
    assert re.search(VEC.format(store), src), f"{name}: no vector store to {store}"
    assert "atomic" not in src  # one writer per element: results cannot depend on scheduling


@pytest.mark.parametrize("name", ["group_cast", "block_cast", "dequant", "channel_cast"])
def test_baseline_compiles(name):
    from tlx.numerics.parity import build_baseline

    obj = build_baseline(QUANT / f"{name}.cu", compile_only=True)
    assert Path(obj).stat().st_size > 0


@pytest.fixture(scope="module")
def cuda_conversions():
    """CUDA's conversion functions (as the baselines call them), built for the host."""
    import os

    import tvm_ffi
    import tvm_ffi.cpp
    from tvm_ffi.cpp.extension import _find_cuda_home

    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), _find_cuda_home(), "/usr/local/cuda"]
    include = next((Path(h) / "include" for h in homes if h and (Path(h) / "include" / "cuda_fp4.h").exists()), None)
    assert include is not None, f"no CUDA headers (cuda_fp4.h) under any of {homes}"
    lib = tvm_ffi.cpp.build(name="quant_conversions_host", cpp_files=[str(QUANT / "conversions_host.cc")],
                            extra_include_paths=[str(include)])
    return tvm_ffi.load_module(lib)


def _sweep() -> torch.Tensor:
    """Every bf16 bit pattern (ties at every binade, denormals, ±0, ±inf, NaN) plus random fp32."""
    every_bf16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    g = torch.Generator().manual_seed(1)
    rand = torch.randn(1 << 16, generator=g) * torch.exp2(torch.randint(-12, 10, (1 << 16,), generator=g).float())
    return torch.cat([every_bf16, rand])


def _cuda(conv, x, kind):
    out = torch.empty(x.shape, dtype=torch.uint8)
    conv.convert_host(x, out, kind)
    return out


def test_cuda_e4m3_conversion_matches_reference(cuda_conversions):
    x = _sweep()
    assert torch.equal(_cuda(cuda_conversions, x, 0), R.cast_e4m3(x).view(torch.uint8))


def test_cuda_e2m1_conversion_matches_reference(cuda_conversions):
    x = _sweep() / 64.0  # centre the sweep on e2m1's range (0.5 .. 6)
    assert torch.equal(_cuda(cuda_conversions, x, 1), R.e2m1_code(x))


def test_cuda_ue8m0_round_up_matches_reference(cuda_conversions):
    x = _sweep().abs()
    x = x[(x >= 2.0**-126) & torch.isfinite(x)]  # scales are positive normal numbers
    assert torch.equal(_cuda(cuda_conversions, x, 2).int(), R.pow2_code(x))


# Bad input is rejected in Python before anything reaches a GPU, so these run on CPU.
BF16 = torch.bfloat16


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: per_token_group_cast(torch.zeros(4, 256, dtype=torch.float16)), TypeError, "x: expected dtype"),
        (lambda: per_token_group_cast(torch.zeros(4, 200, dtype=BF16)), ValueError, "width 200 is not a multiple of 128"),
        (lambda: per_token_group_cast(torch.zeros(4, 256, dtype=BF16), group=96), ValueError, "group: expected one of"),
        (lambda: per_token_group_cast(torch.zeros(4, 256, dtype=BF16), scale_fmt="e8m0"), ValueError, "scale_fmt"),
        (lambda: per_token_group_cast(torch.zeros(4, 256, dtype=BF16)), ValueError, "expected a CUDA tensor"),
        (lambda: per_token_group_cast(torch.zeros(4 * 256 + 1, dtype=BF16)[1:].view(4, 256)), ValueError, "16-byte aligned"),
        (lambda: per_token_group_cast(torch.zeros(256, 4, dtype=BF16).t()), ValueError, "contiguous"),
        (lambda: swiglu_cast(torch.zeros(4, 384, dtype=BF16)), ValueError, "not a multiple of 256"),
        (lambda: swiglu_cast(torch.zeros(4, 512, dtype=BF16), rows=torch.zeros(4, dtype=torch.int64)), ValueError,
         r"rows: expected a torch.int32 tensor of shape \(4,\), got torch.int64"),
        (lambda: swiglu_cast(torch.zeros(4, 512, dtype=BF16), rows=torch.zeros(3, dtype=torch.int32)), ValueError,
         r"rows: expected .* shape \(4,\), got torch.int32 \(3,\)"),
        (lambda: swiglu_cast(torch.zeros(4, 512, dtype=BF16), torch.ones(4, dtype=torch.float64)), ValueError,
         "weights: expected a torch.float32 tensor"),
        (lambda: swiglu_cast(torch.zeros(4, 512, dtype=BF16), rows=torch.zeros(4, dtype=torch.int32)), ValueError,
         "expected a CUDA tensor"),
        (lambda: group_cast_kernel(256, 128, "plain", "bfloat16", masked=True), ValueError, "masked: expected in_mode 'swiglu'"),
        (lambda: mxfp4_cast(torch.zeros(4, 48)), ValueError, "not a multiple of 32"),
        (lambda: fp4_to_fp8(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.uint8), scale_fmt="fp32"),
         ValueError, "power-of-two"),
        (lambda: per_block_cast(torch.zeros(100, 128), 128), ValueError, "100 rows is not a multiple of block 128"),
        (lambda: per_block_cast(torch.zeros(128, 128), 64), ValueError, "block: expected one of"),
        (lambda: fp4_to_fp8_blocks(torch.zeros(100, 64, dtype=torch.uint8), torch.zeros(100, 4, dtype=torch.uint8)),
         ValueError, "100 rows is not a multiple of block 128"),
        (lambda: per_channel_cast_transpose(torch.zeros(40, 64, dtype=BF16)), ValueError, "40 tokens is not a multiple of 16"),
        (lambda: dequant_e4m3(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.zeros(4, 2)), ValueError, "s: expected shape"),
        (lambda: dequant_e4m3(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.zeros(4, 1), (64, 64)), ValueError, "block"),
        (lambda: dequant_e2m1(torch.zeros(4, 64, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8)), ValueError, "codes"),
        (lambda: dequant_e4m3(torch.zeros(4, 128, dtype=torch.float8_e4m3fn), torch.zeros(4, 1), out_dtype=torch.float16),
         TypeError, "out_dtype"),
    ],
)
def test_bad_input_raises_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_swiglu_rows_mask_guards_every_read_of_a_row():
    """The masked SwiGLU kernel reads R first, and every load of X and W and every store of Q and
    S sits under that one check: a masked row is neither read nor written. A CTA takes 256 threads
    of rows (4 rows of 64 threads at I = 2048, 2 of 96 at 3072: whole warps a row), ceil(T / rows)
    CTAs without an int32 overflow, every access proven."""
    kernel = group_cast_kernel(2048, 128, "swiglu", "bfloat16", "e4m3", "fp32", False, 10.0, True, True)
    for k, rows, threads in ((kernel, 4, "256"), (group_cast_kernel(3072, 128, "swiglu", "bfloat16", masked=True), 2, "192")):
        assert k.metadata["launches"][0]["grid"][0] == f"(((T - 1) // {rows}) + 1)" and k.metadata["launches"][0]["block"][0] == threads
        bounds = k.metadata["reports"]["bounds"]
        assert bounds["proven"] == bounds["accesses"] and not bounds["violations"]
    src = kernel.device_source
    body = src[src.index("{", src.index("__launch_bounds__")):]
    guard = body.index("if (0 <= R[")
    depth, close = 0, None
    for i in range(body.index("{", guard), len(body)):  # the guard's matching brace
        depth += {"{": 1, "}": -1}.get(body[i], 0)
        if depth == 0:
            close = i
            break
    reads = [m.start() for m in re.finditer(r"\(\(uint\*\)Xw\)|W\[", body)]
    stores = [m.start() for m in re.finditer(r"\b(Q\w*|S)\[[^\]]*\] =|\*\(uint4\*\)\(\(\(uint\*\)Q\w*\)", body)]
    assert len(reads) == 3 and len(stores) >= 2  # gate, up, weight; the e4m3 words and the scale
    assert all(guard < i < close for i in reads + stores)
    assert not body[close + 1:].strip("} \n")  # nothing after the guarded block
