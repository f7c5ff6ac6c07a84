"""``@tlx.jit`` as a drop-in for ``@tilelang.jit``: the forms TileLang 0.1.15 accepts (lazy,
eager, ``.compile``, ``get_tir``, ``par_compile``, ``get_kernel_source``) each compile through
tlx and give a tlx kernel with JITKernel's methods (autotuners: tests/test_tuning.py)."""

import pytest
import tilelang
import tilelang.language as T
import torch
from tilelang.jit import JITImpl

import tlx
from tests import jit_kernels as J
from tlx.kernel import Kernel


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TLX_CACHE_DIR", str(tmp_path / "cache"))


def test_lazy_compile_and_sources():
    kernel = J.scale.compile(N=1024, block=128)
    assert isinstance(kernel, Kernel) and isinstance(J.scale, JITImpl)
    assert kernel.out_idx == [1]
    assert [(str(p.dtype), p.shape) for p in kernel.params] == [("float32", [1024]), ("float32", [1024])]
    assert kernel.get_kernel_source() == kernel.device_source and "__global__" in kernel.get_kernel_source()
    assert kernel.get_host_source() == kernel.host_source and "tlx::launch(" in kernel.get_host_source()
    assert J.scale.get_kernel_source(1024, block=128) == kernel.get_kernel_source()
    assert J.scale(1024, block=128).directory == kernel.directory  # the call form compiles the same kernel
    assert "T.match_buffer(X_handle, (1024,)" in J.scale.get_tir(1024).script()


def test_build_log_names_each_build_once(tmp_path, monkeypatch):
    """``$TLX_BUILD_LOG`` gets one line per build, naming the factory and its arguments (how a
    device run tells which kernels its carried cache missed); a cache hit, in this process or
    through the disk cache, adds none."""
    log = tmp_path / "builds.log"
    monkeypatch.setenv("TLX_BUILD_LOG", str(log))
    J.scale.compile(N=512, block=64)
    J.scale.compile(N=512, block=64)
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and " built scale(N=512, block=64) in " in lines[0], lines
    J.scale._kernels.clear()
    J.scale._by_call.clear()
    J.scale.compile(N=512, block=64)  # the disk cache's entry
    assert log.read_text().splitlines() == lines


def test_symbolic_dims_reach_params():
    kernel = J.scale(T.dynamic("N"))
    (x, y) = kernel.params
    assert isinstance(x.shape[0], tilelang.tvm.tirx.Var) and x.shape[0].name == "N" and y.shape[0].same_as(x.shape[0])


def test_par_compile_returns_tlx_kernels_in_order():
    kernels = J.scale.par_compile([{"N": 256, "block": 64}, (512,)])
    assert all(isinstance(k, Kernel) for k in kernels)
    assert [k.params[0].shape for k in kernels] == [[256], [512]]
    assert J.scale.par_compile([(256, 64, "not-a-number")], ignore_error=True) == [None]


def test_eager_compile_specializes_on_tensor_shapes():
    a, b = torch.randn(40, 100), torch.randn(40, 100)
    kernel = J.eager_add.compile(a, b)
    assert J.eager_add.mode == "eager" and kernel.out_idx == [2]
    assert [p.shape for p in kernel.params] == [[40, 100]] * 3
    assert "__global__" in J.eager_add.get_kernel_source(a, b, block_M=16)


def test_eager_refuses_out_idx_like_tilelang():
    eager = tlx.jit(out_idx=[-1], target=J.SM90)(J.eager_add.factory)
    with pytest.raises(ValueError, match="out_idx is only supported in lazy mode"):
        eager.compile(torch.randn(4, 4), torch.randn(4, 4))


def test_tilelang_options_are_accepted():
    jf = tlx.jit(out_idx=-1, target="sm_90a", execution_backend="cython", verbose=True, target_host="llvm",
                 compile_flags=["-DTLX_TEST_FLAG=1"], pass_configs={tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True})(J.scale.factory)
    kernel = jf.compile(256)
    assert "-DTLX_TEST_FLAG=1" in kernel.metadata["nvcc_command"]
    assert kernel.metadata["pass_configs"] == {"tl.disable_tma_lower": True, "tl.device_compile_flags": ["-DTLX_TEST_FLAG=1"]}


def test_debug_root_path_gets_the_sources(tmp_path):
    jf = tlx.jit(out_idx=[-1], target=J.SM90, debug_root_path=str(tmp_path / "dbg"))(J.scale.factory)
    kernel = jf.compile(256)
    assert (tmp_path / "dbg" / "tilelang_jit_kernel_scale.c").read_text() == kernel.get_kernel_source()
    assert "T.prim_func" in (tmp_path / "dbg" / "tilelang_jit_program_scale.py").read_text()


@pytest.mark.gpu
def test_eager_call_launches_and_returns_output():
    a, b = torch.randn(100, 200, device="cuda"), torch.randn(100, 200, device="cuda")
    c = J.eager_add(a, b)
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


@pytest.mark.gpu
def test_profiler_checks_and_times_a_tlx_kernel():
    kernel = J.scale(4096)
    profiler = kernel.get_profiler(tilelang.TensorSupplyType.Randn)
    profiler.assert_allclose(lambda x: x * 2.0, rtol=0, atol=0)
    assert profiler.do_bench(n_warmup=2, n_repeat=5) > 0


def test_a_left_out_target_is_tilelangs_default_target(monkeypatch):
    """As in TileLang, a kernel that names no target compiles for ``$TILELANG_DEFAULT_TARGET``
    (how a machine without a GPU builds such code); ``"auto"`` always means the visible GPU."""
    from tlx.lowering import normalize_target

    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    assert normalize_target(None) == {"kind": "cuda", "arch": "sm_90a"}
    kernel = tlx.jit(out_idx=[1])(J.scale.factory).compile(N=256, block=64)
    assert kernel.metadata["target"]["arch"] == "sm_90a"
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", "sm_80")
    assert normalize_target(None) == {"kind": "cuda", "arch": "sm_80"}
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no GPU is visible"):
            normalize_target("auto")
