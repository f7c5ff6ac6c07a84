"""torch's bridge library (tlx/torch_bridge.py): its output factory (hostgen/runtime/
tlx_torch_outputs.cc) with the launchers' ``tlx::Outputs`` that use it, and its call path
(tlx_torch_call.cc) against the entries' tvm_ffi.Functions, driven through bench/alloc_probe.cc:
on the CPU with CPU tensors (the probe checks no device), and on the GPU through real calls."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
tvm_ffi = pytest.importorskip("tvm_ffi")
T = pytest.importorskip("tilelang.language")

from tests.hostgen import sample_kernels as sk  # noqa: E402
from tlx import torch_bridge  # noqa: E402
from tlx.kernel import Kernel, bind_output_factory  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh runtime cache, where the factory library is built once for this module (the
    kernels stay in the usual cache: sample_kernels' JIT objects remember their builds)."""
    path = tmp_path_factory.mktemp("tlx-runtime")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TLX_RUNTIME_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def factory(cache):
    path = torch_bridge.library_path()
    assert not path.exists() and path.parent.parent == cache
    address = torch_bridge.factory_address()  # built on first use, once
    assert address and path.is_file()
    assert torch_bridge.factory_address() == address and torch_bridge.build() == path  # loaded once per process
    return address


def test_the_bridge_can_be_turned_off(factory, monkeypatch):
    """TLX_TORCH_BRIDGE=0: no factory, and entries stay TVM-FFI Functions."""
    monkeypatch.setenv("TLX_TORCH_BRIDGE", "0")
    assert torch_bridge.factory_address() is None
    function = tvm_ffi.get_global_func("testing.nop")
    assert torch_bridge.torch_call(Path("unused.so"), "nop", function) is function


def test_a_failed_build_warns_once_and_leaves_the_tvm_ffi_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("TLX_RUNTIME_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch_bridge, "build_command", lambda output: ["c++", "-x", "c++", "-", "-o", str(output)])  # no input: fails
    with pytest.warns(RuntimeWarning, match="torch's bridge library is unavailable.*building torch's bridge library failed"):
        assert torch_bridge.factory_address() is None
    import warnings

    function = tvm_ffi.get_global_func("testing.nop")
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert torch_bridge.torch_call(Path("unused.so"), "nop", function) is function
    assert again == []  # not retried, not warned again in this process
    assert not torch_bridge.library_path().exists()


@pytest.fixture(scope="module")
def probes(cache, factory, tmp_path_factory):
    """Two copies of the probe library (one global binding each): the environment allocator's
    and the torch factory's, the latter counted."""
    from bench.host_overhead import build_probe

    d = tmp_path_factory.mktemp("probes")
    env = tvm_ffi.load_module(str(build_probe(d / "env")))
    counted = tvm_ffi.load_module(str(build_probe(d / "counted")))
    counted["count_through"](factory)
    return {"env": env, "factory": counted}


def _compile(sample, *args, out_idx=(-1,)):
    """A sample kernel through a fresh JIT object: sample_kernels' own keep their builds in
    memory, and another module's tests expect theirs in that module's cache."""
    import tlx

    return tlx.jit(out_idx=list(out_idx), target=sk.SM90)(sample.__wrapped__)(*args)


def _inputs(m=24, k=16, n=40):
    return torch.randn(m, k, dtype=torch.half), torch.randn(k, n, dtype=torch.half)


@pytest.mark.parametrize("way", ["env", "factory"])
def test_an_output_comes_back_as_a_fresh_writable_torch_tensor(probes, way):
    a, b = _inputs()
    out = probes[way]["allocate_return"](a, b)
    assert type(out) is torch.Tensor
    assert (out.shape, out.dtype, out.device, out.stride()) == ((24, 40), torch.half, a.device, (40, 1))
    assert out.data_ptr() not in (a.data_ptr(), b.data_ptr())
    out.copy_(torch.arange(24 * 40).reshape(24, 40))  # the memory is the tensor's own, all of it
    assert out[23, 39].item() == 24 * 40 - 1
    others = [probes[way]["allocate_return"](a, b) for _ in range(3)]
    assert len({o.data_ptr() for o in others} | {out.data_ptr()}) == 4  # live outputs never share memory


def test_deterministic_mode_fills_new_outputs_as_torch_empty_does(probes):
    """Under torch.use_deterministic_algorithms with fill_uninitialized_memory, torch.empty fills
    new memory with NaN; the factory then allocates as torch.empty does (it skips torch's
    dispatcher otherwise)."""
    import torch.utils.deterministic

    a, b = _inputs()
    saved = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    for way in ("env", "factory"):
        probes[way]["allocate_return"](a, b).fill_(1.0)  # freed memory of the size asked next holds no NaN
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        try:
            out = probes[way]["allocate_return"](a, b)
        finally:
            torch.use_deterministic_algorithms(saved[0])
            torch.utils.deterministic.fill_uninitialized_memory = saved[1]
        assert out.isnan().all(), way


def test_the_factory_hands_back_two_outputs_as_a_tuple_and_holds_nothing_after(probes):
    a, b = _inputs()
    both = probes["factory"]["allocate_two"](a, b, False)
    assert type(both) is tuple and all(type(t) is torch.Tensor for t in both)
    wide, narrow = both
    assert (wide.shape, narrow.shape, wide.dtype, narrow.dtype) == ((24, 40), (40,), torch.half, torch.half)
    assert probes["factory"]["held"]() == 0


def test_a_failure_after_allocating_frees_the_outputs(probes):
    """What a launch that fails after the outputs are allocated does: both are released, none leaks."""
    a, b = _inputs()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="a failure after allocating"):
            probes["factory"]["allocate_two"](a, b, True)
        assert probes["factory"]["held"]() == 0
    probes["factory"]["allocate_drop"](a, b)  # allocated, never handed over: released when the call ends
    assert probes["factory"]["held"]() == 0
    with pytest.raises(RuntimeError, match="a failure after allocating"):
        probes["env"]["allocate_two"](a, b, True)  # the environment allocator's path unwinds alike


def test_an_allocation_that_fails_raises_memory_error(probes):
    """A request torch's allocator refuses comes back as MemoryError, as from TVM-FFI's allocator."""
    a = torch.empty(1 << 31, 1, dtype=torch.half).expand(1 << 31, 1 << 20)  # the probe sizes [2^31, 2^20]: 4 PiB
    b = torch.empty(1, 1 << 20, dtype=torch.half)
    for way in ("env", "factory"):
        with pytest.raises(MemoryError):
            probes[way]["allocate_return"](a[:, :1], b)
    assert probes["factory"]["held"]() == 0


def test_binding_needs_an_address(probes):
    with pytest.raises(TypeError, match=r"tlx_bind_output_factory\(address: int\): expected one integer"):
        probes["env"]["tlx_bind_output_factory"]("torch")


def test_a_kernel_binds_the_factory_when_it_is_built(factory):
    """Kernel.load binds the factory and calls both entries through torch's call path (the
    allocating call keeps the GIL, as it makes Python objects); unbound, the allocating call is
    the entry's tvm_ffi.Function, which releases the GIL as TVM-FFI does by default."""
    import types

    add = _compile(sk.add, T.dynamic("M"), 1024)
    kernel = Kernel.load(add.directory)
    assert isinstance(kernel.__call__, types.BuiltinFunctionType) and isinstance(kernel.launch, types.BuiltinFunctionType)
    assert kernel.use_torch_outputs(False) is False
    assert isinstance(kernel.__call__, tvm_ffi.Function) and kernel.__call__.release_gil is True
    with pytest.raises(ValueError, match="add: argument A expected a CUDA tensor, got one on cpu"):
        kernel(torch.zeros(4, 1024), torch.zeros(4, 1024))  # checked before anything is allocated, either way
    assert kernel.use_torch_outputs() is True and isinstance(kernel.__call__, types.BuiltinFunctionType)
    with pytest.raises(ValueError, match="add: argument A expected a CUDA tensor, got one on cpu"):
        kernel(torch.zeros(4, 1024), torch.zeros(4, 1024))
    with pytest.raises(ValueError, match="add: argument A expected a CUDA tensor, got one on cpu"):
        kernel.launch(torch.zeros(4, 1024), torch.zeros(4, 1024), torch.zeros(4, 1024))
    two = Kernel.load(_compile(sk.two_boxes, T.dynamic("M"), out_idx=(-2, -1)).directory)
    assert isinstance(two.__call__, types.BuiltinFunctionType)  # a tuple from the factory, through torch's call path


# ---- torch's call path (runtime/tlx_torch_call.cc), against the entries' tvm_ffi.Functions ----
@pytest.fixture(scope="module")
def calls(probes, tmp_path_factory):
    """Each probe entry of the factory-bound probe library twice: its tvm_ffi.Function and
    torch's call path into the same symbol."""
    from bench.host_overhead import build_probe

    library = build_probe(tmp_path_factory.mktemp("call_probe"))
    module = tvm_ffi.load_module(str(library))
    module["tlx_bind_output_factory"](torch_bridge.factory_address())
    out = {}
    for name in ("call_only", "allocate_return", "allocate_two"):
        function = module[name]
        function.release_gil = False
        out[name] = (function, torch_bridge.torch_call(library, name, function))
    return out


def test_the_call_path_gives_the_entry_torchs_allocator_as_the_environments(probes, tmp_path):
    """What an entry allocates through TVM-FFI's environment (workspaces; outputs without the
    factory) comes from torch's allocator on this path too, as through the Function."""
    from bench.host_overhead import build_probe

    library = build_probe(tmp_path / "env")
    function = tvm_ffi.load_module(str(library))["allocate_drop"]  # no factory bound: the environment allocator
    call = torch_bridge.torch_call(library, "allocate_drop", function)
    a, b = _inputs()
    assert function(a, b) is None and call(a, b) is None


def test_the_call_path_is_a_builtin_with_the_functions_results(calls):
    a, b = _inputs()
    function, call = calls["allocate_return"]
    assert type(call).__name__ == "builtin_function_or_method"
    mine, theirs = call(a, b), function(a, b)
    assert type(mine) is torch.Tensor and (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())
    function, call = calls["allocate_two"]
    both = call(a, b, False)
    assert type(both) is tuple and [t.shape for t in both] == [t.shape for t in function(a, b, False)]
    assert calls["call_only"][1](a, b) is None


@pytest.mark.parametrize("args", [
    pytest.param(lambda a, b: (a,), id="too_few"),
    pytest.param(lambda a, b: (a, b, a), id="too_many"),
    pytest.param(lambda a, b: (a, 3), id="an_int"),
    pytest.param(lambda a, b: (a, True), id="a_bool"),
    pytest.param(lambda a, b: (a, 2.5), id="a_float"),
    pytest.param(lambda a, b: (a, 1 << 70), id="past_int64"),
    pytest.param(lambda a, b: (a, "B"), id="a_string"),
    pytest.param(lambda a, b: (a, None), id="none"),
])
def test_the_call_path_raises_what_the_function_raises(calls, args):
    """The same exception class and message on both paths, whatever the wrong argument."""
    a, b = _inputs()
    function, call = calls["call_only"]
    with pytest.raises(Exception) as theirs:
        function(*args(a, b))
    with pytest.raises(theirs.type) as mine:
        call(*args(a, b))
    assert str(mine.value) == str(theirs.value)


def test_the_call_path_hands_odd_arguments_to_the_function(calls):
    """A tensor subclass, an int subclass and a non-contiguous view: the same result as the Function's."""
    import enum

    class Flag(enum.IntEnum):
        ON = 1

    a, b = _inputs()
    function, call = calls["allocate_two"]
    for args in [(torch.nn.Parameter(a, requires_grad=False), b, False), (a, b, Flag.ON), (a.t().contiguous().t(), b, False)]:
        try:
            expected = function(*args)
        except Exception as e:  # noqa: BLE001 - whatever it raises, the call path raises alike
            with pytest.raises(type(e), match=None):
                call(*args)
            continue
        got = call(*args)
        assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in expected]


def test_the_call_path_keeps_references_right(calls):
    """A thousand calls neither leak the outputs nor the arguments (reference counts stay put)."""
    import sys

    a, b = _inputs()
    function, call = calls["allocate_return"]
    counts = sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(call)
    for _ in range(1000):
        out = call(a, b)
    assert sys.getrefcount(out) == 2  # `out` and getrefcount's argument
    del out
    assert (sys.getrefcount(a), sys.getrefcount(b), sys.getrefcount(call)) == counts
    _, call_only = calls["call_only"]
    for _ in range(1000):
        with pytest.raises(TypeError):
            call_only(a, 3)
    assert (sys.getrefcount(a), sys.getrefcount(b)) == counts[:2]


# ---- on the GPU: real allocating calls -------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("use", [False, True], ids=["environment_allocator", "torch_factory"])
def test_allocating_call_equals_launch_into_a_poisoned_output(factory, use):
    gemm = _compile(sk.gemm, T.dynamic("M"), 1024, 1024)
    kernel = Kernel.load(gemm.directory)
    kernel.use_torch_outputs(use)
    for m in (1, 128, 1000):
        a = torch.randn(m, 1024, dtype=torch.half, device="cuda")
        b = torch.randn(1024, 1024, dtype=torch.half, device="cuda")
        c = torch.full((m, 1024), float("nan"), dtype=torch.half, device="cuda")
        kernel.launch(a, b, c)
        out = kernel(a, b)
        assert type(out) is torch.Tensor and (out.shape, out.dtype, out.device) == ((m, 1024), torch.half, a.device)
        assert out.is_contiguous() and torch.equal(out, c)
    x = torch.randn(200, 256, dtype=torch.half, device="cuda")
    two = Kernel.load(_compile(sk.two_boxes, T.dynamic("M"), out_idx=(-2, -1)).directory)
    two.use_torch_outputs(use)
    wide, narrow = two(x)
    ref = x.float().reshape(200, 4, 64)
    torch.testing.assert_close(wide, ref.sum(1), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(narrow, ref[:, :, :32].sum(1), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("use", [False, True], ids=["environment_allocator", "torch_factory"])
def test_allocating_call_allocates_on_the_current_stream(factory, use):
    add = _compile(sk.add, T.dynamic("M"), 1024)
    kernel = Kernel.load(add.directory)
    kernel.use_torch_outputs(use)
    a, b = torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        c = kernel(a, b)
    s.synchronize()
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("use", [False, True], ids=["environment_allocator", "torch_factory"])
def test_second_output_out_of_memory_frees_the_first(factory, use):
    """two_boxes allocates B ([M, 64] fp32) then C ([M, 32] fp32); with room for B alone, C's
    allocation fails after B's: the call raises MemoryError and B is freed."""
    two = Kernel.load(_compile(sk.two_boxes, T.dynamic("M"), out_idx=(-2, -1)).directory)
    two.use_torch_outputs(use)
    m = 1 << 21
    x = torch.randn(m, 256, dtype=torch.half, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    room = torch.cuda.memory_reserved() + m * 64 * 4 + m * 32 * 4 // 2  # B fits, C does not
    torch.cuda.set_per_process_memory_fraction(room / total)
    try:
        with pytest.raises(MemoryError):
            two(x)
        assert torch.cuda.memory_allocated() == allocated
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    wide, narrow = two(x)  # with room again, the same call succeeds
    assert wide.shape == (m, 64) and narrow.shape == (m, 32)


@pytest.mark.gpu
def test_the_factory_path_is_not_slower_than_the_environment_allocators(factory, tmp_path):
    """Both ways of the GEMM's allocating call side by side (bench/host_overhead.py's paths,
    which first check each against kernel.launch into a poisoned output): host time per call."""
    from bench.host_overhead import allocating_paths, measure

    gemm = _compile(sk.gemm, T.dynamic("M"), 1024, 1024)
    a = torch.randn(128, 1024, dtype=torch.half, device="cuda")
    b = torch.randn(1024, 1024, dtype=torch.half, device="cuda")
    c = torch.empty(128, 1024, dtype=torch.half, device="cuda")
    paths = {k: v for k, v in allocating_paths(gemm, a, b, c, tmp_path).items() if k.startswith("tlx kernel(a, b)")}
    med = measure(paths, rounds=3, bursts=20)
    env, fac = med["tlx kernel(a, b), environment allocator / tma"], med["tlx kernel(a, b), torch output factory / tma"]
    assert fac <= env + 0.1, med
