"""The registered ``bounds`` pass: error / warn / off, reports, and preconditions for the launcher."""

import warnings

import pytest
import tilelang.language as T

import tlx
from tests.passes.corpus import lower_jit, lowered
from tests.passes.corpus.correct import TARGET
from tilelang import tvm
from tlx.passes import PassContext
from tlx.passes.pipeline import pass_names, run_passes
from tlx.passes.bounds import bounds_pass
from tlx.passes.verification import VerificationError, verify_kernel

tir = tvm.tirx


def _ctx(**options):
    return PassContext(options={"verify": "error", "assume": (), **options})


def test_error_mode_raises_with_counterexample():
    with pytest.raises(VerificationError, match=r"S\[tx \+ 1\].*counterexample: .*tx=127"):
        bounds_pass(lowered("off_by_one_tail"), _ctx())


def test_warn_mode_warns_and_reports():
    ctx = _ctx(verify="warn")
    with pytest.warns(UserWarning, match="out of bounds"):
        bounds_pass(lowered("wrong_stride"), ctx)
    rep = ctx.reports["bounds"]
    assert rep["accesses"] == 4 and rep["proven"] == 2
    assert {v["buffer"] for v in rep["violations"]} == {"S"}


def _holds(expr, **values):
    subst = {v: tir.IntImm(v.dtype, values[v.name]) for v in _free_vars(expr)}
    out = tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(expr, subst))
    return bool(out.value)


def _free_vars(expr):
    found = []
    tir.stmt_functor.post_order_visit(tir.Evaluate(expr), lambda n: found.append(n) if isinstance(n, tir.Var) else None)
    return found


def test_dynamic_kernel_gets_enforceable_precondition():
    ctx = _ctx()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bounds_pass(lowered("add_dynamic"), ctx)
    assert [(p.text, p.origin) for p in ctx.preconditions] == [("N <= 2147483520", "bounds")]
    expr = ctx.preconditions[0].expr
    assert _holds(expr, N=2147483520) and not _holds(expr, N=2147483521)
    assert ctx.reports["bounds"]["preconditions"] == ["N <= 2147483520"]


def test_assumptions_become_launcher_checks():
    ctx = _ctx(assume=("N % 128 == 0",))
    bounds_pass(lowered("add_dynamic"), ctx)
    assert [(p.text, p.origin) for p in ctx.preconditions] == [("N % 128 == 0", "assume")]
    assert _holds(ctx.preconditions[0].expr, N=256) and not _holds(ctx.preconditions[0].expr, N=200)


def test_off_mode_does_not_run():
    assert {"bounds", "eliminate_guards"} <= set(pass_names())
    ctx = _ctx(verify="off", eliminate_guards=False)
    skip = tuple(n for n in pass_names() if n not in ("bounds", "eliminate_guards"))
    run_passes(lowered("off_by_one_tail"), ctx, skip=skip)
    assert "bounds" not in ctx.reports and "eliminate_guards" not in ctx.reports


def _walk_kernel(step: int):
    """A thread walks ``seg`` through a while loop by ``step`` per iteration, then indexes shared
    memory with it under only an upper guard."""

    @tlx.jit(target=TARGET, verify="off")
    def walk(threads=128):
        @T.prim_func
        def main(lengths: T.Tensor((threads,), "int32"), Out: T.Tensor((threads,), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                S = T.alloc_shared((threads,), "int32")
                seg = T.alloc_var("int32", init=0)
                while T.if_then_else(seg < threads, lengths[tx] > seg, False):
                    seg = seg + step
                if seg < threads:
                    S[seg] = tx
                T.sync_threads()
                Out[tx] = S[tx]

        return main

    return lower_jit(walk)


def test_while_loop_counter_keeps_its_start_as_lower_bound():
    """Incremented only, ``seg`` stays >= 0 after a loop without a trip count; decremented, the
    same access is not proven (it depends on an untracked value) and ``seg = -1`` is the witness."""
    up = verify_kernel(_walk_kernel(1), ())
    assert [a.status for a in up.accesses if a.buffer == "S"] == ["proven", "proven"]
    down = verify_kernel(_walk_kernel(-1), ())
    [store] = [a for a in down.accesses if a.buffer == "S" and a.kind == "store"]
    assert store.status == "unknown" and store.counterexample["index"] < 0


def _escaping_scalar_kernel(escape: bool):
    """``x`` is read from memory and checked (``ok``), then (``escape``) its address goes to an
    external call that may change it before it indexes shared memory under the old check."""

    @tlx.jit(target=TARGET, verify="off")
    def escaping(threads=128):
        @T.prim_func
        def main(lengths: T.Tensor((threads,), "int32"), Out: T.Tensor((threads,), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                S = T.alloc_shared((threads,), "int32")
                x = T.alloc_var("int32", init=0)
                ok = T.alloc_var("int32", init=0)
                x = lengths[tx]
                ok = T.if_then_else(0 <= x and x < threads, 1, 0)
                if escape:
                    T.evaluate(T.call_extern("int32", "touch", T.address_of(x)))
                if ok == 1:
                    S[x] = tx
                T.sync_threads()
                Out[tx] = S[tx]

        return main

    return lower_jit(escaping)


def test_a_scalar_whose_address_escapes_is_forgotten():
    """The check proves ``S[x]`` unless ``address_of(x)`` reaches a call in between: then ``x`` may
    hold anything."""
    statuses = {}
    for escape in (False, True):
        report = verify_kernel(_escaping_scalar_kernel(escape), ())
        statuses[escape] = [a.status for a in report.accesses if a.buffer == "S" and a.kind == "store"]
    assert statuses == {False: ["proven"], True: ["unknown"]}


def _scaled_kernel(limit: int):
    """``y = x * 2000000`` computed only where ``0 <= x < limit`` (an ``if_then_else``), x from memory."""

    @tlx.jit(target=TARGET, verify="off")
    def scaled(threads=128):
        @T.prim_func
        def main(X: T.Tensor((threads,), "int32"), Out: T.Tensor((threads,), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                y = T.alloc_var("int32", init=0)
                y = T.if_then_else(0 <= X[tx] and X[tx] < limit, X[tx] * 2000000, 0)
                Out[tx] = y

        return main

    return lower_jit(scaled)


def test_if_then_else_branch_overflow_counts_only_where_taken():
    """Below 1000 the product fits int32, so the lazy branch cannot overflow; below 2000 it can,
    with a counterexample in [1074, 1999]."""
    assert [a for a in verify_kernel(_scaled_kernel(1000), ()).accesses if a.kind == "overflow"] == []
    [bad] = [a for a in verify_kernel(_scaled_kernel(2000), ()).accesses if a.kind == "overflow"]
    assert bad.status != "proven" and 1074 <= bad.counterexample["X[tx]"] <= 1999


def _split_if_kernel(init):
    """``x`` (initialised to ``init``, or not at all) is set under ``tx < 64`` and used under a
    second, separate ``tx < 64`` (TileLang splits one guarded block this way), then once with no
    guard, where it may still hold its old value."""

    @tlx.jit(target=TARGET, verify="off")
    def split_if(threads=128):
        @T.prim_func
        def main(Out: T.Tensor((threads,), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                S = T.alloc_shared((64,), "int32")
                x = T.alloc_var("int32") if init is None else T.alloc_var("int32", init=init)
                if tx < 64:
                    x = tx
                if tx < 64:
                    S[x] = tx
                T.sync_threads()
                Out[tx] = S[x]

        return main

    return lower_jit(split_if)


@pytest.mark.parametrize("init", [1000, None])
def test_a_scalar_set_under_a_condition_is_known_under_it_again(init):
    """After ``if c: x = v``, x is ``If(c, v, its old value)``: under ``c`` again the store is
    proven; the unguarded load is a violation at the old value 1000, or unknown where the old
    value was never set."""
    report = verify_kernel(_split_if_kernel(init), ())
    store, load = [a for a in report.accesses if a.buffer == "S"]
    assert (store.kind, store.status) == ("store", "proven")
    if init is None:
        assert (load.kind, load.status) == ("load", "unknown")
    else:
        assert (load.kind, load.status, load.counterexample["index"]) == ("load", "violation", 1000)


def _local_index_kernel(init: str, clobber: bool):
    """A private array ``a`` is set to -1 by a loop (``init``: over both elements, only the first,
    or both unless the loop breaks first), then per element to a value read from memory where it
    lies in [0, 64); a guarded ``a[i] >= 0`` then indexes shared memory of 64 (after
    ``a[i] = 100`` where ``clobber``)."""

    @tlx.jit(target=TARGET, verify="off")
    def local_index(threads=128):
        @T.prim_func
        def main(X: T.Tensor((threads, 2), "int32"), Out: T.Tensor((threads,), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                S = T.alloc_shared((64,), "int32")
                a = T.alloc_local((2,), "int32")
                g = T.alloc_var("int32")
                for s in T.serial(1 if init == "partial" else 2):
                    if init == "break" and X[tx, 0] == 7:
                        T.loop_break()
                    a[s] = -1
                for s in T.serial(2):
                    g = X[tx, s]
                    if g >= 0 and g < 64:
                        a[s] = g
                if a[tx % 2] >= 0:
                    if clobber:
                        a[tx % 2] = 100
                    S[a[tx % 2]] = tx
                T.sync_threads()
                Out[tx] = S[tx % 64]

        return main

    return lower_jit(local_index)


@pytest.mark.parametrize("init,clobber,proven", [("full", False, True), ("partial", False, False), ("break", False, False),
                                                 ("full", True, False)])
def test_private_array_elements_lie_in_the_hull_of_their_stores(init, clobber, proven):
    """Every element of ``a`` is -1 or in [0, 64) once a loop has set all of it, so the guarded
    store is proven; with an element that may never be set, or after ``a[i] = 100``, it is not."""
    report = verify_kernel(_local_index_kernel(init, clobber), ())
    [store] = [a for a in report.accesses if a.buffer == "S" and a.kind == "store"]
    assert (store.status == "proven") == proven


def _warp_indexed_kernel(index: str, threads: int = 128, dims: int = 1):
    """``Out[warp]`` style accesses through TileLang's thread-position intrinsics (``index`` names
    one), with ``threads`` threads along x, or 32 x ``threads // 32`` along x, y for ``dims`` 2."""
    warps = threads // 32

    @tlx.jit(target=TARGET, verify="off")
    def warp_indexed():
        @T.prim_func
        def main(A: T.Tensor((warps,), "float32"), L: T.Tensor((32,), "float32"), Out: T.Tensor((threads,), "float32")):
            with T.Kernel(1, threads=threads if dims == 1 else (32, warps)):
                i = {"warp": T.get_warp_idx(), "warp_sync": T.get_warp_idx_sync(), "warp_past": T.get_warp_idx() + 1,
                     "group": T.get_warp_group_idx() * warps + T.get_warp_idx() % 4,
                     "lane": T.get_lane_idx(), "lane16": T.get_lane_idx(16) + 16,
                     "opaque": T.call_extern("int32", "some_index")}[index]
                if index.startswith("lane"):
                    Out[T.get_warp_idx() * 32 + T.get_lane_idx()] = L[i]
                elif index == "opaque":  # shared memory: TileLang guards no access there
                    S = T.alloc_shared((warps,), "float32")
                    S[i] = A[0]
                else:
                    Out[T.get_warp_idx() * 32 + T.get_lane_idx()] = A[i]

        return main

    return lower_jit(warp_indexed)


@pytest.mark.parametrize("index,dims", [("warp", 1), ("warp_sync", 1), ("lane", 1), ("lane16", 1), ("warp", 2), ("lane", 2)])
def test_lane_and_warp_intrinsics_are_the_thread_index_divided(index, dims):
    """TileLang's ``get_warp_idx`` / ``get_lane_idx`` are the block-linear thread id divided by /
    modulo the warp size (DeepSeek's TileKernels index per-warp rows so: before, a fresh int32 made
    them a false violation with index -1 at tid 0)."""
    res = verify_kernel(_warp_indexed_kernel(index, dims=dims), ())
    assert res.accesses and all(a.status == "proven" for a in res.accesses), [(a.buffer, a.status, a.detail) for a in res.accesses]


def test_a_warp_index_past_the_buffer_is_a_violation_at_a_real_thread():
    """``A[warp + 1]`` with 4 warps and 4 rows: the last warp's threads (96..127) overrun."""
    res = verify_kernel(_warp_indexed_kernel("warp_past"), ())
    [bad] = [a for a in res.accesses if a.buffer == "A"]
    assert bad.status == "violation"
    assert 96 <= bad.counterexample["tx"] < 128 and bad.counterexample["index"] == 4


def test_an_unmodelled_call_in_an_index_is_unknown_not_a_violation():
    """An index from an extern call can be anything its dtype holds, but no counterexample can
    choose that value: "unknown", naming the call."""
    res = verify_kernel(_warp_indexed_kernel("opaque"), ())
    [acc] = [a for a in res.accesses if a.buffer == "S"]
    assert acc.status == "unknown" and "some_index" in acc.detail and "does not model" in acc.detail


def _strided_kernel(column_past_the_row: bool):
    """Rows of X, a ``StridedTensor`` whose row stride ``S`` no dimension gives; the last row's
    element past its 32 columns when ``column_past_the_row``."""
    M, S = T.dynamic("M"), T.dynamic("S")

    @tlx.jit(target=TARGET, verify="off")
    def strided():
        @T.prim_func
        def main(X: T.StridedTensor((M, 32), (S, 1), "float32"), Y: T.Tensor((M, 33), "float32")):
            with T.Kernel(M, threads=32) as bx:
                tx = T.get_thread_binding()
                Y[bx, tx] = X[bx, tx]
                if column_past_the_row and tx == 0:
                    Y[bx, 32] = X[bx, 32]

        return main

    return lower_jit(strided)


def test_a_strided_argument_holds_its_views_span_and_its_stride_is_not_negative():
    """X's memory is what any tensor of that shape and stride holds, ``(M - 1) * S + 32``
    elements (TileLang flattens it to ``S * M``, more than a tight tensor holds); the launcher binds
    ``S >= 0``. In-row accesses are proven (before: a violation at ``S < 0``); the last row's
    element 32 is a violation even where ``S * M`` would cover it (``S > 32``)."""
    res = verify_kernel(_strided_kernel(False), ())
    assert all(a.status == "proven" for a in res.accesses), [(a.buffer, a.status, a.detail) for a in res.accesses]
    res = verify_kernel(_strided_kernel(True), ())
    [past] = [a for a in res.accesses if a.buffer == "X" and "32" in a.index]
    assert past.status == "violation", (past.status, past.detail)


def test_a_stepped_loop_lowered_without_its_zero_trip_case_is_a_violation():
    """``for i in T.serial(lane, 9, 32)`` runs once for lanes 0..8 and never for the others, but
    TileLang 0.1.15 lowers it to one unconditional iteration (its CUDA: ``S[(tx >> 5) * 9 +
    (tx & 31)] = 0;``), so lanes 9..31 write past each row and the last warp past the buffer.
    Found in DeepSeek's TileKernels (``get_fused_mapping_kernel``, its per-warp expert counts);
    the check reports what the GPU runs: a violation at thread 255, index 94 of 72."""

    @tlx.jit(target=TARGET, verify="off")
    def stepped(experts=9, threads=256):
        @T.prim_func
        def main(Out: T.Tensor((threads // 32, experts), "int32")):
            with T.Kernel(1, threads=threads):
                tx = T.get_thread_binding()
                S = T.alloc_shared((threads // 32, experts), "int32")
                for i in T.serial(tx % 32, experts, 32):
                    S[tx // 32, i] = 0
                T.sync_threads()
                if tx < experts:
                    Out[0, tx] = S[0, tx]

        return main

    res = verify_kernel(lower_jit(stepped), ())
    [store] = [a for a in res.accesses if a.buffer == "S" and a.kind == "store"]
    assert store.status == "violation" and store.counterexample["index"] >= 72


def test_the_right_operand_of_and_is_checked_only_where_it_runs():
    """``k != 0 and L[k - 1] == 0``: C's ``&&`` never reads ``L[-1]`` (TileKernels' top-2 gate
    reads its previous pick so; it was a violation at k = 0)."""

    @tlx.jit(target=TARGET, verify="off")
    def previous_pick():
        @T.prim_func
        def main(A: T.Tensor((32,), "int32"), Out: T.Tensor((32,), "int32")):
            with T.Kernel(1, threads=32):
                tx = T.get_thread_binding()
                L = T.alloc_local((4,), "int32")
                for k in T.serial(4):
                    L[k] = A[tx] + k
                for k in T.serial(4):
                    if k != 0 and L[k - 1] == 0:
                        Out[tx] = k

        return main

    res = verify_kernel(lower_jit(previous_pick), ())
    reads = [a for a in res.accesses if a.buffer == "L" and a.kind == "load"]
    assert reads and all(a.status == "proven" for a in reads), [(a.index, a.status, a.detail) for a in reads]
