"""The ``viewed_params`` pass: a read-only parameter that a view is made from loses ``const``
(TileLang would declare it ``const T*`` and the view ``void*``, which nvcc refuses)."""

import tilelang.language as T

import tlx
from tests.passes.corpus.correct import TARGET
from tlx.lowering import lower
from tlx.passes import PassContext
from tlx.passes.viewed_params import viewed_params_pass

M = T.dynamic("M")


def row_sums(view: bool):
    """Each block copies its 4 rows of A to B, through a per-block view of A or directly."""

    @T.prim_func
    def main(A: T.Tensor((M, 64), "float32"), B: T.Tensor((M, 64), "float32"), W: T.Tensor((64,), "float32")):
        with T.Kernel(T.ceildiv(M, 4), threads=64) as bx:
            rows = T.make_tensor_from_addr(T.address_of(A[bx * 4, 0]), (4, 64), "float32") if view else None
            for r in T.serial(4):
                for j in T.Parallel(64):
                    B[bx * 4 + r, j] = (rows[r, j] if view else A[bx * 4 + r, j]) * W[j]

    return main


@tlx.jit(target=TARGET, assume=["M % 4 == 0", "M <= 1048576"])
def viewed_row_sums():
    return row_sums(True)


def _read_only(kernel):
    (func,) = [f for _, f in kernel.device_mod.functions.items()]
    return [str(func.params[int(i)].name) for i in func.attrs["tl.readonly_param_indices"]]


def test_a_viewed_parameter_leaves_the_read_only_list_and_nothing_else_does():
    before = lower(row_sums(True), TARGET)
    after = viewed_params_pass(before, PassContext())
    assert _read_only(before) == ["A", "W"] and _read_only(after) == ["W"]
    (f0,), (f1,) = before.device_mod.functions.values(), after.device_mod.functions.values()
    assert f0.body.same_as(f1.body) and f0.params == f1.params


def test_a_kernel_without_views_is_the_same_object():
    before = lower(row_sums(False), TARGET)
    assert viewed_params_pass(before, PassContext()).device_mod.same_as(before.device_mod)


def test_a_view_of_a_read_only_input_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path))
    kernel = viewed_row_sums()
    src = kernel.get_kernel_source()
    assert "float* __restrict__ A" in src and "const float* __restrict__ W" in src
    assert kernel.metadata["reports"]["bounds"]["unknown"] == [] and not kernel.metadata["reports"]["bounds"]["violations"]
