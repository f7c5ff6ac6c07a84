"""``ldmatrix`` / ``stmatrix`` pointers: the verifier checks the bytes the instruction moves (a
16-byte row per lane in shared memory, ``num`` 32-bit registers per lane), not TileLang's
pointer extents, which count 16-bit units and so double the range of 32-bit elements."""

import tilelang.language as T

import tlx
from tests.passes.corpus import lower_jit
from tlx.passes.verification import verify_kernel

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[2], target=TARGET, verify="off")
def gemm(dtype="float32", M=64, N=64, K=64, bm=64, bn=64, bk=32):
    """A pipelined GEMM whose float32 tiles reach the tensor cores (tf32) through ldmatrix."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // bn, M // bm, threads=128) as (bx, by):
            As = T.alloc_shared((bm, bk), dtype)
            Bs = T.alloc_shared((bn, bk), dtype)
            Cl = T.alloc_fragment((bm, bn), "float32")
            T.clear(Cl)
            for k in T.Pipelined(K // bk, num_stages=2):
                T.copy(A[by * bm, k * bk], As)
                T.copy(B[bx * bn, k * bk], Bs)
                T.gemm(As, Bs, Cl, transpose_B=True)
            T.copy(Cl, C[by * bm, bx * bn])

    return main


def _pointers(dtype):
    report = verify_kernel(lower_jit(gemm, dtype=dtype))
    return report, [a for a in report.accesses if a.kind == "pointer" and a.buffer in ("As", "Bs", "A_local", "B_local")]


def test_tf32_ldmatrix_is_proven():
    report, pointers = _pointers("float32")
    assert {a.buffer for a in pointers} == {"As", "Bs", "A_local", "B_local"}
    assert all(a.status == "proven" for a in pointers), [(a.buffer, a.index, a.counterexample) for a in pointers if a.status != "proven"]
    assert report.proven == report.checked


def test_fp16_ldmatrix_is_still_proven():
    report, pointers = _pointers("float16")
    assert pointers and all(a.status == "proven" for a in pointers)
