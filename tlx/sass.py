"""Work that ptxas placed behind a wgmma wait although it does not depend on the waited wgmma,
read from a kernel's SASS.

A kernel that overlaps tensor-core work with CUDA-core work (FlashAttention's softmax beside
``P V``) writes the elementwise work before ``wgmma.wait_group``. The wait has no register
operands, so ptxas may issue it early and the independent work after it, where it no longer
overlaps anything; the PTX shows the intended order, only the SASS the real one (seen in tlx's
dense attention forward: 54 of a key block's 66 exp2s after the wait for ``P V``). This module
finds such work: for every ``WARPGROUP.DEPBAR`` it takes the wgmma groups that the wait retires
(``gsb0`` commits simulated in address order), then follows the instructions after it up to the
next wgmma issue or loop end. An instruction there is *held* (must follow the wait) when it is a
memory, barrier, synchronisation or control instruction, reads a register (or predicate) that a
retired wgmma writes or a held instruction wrote, or writes a register a retired wgmma reads or
writes; every other instruction could have issued before the wait. Branches inside that stretch
are read straight through, and a destination the parser does not recognise counts as held, so
the count errs low: at least that much independent work waits.

The disassembler is ``nvdisasm`` or ``cuobjdump`` on ``PATH``, else the ``nvidia-cuda-nvdisasm``
wheel's (a dependency of tlx); without one, :func:`report` says so."""

from __future__ import annotations

import collections
import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Instruction", "disassembler", "functions", "operand_registers", "report", "waits_holding_free_work"]

# instructions that must stay after a wait whatever their operands: memory, barriers,
# synchronisation and control flow (a conservative list: an opcode not here is judged by its registers)
_HELD_PREFIXES = ("LD", "ST", "RED", "ATOM", "BAR", "SYNCS", "MEMBAR", "FENCE", "BRA", "BRX", "JMP", "CALL", "RET", "EXIT",
                  "WARPSYNC", "BSSY", "BSYNC", "WARPGROUP", "HGMMA", "UTMA", "UBLKCP", "ARRIVES", "ELECT", "NANOSLEEP",
                  "YIELD", "CCTL", "ERRBAR", "DEPBAR", "S2R", "S2UR", "CS2R", "VOTE", "MATCH", "BPT", "KILL")
# opcodes whose first operand is a predicate they write (the registers that follow are sources)
_PREDICATE_RESULT = re.compile(r"^(?:[FIDH]SETP|HSETP2|PLOP3|ISETP|FCHK|R2P|UISETP|UPLOP3|VOTE)")
ARITHMETIC = ("MUFU", "FFMA", "FADD", "FMUL", "FMNMX", "F2FP", "HFMA2", "HADD2", "HMUL2", "FSEL", "SHFL")
_REGISTER = re.compile(r"(?<![\w.])(U?R\d+|U?P\d)(?:\.(64|128))?")


@dataclass
class Instruction:
    address: int
    predicate: str | None  # the guarding predicate register ("P1"), or None
    opcode: str  # with its modifiers ("HGMMA.64x128x16.F32.BF16")
    operands: list[str] = field(default_factory=list)
    text: str = ""

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def disassembler() -> list[str] | None:
    """The command that prints a cubin's SASS, or None: ``nvdisasm`` or ``cuobjdump -sass`` on
    ``PATH``, else the ``nvidia-cuda-nvdisasm`` wheel's binary."""
    if shutil.which("nvdisasm"):
        return [shutil.which("nvdisasm"), "-c"]
    if shutil.which("cuobjdump"):
        return [shutil.which("cuobjdump"), "-sass"]
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return [str(candidate), "-c"]
    return None


def functions(sass: str) -> dict[str, list[Instruction]]:
    """The instructions of each function in ``sass`` (either disassembler's text), branch targets
    resolved to addresses (``nvdisasm`` names them by label)."""
    result: dict[str, list[Instruction]] = {}
    labels: dict[str, int] = {}
    name, pending = None, []
    for line in sass.splitlines():
        header = re.match(r"\s*(?:Function : (\S+)|\.text\.(\S+):)", line)
        if header:
            name = header.group(1) or header.group(2)
            result.setdefault(name, [])
            continue
        label = re.match(r"\s*(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if not m or name is None:
            continue
        address = int(m.group(1), 16)
        for lab in pending:
            labels[lab] = address
        pending = []
        words = m.group(2).split(None, 1)
        predicate = None
        if words and words[0].startswith("@"):
            predicate = words[0].lstrip("@!")
            words = words[1].split(None, 1) if len(words) > 1 else []
        if not words:
            continue
        operands = [o.strip() for o in words[1].split(",")] if len(words) > 1 else []
        result[name].append(Instruction(address, predicate, words[0], operands, m.group(2)))
    for body in result.values():  # `(.L_x_12) -> 0x1c0
        for ins in body:
            ins.operands = [re.sub(r"`\((\.L_x_\d+)\)", lambda x: hex(labels.get(x.group(1), -1)), o) for o in ins.operands]
    return result


def operand_registers(operand: str) -> list[str]:
    """The registers an operand names (``R4.64`` is R4 and R5; RZ / PT name none)."""
    regs = []
    for name, width in _REGISTER.findall(operand):
        prefix, number = re.match(r"(U?[RP])(\d+)", name).groups()
        count = {"64": 2, "128": 4}.get(width, 1) if prefix.endswith("R") else 1
        regs += [f"{prefix}{int(number) + i}" for i in range(count)]
    return regs


def _wgmma_registers(ins: Instruction) -> set[str]:
    """The registers an ``HGMMA`` writes (its accumulator: N/2 fp32 or N/4 fp16 registers a
    thread for m64nN) and reads from registers (the A fragment: 4 registers)."""
    shape = re.search(r"\.64x(\d+)x\d+\.(F32|F16|S32)", ins.opcode)
    n = int(shape.group(1)) if shape else 256
    acc_regs = n // 4 if shape and shape.group(2) == "F16" else n // 2
    regs: set[str] = set()
    if ins.operands and re.fullmatch(r"R\d+", ins.operands[0]):
        first = int(ins.operands[0][1:])
        regs |= {f"R{first + i}" for i in range(acc_regs)}
    if len(ins.operands) > 1 and re.fullmatch(r"R\d+", ins.operands[1]):
        first = int(ins.operands[1][1:])
        regs |= {f"R{first + i}" for i in range(4)}
    return regs


def _writes_and_reads(ins: Instruction) -> tuple[list[str], list[str]] | None:
    """(registers written, registers read), or None where the destination is not recognised."""
    regs = [operand_registers(o) for o in ins.operands]
    if not regs:
        return [], []
    if _PREDICATE_RESULT.match(ins.opcode):
        return regs[0] + (regs[1] if len(ins.operands) > 1 and re.fullmatch(r"U?P\w+", ins.operands[1]) else []), \
            sum(regs[1:], [])
    if ins.operands[0] in ("PT", "RZ", "URZ") or re.fullmatch(r"U?P\d", ins.operands[0]):
        if ins.base == "SHFL" and len(regs) > 1:  # SHFL PT, Rd, Ra, ...: the register after the predicate
            return regs[1], sum(regs[2:], [])
        return None
    if not regs[0]:
        return None
    return regs[0], sum(regs[1:], [])


def waits_holding_free_work(body: list[Instruction], minimum: int = 8) -> list[dict]:
    """The waits of one function after which at least ``minimum`` arithmetic instructions
    (``ARITHMETIC``) could have issued before the wait: ``{"offset", "wait", "in_loop" (a
    backward branch after the wait reaches back before it: the cost recurs), "retires" (wgmma
    instructions), "free" (opcode counts), "held" (instructions kept after the wait)}``."""
    # loops: backward branches before the last EXIT (after it ptxas puts the spin-wait retries,
    # whose branches back into the code are not loops)
    end = max((i.address for i in body if i.base == "EXIT"), default=body[-1].address if body else 0)
    loops = [(int(i.operands[-1], 16), i.address) for i in body if i.base == "BRA" and i.operands and i.address < end
             and i.operands[-1].startswith("0x") and 0 <= int(i.operands[-1], 16) <= i.address]
    findings = []
    groups: collections.deque[list[Instruction]] = collections.deque()
    current: list[Instruction] = []
    for index, ins in enumerate(body):
        if ins.base == "HGMMA":
            current.append(ins)
            if "gsb0" in ins.operands:
                groups.append(current)
                current = []
            continue
        wait = re.fullmatch(r"WARPGROUP\.DEPBAR\.LE", ins.opcode)
        if not wait or len(ins.operands) < 2:
            continue
        keep = int(ins.operands[1], 0)
        retired: list[Instruction] = []
        while len(groups) > keep:
            retired += groups.popleft()
        if not retired:
            continue
        touched = set().union(*(_wgmma_registers(w) for w in retired))
        held_regs = set(touched)
        free, held = collections.Counter(), 0
        for later in body[index + 1:]:
            backward = later.base == "BRA" and later.operands and later.operands[-1].startswith("0x") \
                and int(later.operands[-1], 16) <= later.address
            if later.opcode.startswith("WARPGROUP.ARRIVE") or later.base == "HGMMA" or backward \
                    or later.opcode.startswith("WARPGROUP.DEPBAR"):
                break
            access = _writes_and_reads(later)
            reads = (access[1] if access else []) + ([later.predicate] if later.predicate else [])
            if (later.base.startswith(_HELD_PREFIXES) or access is None or any(r in held_regs for r in reads)
                    or any(r in touched for r in access[0])):
                held += 1
                held_regs |= set(access[0]) if access else set()
            else:
                free[later.base] += 1
        arithmetic = {op: free[op] for op in ARITHMETIC if free[op]}
        if sum(arithmetic.values()) >= minimum:
            in_loop = any(start <= ins.address < end for start, end in loops)
            findings.append({"offset": hex(ins.address), "wait": ins.text, "in_loop": in_loop, "retires": len(retired),
                             "free": arithmetic, "held": held})
    return findings


def report(cubin: Path) -> dict:
    """``{"disassembler": name or None, "waits": {function: findings}}`` for a cubin (only the
    functions with a finding)."""
    command = disassembler()
    if command is None:
        return {"disassembler": None, "waits": {}}
    sass = subprocess.run([*command, str(cubin)], capture_output=True, text=True, check=True).stdout
    waits = {name: found for name, body in functions(sass).items() if (found := waits_holding_free_work(body))}
    return {"disassembler": Path(command[0]).name, "waits": waits}
