"""Values reached through a bound variable (``end = cu[b + 1]``, ``j = S[...]``): the verifier
uses the binding, shows the loaded value in the counterexample, reports the refutation as
unknown and data-dependent, and never turns a loaded value into a violation."""

import tilelang.language as T

import tlx
from tests.passes.corpus import lower_jit
from tlx.passes.verification import verify_kernel

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[2], target=TARGET, verify="off")
def ragged_end(batch=4, length=1024, threads=128):
    """Each block reads backwards from its sequence's end offset, read from an input table."""

    @T.prim_func
    def main(cu: T.Tensor((batch + 1,), "int32"), X: T.Tensor((length,), "float32"), Y: T.Tensor((batch, threads), "float32")):
        with T.Kernel(batch, threads=threads) as b:
            tx = T.get_thread_binding()
            end = cu[b + 1]
            Y[b, tx] = X[end - 1 - tx]

    return main


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def rotate_through_shared(threads=128):
    """A correct kernel whose index is a value the kernel itself wrote to shared memory."""

    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), Y: T.Tensor((threads,), "float32")):
        with T.Kernel(1, threads=threads) as b:
            tx = T.get_thread_binding()
            S = T.alloc_shared((threads,), "int32")
            F = T.alloc_shared((threads,), "float32")
            S[tx] = tx
            F[tx] = X[tx]
            T.sync_threads()
            j = S[(tx + 1) % threads]
            Y[tx] = F[j]

    return main


@tlx.jit(out_idx=[2], target=TARGET, verify="off")
def guarded_gather(n=256, bins=64, threads=128):
    """``k = ids[i]`` indexes a shared table (which TileLang does not guard); the guard tests the
    input element itself, so ``k`` is in bounds only through its binding."""

    @T.prim_func
    def main(ids: T.Tensor((n,), "int32"), W: T.Tensor((bins,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(n // threads, threads=threads) as b:
            tx = T.get_thread_binding()
            S = T.alloc_shared((bins,), "float32")
            if tx < bins:
                S[tx] = W[tx]
            T.sync_threads()
            k = ids[b * threads + tx]
            if ids[b * threads + tx] >= 0 and ids[b * threads + tx] < bins:
                Y[b * threads + tx] = S[k]

    return main


@tlx.jit(out_idx=[2], target=TARGET, verify="off")
def counted_sum(rows=2, table=64, threads=128, clamp=False, spill=False):
    """Each block sums the first ``counts[row]`` entries of its row's table, staged in shared
    memory. Only the caller's contract keeps the count within the table, unless ``clamp``;
    ``spill`` adds a read past the table that needs no input value (threads >= table)."""

    @T.prim_func
    def main(counts: T.Tensor((rows,), "int32"), W: T.Tensor((rows, table), "int32"), Y: T.Tensor((rows, threads), "int32")):
        with T.Kernel(rows, threads=threads) as r:
            tx = T.get_thread_binding()
            S = T.alloc_shared((table,), "int32")
            n = T.alloc_var("int32")
            acc = T.alloc_var("int32")
            n = counts[r]
            for i in T.Parallel(table):
                S[i] = W[r, i]
            acc = 0
            for j in T.serial(T.min(n, table) if clamp else n):
                acc += S[j]
            if spill:
                acc += S[tx]
            Y[r, tx] = acc

    return main


def _accesses(fn, buffer, **params):
    report = verify_kernel(lower_jit(fn, **params))
    return [a for a in report.accesses if a.buffer == buffer]


def test_loaded_end_offset_is_data_dependent_and_shown():
    overflow = next(a for a in _accesses(ragged_end, "") if a.kind == "overflow")
    # the overflow needs a particular value in the input: unknown (data-dependent), never a violation
    assert overflow.status == "unknown" and overflow.data_dependent
    assert "end" in overflow.counterexample
    assert overflow.counterexample["cu[bx + 1]"] == overflow.counterexample["end"]
    assert "when the input holds cu[bx + 1] = " in overflow.detail


def test_value_from_shared_memory_is_unknown_not_a_violation():
    (load,) = [a for a in _accesses(rotate_through_shared, "F") if a.kind == "load"]
    assert load.status == "unknown", load.detail
    assert "does not track" in load.detail
    assert "S[(tx + 1) % 128]" in load.counterexample, load.counterexample


def test_binding_is_a_fact():
    (load,) = [a for a in _accesses(guarded_gather, "S") if a.kind == "load"]
    assert load.status == "proven", (load.detail, load.counterexample)


def _table_reads(**params):
    return [a for a in _accesses(counted_sum, "S", **params) if a.kind == "load"]


def test_loop_over_a_loaded_count_is_data_dependent():
    """``for j in range(n)`` with ``n = counts[r]``: S[j] leaves the table only for a count past
    it, an input value. The verifier reported this as a violation (the loop bound's load was not
    followed into the counterexample); it is unknown, data-dependent, and names the count."""
    (read,) = _table_reads()
    cex = read.counterexample
    assert read.status == "unknown" and read.data_dependent, (read.status, read.detail)
    assert cex["counts[bx]"] > cex["j"] >= 64 == cex["extent"] and cex["index"] == cex["j"]
    assert f"when the input holds counts[bx] = {cex['counts[bx]']}" in read.detail


def test_clamped_loaded_count_is_proven():
    (read,) = _table_reads(clamp=True)
    assert read.status == "proven", (read.detail, read.counterexample)


def test_read_that_needs_no_input_value_stays_a_violation():
    """Beside the loop over a loaded count, S[tx] (tx up to 127, 64 entries) is refuted by the
    thread index alone: still a violation, with no input value in its counterexample."""
    spill = next(a for a in _table_reads(spill=True) if a.index == "tx")
    assert spill.status == "violation" and not spill.data_dependent, (spill.status, spill.detail)
    assert spill.counterexample["tx"] >= 64 and "counts[bx]" not in spill.counterexample


@tlx.jit(out_idx=[1], target=TARGET, verify="off")
def lane_masks(width="uint32", threads=128):
    """Each thread reads the element its warp's ballot of signs, narrowed to ``width``, picks."""

    @T.prim_func
    def main(X: T.Tensor((threads,), "float32"), Y: T.Tensor((threads,), "float32")):
        with T.Kernel(1, threads=threads) as b:
            tx = T.get_thread_binding()
            mask = T.alloc_var(width)
            mask = T.Cast(width, T.ballot_sync(X[tx] < 0))
            Y[tx] = X[T.Cast("int32", mask % threads)]

    return main


def test_a_ballot_is_a_32_bit_mask():
    # CUDA's ballot fills 32 bits of TileLang's uint64: narrowing it to uint32 cannot overflow ...
    assert not [a for a in _accesses(lane_masks, "mask") if a.kind == "overflow"]
    # ... and to uint16 it can
    (overflow,) = [a for a in _accesses(lane_masks, "mask", width="uint16") if a.kind == "overflow"]
    assert overflow.status != "proven", overflow.detail
