"""The one walk over a device function, and what its memory-moving calls touch.

Two analyses read a device function statement by statement in program order: the bounds
verifier (:mod:`tlx.passes.verification`, which carries a Z3 context) and the device program
model (:mod:`tlx.ir.program`, which carries the context races, bank conflicts and vector
legality read). Both are a :class:`DeviceWalker`: one dispatch over TIR statements, one table
of buffers and of pointer aliases (``handle_add_byte_offset``), and one rule for what the
walk does not know: a statement no ``visit_<Type>`` handles goes to :meth:`~DeviceWalker.unmodelled`,
which each analysis turns into an *unknown* verdict, never into a silent descent.

:func:`pointer_uses` is the one description of what a memory-moving intrinsic touches through
its ``tvm_access_ptr`` arguments (``cp.async``, ``ldmatrix`` / ``stmatrix``, any other call
handed a pointer): both analyses read ranges from it, so they cannot disagree about them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilelang import tvm

from tlx.ir.tir import const_int, elem_bytes, op_name

tir = tvm.tirx

__all__ = ["ACCESS_PTR", "CP_ASYNC", "MATRIX_MOVES", "DeviceWalker", "PointerUse", "is_access_ptr", "is_cp_async", "pointer_uses",
           "storage_scope"]

ACCESS_PTR = "tirx.tvm_access_ptr"
CP_ASYNC = ("tl.ptx_cp_async", "tirx.ptx_cp_async")
MATRIX_MOVES = ("tl.ptx_ldmatrix", "tirx.ptx_ldmatrix", "tl.ptx_stmatrix", "tirx.ptx_stmatrix")


def is_access_ptr(e) -> bool:
    return isinstance(e, tir.Call) and op_name(e) == ACCESS_PTR


def storage_scope(var) -> str:
    """The storage scope of a pointer variable's type (``""`` when it has none)."""
    ta = getattr(var, "type_annotation", None)
    return str(getattr(ta, "storage_scope", "")) if ta is not None else ""


@dataclass(frozen=True)
class PointerUse:
    """One ``tvm_access_ptr(type, data, offset, extent, rw)`` argument of a call, and the
    elements (of the pointer's type, from ``offset``) one thread really touches through it."""

    ptr: Any
    elems: Any  # PrimExpr
    read: bool
    write: bool
    predicate: Any = None  # touched only where this holds (cp.async's source), else None


def is_cp_async(call) -> bool:
    """A ``cp.async`` whose two pointers are ``tvm_access_ptr`` s (the form :func:`pointer_uses` models)."""
    return op_name(call) in CP_ASYNC and all(is_access_ptr(a) for a in call.args[:2])


def pointer_uses(call, is_shared) -> list[PointerUse]:
    """What ``call`` touches through its ``tvm_access_ptr`` arguments, in argument order.

    * ``ptx_cp_async(dst, src, n[, predicate])``: ``n`` elements (TileLang's ``tl.`` op) or
      bytes (TVM's ``tirx.`` op) are written to ``dst`` and read from ``src`` where the
      predicate holds (else the copy zero-fills).
    * ``ptx_ldmatrix(trans, num, smem, local)`` / ``ptx_stmatrix(trans, num, smem, ...)``:
      each lane's shared address is one 16-byte matrix row and each lane holds ``num``
      32-bit registers, whatever element type the pointers carry (TileLang's extents count
      16-bit units). ``is_shared(data var)`` says which pointer is the shared one.
    * any other call: each pointer's own extent, read and written as its mask says.
    """
    name = op_name(call)
    if is_cp_async(call):
        dst, src, count = call.args[0], call.args[1], call.args[2]
        n = count
        if name == "tirx.ptx_cp_async":
            n = tir.floordiv(count, elem_bytes(dst.args[0].dtype))
        predicate = call.args[3] if len(call.args) > 3 else None
        return [PointerUse(dst, n, False, True), PointerUse(src, n, True, False, predicate)]
    if name in MATRIX_MOVES:
        loads = "ldmatrix" in name
        out = []
        for arg in call.args[2:]:
            if not is_access_ptr(arg):
                continue
            shared = is_shared(arg.args[1])
            touched = tir.IntImm("int32", 16) if shared else call.args[1] * 4
            out.append(PointerUse(arg, tir.floordiv(touched, elem_bytes(arg.args[0].dtype)), loads == shared, loads != shared))
        return out
    out = []
    for arg in call.args:
        if is_access_ptr(arg):
            rw = const_int(arg.args[4]) or 3
            out.append(PointerUse(arg, arg.args[3], bool(rw & 1), bool(rw & 2)))
    return out


def pointer_alias(value):
    """``(q, byte offset)`` when a handle binding's ``value`` points into ``q``:
    ``handle_add_byte_offset(q, n)`` (TileLang's carve-outs of the dynamic shared memory),
    ``address_of(q[i])`` of a flat buffer (a view made with ``T.make_tensor_from_addr``), or ``q``
    itself (another name for it); None for anything else."""
    if isinstance(value, tir.Call) and op_name(value) == "tirx.address_of" and isinstance(value.args[0], tir.BufferLoad) \
            and len(value.args[0].indices) == 1 and value.args[0].indices[0].dtype.lanes == 1:
        load = value.args[0]
        return load.buffer.data, load.indices[0] * elem_bytes(load.buffer.dtype)
    if isinstance(value, tir.Call) and op_name(value) == "tirx.handle_add_byte_offset":
        return value.args[0], value.args[1]
    if isinstance(value, tir.Var) and str(value.dtype) == "handle":
        return value, tir.IntImm("int64", 0)
    return None


class DeviceWalker:
    """Program-order walk over one device function's statements.

    Subclasses define ``visit_<StatementType>`` for what they read; a statement without one
    goes to :meth:`unmodelled`. The walker keeps the buffers declared so far (``buffers``:
    data var -> Buffer) and the pointer aliases (``aliases``: handle var -> (root data var,
    byte offset)) that ``Bind(p, handle_add_byte_offset(q, n))`` statements create.
    """

    def __init__(self, func: str):
        self.func = func
        self.buffers: dict = {}
        self.aliases: dict = {}

    def visit(self, s) -> None:
        method = getattr(self, "visit_" + type(s).__name__, None)
        if method is None:
            self.unmodelled(s)
        else:
            method(s)

    def unmodelled(self, s) -> None:
        """A statement this walk cannot read: each analysis records it as unknown."""
        raise NotImplementedError(f"{type(self).__name__}.unmodelled")

    def visit_SeqStmt(self, s) -> None:
        for x in s.seq:
            self.visit(x)

    def visit_DeclBuffer(self, s) -> None:
        self.buffers.setdefault(s.buffer.data, s.buffer)

    def visit_AllocBuffer(self, s) -> None:
        self.buffers[s.buffer.data] = s.buffer

    def note_alias(self, s) -> bool:
        """Record a binding of ``p`` to a pointer into another allocation (:func:`pointer_alias`):
        ``p``'s root allocation and byte offset. False for any other binding."""
        target = pointer_alias(s.value)
        if target is None:
            return False
        base, off = target
        if base in self.aliases:
            root, off0 = self.aliases[base]
            self.aliases[s.var] = (root, off0 + off)
        else:
            self.aliases[s.var] = (base, off)
        return True

    def root_of(self, data) -> tuple[Any, Any]:
        """(root data var, byte offset) of a pointer: itself at 0 unless it is an alias."""
        return self.aliases.get(data, (data, 0))

    def is_shared(self, data) -> bool:
        """Whether a pointer points into shared memory (its root buffer's scope, else its type's)."""
        buf = self.buffers.get(self.root_of(data)[0])
        scope = str(buf.scope()) if buf is not None else storage_scope(data)
        return scope.startswith("shared")
