"""System-scope flags (kernels/moe/mega/sysflags.py): the PTX each helper emits (CPU) and the
release / acquire hand-off and the timeout on their own (GPU)."""

import time

import pytest
import tilelang.language as T
import torch

import tlx
from kernels.moe.mega.sysflags import PRELUDE, acquire_load, release_add, release_store, wait_at_least, wait_equal

TARGET = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(target=TARGET)
def handoff_kernel(n: int):
    """Block 1 writes ``data`` (n words) then releases ``flag = 7`` and adds 1 to ``count``; block 0
    waits for ``flag == 7`` (or times out), then, in the same thread, copies ``data`` to ``out``
    and writes ``ok``: 1 arrived, 0 timed out. ``producer = 0`` leaves block 1 idle (a producer
    that never arrives)."""

    @T.prim_func
    def main(data: T.Tensor((n,), "int32"), flag: T.Tensor((4,), "int32"), out: T.Tensor((n,), "int32"),
             ok: T.Tensor((2,), "int32"), producer: T.int32, timeout_ns: T.int64):
        with T.Kernel(2, threads=32, prelude=PRELUDE) as b:
            if T.get_thread_binding() == 0:
                if b == 1 and producer != 0:
                    for i in T.serial(n):
                        data[i] = i * 3 + 1
                    release_store(flag[0], 7)
                    release_add(flag[1], 1)
                if b == 0:
                    ok[0] = wait_equal(flag[0], 7, flag[3], timeout_ns)
                    ok[1] = wait_at_least(flag[1], 1, flag[3], timeout_ns) + acquire_load(flag[2])
                    for i in T.serial(n):
                        out[i] = data[i]

    return main


def test_helpers_emit_system_scope_ptx():
    src = handoff_kernel(64).device_source
    for ptx in ("st.release.sys.global.s32", "red.release.sys.global.add.s32", "ld.acquire.sys.global.s32",
                "fence.acq_rel.sys", "%%globaltimer"):
        assert ptx in src, ptx
    for call in ("tlx_release_store_sys(", "tlx_release_add_sys(", "tlx_wait_flag_sys(", "tlx_acquire_load_sys("):
        assert call in src.split("__global__", 1)[1], call  # called from the kernel, not just declared


@pytest.mark.gpu
def test_release_acquire_handoff_between_blocks():
    n = 4096
    for _ in range(20):
        data = torch.zeros(n, dtype=torch.int32, device="cuda")
        flag = torch.zeros(4, dtype=torch.int32, device="cuda")
        out = torch.full((n,), -5, dtype=torch.int32, device="cuda")
        ok = torch.full((2,), -1, dtype=torch.int32, device="cuda")
        handoff_kernel(n)(data, flag, out, ok, 1, int(5e9))
        torch.cuda.synchronize()
        assert ok.tolist() == [1, 1]
        assert torch.equal(out, torch.arange(n, device="cuda", dtype=torch.int32) * 3 + 1)


@pytest.mark.gpu
def test_missing_producer_times_out_in_bounded_time():
    n = 16
    data = torch.zeros(n, dtype=torch.int32, device="cuda")
    flag = torch.zeros(4, dtype=torch.int32, device="cuda")
    out = torch.full((n,), -5, dtype=torch.int32, device="cuda")
    ok = torch.full((2,), -1, dtype=torch.int32, device="cuda")
    kernel = handoff_kernel(n)
    t0 = time.perf_counter()
    kernel(data, flag, out, ok, 0, int(0.2e9))
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    assert ok.tolist() == [0, 0]
    assert 0.2 <= took < 2.0, took  # two waits of 0.2 s at most
    # the abort word cuts a wait short
    flag[3] = 1
    t0 = time.perf_counter()
    kernel(data, flag, out, ok, 0, int(5e9))
    torch.cuda.synchronize()
    assert ok.tolist() == [0, 0] and time.perf_counter() - t0 < 1.0
