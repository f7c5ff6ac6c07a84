"""Launcher generation without a GPU: plan, source structure, build, and argument rejection."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("tilelang.language")

from tests.conftest import CPU_TARGET  # noqa: E402
from tests.hostgen import sample_kernels as sk  # noqa: E402
from tlx.hostgen import plan_launcher, walk_steps  # noqa: E402
from tlx.lowering import lower  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("tlx-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TLX_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def add(cache):
    return sk.add(T.dynamic("M"), 1024)


@pytest.fixture(scope="module")
def gemm(cache):
    return sk.gemm(T.dynamic("M"), 1024, 1024)


def test_plan_binds_symbolic_dims_and_reads_tma_descriptors():
    plan = plan_launcher(lower(sk.gemm.get_tir(T.dynamic("M"), 1024, 1024), CPU_TARGET))
    assert list(plan.shape_vars) == ["M"]
    var, tensor, dim = plan.shape_vars["M"]
    assert (tensor.name, dim) == ("A", 0)
    descs = [s.desc for s in plan.steps if s.kind == "desc"]
    assert sorted(d.tensor for d in descs) == ["A", "B"]
    assert all(d.rank == 2 and d.global_stride[0] == 2 for d in descs)
    launches = [s.launch for s in plan.steps if s.kind == "launch"]
    assert len(launches) == 1 and launches[0].arg_types[:2] == ["desc", "desc"]
    assert {t.name: t.align for t in plan.tensors}["A"] == 16


def test_two_descriptors_of_one_tensor_get_distinct_names(cache):
    """Lowering names both TMA descriptors of A ``A_desc`` (boxes 128 x 64 and 128 x 32): the
    launcher declares them apart, and it builds."""
    src = sk.two_boxes(T.dynamic("M")).host_source
    assert "const CUtensorMap& v_A_desc = " in src and "const CUtensorMap& v_A_desc_1 = " in src
    boxes = ("{cuuint32_t(int64_t(64)), cuuint32_t(int64_t(128))}", "{cuuint32_t(int64_t(32)), cuuint32_t(int64_t(128))}")
    assert all(box in src for box in boxes)
    assert "p0 = v_A_desc;" in src and "p1 = v_A_desc_1;" in src


def test_parameters_that_share_a_name_get_distinct_identifiers(cache):
    """A kernel that renames its buffers (``for src, dst in ((X, Y), (X2, Y2))``) has two
    parameters called src and two called dst: the launcher names them by position (it once
    declared ``t_src`` twice and failed to compile), builds, and its messages keep the names."""
    kernel = sk.copy_pairs(T.dynamic("N"))
    src = kernel.host_source
    assert [p["name"] for p in kernel.metadata["params"]] == ["src", "src", "dst", "dst"]
    for i in range(4):
        assert f"const DLTensor* t_arg{i} = tlx::tensor_arg(kKernel, args, {i}, " in src
        assert f"void* const v_arg{i} = tlx::data_ptr(t_arg{i});" in src
    assert "t_src" not in src and "v_src" not in src
    assert 'tlx::check_dim(kKernel, "dst", t_arg3, 0, v_N, "N (from src.shape[0])");' in src
    assert "const DLDevice device = t_arg0->device;" in src  # the allocating call
    assert "int64_t shape_arg2[] = {v_N};" in src and "int64_t shape_arg3[] = {v_N};" in src
    x = torch.zeros(4)
    with pytest.raises(TypeError, match="src"):
        kernel(x, x.int())
    with pytest.raises(TypeError, match="src"):
        kernel.launch(x, x.int(), x, x)
    with pytest.raises(ValueError, match="dst.shape"):
        kernel.launch(x, x, x, torch.zeros(5))


def test_vectorized_kernel_requires_vector_alignment():
    plan = plan_launcher(lower(sk.add.get_tir(T.dynamic("M"), 1024), CPU_TARGET))
    assert {t.name: t.align for t in plan.tensors} == {"A": 16, "B": 16, "C": 16}


def test_launcher_source_checks_every_argument(gemm):
    src = gemm.host_source
    for needle in (
        "tlx::check_num_args(kKernel, num_args, 3",
        'tlx::check_dtype(kKernel, "A", t_A, 2, 16, 1)',
        'tlx::bind_dim(kKernel, "A", t_A, 0, "M")',
        'tlx::check_dim(kKernel, "C", t_C, 0, v_M, "M (from A.shape[0])")',
        'tlx::check_stride(kKernel, "B", t_B, 0, int64_t(1024))',
        'tlx::check_align(kKernel, "A", v_A, 16, "the kernel\'s TMA copies")',
        "TensorMapCache<2>",
        "TVMFFIEnvGetStream(kDLCUDA, device_id)",
        "tlx::launch(",
    ):
        assert needle in src, needle
    assert src.index("check_dtype") < src.index("check_cuda_device") < src.index("tlx::launch(")
    assert "kernel.cubin" in src and gemm.metadata["launches"][0]["dynamic_shared_memory"] == "98304"


def test_metadata_describes_params_and_launches(add):
    md = add.metadata
    assert [p["name"] for p in md["params"]] == ["A", "B", "C"]
    assert md["symbolic_dims"] == {"M": {"tensor": "A", "dim": 0}}
    assert md["params"][2]["output"] and not md["params"][0]["output"]
    assert md["launches"][0]["block"][0] == "128"
    assert md["nvcc_command"][:5] == ["nvcc", "--cubin", "-O3", "-lineinfo", "-arch=sm_90a"]


@pytest.mark.parametrize(
    "make, exc, words",
    [
        (lambda: (torch.zeros(4, 1024, dtype=torch.float16), torch.zeros(4, 1024)), TypeError, ["add", "A", "float32", "float16"]),
        (lambda: (torch.zeros(4, 1024),), TypeError, ["add(A: float32[M, 1024], B: float32[M, 1024])", "expected 2 arguments, got 1"]),
        (lambda: (torch.zeros(4, 1000), torch.zeros(4, 1000)), ValueError, ["add", "A.shape[1]", "1024", "1000"]),
        (lambda: (torch.zeros(4, 1024), torch.zeros(5, 1024)), ValueError, ["add", "B.shape[0]", "M", "4", "5"]),
        (lambda: (torch.zeros(1024, 4).t(), torch.zeros(4, 1024)), ValueError, ["add", "A.stride(0)", "1024"]),
        (lambda: (torch.zeros(4, 1024), torch.zeros(4, 1024)), ValueError, ["add", "CUDA tensor", "cpu"]),
        (lambda: (torch.zeros(4, 1024, 1), torch.zeros(4, 1024)), ValueError, ["add", "A", "2 dimensions", "3"]),
        (lambda: ("x", torch.zeros(4, 1024)), TypeError, ["add", "A", "tensor", "str"]),
    ],
)
def test_bad_arguments_raise_named_errors_without_a_gpu(add, make, exc, words):
    with pytest.raises(exc) as info:
        add(*make())
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_scalar_arguments_are_type_checked(cache):
    axpy = sk.axpy(T.dynamic("N"))
    x = torch.zeros(16)
    with pytest.raises(TypeError, match="alpha"):
        axpy.launch(x, x, "2.0")
    with pytest.raises(TypeError, match="expected 3 arguments"):
        axpy.launch(x, x)
    with pytest.raises(ValueError, match="CUDA tensor"):
        axpy.launch(x, x, 2.0)


def test_cache_hit_reuses_the_build_and_corruption_is_rebuilt(add, cache):
    again = sk.add.__wrapped__  # the factory itself: a fresh JIT object has no in-memory cache
    import tlx

    fresh = tlx.jit(out_idx=[-1], target=sk.SM90)(again)
    k2 = fresh(T.dynamic("M"), 1024)
    assert k2.directory == add.directory
    lib = add.directory / "launcher.so"
    lib.unlink()  # a new file, not an in-place write: this process still maps the old one
    lib.write_bytes(b"corrupted")
    fresh2 = tlx.jit(out_idx=[-1], target=sk.SM90)(again)
    with pytest.warns(RuntimeWarning, match="corrupted"):
        k3 = fresh2(T.dynamic("M"), 1024)
    assert k3.directory == add.directory
    with pytest.raises(ValueError, match="CUDA tensor"):
        k3(torch.zeros(2, 1024), torch.zeros(2, 1024))


def test_pass_configs_are_part_of_the_cache_key(add, cache):
    import tlx

    unrolled = tlx.jit(out_idx=[-1], target=sk.SM90, pass_configs={"tirx.disable_vectorize": True})(sk.add.__wrapped__)
    k = unrolled(T.dynamic("M"), 1024)
    assert k.directory != add.directory
    assert k.device_source != add.device_source  # the configuration reached the lowering


_CHILD = """
import sys
sys.path.insert(0, {root!r})
import tilelang.language as T
from tests.hostgen import sample_kernels as sk
k = sk.axpy(T.dynamic("N"), block=128)
print(k.directory, file=sys.stderr)
"""

_LOAD = """
import sys, time
sys.path.insert(0, {root!r})
import tilelang.language as T
from tests.hostgen import sample_kernels as sk
t0 = time.perf_counter()
k = sk.axpy(T.dynamic("N"), block=128)
print(time.perf_counter() - t0)
"""


def test_two_processes_compiling_the_same_kernel_both_succeed_and_reload_is_fast(tmp_path):
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "TLX_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD.format(root=root)], env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    dirs = []
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        dirs.append(err.strip().splitlines()[-1])
    assert dirs[0] == dirs[1]
    loads = []
    for _ in range(3):  # best of three fresh processes: one cold load on a shared 2-core machine is noisy
        out = subprocess.run([sys.executable, "-c", _LOAD.format(root=root)], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr
        loads.append(float(out.stdout.strip().splitlines()[-1]))
    assert min(loads) < 0.05, loads  # a cached kernel loads in a fresh process in under 50 ms


def test_launchers_compile_against_the_precompiled_header_to_the_same_assembly(add, tmp_path):
    """Once a compile has built the runtime support, a launcher's compile takes the precompiled
    ``tlx_launcher.h`` (GCC's ``-H`` marks a valid one with ``!``) and emits the assembly it
    emits from the header itself."""
    from tlx.hostgen import launcher_compile_command, runtime_support

    runtime, missing = runtime_support()
    assert missing == [] and (runtime.parent / "tlx_launcher.h.gch").is_file()
    (tmp_path / "launcher.cc").write_text(add.host_source)
    with_pch = subprocess.run([*launcher_compile_command(tmp_path, runtime), "-H"], capture_output=True, text=True)
    assert with_pch.returncode == 0, with_pch.stderr
    assert f"! {runtime.parent / 'tlx_launcher.h.gch'}" in with_pch.stderr.splitlines()
    precompiled = (tmp_path / "launcher.s").read_text()
    no_pch = tmp_path / "none" / "tlx_runtime.o"  # a runtime directory without the header: the header is parsed
    header = subprocess.run([*launcher_compile_command(tmp_path, no_pch), "-H"], capture_output=True, text=True)
    assert header.returncode == 0 and ".gch" not in header.stderr and "tlx_launcher.h" in header.stderr
    assert (tmp_path / "launcher.s").read_text() == precompiled


def test_torch_op_fake_implementation_sizes_outputs(add):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = add.as_torch_op()
    with FakeTensorMode():
        a = torch.empty(37, 1024)
        out = op(a, a)
    assert tuple(out.shape) == (37, 1024) and out.dtype == torch.float32


def test_repeat_call_with_plain_arguments_is_a_dict_lookup(cache):
    import time

    first = sk.axpy(4096, block=128)
    assert sk.axpy(4096, block=128) is first and sk.axpy(4096, 128) is first  # same kernel, positional or keyword
    assert sk.axpy(T.dynamic("N"), block=128) is not first  # a symbolic dim is another kernel
    t0 = time.perf_counter()
    for _ in range(1000):
        sk.axpy(4096, block=128)
    per_call = (time.perf_counter() - t0) / 1000
    assert per_call < 20e-6, f"jit lookup took {per_call * 1e6:.1f} us"


@pytest.fixture(scope="module")
def rows(cache):
    return sk.scaled_rows(T.dynamic("M"))


def test_scalars_are_checked_as_strictly_as_tensors(rows):
    x = torch.zeros(64)
    with pytest.raises(TypeError, match=r"scaled_rows: argument bias \(#2\) expected int32, got bool"):
        rows.launch(x, x, True, 1.0)
    with pytest.raises(ValueError, match=r"scaled_rows: argument scale expected a finite float32 .* got 1e\+300"):
        rows.launch(x, x, 1, 1e300)
    for fine in (float("inf"), float("nan"), -3.4e38, 7):  # representable in float32: reaches the device check
        with pytest.raises(ValueError, match="CUDA tensor"):
            rows.launch(x, x, 1, fine)


def test_grid_past_the_cuda_limit_names_axis_expression_and_shape(rows):
    m = 65535 * 32 + 1  # grid.y = ceildiv(M, 32) = 65536
    x = torch.zeros(m)
    with pytest.raises(ValueError, match=r"scaled_rows: grid.y = .* = 65536 exceeds the CUDA limit of 65535 \(M = 2097121\)"):
        rows.launch(x, x, 0, 1.0)
    with pytest.raises(ValueError, match="CUDA tensor"):  # one row fewer: within the limit
        rows.launch(torch.zeros(m - 1), torch.zeros(m - 1), 0, 1.0)


def test_a_failed_shape_precondition_names_it_and_the_values(cache):
    """The verifier's preconditions are checked before the device: CPU tensors reach them."""
    window = sk.offset_window()
    assert {p["text"] for p in window.metadata["preconditions"]} >= {"off >= 0", "off <= 224"}
    a, b = torch.zeros(256), torch.zeros(32)
    with pytest.raises(ValueError, match=r"^offset_window: shape precondition off >= 0 does not hold for off = -1$"):
        window.launch(a, b, -1)
    with pytest.raises(ValueError, match=r"^offset_window: shape precondition off <= 224 does not hold for off = 225$"):
        window.launch(a, b, 225)
    with pytest.raises(ValueError, match="CUDA tensor"):  # within the window: on to the device check
        window.launch(a, b, 224)


def test_a_program_assume_is_a_launcher_check(cache):
    """``T.assume`` reaches the host as an assert (TileLang's lowering): the launcher raises on a
    shape that breaks it instead of launching a kernel compiled on the assumption."""
    kernel = sk.assumed_rows(T.dynamic("M"))
    assert "T.assume(M >= 64)" in kernel.host_source
    with pytest.raises(ValueError, match=r"^assumed_rows: shape precondition T.assume\(M >= 64\) does not hold for M = 32$"):
        kernel.launch(torch.zeros(32), torch.zeros(32))
    with pytest.raises(ValueError, match="CUDA tensor"):  # the assumption holds: on to the device check
        kernel.launch(torch.zeros(64), torch.zeros(64))


def test_a_cp_async_source_is_checked_for_its_alignment(cache):
    """A 16-byte cp.async from X needs X 16-byte aligned (a misaligned source faults on the
    device, an error that poisons the context): the launcher checks it, through a view of X too."""
    kernel = sk.gathered_rows(T.dynamic("N"))
    assert "cp_async" in kernel.device_source
    assert 'tlx::check_align(kKernel, "X", v_X, 16,' in kernel.host_source


def test_empty_problem_is_a_documented_no_op(rows, gemm):
    for kernel in (rows, gemm):
        assert "empty problem: a no-op" in kernel.host_source
        src = kernel.host_source
        assert src.index("empty problem") < src.index("g_module.enter")  # before any encoding or launch


@pytest.mark.gpu
def test_empty_problem_launches_nothing_on_the_gpu(rows, gemm):
    empty = torch.empty(0, device="cuda")
    rows.launch(empty, empty, 0, 1.0)  # no error, nothing launched
    a = torch.randn(0, 1024, dtype=torch.float16, device="cuda")
    b = torch.randn(1024, 1024, dtype=torch.float16, device="cuda")
    assert gemm(a, b).shape == (0, 1024)  # TMA kernel: no descriptor encoded for the empty A
    torch.cuda.synchronize()


def test_the_allocating_call_checks_inputs_before_it_allocates(add):
    """The launcher's allocating entry checks every input (placement included) before it asks
    the environment allocator for the outputs: a huge stride-0 input raises the launcher's
    ValueError, never an out-of-memory error."""
    src = add.host_source
    assert add.metadata["allocating_entry"] == "allocate_and_launch"
    body = src[src.index("int allocate_and_launch("):src.index("}  // namespace")]
    first_alloc = body.index("outputs.allocate(")
    for check in ("check_stride(kKernel, \"A\"", "check_dim(kKernel, \"B\"", "grid_too_large", "check_cuda_device(kKernel, \"B\""):
        assert body.index(check) < first_alloc, check
    assert "int64_t shape_C[] = {v_M, int64_t(1024)};" in body  # C: float32[M, 1024], M from A.shape[0]
    assert "outputs.allocate(0, DLDataType{2, 32, 1}, device, 2, shape_C)" in body
    huge = torch.zeros(1, 1024).expand(1 << 30, 1024)  # stride 0: a 4 TiB output if sized first
    with pytest.raises(ValueError, match=r"add: argument A.stride\(0\) expected 1024"):
        add(huge, huge)
    with pytest.raises(ValueError, match=r"add: argument B.shape\[1\] expected 1024, got 1000"):
        add(torch.zeros(4, 1024), torch.zeros(4, 1000))
    with pytest.raises(ValueError, match="add: argument A expected a CUDA tensor, got one on cpu"):
        add(torch.zeros(4, 1024), torch.zeros(4, 1024))  # valid but for the device: still nothing allocated
    with pytest.raises(TypeError, match=r"add\(A: float32\[M, 1024\], B: float32\[M, 1024\]\): expected 2 arguments, got 3"):
        add(torch.zeros(4, 1024), torch.zeros(4, 1024), torch.zeros(4, 1024))
    with pytest.raises(TypeError, match=r"add: argument B \(#1\) expected a tensor, got int"):
        add(torch.zeros(4, 1024), 3)


def test_calling_a_kernel_runs_the_launchers_entry_with_no_python_frame_between(add, rows):
    """``kernel(*args)`` resolves to the launcher's entry itself, as its tvm_ffi.Function or torch's
    call path into it (a builtin, once the torch bridge library is built): the allocating entry
    for a kernel with one output, the plain one for a kernel without outputs."""
    import types

    import tvm_ffi

    assert isinstance(add.__call__, (tvm_ffi.Function, types.BuiltinFunctionType)) and add.__call__ is not add.launch
    assert rows.__call__ is rows.launch
    with pytest.raises(ValueError, match=r"add: argument B.shape\[1\] expected 1024, got 1000"):
        add(torch.zeros(4, 1024), torch.zeros(4, 1000))


def test_kernels_without_outputs_have_no_allocating_entry(rows):
    assert rows.metadata["allocating_entry"] is None and "allocate_and_launch" not in rows.host_source


def test_two_outputs_are_allocated_in_order(cache):
    """Each output gets its dtype and its shape from the inputs' dims, in parameter order."""
    kernel = sk.two_boxes(T.dynamic("M"))
    body = kernel.host_source[kernel.host_source.index("int allocate_and_launch("):]
    assert "tlx::Outputs<2> outputs;" in body
    assert "int64_t shape_B[] = {v_M, int64_t(64)};" in body and "int64_t shape_C[] = {v_M, int64_t(32)};" in body
    assert "args[1] = outputs.allocate(0, DLDataType{2, 32, 1}, device, 2, shape_B);" in body
    assert "args[2] = outputs.allocate(1, DLDataType{2, 32, 1}, device, 2, shape_C);" in body
    assert body.index("outputs.allocate(1,") < body.index("call(args, 3);") < body.index("outputs.release(result);")


def test_tfloat32_arguments_take_float32_tensors_as_in_tilelang(cache):
    """example_mhc_pre passes a float32 tensor for a T.tfloat32 parameter: the launcher checks
    float32 (TVM's custom code 130 is no DLPack dtype) and names dtypes readably."""
    kernel = sk.tf32_rows(T.dynamic("M"))
    assert 'tlx::check_dtype(kKernel, "W", t_W, 2, 32, 1)' in kernel.host_source
    with pytest.raises(ValueError, match="tf32_rows: argument W expected a CUDA tensor, got one on cpu"):
        kernel.launch(torch.zeros(4, 64), torch.zeros(4, 64))  # the dtype check passed; the placement check stops it
    with pytest.raises(TypeError, match="tf32_rows: argument W expected dtype float32, got float16$"):
        kernel.launch(torch.zeros(4, 64, dtype=torch.float16), torch.zeros(4, 64))
    with pytest.raises(TypeError, match="argument Y expected dtype float32, got float8_e4m3fn$"):
        kernel.launch(torch.zeros(4, 64), torch.zeros(4, 64).to(torch.float8_e4m3fn))


def test_fp4_arguments_are_packed_two_per_byte_as_in_tilelang(cache):
    """act_quant's fp4 output: TileLang returns it as torch.float4_e2m1fn_x2 of shape (M, N // 2);
    tlx's launcher allocates and checks the same, and its metadata names the storage."""
    kernel = sk.fp4_quantize(T.dynamic("M"))
    q = kernel.metadata["params"][1]
    assert (q["dtype"], q["shape"], q["storage_dtype"], q["storage_shape"]) == ("float4_e2m1fn", ["M", "64"], "float4_e2m1fnx2", ["M", "32"])
    src = kernel.host_source
    assert "outputs.allocate(0, DLDataType{17, 4, 2}, device, 2, shape_Q)" in src and "int64_t shape_Q[] = {v_M, int64_t(32)};" in src
    assert 'tlx::check_dim(kKernel, "Q", t_Q, 1, int64_t(32), "32")' in src and 'tlx::check_stride(kKernel, "Q", t_Q, 0, int64_t(32))' in src
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    for storage in (torch.float4_e2m1fn_x2, torch.uint8, torch.int8):  # any byte-sized dtype holds it, as in TileLang
        with pytest.raises(ValueError, match="expected a CUDA tensor"):
            kernel.launch(x, torch.zeros(4, 32, dtype=torch.uint8).view(storage))
    with pytest.raises(TypeError, match=r"argument Q is float4_e2m1fn, packed 2 per byte: expected a dtype of 8 bits .* got bfloat16"):
        kernel.launch(x, torch.zeros(4, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"argument Q.shape\[1\] expected 32, got 64"):
        kernel.launch(x, torch.zeros(4, 64, dtype=torch.uint8))


def test_fp4_output_of_the_torch_op_is_sized_as_stored(cache):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = sk.fp4_quantize(T.dynamic("M")).as_torch_op()
    with FakeTensorMode():
        out = op(torch.empty(37, 64, dtype=torch.bfloat16))
    assert tuple(out.shape) == (37, 32) and out.dtype == torch.float4_e2m1fn_x2


def test_fp4_argument_with_a_symbolic_last_dimension_is_refused_by_name():
    from tlx.hostgen import HostgenError

    with pytest.raises(HostgenError, match=r"argument Q \(float4_e2m1fn, stored 2 per float4_e2m1fnx2 element\) .* "
                                  "constant extent divisible by 2; got extent N"):
        plan_launcher(lower(sk.fp4_flag.get_tir(T.dynamic("N")), CPU_TARGET))
    plan_launcher(lower(sk.fp4_flag.get_tir(64), CPU_TARGET))  # a constant even length is stored as 32 bytes


def test_host_workspaces_are_planned_in_order_and_passed_to_the_launches():
    """``T.alloc_global`` in host code (TileLang allocates it from TVM's workspace pool per call)
    is a workspace step ahead of the launches that pass its data pointer."""
    plan = plan_launcher(lower(sk.split_row_stats.get_tir(T.dynamic("M"), 256), CPU_TARGET))
    kinds = [s.kind for s in plan.steps]
    assert kinds == ["workspace", "workspace", "launch", "launch"]
    sums, peaks = (s.workspace for s in plan.steps[:2])
    assert (sums.name, sums.dtype, sums.bits, str(sums.elements)) == ("sums", "float32", 32, "M * 4")
    assert (peaks.name, peaks.dtype, peaks.bits, str(peaks.elements)) == ("peaks", "float16", 16, "M * 4")
    for launch in (s.launch for s in plan.steps[2:]):
        passed = [a for a in launch.args if any(a.same_as(w.data_var) for w in (sums, peaks))]
        assert len(passed) == 2, launch.kernel


def test_launcher_allocates_workspaces_after_the_checks_and_before_the_launches(cache):
    kernel = sk.split_row_stats(T.dynamic("M"), 256)
    assert kernel.metadata["workspaces"] == [{"name": "sums", "dtype": "float32", "elements": "(M * 4)"},
                                             {"name": "peaks", "dtype": "float16", "elements": "(M * 4)"}]
    src = kernel.host_source
    call = src[src.index("int call("):src.index("int allocate_and_launch(")]
    assert "tlx::Workspaces<2> workspaces;" in call
    sums = call.index("void* const v_sums = workspaces.allocate(0, device_id, (v_sums_elements * 32 + 7) / 8);")
    peaks = call.index("void* const v_peaks = workspaces.allocate(1, device_id, (v_peaks_elements * 16 + 7) / 8);")
    size_check = call.index('tlx::fail_workspace_size(kKernel, "sums", "(M * 4)", v_sums_elements')
    assert size_check < call.index("tlx::check_cuda_device(") < call.index("return 0;  // empty problem") < sums < peaks
    assert peaks < call.index("tlx::launch(kKernel, fn[0]") < call.index("tlx::launch(kKernel, fn[1]")
    allocating = src[src.index("int allocate_and_launch("):]
    assert allocating.index("tlx::fail_workspace_size(") < allocating.index("outputs.allocate(0,")


def test_constant_workspace_sizes_are_folded_and_are_tilelangs(cache):
    """Workspaces of constant size get the bytes TileLang's own host code asks its workspace pool for."""
    import re

    import tilelang

    ours = sk.split_row_stats(64, 256).host_source
    assert "fail_workspace_size" not in ours
    ours = dict(re.findall(r"void\* const v_(\w+) = workspaces\.allocate\(\d, device_id, int64_t\((\d+)\)\);", ours))
    theirs = tilelang.compile(sk.split_row_stats.get_tir(64, 256), out_idx=[-2, -1], target=sk.SM90).get_host_source()
    theirs = dict(re.findall(r"void\* (\w+) = TVMBackendAllocWorkspace\(2, dev_id, \(uint64_t\)(\d+), ", theirs))
    assert ours == theirs == {"sums": "1024", "peaks": "512"}


def test_a_negative_workspace_size_is_refused_before_the_gpu(cache):
    """The size comes from a scalar: a negative one raises with its values, ahead of the device
    checks (these tensors are on the CPU, and a valid size gets as far as saying so)."""
    kernel = sk.weighted_copies(T.dynamic("N"))
    x, y = torch.zeros(8), torch.zeros(8)
    with pytest.raises(ValueError, match=r"workspace copies needs \(reps \* N\) = -8 elements, expected 0 to "
                                         r"288230376151711743 \(reps = -1, N = 8\)"):
        kernel(x, y, -1)
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        kernel(x, y, 2)


def test_tma_descriptors_may_map_a_workspace(cache):
    """A TMA copy into or out of a workspace (as in TileLang's split MLA decode) encodes its
    descriptor over the workspace's data pointer, after the allocation."""
    plan = plan_launcher(lower(sk.doubled_through_workspace.get_tir(T.dynamic("M")), CPU_TARGET))
    steps = list(walk_steps(plan.steps))
    [workspace] = [s for s in steps if s.kind == "workspace"]
    [desc] = [s for s in steps if s.kind == "desc" and s.desc.tensor == "doubled"]
    assert desc.desc.tensor_index == -1 and desc.desc.address.same_as(workspace.workspace.data_var)
    assert steps.index(workspace) < steps.index(desc)
    src = sk.doubled_through_workspace(T.dynamic("M")).host_source
    assert src.index("void* const v_doubled = workspaces.allocate(0,") < src.index('cache_v_doubled_desc.get(kKernel, "doubled", ')


def test_a_kernel_that_waits_on_the_grid_before_it_is_a_programmatic_dependent_launch():
    """``T.pdl_sync()`` in the second kernel (TileLang marks it ``has_cuda_pdl_sync``): that launch,
    and only that one, carries the programmatic-stream-serialization attribute."""
    kernel = sk.chained_through_workspace(T.dynamic("N"))
    assert [lc["programmatic_dependent"] for lc in kernel.metadata["launches"]] == [False, True]
    launches = [line.strip() for line in kernel.host_source.splitlines() if "tlx::launch(" in line]
    assert [line.endswith(", false, false);") for line in launches] == [True, False]
    assert launches[1].endswith(", false, true);")
    assert "cudaGridDependencySynchronize();" in kernel.device_source
    assert "cudaTriggerProgrammaticLaunchCompletion();" in kernel.device_source
    assert not any(lc["programmatic_dependent"] for lc in sk.add(T.dynamic("M"), 1024).metadata["launches"])


def test_a_stride_that_no_dimension_gives_is_bound_from_the_tensor(cache):
    """A ``StridedTensor`` whose row stride is a variable of its own builds (it did not: "shape
    variable S of X is not bound by any dimension", found on DeepSeek's TileKernels): the launcher
    binds ``S`` from X's stride(0), checks the rest of X's layout against it, and the bounds
    verifier proves X's accesses within the span such a view holds (``S >= 0``, rows padded or not)."""
    k = sk.strided_rows(T.dynamic("M"))
    src = k.host_source
    assert 'tlx::bind_stride(kKernel, "X", t_X, 0, "S")' in src
    assert 'tlx::check_stride(kKernel, "X", t_X, 1, int64_t(1))' in src
    assert k.metadata["symbolic_strides"] == {"S": {"tensor": "X", "dim": 0}}
    assert not [p for p in k.metadata["preconditions"] if "S" in p["text"]]
    padded = torch.zeros(6, 48)[:, :32]  # stride 48: accepted, refused only for being on the CPU
    for x in (padded, torch.zeros(6, 32)):
        with pytest.raises(ValueError, match="CUDA tensor"):
            k(x, torch.zeros(6, 32))
    with pytest.raises(ValueError, match=r"X.stride\(1\) expected 1"):
        k(torch.zeros(32, 6).t(), torch.zeros(6, 32))
