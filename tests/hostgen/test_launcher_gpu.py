"""Generated launchers on the GPU: results, argument fuzzing (nothing reaches the GPU), CUDA graphs."""

import random

import pytest

torch = pytest.importorskip("torch")
T = pytest.importorskip("tilelang.language")

from tests.hostgen import sample_kernels as sk  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kernels():
    return {
        "add": sk.add(T.dynamic("M"), 1024),
        "axpy": sk.axpy(T.dynamic("N")),
        "gemm": sk.gemm(T.dynamic("M"), 1024, 1024),
    }


def test_add_matches_torch(kernels):
    for m in (1, 31, 32, 1000, 4097):
        a, b = torch.randn(m, 1024, device="cuda"), torch.randn(m, 1024, device="cuda")
        torch.testing.assert_close(kernels["add"](a, b), a + b, rtol=0, atol=0)


def test_axpy_scalar_and_in_place(kernels):
    for n in (1, 255, 256, 100_003):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        expected = 1.5 * x + y
        kernels["axpy"](x, y, 1.5)
        torch.testing.assert_close(y, expected)


def test_gemm_tma_descriptors_follow_new_pointers(kernels):
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.half)
    for m in (128, 256, 1000, 128):
        a = torch.randn(m, 1024, device="cuda", dtype=torch.half)
        c = kernels["gemm"](a, b)
        ref = (a.float() @ b.float()).half()
        torch.testing.assert_close(c, ref, rtol=2e-2, atol=2e-1)


def test_two_descriptors_of_one_tensor():
    """Two TMA boxes over A (both named ``A_desc`` by lowering): each descriptor reads its own box."""
    kernel = sk.two_boxes(T.dynamic("M"))
    for m in (128, 384, 1000):
        a = torch.randn(m, 256, device="cuda", dtype=torch.half)
        b, c = torch.zeros(m, 64, device="cuda"), torch.zeros(m, 32, device="cuda")
        for k in range(4):
            b += a[:, k * 64:(k + 1) * 64].float()
            c += a[:, k * 64:k * 64 + 32].float()
        out_b, out_c = kernel(a)
        assert torch.equal(out_b, b) and torch.equal(out_c, c)


def test_launch_at_the_shared_memory_limit_runs():
    """The largest size the compile-time check lets through (dynamic + the kernel's own static =
    the sm_90 limit; the MLA decode example's 231424 dynamic bytes behind a 2048-byte section)
    launches on the device, and the driver refuses one byte more: the check is the driver's."""
    from tlx.hostgen.image import SHARED_PER_BLOCK

    static = sk.staged(T.dynamic("N")).metadata["launches"][0]["static_shared_memory"]
    fits = (SHARED_PER_BLOCK["90"] - static) // 2
    kernel = sk.staged(T.dynamic("N"), stage_bytes=fits)
    a = torch.randint(0, 256, (3, fits), dtype=torch.uint8, device="cuda")
    b = torch.zeros_like(a)
    kernel(a, b)
    assert torch.equal(a, b)
    dynamic = int(kernel.metadata["launches"][0]["dynamic_shared_memory"])
    cubin = (kernel.directory / "kernel.cubin").read_bytes()
    assert _driver_takes_dynamic_limit(cubin, "main_kernel", dynamic)
    assert not _driver_takes_dynamic_limit(cubin, "main_kernel", dynamic + 1)


def _driver_takes_dynamic_limit(cubin: bytes, function: str, dynamic: int) -> bool:
    """Whether the driver lets ``function`` of ``cubin`` opt in to ``dynamic`` bytes of dynamic
    shared memory (cuFuncSetAttribute), in torch's current context."""
    import ctypes

    torch.cuda.synchronize()  # torch's context is current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(cubin)) == 0
    try:
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), module, function.encode()) == 0
        max_dynamic_shared_size_bytes = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        return cuda.cuFuncSetAttribute(fn, max_dynamic_shared_size_bytes, ctypes.c_int(dynamic)) == 0
    finally:
        cuda.cuModuleUnload(module)


def test_zero_rows_launch_nothing(kernels):
    a = torch.empty(0, 1024, device="cuda")
    assert kernels["add"](a, a).shape == (0, 1024)


def _bad_calls(kernel, kernel_name, rng):
    """Yield (description, args, good args) triples whose args must all be rejected."""
    dev = "cuda"
    aligns = {p["index"]: p.get("align", 1) for p in kernel.metadata["params"]}
    if kernel_name == "add":
        good = [torch.randn(64, 1024, device=dev), torch.randn(64, 1024, device=dev), torch.empty(64, 1024, device=dev)]
    elif kernel_name == "axpy":
        good = [torch.randn(4096, device=dev), torch.randn(4096, device=dev), 2.0]
    else:
        good = [torch.randn(256, 1024, device=dev).half(), torch.randn(1024, 1024, device=dev).half(), torch.empty(256, 1024, device=dev).half()]
    mutations = []
    for i, g in enumerate(good):
        if isinstance(g, torch.Tensor):
            mutations += [
                ("dtype", i, lambda g=g: g.to(torch.float64 if g.dtype != torch.float64 else torch.float32)),
                ("int dtype", i, lambda g=g: g.to(torch.int32)),
                ("cpu tensor", i, lambda g=g: g.cpu()),
                ("extra dim", i, lambda g=g: g.unsqueeze(0)),
                ("missing dim", i, lambda g=g: g.reshape(-1)[:1] if g.dim() > 1 else g.reshape(1, -1)),
                ("wrong width", i, lambda g=g: g.narrow(-1, 0, g.shape[-1] - 1) if g.shape[-1] > 1 else g.expand(2, *g.shape[1:])),
                ("non-contiguous", i, lambda g=g: torch.empty(*g.shape[:-1], g.shape[-1] * 2, dtype=g.dtype, device=g.device)[..., ::2]),
                ("None", i, lambda g=g: None),
                ("python int", i, lambda g=g: 3),
                ("string", i, lambda g=g: "x"),
            ]
            if aligns[i] > g.element_size():
                mutations.append(
                    ("misaligned view", i, lambda g=g: torch.empty(g.numel() + 1, dtype=g.dtype, device=g.device)[1:].view(g.shape))
                )
        else:
            mutations += [("tensor for scalar", i, lambda: torch.ones(1, device=dev)), ("None scalar", i, lambda: None), ("string scalar", i, lambda: "2.0")]
    mutations += [("too few", None, None), ("too many", None, None)]
    for _ in range(200):
        what, i, make = rng.choice(mutations)
        args = list(good)
        if what == "too few":
            args = args[:-1]
        elif what == "too many":
            args = args + [args[-1]]
        else:
            args[i] = make()
        yield what, args, good


@pytest.mark.parametrize("kernel_name", ["add", "axpy", "gemm"])
def test_fuzz_bad_calls_all_raise_and_never_launch(kernels, kernel_name):
    k = kernels[kernel_name]
    rng = random.Random(1234)
    n = 0
    for what, args, good in _bad_calls(k, kernel_name, rng):
        out = good[2] if kernel_name != "axpy" else good[1]
        out.fill_(7.0)
        torch.cuda.synchronize()
        with pytest.raises((TypeError, ValueError)) as info:
            k.launch(*args)
        assert k.name in str(info.value), (what, str(info.value))
        torch.cuda.synchronize()
        assert bool((out == 7.0).all()), f"{what}: a rejected call wrote the output"
        n += 1
    assert n == 200


def test_cuda_graph_capture(kernels):
    a, b = torch.randn(512, 1024, device="cuda"), torch.randn(512, 1024, device="cuda")
    c = torch.empty_like(a)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kernels["add"].launch(a, b, c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kernels["add"].launch(a, b, c)
    a.copy_(torch.randn_like(a))
    c.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_launches_on_current_torch_stream(kernels):
    a, b = torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")
    c = torch.full_like(a, float("nan"))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        kernels["add"].launch(a, b, c)
    s.synchronize()
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_torch_compile_through_custom_op(kernels):
    op = kernels["add"].as_torch_op("tlx_test::add_compiled")

    @torch.compile(fullgraph=True)
    def f(a, b):
        return op(a, b) * 2

    a, b = torch.randn(300, 1024, device="cuda"), torch.randn(300, 1024, device="cuda")
    torch.testing.assert_close(f(a, b), (a + b) * 2)


def test_allocating_call_returns_fresh_outputs_of_the_right_dtype_shape_and_device(kernels):
    """The launcher allocates the outputs (torch's caching allocator, through TVM-FFI's
    environment allocator) and returns torch tensors that hold the kernel's results."""
    a, b = torch.randn(300, 1024, device="cuda"), torch.randn(300, 1024, device="cuda")
    c = kernels["add"](a, b)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32 and c.shape == (300, 1024) and c.device == a.device
    assert c.is_contiguous() and c.data_ptr() not in (a.data_ptr(), b.data_ptr())
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)
    x = torch.randn(256, 1024, dtype=torch.float16, device="cuda")
    w = torch.randn(1024, 1024, dtype=torch.float16, device="cuda")
    out = torch.full((256, 1024), float("nan"), dtype=torch.float16, device="cuda")
    kernels["gemm"].launch(x, w, out)
    assert torch.equal(kernels["gemm"](x, w), out)  # the same kernel, bit for bit
    x = torch.randn(200, 256, dtype=torch.float16, device="cuda")
    wide, narrow = sk.two_boxes(T.dynamic("M"))(x)
    assert (wide.shape, narrow.shape, wide.dtype, narrow.dtype) == ((200, 64), (200, 32), torch.float32, torch.float32)
    ref = x.float().reshape(200, 4, 64)
    torch.testing.assert_close(wide, ref.sum(1), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(narrow, ref[:, :, :32].sum(1), rtol=1e-3, atol=1e-3)


def test_allocating_call_runs_on_the_current_stream(kernels):
    a, b = torch.randn(4096, 1024, device="cuda"), torch.randn(4096, 1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)
        c = kernels["add"](a, b)
    s.synchronize()
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


def test_allocating_call_costs_little_more_than_launch_and_beats_tilelang_1_5x(kernels):
    """The targets of issue 25, side by side in one process (host time per call, median of
    bursts; bench/host_overhead.py measures the same paths with more rounds): the allocating call
    at least 1.5x faster than TileLang's, and at most ``launch`` + 1.5 us. The H200 hosts lent
    differ about 2x in speed, and on the slower ones torch's own allocation, tensor and free
    alone exceed 1.5 us (2026-12-04: launch + 1.0-1.35 us where ``torch.empty`` takes 2.1-2.5 us,
    + 2.2-2.5 us where it takes 4.2-5.1 us), so there the bound is the premise of the target
    instead: allocating in the launcher costs well under one ``torch.empty`` from Python."""
    import tilelang

    from bench.host_overhead import measure

    gemm = kernels["gemm"]
    a = torch.randn(128, 1024, dtype=torch.float16, device="cuda")
    b = torch.randn(1024, 1024, dtype=torch.float16, device="cuda")
    c = torch.empty(128, 1024, dtype=torch.float16, device="cuda")
    tl_alloc = tilelang.compile(sk.gemm.get_tir(T.dynamic("M"), 1024, 1024), out_idx=[-1], target="cuda", execution_backend="tvm_ffi")
    assert torch.equal(tl_alloc(a, b), gemm(a, b))
    empty = (lambda: torch.empty(128, 1024, dtype=torch.float16, device="cuda"), ())
    med = measure({"launch": (gemm.launch, (a, b, c)), "allocating": (gemm, (a, b)), "tilelang": (tl_alloc, (a, b)),
                   "torch.empty": empty}, rounds=3, bursts=20)
    assert med["tilelang"] >= 1.5 * med["allocating"], med
    extra = med["allocating"] - med["launch"]
    assert extra <= 1.5 or extra <= 0.6 * med["torch.empty"], med


def _tilelang_build(tir, out_idx=None):
    import tilelang

    return tilelang.compile(tir, out_idx=out_idx, target="cuda", execution_backend="tvm_ffi")


def test_fp4_output_matches_tilelang_bit_for_bit():
    """The allocating call returns fp4 packed as TileLang returns it (torch.float4_e2m1fn_x2,
    shape (M, N // 2)) with the same bits; a preallocated output is overwritten entirely."""
    tlx_kernel = sk.fp4_quantize(T.dynamic("M"))
    reference = _tilelang_build(sk.fp4_quantize.get_tir(T.dynamic("M")), out_idx=[-1])
    for m in (1, 33, 1000):
        x = (torch.randn(m, 64, device="cuda") * 4).to(torch.bfloat16)
        q, expected = tlx_kernel(x), reference(x)
        assert (q.dtype, tuple(q.shape)) == (expected.dtype, tuple(expected.shape)) == (torch.float4_e2m1fn_x2, (m, 32))
        assert torch.equal(q.view(torch.uint8), expected.view(torch.uint8))
        poisoned = torch.full((m, 32), 0xFF, dtype=torch.uint8, device="cuda")
        tlx_kernel.launch(x, poisoned)
        assert torch.equal(poisoned, expected.view(torch.uint8))


def test_tfloat32_argument_takes_a_float32_tensor_like_tilelang():
    kernel = sk.tf32_rows(T.dynamic("M"))
    reference = _tilelang_build(sk.tf32_rows.get_tir(T.dynamic("M")))
    w = torch.randn(100, 64, device="cuda")
    got, expected = (torch.full((100, 64), float("nan"), device="cuda") for _ in range(2))
    kernel(w, got)
    reference(w, expected)
    assert torch.equal(got, expected) and not got.isnan().any()


def _row_stats_reference(x):
    """Row sums (exact: the entries are small integers) and row maxima rounded to float16."""
    return x.sum(dim=1), x.half().amax(dim=1)


def test_host_workspaces_match_torch_on_both_calls():
    """Two kernels pass partial results through two global workspaces the launcher allocates per
    call, through the allocating call and through ``launch`` with poisoned outputs (no rows: a
    no-op that allocates nothing)."""
    kernel = sk.split_row_stats(T.dynamic("M"), 256)
    for m in (0, 1, 127, 128, 1000, 4097):
        x = torch.randint(-64, 64, (m, 256), device="cuda").float()
        total, peak = kernel(x)
        ref_total, ref_peak = _row_stats_reference(x)
        assert torch.equal(total, ref_total) and torch.equal(peak, ref_peak)
        total.fill_(float("nan"))
        peak.fill_(float("nan"))
        kernel.launch(x, total, peak)
        assert torch.equal(total, ref_total) and torch.equal(peak, ref_peak)


def _queued_behind_a_sleep(kernel, inputs) -> list:
    """``kernel(x)`` for each input, queued back to back on a side stream behind a sleep (no
    synchronization between them), the results once the stream is done."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)
        results = [kernel(x) for x in inputs]
    stream.synchronize()
    return results


def test_workspaces_are_reused_in_stream_order():
    """Calls queued back to back on a side stream, behind a sleep, with no synchronization between
    them: each call's workspaces go back to the allocator while its kernels are still queued, and
    the next call's reuse of that memory must not corrupt them."""
    kernel = sk.split_row_stats(T.dynamic("M"), 256)
    inputs = [torch.randint(-64, 64, (2048, 256), device="cuda").float() for _ in range(8)]
    results = _queued_behind_a_sleep(kernel, inputs)
    for x, (total, peak) in zip(inputs, results):
        ref_total, ref_peak = _row_stats_reference(x)
        assert torch.equal(total, ref_total) and torch.equal(peak, ref_peak)


def test_workspaces_under_cuda_graph_capture():
    kernel = sk.split_row_stats(T.dynamic("M"), 256)
    x = torch.randint(-64, 64, (1000, 256), device="cuda").float()
    total, peak = torch.empty(1000, device="cuda"), torch.empty(1000, device="cuda", dtype=torch.half)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel.launch(x, total, peak)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.launch(x, total, peak)
    x.copy_(torch.randint(-64, 64, (1000, 256), device="cuda").float())
    total.fill_(float("nan"))
    peak.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_total, ref_peak = _row_stats_reference(x)
    assert torch.equal(total, ref_total) and torch.equal(peak, ref_peak)


def test_scalar_sized_workspace_matches_torch():
    kernel = sk.weighted_copies(T.dynamic("N"))
    x = torch.randn(5000, device="cuda")
    for reps in (0, 1, 3, 7):
        y = torch.full_like(x, float("nan"))
        kernel(x, y, reps)
        expected = torch.zeros_like(x)
        for r in range(reps):
            expected = expected + x * r
        assert torch.equal(y, expected), reps
    with pytest.raises(ValueError, match=r"workspace copies needs \(reps \* N\) = -5000 elements"):
        kernel(x, y, -1)


def test_tma_copies_through_a_workspace_match_torch():
    kernel = sk.doubled_through_workspace(T.dynamic("M"))
    for m in (64, 1000, 4096):
        x = torch.randn(m, 64, device="cuda").half()
        assert torch.equal(kernel(x), x * 2 + x), m


def test_a_programmatic_dependent_launch_sees_the_first_kernels_writes():
    """The second kernel of ``chained_through_workspace`` is launched as a programmatic dependent
    (it may start while the first drains) and reads the first's workspace after ``T.pdl_sync()``:
    calls queued back to back behind a sleep, each on new inputs and a fresh workspace, then
    the same launches captured in a CUDA graph and replayed on new values, all equal to torch."""
    kernel = sk.chained_through_workspace(T.dynamic("N"))
    inputs = [torch.randn(n, device="cuda") for n in (1, 1000, 1 << 22, 4097, 1 << 22)]
    for x, y in zip(inputs, _queued_behind_a_sleep(kernel, inputs)):
        assert torch.equal(y, x * 3 + x)
    x = inputs[2]
    y = torch.full_like(x, float("nan"))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        kernel.launch(x, y)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.launch(x, y)
        kernel.launch(y, x)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        expected = x * 3 + x
        expected = expected * 3 + expected
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(x, expected)
