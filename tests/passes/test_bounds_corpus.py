"""The verifier on the corpus: correct kernels proven, every planted bug found with a real counterexample."""

import functools

import pytest

from tests.passes.corpus import lowered as _lowered
from tests.passes.corpus.bugs import BUGS
from tests.passes.corpus.correct import CORRECT
from tlx.passes.preconditions import derive_preconditions
from tlx.passes.verification import verify_kernel


@functools.cache
def _verified(name, assume):
    return verify_kernel(_lowered(name), assume)


@pytest.mark.parametrize("name,assume", [(e[0], e[3]) for e in CORRECT])
def test_correct_kernel_is_proven(name, assume):
    kernel = _lowered(name)
    report = _verified(name, assume)
    assert report.checked > 0
    assert not [a for a in report.accesses if a.status == "violation" and a.kind != "overflow"
                and not a.detail.startswith("not proven")], "a correct kernel must have no bounds violation"
    pre, final = derive_preconditions(kernel, report, assume) if report.violations() or report.unknowns() else ([], report)
    assert not final.violations() and not final.unknowns(), [a.detail for a in final.violations() + final.unknowns()]
    assert final.proven == final.checked
    # Only int32 range limits are ever needed here (ceildiv of a dynamic dim near 2**31).
    assert all(" <= " in p.text for p in pre), [p.text for p in pre]


def test_share_proven_across_corpus():
    """Target: >= 95% of accesses proven, under the preconditions the launcher enforces.

    Without them the dynamic kernels' accesses stay unproven only because ceildiv of a
    dimension within 127 of 2**31 overflows int32 (the overflow is reported as such).
    """
    total = proven = 0
    for name, _, _, assume in CORRECT:
        report = _verified(name, assume)
        if report.violations() or report.unknowns():
            _, report = derive_preconditions(_lowered(name), report, assume)
        total += report.checked
        proven += report.proven
    assert proven / total >= 0.95, f"{proven}/{total}"


@pytest.mark.parametrize("name,assume,buffer,kind", [(e[0], e[3], e[4], e[5]) for e in BUGS])
def test_planted_bug_is_found_with_counterexample(name, assume, buffer, kind):
    report = _verified(name, assume)
    # a bug that needs particular input contents is reported unknown (data-dependent), with its counterexample
    hits = [a for a in report.violations() + [u for u in report.unknowns() if u.data_dependent] if a.buffer == buffer and a.kind == kind]
    assert hits, f"{name}: no violation on {buffer} ({kind}); got {[(a.buffer, a.kind, a.status) for a in report.accesses]}"
    cex = hits[0].counterexample
    assert cex, "a violation must carry a counterexample"
    if kind == "overflow":
        assert cex["value"] > 2**31 - 1 or cex["value"] < -(2**31)
    else:
        assert cex["index"] < 0 or cex["index"] >= cex["extent"]
    # No precondition on shape variables rescues a bug in a kernel without them.
    if not any(k.isupper() for k in cex):
        pre, final = derive_preconditions(_lowered(name), report, assume)
        assert not pre and (final.violations() or [u for u in final.unknowns() if u.data_dependent])


def test_int32_overflow_counterexample_is_consistent():
    """The counterexample's block index times the row length really exceeds int32."""
    report = _verified("int32_overflow", ())
    hit = next(a for a in report.violations() if a.kind == "overflow")
    cex = hit.counterexample
    assert cex["bx"] < cex["M"]
    assert cex["bx"] * 65536 == cex["value"] > 2**31 - 1


def test_int32_overflow_precondition_is_the_tight_bound():
    kernel = _lowered("int32_overflow")
    pre, final = derive_preconditions(kernel, _verified("int32_overflow", ()))
    assert [p.text for p in pre] == ["M <= 32768"]
    assert final.proven == final.checked


def test_user_assumption_replaces_precondition():
    report = _verified("add_dynamic", ("N <= 1 << 30",))
    assert report.proven == report.checked and not report.violations()


def test_data_dependent_counterexample_names_the_input():
    """The missing guard needs a bad bin id in ``ids``: the counterexample gives that element and
    value, and the access is unknown (data-dependent), not a violation: no shape refutes it."""
    report = _verified("missing_guard", ())
    assert not [a for a in report.violations() if a.buffer == "S"]
    hit = next(a for a in report.unknowns() if a.buffer == "S")
    assert hit.data_dependent
    loaded = [k for k in hit.counterexample if k.startswith("ids[")]
    assert loaded and hit.counterexample[loaded[0]] == hit.counterexample["index"]
    assert "when the input holds ids[" in hit.detail


def test_cp_async_sources_are_checked_under_their_predicate():
    """gemm_no_tma's cp.async reads of A and B (8 elements each) are proven only thanks to the
    zero-fill predicates; with the predicates dropped the verifier must refute a read of A."""
    from tilelang import tvm

    tir = tvm.tirx
    kernel = _lowered("gemm_no_tma")
    report = _verified("gemm_no_tma", ())
    reads = [a for a in report.accesses if a.kind == "pointer" and a.scope == "global"]
    assert {a.buffer for a in reads} == {"A", "B"} and all(a.status == "proven" for a in reads)

    def drop_predicate(node):
        if isinstance(node, tir.Call) and str(node.op.name).endswith("ptx_cp_async") and len(node.args) == 4:
            return tir.Call(node.dtype, node.op, list(node.args[:3]))
        return None

    funcs = {gv: f.with_body(tir.stmt_functor.ir_transform(f.body, None, drop_predicate, ["tirx.Call"]))
             for gv, f in kernel.device_mod.functions.items()}
    unguarded = kernel.with_device_mod(tvm.IRModule(funcs))
    bad = [a for a in verify_kernel(unguarded).violations() if a.kind == "pointer"]
    assert bad and bad[0].buffer == "A" and bad[0].counterexample["end byte"] > bad[0].counterexample["bytes"]


def test_pointer_check_takes_the_allocation_size_as_host_arithmetic():
    """A cp.async source in a [R, 65536] bf16 tensor: the allocation's R * 65536 elements pass
    int32 for R >= 32768, but the host computes sizes in 64 bits; only the kernel's own offset
    arithmetic may be held to its width. (The check used to report such pointers unknown.)"""
    import tilelang.language as T

    from tests.conftest import CPU_TARGET
    from tlx.lowering import lower

    rows, cols = T.dynamic("R"), 65536

    @T.prim_func
    def stage_rows(X: T.Tensor((rows, cols), "bfloat16"), Y: T.Tensor((rows, cols), "bfloat16")):
        with T.Kernel(cols // 256, rows, threads=32) as (bx, by):
            tile = T.alloc_shared((256,), "bfloat16")
            tx = T.get_thread_binding()
            T.ptx_cp_async(T.access_ptr(tile[tx * 8], "w", extent=8),
                           T.access_ptr(X[by, bx * 256 + tx * 8], "r", extent=8), 8)
            T.ptx_commit_group()
            T.ptx_wait_group(0)
            for v in T.vectorized(8):
                Y[by, bx * 256 + tx * 8 + v] = tile[tx * 8 + v]

    report = verify_kernel(lower(stage_rows, CPU_TARGET))
    reads = [a for a in report.accesses if a.kind == "pointer" and a.buffer == "X"]
    assert reads and all(a.status == "proven" for a in reads), [(a.status, a.detail) for a in reads]


def test_pointer_extent_is_not_device_arithmetic():
    """A whole [R, 65536] fp32 tensor handed to a helper (``X.access_ptr``): its extent R * 65536
    passes int32 for R >= 32768, but the code generator never computes it (it emits ``X + offset``),
    so the pointer is proven (it was "pointer arithmetic may overflow"). An offset the device
    computes still may not wrap: the same kernel with Y's offset ``by * 65536 + ...`` rewritten in
    int32 (TileLang writes it in int64) is not proven."""
    import tilelang.language as T
    from tilelang import tvm

    from tests.conftest import CPU_TARGET
    from tlx.lowering import lower

    tir = tvm.tirx
    rows, cols = T.dynamic("R"), 65536

    @T.prim_func
    def hand_over(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, cols), "float32")):
        with T.Kernel(cols // 256, rows, threads=256) as (bx, by):
            T.call_extern("handle", "tlx_test_sum_rows", X.access_ptr("r"))
            T.call_extern("handle", "tlx_test_sum_rows", T.access_ptr(Y[by, bx * 256 + T.get_thread_binding()], "w", extent=1))

    def pointer_status(kernel):
        report = verify_kernel(kernel)
        return {a.buffer: (a.status, a.detail) for a in report.accesses if a.kind == "pointer"}

    kernel = lower(hand_over, CPU_TARGET)
    assert pointer_status(kernel) == {"X": ("proven", ""), "Y": ("proven", "")}

    def to_int32(node):
        if isinstance(node, tir.Cast) and node.dtype == "int64":
            return node.value
        if isinstance(node, tir.IntImm) and node.dtype == "int64":
            return tir.IntImm("int32", node.value)
        return None

    def narrow_offset(node):
        if isinstance(node, tir.Call) and node.op.name == "tirx.tvm_access_ptr" and node.args[1].name == "Y":
            offset = tir.stmt_functor.ir_transform(tir.Evaluate(node.args[2]), None, to_int32, ["tirx.Cast", "ir.IntImm"])
            return tir.Call(node.dtype, node.op, [*node.args[:2], offset.value, *node.args[3:]])
        return None

    funcs = {gv: f.with_body(tir.stmt_functor.ir_transform(f.body, None, narrow_offset, ["tirx.Call"]))
             for gv, f in kernel.device_mod.functions.items()}
    status = pointer_status(kernel.with_device_mod(tvm.IRModule(funcs)))
    assert status["X"] == ("proven", "") and status["Y"] == ("unknown", "pointer arithmetic may overflow"), status


def _gather(guard_offset: int, write_ids: bool):
    """out[i] = table[ids[i]] guarded by ``ids[i + guard_offset]`` being a valid row (the right
    guard only at offset 0); with ``write_ids`` the kernel also overwrites ``ids``."""
    import tilelang.language as T

    from tests.conftest import CPU_TARGET
    from tlx.lowering import lower

    n = T.dynamic("N")

    @T.prim_func
    def gather(ids: T.Tensor((n + 1,), "int32"), table: T.Tensor((64,), "float32"), out: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, 128), threads=128) as bx:
            tx = T.get_thread_binding()
            i = bx * 128 + tx
            if i < n:
                if ids[i + guard_offset] >= 0 and ids[i + guard_offset] < 64:
                    out[i] = table[T.Cast("int64", ids[i])]  # the index written with another cast
                if write_ids:
                    ids[i] = 0

    # TileLang's own legalization would guard table[ids[i]] by itself: only the user's guard here
    report = verify_kernel(lower(gather, CPU_TARGET, {"tl.disable_safe_memory_legalize": True}), ("N <= 1 << 20",))
    return next(a for a in report.accesses if a.buffer == "table")


def test_guarded_read_only_input_proves_the_data_dependent_index():
    """An element of a read-only input holds one value: the guard's load and the index's load are
    one term, so the gather is proven; guarding another element, or an input the kernel writes,
    still leaves a data-dependent counterexample."""
    assert _gather(0, write_ids=False).status == "proven"
    wrong_element = _gather(1, write_ids=False)
    assert wrong_element.status == "unknown" and wrong_element.data_dependent and wrong_element.counterexample
    written = _gather(0, write_ids=True)
    assert written.status == "unknown" and written.data_dependent and written.counterexample


def test_a_pointer_written_through_an_alias_is_not_read_only():
    """``A_alias = A`` then a store through ``A_alias``: A is written, B only read."""
    from tilelang import tvm

    from tlx.ir.facts import read_only_params

    tir = tvm.tirx

    def ptr(name):
        return tir.Var(name, tvm.ir.PointerType(tvm.ir.PrimType("float32"), "global"))

    a, b, alias = ptr("A"), ptr("B"), ptr("A_alias")
    through_alias = tir.decl_buffer((4,), "float32", data=alias, name="A_alias_buf")
    source = tir.decl_buffer((4,), "float32", data=b, name="B_buf")
    body = tir.SeqStmt([tir.Bind(alias, a), tir.BufferStore(through_alias, tir.BufferLoad(source, [0]), [0])])
    assert read_only_params(tir.PrimFunc([a, b], body)) == {b}


def _counter_overflow(step: int, loop: str = "for"):
    """The overflow entry of ``it = it + step`` in a persistent loop (a pipeline's stage counter)."""
    import tilelang.language as T

    from tests.conftest import CPU_TARGET
    from tlx.lowering import lower

    n = T.dynamic("N")

    @T.prim_func
    def ring(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32")):
        with T.Kernel(8, threads=128) as bx:
            S = T.alloc_shared((4, 128), "float32")
            it = T.alloc_var("int32", init=0)
            tx = T.get_thread_binding()
            if loop == "for":
                for w in T.serial(T.ceildiv(n, 1024)):
                    if (w * 8 + bx) * 128 + tx < n:
                        S[it % 4, tx] = A[(w * 8 + bx) * 128 + tx]
                        B[(w * 8 + bx) * 128 + tx] = S[it % 4, tx]
                    it = it + step
            elif loop == "while":
                while it < n:
                    S[it % 4, tx] = A[it]
                    it = it + step
            else:  # a while loop whose condition does not bound it
                while A[tx] > 0.0:
                    S[it % 4, tx] = A[tx]
                    it = it + step

    report = verify_kernel(lower(ring, CPU_TARGET, {}), ("N <= 1 << 30",))
    return [a for a in report.accesses if a.kind == "overflow" and a.buffer == "it"]


def test_a_counter_is_bounded_by_the_trip_counts_of_its_loops():
    """``it`` starts at 0 and grows by ``step`` once per iteration of a loop of ceil(N / 1024)
    trips: with step 1 its increment cannot overflow int32; with step 4096 it can (N up to 2^30),
    and the verifier still says so. A while loop has no trip count: ``while it < N`` bounds the
    body's ``it`` (the condition's value), while a loop on data leaves it unproven."""
    assert _counter_overflow(1) == []
    big = _counter_overflow(4096)
    assert big and big[0].status != "proven"
    assert _counter_overflow(1, loop="while") == []
    assert [a.status for a in _counter_overflow(1, loop="while_on_data")] == ["unknown"]


def test_a_counter_whose_pointer_escapes_is_not_bounded():
    """``it`` set to 0 and incremented in a loop is a counter; a call that receives its pointer
    (even before its first use) may change it unseen, so it is not."""
    from tilelang import tvm

    from tlx.ir.facts import counters

    tir = tvm.tirx
    data = tir.Var("it", tvm.ir.PointerType(tvm.ir.PrimType("int32"), "local.var"))
    it = tir.decl_buffer((1,), "int32", name="it", data=data)
    n = tir.Var("n", "int32")
    start = tir.BufferStore(it, tir.IntImm("int32", 0), [0])
    loop = tir.For(tir.Var("i", "int32"), 0, n, tir.ForKind.SERIAL,
                   tir.BufferStore(it, tir.BufferLoad(it, [0]) + 1, [0]))
    escape = tir.Evaluate(tir.call_extern("int32", "touch", data))
    found = counters(tir.PrimFunc([n], tir.SeqStmt([start, loop])))
    assert [(d.name, c[0], len(c[1])) for d, c in found.items()] == [("it", 0, 1)]
    assert counters(tir.PrimFunc([n], tir.SeqStmt([escape, start, loop]))) == {}
