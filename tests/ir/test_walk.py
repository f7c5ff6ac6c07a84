"""The one device walk: the verifier and the program model read the same ranges from a memory-moving
call, and a statement the walk cannot read leaves both verdicts unknown."""

from tilelang import tvm

from tests.passes.corpus import lowered
from tests.passes.layout_corpus import kernels as K
from tlx.ir.program import collect_program
from tlx.ir.tir import calls, device_functions, op_name
from tlx.ir.walk import pointer_uses, storage_scope
from tlx.lowering import lower
from tlx.passes.banks import banks_report
from tlx.passes.races import races_report
from tlx.passes.vectors import vectors_report
from tlx.passes.verification import verify_kernel

tir = tvm.tirx
TARGET = {"kind": "cuda", "arch": "sm_90a"}


def test_cp_async_range_is_the_same_for_verifier_and_program_model():
    """TileLang's ``tl.ptx_cp_async`` counts elements: 8 float16 (16 bytes) per thread here. The
    program model used to read the count as bytes, half the range the copy writes."""
    func, configs = K.gemm(configs=K.GEMM_SIMT_COPY)
    kernel = lower(func, TARGET, configs)
    [(_, device)] = list(device_functions(kernel.device_mod))
    copies = [c for c in calls(device) if op_name(c) == "tl.ptx_cp_async"]
    assert copies
    for copy in copies:
        dst, src = pointer_uses(copy, lambda data: storage_scope(data).startswith("shared"))
        assert (dst.write, dst.read, src.read, src.write) == (True, False, True, False)
        assert int(dst.elems) == int(src.elems) == 8
    modelled = [a for a in collect_program(kernel)[0].accesses if a.op == "ptx_cp_async"]
    assert modelled and all((a.width, a.extent_elems) == (16, 8) for a in modelled)
    checked = [a for a in verify_kernel(kernel).accesses if a.kind == "pointer" and a.scope.startswith("shared")]
    assert checked and all(a.index.endswith(" + 8)") for a in checked)


def test_unmodelled_statement_is_unknown_to_both():
    """A statement type the walk has no rule for (here a schedulable block left in device code)
    is an unknown verdict of every analysis (bounds, races, vectors, bank conflicts), not a
    silent descent into its body."""
    kernel = lowered("add_dynamic")
    [(name, func)] = list(device_functions(kernel.device_mod))
    block = tir.SBlockRealize([], tir.IntImm("bool", 1), tir.SBlock([], [], [], "opaque", func.body))
    gv = kernel.device_mod.get_global_var(name)
    wrapped = kernel.with_device_mod(tvm.IRModule({gv: func.with_body(block)}, attrs=kernel.device_mod.attrs))

    assert verify_kernel(kernel).checked == 3  # C = A + B
    report = verify_kernel(wrapped)
    [unknown] = report.unknowns()
    assert report.checked == 1 and report.proven == 0
    assert unknown.kind == "statement" and "SBlockRealize" in unknown.detail
    assert collect_program(kernel)[0].opaque == []
    assert collect_program(wrapped)[0].unread == ["SBlockRealize statement (not modelled)"]
    assert races_report(kernel)["verdict"] == "race-free" and races_report(wrapped)["verdict"] == "unknown"
    assert vectors_report(kernel)["unknown"] == 0 and vectors_report(wrapped)["unknown"] == 1
    assert banks_report(kernel)["unknown"] == 0 and banks_report(wrapped)["unknown"] == 1
