"""System-scope flags for the MegaMoE protocol: the one primitive TileLang 0.1.15 lacks.

TileLang's ``T.atomic_load`` / ``T.atomic_store`` take a memory order but no scope (device scope
in its CUDA templates); a flag written by one GPU and read by a peer over NVLink needs the
``.sys`` scope. The helpers below are inline PTX in a prelude (``PRELUDE``, included with
``T.Kernel(prelude=...)``) and the TIR calls that reach them:

* ``release_store(flag_ref, v)``: ``fence.acq_rel.sys`` then ``st.release.sys`` — every write the
  thread (and, cumulatively, the work ordered before it) made is visible to a reader that
  acquires the value;
* ``release_add(flag_ref, v)``: ``red.release.sys.add`` (a counter many CTAs arrive on);
* ``wait_equal`` / ``wait_at_least(flag_ref, target, abort_ref, timeout_ns)``: spin with
  ``ld.acquire.sys`` until ``flag == target`` (epoch flags: a flag carries the call counter, so
  no one resets it) or ``flag >= target`` (arrival counters), or until the local ``abort`` word is
  non-zero, or until ``%globaltimer`` has advanced by ``timeout_ns``. They return 1 when the
  flag arrived, 0 otherwise: a wait never hangs.

``tests/kernels/moe/mega/test_mega_sysflags.py`` checks the PTX that each helper emits (CPU) and the
protocol on its own on the GPU (a producer block and a consumer block, a missing producer that
times out).
"""

from __future__ import annotations

import tilelang.language as T

from tlx.numerics import determinism

PRELUDE = r"""
#ifndef TLX_SYSFLAGS_PRELUDE_
#define TLX_SYSFLAGS_PRELUDE_
__device__ __forceinline__ void tlx_release_store_sys(int* flag, int value) {
  asm volatile("fence.acq_rel.sys;\n\tst.release.sys.global.s32 [%0], %1;" :: "l"(flag), "r"(value) : "memory");
}
__device__ __forceinline__ void tlx_release_add_sys(int* flag, int value) {
  asm volatile("fence.acq_rel.sys;\n\tred.release.sys.global.add.s32 [%0], %1;" :: "l"(flag), "r"(value) : "memory");
}
__device__ __forceinline__ int tlx_acquire_load_sys(const int* flag) {
  int value;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
  return value;
}
__device__ __forceinline__ unsigned long long tlx_globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// 1 once *flag == target (exact) or *flag >= target (at_least) was acquired; 0 on timeout or when
// *abort != 0 (another wait of this rank has failed: the rank stops waiting at once, so a failure
// costs one timeout, not one per wait).
__device__ __forceinline__ int tlx_wait_flag_sys(const int* flag, int target, int at_least, const int* abort,
                                                 long long timeout_ns) {
  unsigned long long start = tlx_globaltimer_ns();
  while (true) {
    int value = tlx_acquire_load_sys(flag);
    if (at_least ? value >= target : value == target) return 1;
    if (tlx_acquire_load_sys(abort) != 0) return 0;
    if ((long long)(tlx_globaltimer_ns() - start) > timeout_ns) return 0;
    __nanosleep(64);
  }
}
#endif
"""


# Per-row-block counters of the fused wave kernel (``kernels.moe.mega.wave``): TMA-stored rows
# handed from one CTA to another's TMA loads. TileLang's fence_proxy_async is
# ``fence.proxy.async.shared::cta`` (shared memory only); rows that pass through global memory
# want ``fence.proxy.async.global`` on both sides (after the store has completed, before the
# release; after the acquire, before the load). The counter is addressed as base + index: TileLang
# guards a data-dependent index of ``T.address_of`` with a select, which its loop passes reject.
COUNTER_PRELUDE = r"""
#ifndef TLX_COUNTER_PRELUDE_
#define TLX_COUNTER_PRELUDE_
__device__ __forceinline__ void tlx_fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ int tlx_wait_count_sys(const int* counts, int index, int target, const int* abort,
                                                  long long timeout_ns) {
  return tlx_wait_flag_sys(counts + index, target, 1, abort, timeout_ns);
}
__device__ __forceinline__ void tlx_count_release_sys(int* counts, int index) {
  tlx_release_add_sys(counts + index, 1);
}
#endif
"""


# what `tlx check`'s determinism analysis may assume of each helper (it does not read inline PTX)
determinism.declare_sync(tlx_release_store_sys="flag_store", tlx_release_add_sys="counter_add",
                         tlx_count_release_sys="counter_add", tlx_wait_flag_sys="wait", tlx_wait_count_sys="wait",
                         tlx_fence_proxy_async_global="fence")


def fence_proxy_async_global():
    """``fence.proxy.async.global`` (``COUNTER_PRELUDE``): orders this thread's generic-proxy global
    accesses with its TMA (async-proxy) global accesses."""
    return T.call_extern("handle", "tlx_fence_proxy_async_global")


def wait_count(counts, index, target, abort_ref, timeout_ns):
    """``wait_at_least`` on ``counts[index]`` (an int32 buffer; ``COUNTER_PRELUDE`` after ``PRELUDE``)."""
    return T.call_extern("int32", "tlx_wait_count_sys", counts.access_ptr("r"), index, target, T.address_of(abort_ref),
                         timeout_ns)


def count_release(counts, index):
    """``release_add(counts[index], 1)`` (``COUNTER_PRELUDE`` after ``PRELUDE``)."""
    return T.call_extern("handle", "tlx_count_release_sys", counts.access_ptr("rw"), index)


def release_store(flag_ref, value):
    """``st.release.sys`` of int32 ``value`` to ``flag_ref`` (a buffer element)."""
    return T.call_extern("handle", "tlx_release_store_sys", T.address_of(flag_ref), value)


def release_add(flag_ref, value):
    """``red.release.sys.add`` of int32 ``value`` to ``flag_ref``."""
    return T.call_extern("handle", "tlx_release_add_sys", T.address_of(flag_ref), value)


def acquire_load(flag_ref):
    """``ld.acquire.sys`` of ``flag_ref`` (int32)."""
    return T.call_extern("int32", "tlx_acquire_load_sys", T.address_of(flag_ref))


def wait_equal(flag_ref, target, abort_ref, timeout_ns):
    """1 once ``flag == target`` was acquired, 0 on timeout or abort (see the module docstring)."""
    return T.call_extern("int32", "tlx_wait_flag_sys", T.address_of(flag_ref), target, 0, T.address_of(abort_ref),
                         timeout_ns)


def wait_at_least(flag_ref, target, abort_ref, timeout_ns):
    """1 once ``flag >= target`` was acquired, 0 on timeout or abort (see the module docstring)."""
    return T.call_extern("int32", "tlx_wait_flag_sys", T.address_of(flag_ref), target, 1, T.address_of(abort_ref),
                         timeout_ns)
