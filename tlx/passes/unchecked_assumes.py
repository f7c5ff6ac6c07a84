"""A program's ``T.assume`` that nothing checks.

TileLang hoists ``T.assume(cond)`` to a host assert, which tlx's launcher checks
(tlx/hostgen/plan.py), only when ``cond`` names the kernel's parameters alone. One that names
anything else (a block or thread index, a value loaded from memory, a loop variable) stays in the
device code as a fact TileLang's simplifier may use, to drop a bounds guard for instance, and
nothing ever checks it; tlx's proofs leave it out too (tlx/passes/verification.py takes a
``tl.assume`` only where the launcher checks it), so an access whose guard it dropped is reported
unknown. This pass names each such assumption with the names that keep it on the device, so that
a wrong one cannot pass silently. It only reads the kernel.
"""

from __future__ import annotations

import warnings

from tilelang import tvm

from tlx.ir.facts import launcher_checks
from tlx.ir.tir import device_functions, free_vars
from tlx.lowering import LoweredKernel
from tlx.passes import PassContext
from tlx.passes.assume import shape_vars

tir = tvm.tirx

__all__ = ["unchecked_assumes", "unchecked_assumes_pass"]

_PREFIX = "Assume: "  # TileLang's message for a program's T.assume (not its own buffer-shape facts)


def _in_program_order(body) -> list:
    """The AttrStmts of ``body``, outer before inner (an assumption's scope holds the ones after it)."""
    found = []

    def visit(n) -> bool:
        if isinstance(n, tir.AttrStmt):
            found.append(n)
        return True

    tir.stmt_functor.pre_order_visit(body, visit)
    return found


def unchecked_assumes(kernel: LoweredKernel) -> list[dict]:
    """Each device-side ``T.assume`` of the program that the launcher does not check: its text
    (as the program wrote it) and the names in it that are not the kernel's parameters."""
    checked = launcher_checks(kernel)
    params = set(shape_vars(kernel.prim_func))
    out, seen = [], set()
    for _, func in device_functions(kernel.device_mod):
        for attr in _in_program_order(func.body):
            message = getattr(attr.value, "value", None)
            if attr.attr_key != "tl.assume" or not isinstance(message, str) or not message.startswith(_PREFIX):
                continue
            if not isinstance(attr.node, tvm.ir.PrimExpr) or str(attr.node) in checked:
                continue
            text = message[len(_PREFIX):]
            if text not in seen:
                seen.add(text)
                out.append({"condition": text, "names": sorted({v.name for v in free_vars(attr.node)} - params)})
    return out


def unchecked_assumes_pass(kernel: LoweredKernel, ctx: PassContext) -> LoweredKernel:
    found = unchecked_assumes(kernel)
    ctx.reports["unchecked_assumes"] = found
    for a in found:
        names = ", ".join(a["names"]) or "no parameter the launcher binds"
        warnings.warn(f"{kernel.name}: T.assume({a['condition']}) is checked nowhere: it names {names}, so TileLang "
                      "keeps it on the device (it hoists to the launcher only conditions over the kernel's parameters) "
                      "and may simplify the code with it; tlx's proofs do not use it", UserWarning, stacklevel=2)
    return kernel
