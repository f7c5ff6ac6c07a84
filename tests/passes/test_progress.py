"""tlx/passes/progress.py: a two-warpgroup mbarrier hand-off runs to the end; the classic
mistakes (the producer's first wait without the flipped parity, a missing arrive, an init count
no phase reaches) deadlock, reported with the wait that never ends; a loop bound read from
memory is unknown; a ring position a thread carries in its own scalar is followed; a cross-warp
AllReduce is its named barriers; a thread that only polls a barrier and falls behind it is
unknown, not a deadlock; ``tlx check --only progress`` decides."""

import pytest
import tilelang.language as T

from tlx.ir.tir import device_functions
from tlx.lowering import lower
from tlx.passes.progress import check_progress, simulate, simulate_schedules

TARGET = {"kind": "cuda", "arch": "sm_90a"}


def _handoff(producer_flip: bool = True, consumer_arrives: bool = True, empty_count: int = 128, steps: int = 8,
             trips_from_memory: bool = False):
    """Producer warpgroup 0 fills stage k % 2 of a tile and arrives on full; consumer warpgroup
    1 waits for it, reads, and arrives on empty, which the producer waits for before reusing."""

    @T.prim_func
    def main(A: T.Tensor((1024,), "float32"), B: T.Tensor((1024,), "float32"), N: T.Tensor((1,), "int32")):
        with T.Kernel(1, threads=256):
            S = T.alloc_shared((2, 128), "float32")
            full = T.alloc_barrier([128] * 2)
            empty = T.alloc_barrier([empty_count] * 2)
            tx = T.get_thread_binding()
            trips = N[0] if trips_from_memory else steps
            if tx < 128:
                for k in T.serial(trips):
                    T.mbarrier_wait_parity(empty[k % 2], ((k // 2) & 1) ^ 1 if producer_flip else (k // 2) & 1)
                    S[k % 2, tx] = A[k * 128 + tx]
                    T.mbarrier_arrive(full[k % 2])
            else:
                for k in T.serial(trips):
                    T.mbarrier_wait_parity(full[k % 2], (k // 2) & 1)
                    B[k * 128 + tx - 128] = S[k % 2, tx - 128]
                    if consumer_arrives or k < 3:
                        T.mbarrier_arrive(empty[k % 2])

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_a_correct_handoff_makes_progress():
    report = check_progress(_handoff())
    assert report.verdict == "ok" and "8 schedules" in report.detail


@pytest.mark.parametrize("mistake,stuck", [
    (dict(producer_flip=False), "wait empty[0] parity 0 (phases completed 0, 0/128 arrivals"),
    (dict(consumer_arrives=False), "wait empty[1] parity 1 (phases completed 1, 0/128 arrivals"),
    (dict(empty_count=256), "wait empty[0] parity 0 (phases completed 0, 128/256 arrivals"),
])
def test_protocol_mistakes_deadlock_with_the_wait_named(mistake, stuck):
    report = check_progress(_handoff(**mistake))
    assert report.verdict == "deadlock", report
    assert stuck in report.detail, report.detail
    assert report.stuck and all(op[0] == "wait" for _, op in report.stuck)


def test_a_trip_count_read_from_memory_is_unknown_and_swept():
    """A trip count read from memory keeps the verdict unknown; the protocol is then run at each
    trip count of SWEEP: no hang for the correct hand-off, the first hanging count for a
    consumer that stops arriving after three tiles (two stages: the producer's sixth tile waits for
    the fourth one's release)."""
    report = check_progress(_handoff(trips_from_memory=True))
    assert report.verdict == "unknown" and "control value is not known" in report.detail
    assert "no hang at trips = 0..9" in report.detail, report.detail
    broken = check_progress(_handoff(trips_from_memory=True, consumer_arrives=False))
    assert broken.verdict == "unknown" and "at trips = 6 it hangs" in broken.detail, broken.detail
    assert broken.stuck and all(op[0] == "wait" for _, op in broken.stuck)


def _ring_across_tiles(consumer_advances: bool = True, tiles: int = 3, blocks: int = 3):
    """A persistent hand-off: ``tiles`` tiles of ``blocks`` blocks through a two-stage ring whose
    position each side carries from tile to tile in a ``T.alloc_var`` (the ring wraps inside a
    tile when ``blocks`` is odd, so each tile starts at another slot and parity)."""

    @T.prim_func
    def main(A: T.Tensor((4096,), "float32"), B: T.Tensor((4096,), "float32")):
        with T.Kernel(1, threads=256):
            S = T.alloc_shared((2, 128), "float32")
            full = T.alloc_barrier([128] * 2)
            empty = T.alloc_barrier([128] * 2)
            tx = T.get_thread_binding()
            if tx < 128:
                base = T.alloc_var("int32")
                base = 0
                for t in T.serial(tiles):
                    for k in T.serial(blocks):
                        T.mbarrier_wait_parity(empty[(base + k) % 2], (((base + k) // 2) & 1) ^ 1)
                        S[(base + k) % 2, tx] = A[(t * blocks + k) * 128 + tx]
                        T.mbarrier_arrive(full[(base + k) % 2])
                    base = (base + blocks) % 4
            else:
                base = T.alloc_var("int32")
                base = 0
                for t in T.serial(tiles):
                    for k in T.serial(blocks):
                        T.mbarrier_wait_parity(full[(base + k) % 2], ((base + k) // 2) & 1)
                        B[(t * blocks + k) * 128 + tx - 128] = S[(base + k) % 2, tx - 128]
                        T.mbarrier_arrive(empty[(base + k) % 2])
                    if consumer_advances:
                        base = (base + blocks) % 4

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_a_ring_position_carried_across_tiles_is_simulated():
    """The thread's own scalar (``base``) is followed through its stores, not taken for memory:
    the correct persistent ring runs to the end; a consumer that never advances its position
    waits, in the second tile, for a parity its slot already passed."""
    assert check_progress(_ring_across_tiles()).verdict == "ok"
    report = check_progress(_ring_across_tiles(consumer_advances=False))
    assert report.verdict == "deadlock", report
    assert report.stuck and all(op[0] == "wait" for _, op in report.stuck)


def test_named_barriers_and_syncthreads_release_only_when_full():
    """Two threads meet at named barrier 1 of 2, then at __syncthreads; a third thread that
    reaches a named barrier of 2 threads alone waits forever."""
    ok = [[("bar", 1, 2), ("sync",)], [("bar", 1, 2), ("sync",)]]
    assert simulate(ok, 0).verdict == "ok"
    alone = [[("bar", 1, 2), ("sync",)], [("bar", 1, 2), ("sync",)], [("bar", 2, 2)]]
    report = simulate(alone, 0)
    assert report.verdict == "deadlock" and "threads 2 at named barrier 2 of 2 threads" in report.detail


def _reduce_over_a_warpgroup(every_thread: bool):
    """Warpgroup 0 of 256 threads reduces a [64, 128] fragment over its rows: TileLang lays the
    rows across the four warps, so the reduce goes through shared memory between named
    barriers of 128 threads (``tl::AllReduce<..., tl::NamedBarrier<128>>``); with
    ``every_thread`` False only the even threads reach it."""

    @T.prim_func
    def main(A: T.Tensor((64, 256), "float32"), B: T.Tensor((256,), "float32")):
        with T.Kernel(1, threads=256):
            tx = T.get_thread_binding()
            frag = T.alloc_fragment((64, 128), "float32")
            mx = T.alloc_fragment((128,), "float32")
            if tx < 128:
                if every_thread or tx % 2 == 0:
                    T.copy(A[:, 0:128], frag)
                    T.reduce_max(frag, mx, dim=0)
                    T.copy(mx, B[0:128])

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_an_all_reduce_is_its_named_barriers():
    """A cross-warp AllReduce is simulated as its barriers (it was "unknown"): the warpgroup's
    reduce makes progress; reached by half of its threads, they wait at named barrier 1."""
    assert check_progress(_reduce_over_a_warpgroup(True)).verdict == "ok"
    report = check_progress(_reduce_over_a_warpgroup(False))
    assert report.verdict == "deadlock" and "at named barrier 1 of 128 threads" in report.detail, report.detail


@pytest.mark.parametrize("template, trace", [
    ("tl::AllReduce<tl::MaxOp, 128, 32, 128, tl::NamedBarrier<128>>::run", [("bar", 1, 128), ("bar", 2, 128)] * 2),
    ("tl::AllReduce<tl::SumOp, 4, 1, 0, tl::NamedBarrier<128>>::run", []),  # inside a warp: shuffles only
    ("tl::AllReduce<tl::SumOp, 256, 1>::run", [("sync",)] * 6),  # SyncThreadsBarrier, the default: offsets 128, 64, 32
    ("tl::AllReduce<tl::MaxOp, 256, 64, 0, tl::SyncThreadsBarrier>::run", [("sync",)] * 4),  # offsets 128, 64
])
def test_all_reduce_barriers_follow_its_butterfly(template, trace):
    from tlx.passes.progress import _all_reduce_barriers

    assert _all_reduce_barriers(template) == trace


def test_an_all_reduce_it_cannot_read_is_unknown():
    from tlx.passes.progress import Unknown, _all_reduce_barriers

    assert _all_reduce_barriers("tl::warp_reduce<float>") is None
    with pytest.raises(Unknown, match="template arguments"):
        _all_reduce_barriers("tl::AllReduce<tl::MaxOp, N, 32>::run")


def _branch_on_data(arms: str):
    """Warpgroup 1 branches per thread on a value it read from memory. ``arms``: "bar", both
    arms meet at named barrier 3 of its 128 threads; "one", only one arm does; "arrive", both
    arrive on an mbarrier of 128 arrivals that warpgroup 0 waits for (a producer's copy or zeros
    per slot); "uniform": as "bar", on a value every thread reads at one index."""

    @T.prim_func
    def main(A: T.Tensor((256,), "float32"), B: T.Tensor((256,), "float32")):
        with T.Kernel(1, threads=256):
            tx = T.get_thread_binding()
            done = T.alloc_barrier([128])
            if tx >= 128:
                if A[0 if arms == "uniform" else tx] > 0:
                    if arms != "arrive":
                        T.sync_threads(3, 128)
                    B[tx] = A[tx]
                    if arms == "arrive":
                        T.mbarrier_arrive(done[0])
                else:
                    if arms == "bar" or arms == "uniform":
                        T.sync_threads(3, 128)
                    B[tx] = 0
                    if arms == "arrive":
                        T.mbarrier_arrive(done[0])
            else:
                T.mbarrier_wait_parity(done[0], 0) if arms == "arrive" else T.evaluate(0)

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_a_data_branch_whose_arms_synchronise_alike_needs_no_value():
    """A branch on a value read from memory is simulated without it when both arms take the same
    steps; when they differ the verdict stays unknown, and so it does when the arms meet at an
    aligned barrier (bar.sync) and the value may differ between lanes: lanes of one warp that
    disagree would reach it at two instructions, undefined in PTX (the sparse decode's e4m3
    gather hung so on an H100); a value read at one index for every thread cannot split a warp."""
    assert check_progress(_branch_on_data("arrive")).verdict == "ok"
    assert check_progress(_branch_on_data("uniform")).verdict == "ok"  # no warp can split on A[0]
    report = check_progress(_branch_on_data("bar"))
    assert report.verdict == "unknown" and "aligned barrier in both arms" in report.detail, report.detail
    report = check_progress(_branch_on_data("one"))
    assert report.verdict == "unknown" and "control value is not known" in report.detail, report.detail


def _barrier_under_lane_test(split_warp: bool):
    """A named barrier in a branch on the thread: the first 16 lanes of each warp (one warp
    split between the arms, a barrier in each) or the first 64 threads (whole warps)."""

    @T.prim_func
    def main(A: T.Tensor((128,), "float32")):
        with T.Kernel(1, threads=128):
            tx = T.get_thread_binding()
            if (tx % 32 < 16) if split_warp else (tx < 64):
                T.sync_threads(3, 128)
                A[tx] = 1
            else:
                T.sync_threads(3, 128)
                A[tx] = 2

    [(_, func)] = list(device_functions(lower(main, TARGET, {"tl.disable_thread_storage_sync": True}).device_mod))
    return func


def test_a_warp_split_between_two_aligned_barriers_is_a_deadlock():
    """bar.sync is warp-aligned: lanes of one warp reaching it at two instructions is undefined
    (the simulation alone counts 128 arrivals and would pass it); whole warps may take either."""
    report = check_progress(_barrier_under_lane_test(True))
    assert report.verdict == "deadlock" and "lanes 0 and 16 reach their aligned barrier 0 at two instructions" in report.detail, report.detail
    assert check_progress(_barrier_under_lane_test(False)).verdict == "ok"


def _reallocated_prim_func(producer_regs: int, consumer_regs: int):
    """384 threads (168 registers a thread at launch): warpgroups 1 and 2 give registers back
    (setmaxnreg.dec to ``producer_regs``), warpgroup 0 takes more (inc to ``consumer_regs``)
    and then meets warpgroup 1 at a named barrier."""

    @T.prim_func
    def main(A: T.Tensor((384,), "float32")):
        with T.Kernel(1, threads=384):
            tx = T.get_thread_binding()
            if tx < 128:
                T.set_max_nreg(consumer_regs, 1)
                A[tx] = A[tx] + 1
                T.sync_threads(8, 256)
            elif tx < 256:
                T.set_max_nreg(producer_regs, 0)
                T.sync_threads(8, 256)
            else:
                T.set_max_nreg(producer_regs, 0)

    return main


def _reallocated(producer_regs: int, consumer_regs: int):
    [(_, func)] = list(device_functions(lower(_reallocated_prim_func(producer_regs, consumer_regs), TARGET, {}).device_mod))
    return func


def test_register_reallocation_past_the_pool_deadlocks():
    """Two warpgroups down to 136 free 2 x 128 x 32 registers; one up to 240 needs 128 x 72:
    1024 short, and its increase waits forever (the e4m3 key-major decode kernel's first split,
    found so on the CPU before it ran). 232 fits exactly (168 x 384 at launch)."""
    report = check_progress(_reallocated(136, 240))  # the static count, before any simulation
    assert report.verdict == "deadlock", report
    assert "warps 0-3 increase to [240] registers a thread, 1024 registers more than the CTA's 384 threads x 168" in report.detail
    from tlx.passes.progress import thread_traces

    simulated = simulate(thread_traces(_reallocated(136, 240), {}, 384), 0)  # and the simulation
    # three warps get their registers, the fourth waits for ever, and warpgroups 0 and 1 then at their named barrier
    assert simulated.verdict == "deadlock" and "at setmaxnreg.inc to 240 registers a thread" in simulated.detail, simulated
    assert check_progress(_reallocated(136, 232)).verdict == "ok"


def _two_ctas_a_sm(producer_regs: int, consumer_regs: int):
    """256 threads under ``__launch_bounds__(256, 2)``: 128 registers a thread at launch (what
    ptxas gives the e4m3 decode kernel with one producer), warpgroup 1 down to
    ``producer_regs``, warpgroup 0 up to ``consumer_regs``, then a named barrier of both."""

    @T.prim_func
    def main(A: T.Tensor((256,), "float32")):
        with T.Kernel(1, threads=256):
            T.annotate_min_blocks_per_sm(2)
            tx = T.get_thread_binding()
            if tx < 128:
                T.set_max_nreg(consumer_regs, 1)
                A[tx] = A[tx] + 1
                T.sync_threads(8, 256)
            else:
                T.set_max_nreg(producer_regs, 0)
                T.sync_threads(8, 256)

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_two_ctas_a_sm_share_the_register_file():
    """With two CTAs a SM each CTA holds half the register file: 96 + 168 over 2 x 128 threads is
    1024 registers more than 256 x 128 (the count for one CTA a SM, 256 x 168, would hide it);
    96 + 160 fits exactly. Both the static count and the simulation see it."""
    from tlx.passes.progress import ctas_per_sm, thread_traces

    over = _two_ctas_a_sm(96, 168)
    assert ctas_per_sm(over) == 2
    report = check_progress(over)
    assert report.verdict == "deadlock", report
    assert "warps 0-3 increase to [168] registers a thread, 1024 registers more than the CTA's 256 threads x 128" in report.detail
    simulated = simulate(thread_traces(over, {}, 256), 0, ctas_per_sm(over))
    assert simulated.verdict == "deadlock" and "at setmaxnreg.inc to 168 registers a thread" in simulated.detail, simulated
    assert check_progress(_two_ctas_a_sm(96, 160)).verdict == "ok"
    assert ctas_per_sm(_reallocated(136, 232)) == 1


def test_a_compile_refuses_a_kernel_whose_registers_cannot_fit():
    """The register count runs on every verified compile: 136 / 240 over 384 threads is a
    DeadlockError before any launch (and 136 / 232 compiles)."""
    from tlx.compiler import compile_artifacts
    from tlx.options import Options
    from tlx.passes.progress import DeadlockError

    def build(consumer_regs):
        main = _reallocated_prim_func(136, consumer_regs)
        return compile_artifacts(main, Options.make(target=TARGET), stop_after="passes")[1]

    with pytest.raises(DeadlockError, match=r"would hang: setmaxnreg: warps 0-3 increase to \[240\]"):
        build(240)
    assert build(232).reports["registers"] == {"deadlocks": {}}


def _observed_ring(steps: int = 6):
    """Thread 0 fills a two-slot ring (waits on empty, arrives on full), thread 1 drains it (waits
    on full, arrives on empty), and thread 2 only polls the empty barriers as thread 0 does: the
    non-elected threads of a producer warpgroup in TileLang's warp specialization."""
    init = [("init", ("full", 0), 1), ("init", ("full", 1), 1), ("init", ("empty", 0), 1), ("init", ("empty", 1), 1)]
    producer, consumer, poller = [*init, ("sync",)], [("sync",)], [("sync",)]
    for k in range(steps):
        wait_empty = ("wait", ("empty", k % 2), ((k // 2) & 1) ^ 1)
        producer += [wait_empty, ("arrive", ("full", k % 2))]
        poller.append(wait_empty)
        consumer += [("wait", ("full", k % 2), (k // 2) & 1), ("arrive", ("empty", k % 2))]
    return [producer, consumer, poller]


def test_a_thread_that_only_polls_a_barrier_and_falls_behind_is_unknown_not_a_deadlock():
    """Some random schedule runs the poller after the ring went two phases on: it finds its
    parity back in the current phase, which never completes. A fair schedule finishes, and no
    arrival waits on the poller: "unknown" with the reason, not "deadlock"."""
    traces = _observed_ring()
    lagging = [r for r in (simulate(traces, seed) for seed in range(32)) if r.verdict == "deadlock"]
    assert lagging and all(r.late and r.detail.startswith("threads 2 at wait empty") for r in lagging)
    assert simulate(traces, 0, fair=True).verdict == "ok"
    report = simulate_schedules(traces, seeds=32)
    assert report.verdict == "unknown" and "only threads that wait on a barrier they never arrive on" in report.detail


def test_a_poller_waiting_for_a_phase_that_never_comes_still_deadlocks():
    """The poller waits for one phase of empty[0] more than the ring completes (its third, then a
    fourth): no schedule lets it finish."""
    traces = _observed_ring()
    traces[2] += [("wait", ("empty", 0), 0), ("wait", ("empty", 0), 1)]
    report = simulate_schedules(traces, seeds=8)
    assert report.verdict == "deadlock" and "threads 2 at wait empty[0] parity 1" in report.detail


def _warp_specialized_gemm():
    """TileLang's own warp specialization of a pipelined GEMM (sm_90a, TMA): its producer
    warpgroup's non-elected threads poll the consumers' barriers."""

    @T.prim_func
    def main(A: T.Tensor((128, 512), "float16"), B: T.Tensor((512, 128), "float16"), C: T.Tensor((128, 128), "float32")):
        with T.Kernel(1, threads=128):
            A_s = T.alloc_shared((128, 64), "float16")
            B_s = T.alloc_shared((64, 128), "float16")
            acc = T.alloc_fragment((128, 128), "float32")
            T.clear(acc)
            for k in T.Pipelined(8, num_stages=2):
                T.copy(A[0:128, k * 64:(k + 1) * 64], A_s)
                T.copy(B[k * 64:(k + 1) * 64, 0:128], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C)

    [(_, func)] = list(device_functions(lower(main, TARGET, {}).device_mod))
    return func


def test_tilelangs_warp_specialized_pipeline_is_not_called_a_deadlock():
    """Most random schedules leave a poller behind (it was "deadlock" before the fair schedule
    was asked); the verdict is "unknown" and says why."""
    report = check_progress(_warp_specialized_gemm())
    assert report.verdict == "unknown" and "never arrive on" in report.detail, report
