"""Each warpgroup's cross-warp reductions on named barriers of their own.

TileLang 0.1.15 lowers a reduction that spans warps (``T.reduce_max`` over a fragment whose
reduced dimension lies across warps) to ``tl::AllReduce<Op, threads, scale, offset,
tl::NamedBarrier<n>>``, whose exchange through shared memory synchronises on ``bar.sync 1, n``
and ``bar.sync 2, n`` whichever threads run it. Two warpgroups that reduce in branches of their
own (two consumers, each on its own split) then meet at the same hardware barrier: it releases
once any ``n`` threads of either arrived, so a reduction reads a workspace the other warpgroup's
threads were meant to fill, or a warpgroup waits forever (tlx's progress check finds that
schedule). This pass keeps ids 1 and 2 for the first group of threads (the lowest ``offset``)
and gives every other group a pair of ids the function does not use (from 15 down), through
``tlx::NamedBarrierIds<n, first, second>`` (``PRELUDE``). A function with one group, or too
few free ids, is left as it is (the progress check then still reports it).
"""

from __future__ import annotations

import re

from tilelang import tvm

from tlx.ir.tir import calls, const_int, device_functions, extern_name, op_name
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext

tir = tvm.tirx

__all__ = ["PRELUDE", "reduce_barriers_pass", "reduce_groups"]

PRELUDE = r"""
#ifndef TLX_NAMED_BARRIER_IDS_
#define TLX_NAMED_BARRIER_IDS_
namespace tlx {
// tl::NamedBarrier with the two ids an AllReduce synchronises on chosen (tlx/passes/reduce_barriers.py)
template <int all_threads, int first, int second> struct NamedBarrierIds {
  template <int phase = 1> static __device__ __forceinline__ void sync() {
    asm volatile("bar.sync %0, %1;" : : "r"(phase == 1 ? first : second), "r"(all_threads));
  }
};
}  // namespace tlx
#endif
"""

NAMED_BARRIERS = 16  # bar.sync ids 0..15 (0: __syncthreads)
_REDUCE = re.compile(r"^tl::AllReduce<\s*[\w:]+\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(tl::NamedBarrier<\s*(\d+)\s*>)")


def _group(name: str) -> tuple[int, int, str] | None:
    """(offset, barrier threads, the barrier's text) of an AllReduce call that synchronises on
    named barriers (a level at a distance of 32 threads or more), else None."""
    m = _REDUCE.match(name)
    if m is None or int(m.group(1)) // 2 < max(32, int(m.group(2))):
        return None
    return int(m.group(3)), int(m.group(5)), m.group(4)


def reduce_groups(func) -> list[tuple[int, int]]:
    """The (offset, threads) groups of ``func``'s barrier-using AllReduce calls, in offset order."""
    return sorted({g[:2] for c in calls(func) if (g := _group(extern_name(c) or "")) is not None})


def _used_ids(func) -> set[int]:
    """Named-barrier ids ``func`` synchronises on besides the AllReduce ones: its
    ``tvm_storage_sync`` ids (``T.sync_threads``, TileLang's partial syncs), 0, 1 and 2."""
    used = {0, 1, 2}
    for c in calls(func):
        if op_name(c) == "tirx.tvm_storage_sync" and len(c.args) >= 2:
            i = const_int(c.args[1])
            used.add(-1 if i is None else i)
    return used


def reduce_barriers_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    mod, updates, report = kernel.device_mod, {}, {}
    for name, func in device_functions(mod):
        groups = reduce_groups(func)
        if len(groups) < 2:
            continue
        used = _used_ids(func)
        free = [i for i in range(NAMED_BARRIERS - 1, 2, -1) if i not in used]
        if -1 in used or len(free) < 2 * (len(groups) - 1):
            report[name] = {"groups": [list(g) for g in groups], "renumbered": False,
                            "reason": "not enough named barrier ids known free"}
            continue
        ids = {groups[0]: (1, 2)} | {g: (free[2 * k], free[2 * k + 1]) for k, g in enumerate(groups[1:])}

        def rename(call):
            group = _group(extern_name(call) or "")
            if group is None or ids[group[:2]] == (1, 2):
                return None
            first, second = ids[group[:2]]
            text = str(call.args[0].value).replace(group[2], f"tlx::NamedBarrierIds<{group[1]}, {first}, {second}>", 1)
            return tir.Call(call.dtype, call.op, [tir.StringImm(text), *call.args[1:]], call.span)

        body = tir.stmt_functor.ir_transform(func.body, None, rename, ["tirx.Call"])
        body = tir.AttrStmt(tir.IntImm("int32", 0), "pragma_import_c", tir.StringImm(PRELUDE), body)
        updates[name] = func.with_body(body)
        report[name] = {"groups": [list(g) for g in groups], "renumbered": True, "ids": [list(ids[g]) for g in groups]}
    if report:
        ctx.reports["reduce_barriers"] = report
    if not updates:
        return kernel
    new_mod = tvm.IRModule({gv: updates.get(gv.name_hint, f) for gv, f in mod.functions.items()}, attrs=mod.attrs)
    return kernel.with_device_mod(new_mod)
