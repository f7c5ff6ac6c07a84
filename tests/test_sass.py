"""tlx.sass on SASS written here (both disassemblers' formats), where which instructions could
issue before a wgmma wait is known by construction; the compiled kernels' reports are tested
with the kernels (tests/kernels/attention/test_dense_fwd_compile.py)."""

import textwrap

import pytest

from tlx import sass


def _cuobjdump(lines: list[str]) -> str:
    """A cuobjdump listing of one function with ``lines`` at 0x0, 0x10, ..."""
    body = "\n".join(f"        /*{16 * i:04x}*/                   {line} ;" for i, line in enumerate(lines))
    return "\n\tcode for sm_90a\n\t\tFunction : k\n\t.headerflags\t@\"EF_CUDA_SM90\"\n" + body + "\n"


# a key loop as the dense forward's: S = Q K^T into R88.., P V (P in R152..R155) into R24..R87
LOOP = [
    "WARPGROUP.ARRIVE",  # 0x00: the loop head
    "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], RZ, !UPT, gsb0",  # S
    "HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR8].tnspB, R24, gsb0",  # P V
    "WARPGROUP.DEPBAR.LE gsb0, 0x1",  # 0x30: S done
    "FMNMX R5, R88, R89, !PT",
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",  # 0x50: P V done
    "MUFU.EX2 R88, R88",  # free: S's registers are not P V's
    "MUFU.EX2 R89, R89",
    "FADD R6, R88, R89",  # free: reads free results only
    "FMUL R7, R24, R6",  # held: reads P V's accumulator
    "FADD R8, R7, 1",  # held: reads a held result
    "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR9], RZ",  # held: synchronisation
    "F2FP.BF16.F32.PACK_AB R152, R89, R88",  # held: overwrites P V's A fragment
    "SHFL.BFLY PT, R9, R6, 0x2, 0x1f",  # free: the register after the predicate is written
    "FSETP.GT.AND P0, PT, R8, RZ, PT",  # held: reads R8
    "@P0 FADD R10, R6, R6",  # held: its predicate is held
    "FFMA R11, R6, R6, R6",  # free
    "ISETP.NE.AND P1, PT, R5, RZ, PT",
    "@!P1 BRA 0x0",  # the back edge
    "EXIT",
]


def test_free_work_after_a_wait_is_counted_and_dependent_work_is_not():
    (body,) = sass.functions(_cuobjdump(LOOP)).values()
    assert [i.opcode for i in body[:2]] == ["WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16"]
    found = sass.waits_holding_free_work(body, minimum=1)
    assert found == [{"offset": "0x50", "wait": "WARPGROUP.DEPBAR.LE gsb0, 0x0", "in_loop": True, "retires": 1,
                      "free": {"MUFU": 2, "FFMA": 1, "FADD": 1, "SHFL": 1}, "held": 6}]
    # ISETP (free, not arithmetic) is not counted; after the wait for S only FMNMX, which reads S: held
    assert sass.waits_holding_free_work(body, minimum=6) == []


def test_a_wait_outside_any_loop_and_the_retry_stubs_after_exit():
    """Backward branches after the last EXIT (ptxas's spin-wait retries) are not loops."""
    lines = ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
             *["MUFU.RCP R90, R90"] * 8, "EXIT", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R9", "BRA 0x10"]
    (body,) = sass.functions(_cuobjdump(lines)).values()
    (found,) = sass.waits_holding_free_work(body)
    assert found["in_loop"] is False and found["free"] == {"MUFU": 8}


def test_nvdisasm_labels_resolve_to_addresses():
    listing = textwrap.dedent("""\
        //--------------------- .text.k --------------------------
        \t.section\t.text.k,"ax",@progbits
        .text.k:
                /*0000*/                   MOV R1, R2 ;
        .L_x_3:
                /*0010*/                   FADD R1, R1, R1 ;
                /*0020*/              @!P0 BRA `(.L_x_3) ;
                /*0030*/                   EXIT ;
        """)
    (body,) = sass.functions(listing).values()
    branch = body[2]
    assert (branch.predicate, branch.base, branch.operands) == ("P0", "BRA", ["0x10"])


@pytest.mark.parametrize("operand, registers", [("R4.64", ["R4", "R5"]), ("-|R7|", ["R7"]), ("[R4+UR9+0x10]", ["R4", "UR9"]),
                                                ("R2.reuse", ["R2"]), ("RZ", []), ("PT", []), ("!P3", ["P3"])])
def test_operand_registers(operand, registers):
    assert sass.operand_registers(operand) == registers


def test_report_without_a_disassembler(monkeypatch, tmp_path):
    monkeypatch.setattr(sass, "disassembler", lambda: None)
    assert sass.report(tmp_path / "k.cubin") == {"disassembler": None, "waits": {}}
