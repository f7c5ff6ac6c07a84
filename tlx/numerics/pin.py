"""Layout pinning: record every compile decision that fixes accumulation or reduction order,
and hold later compiles to it.

A pin file (``NAME.pin.json``, written by ``tlx pin FILE.py::NAME``) holds:

- ``pass_configs``: the explicit pass configs of the pinned compile (re-applied);
- ``fragments``: every register-fragment layout as inferred (input shape, thread and index
  expressions, replication), re-applied with ``T.annotate_layout``: a fragment's layout
  decides which thread holds which element, hence the order of every reduction over it;
- ``decisions``: what TileLang decided, each compared on every pinned compile —
  ``layouts`` (every shared/fragment layout after LayoutInference, swizzles included, as
  TileLang prints them; a fragment's thread mapping is its warp partition), ``gemm`` (each
  MMA/WGMMA instruction with its shape and operand types), ``reduce`` (the cross-thread
  reduction and scan templates, which name their strategy), ``pipeline`` (num_stages of each
  pipelined loop, warp specialization), ``launch`` (grid, block and shared memory of each
  device kernel), ``tma`` (TMA descriptor parameters: box, swizzle, interleave, L2 promotion)
  and ``numerics`` (the nvcc floating-point flags).

A compile with ``pin=PATH`` lowers the kernel once, with the pinned fragment layouts annotated
and the pinned pass configs (:func:`lower_pinned`; an explicit request that contradicts the pin
is an error), and its first pass (:func:`pin_pass`) compares every decision and raises
:class:`PinMismatchError` naming each one that differs, or naming the fragment whose layout TileLang can no longer honour. Shared-memory layouts are
checked, not forced: they only move addresses (the arithmetic is the same whatever the
swizzle), and TileLang stage-expands them during lowering, so a recorded one cannot always be
handed back to ``T.annotate_layout``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tilelang import tvm

from tlx.ir.tir import calls, device_functions, extern_name, op_name
from tlx.lowering import lower, normalize_target
from tlx.numerics.modes import nvcc_flags
from tlx.passes import TlxError

__all__ = ["PIN_VERSION", "PinFileError", "PinMismatchError", "annotate_fragments", "load_pin", "lower_pinned", "pin_kernel_file", "pin_pass", "pinned_pass_configs", "record"]

PIN_VERSION = 2
DECISIONS = ("layouts", "gemm", "reduce", "pipeline", "launch", "tma", "numerics")


class PinMismatchError(TlxError, RuntimeError):
    """The compiler no longer makes a pinned decision."""


class PinFileError(PinMismatchError, ValueError):
    """The pin file is missing or malformed (a ValueError; also a PinMismatchError, so a
    compile with that pin stops instead of going on unpinned)."""


def _layout_map(layout_mod):
    """(buffer name, layout) for every ``layout_map`` annotation after LayoutInference."""
    if layout_mod is None:
        return []
    found = []
    for _, func in device_functions(layout_mod):

        def visit(node):
            if isinstance(node, tvm.tirx.SBlock) and "layout_map" in node.annotations:
                found.extend((getattr(var, "name", str(var)), layout) for var, layout in node.annotations["layout_map"].items())

        tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    return found


def _layouts(layout_mod) -> dict:
    return dict(sorted((name, f"{type(layout).__name__}: {layout}") for name, layout in _layout_map(layout_mod)))


def _fragments(layout_mod) -> dict:
    """Each fragment layout as data that :func:`_rebuild_fragment` turns back into a Fragment.

    The thread expression is kept with the first thread of the fragment's range and re-applied
    offset by it, so a warp-specialized consumer's fragment lands on the same threads."""
    from tilelang.layout import Fragment

    out = {}
    for name, layout in _layout_map(layout_mod):
        if isinstance(layout, Fragment):
            tr = layout.thread_range
            out[name] = {
                "shape": [int(d) for d in layout.get_input_shape()],
                "vars": [v.name for v in layout.get_forward_vars()],
                "thread": str(layout.forward_thread),
                "thread_offset": int(tr.min) if tr is not None else 0,
                "index": [str(e) for e in layout.forward_index],
                "replicate": int(layout.replicate_size),
            }
    return dict(sorted(out.items()))


def _rebuild_fragment(name: str, spec: dict, path: str):
    """A Fragment from its pinned data (the expressions are TileLang's printed TIR: Python
    arithmetic over the layout's variables, ``//`` and ``%`` being floor division and modulo)."""
    import tilelang.language as T
    from tilelang.layout import Fragment

    inputs = [v for v in spec["vars"] if v != "_rep"]

    def scope(args):
        env = {"T": T, **dict(zip(inputs, args))}
        if len(args) > len(inputs):
            env["_rep"] = args[len(inputs)]
        return env

    def thread(*args):
        return eval(spec["thread"], {"__builtins__": {}}, scope(args)) + spec["thread_offset"]  # noqa: S307 - pin data, no builtins

    def index(*args):
        exprs = [eval(e, {"__builtins__": {}}, scope(args)) for e in spec["index"]]  # noqa: S307
        return exprs[0] if len(exprs) == 1 else exprs

    try:
        return Fragment(spec["shape"], forward_thread_fn=thread, replicate=spec["replicate"], forward_index_fn=index)
    except Exception as e:  # a malformed or hand-edited expression
        raise PinFileError(f"pin {path}: cannot rebuild the layout of fragment {name!r} ({type(e).__name__}: {e})") from None


def annotate_fragments(prim_func, fragments: dict, path: str = ""):
    """``prim_func`` with each pinned fragment layout annotated on the block that allocates the
    buffer (``T.annotate_layout``); a pinned fragment missing from the program is an error."""
    seen: set = set()

    def annotate(block):
        if not isinstance(block, tvm.tirx.SBlock):
            return None
        pinned = {b.data: _rebuild_fragment(b.name, fragments[b.name], path) for b in block.alloc_buffers if b.name in fragments}
        if not pinned:
            return None
        seen.update(b.name for b in block.alloc_buffers if b.name in fragments)
        annotations = dict(block.annotations)
        annotations["layout_map"] = {**dict(annotations.get("layout_map", {})), **pinned}
        return tvm.tirx.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body, block.init,
                               block.alloc_buffers, block.match_buffers, annotations)  # fmt: skip

    body = tvm.tirx.stmt_functor.ir_transform(prim_func.body, None, annotate, ["tirx.SBlock"])
    missing = sorted(set(fragments) - seen)
    if missing:
        raise PinMismatchError(f"pin {path}: fragment(s) {', '.join(missing)} no longer exist in the kernel")
    return prim_func.with_body(body)


def _gemm_and_reduce(device_mod) -> tuple[list, list]:
    gemm, reduce = [], set()
    for fname, func in device_functions(device_mod):
        for call in calls(func):
            op = op_name(call)
            if "mma" in op.rsplit(".", 1)[-1]:
                consts = [str(a.value) if isinstance(a, tvm.tirx.StringImm) else int(a)
                          for a in call.args if isinstance(a, (tvm.tirx.StringImm, tvm.tirx.IntImm))]  # fmt: skip
                entry = f"{fname}: {op}({', '.join(map(str, consts))})"
                if entry not in gemm:
                    gemm.append(entry)
            ext = extern_name(call)
            if ext and ext.startswith("tl::") and any(k in ext for k in ("Reduce", "Scan", "gemm", "Gemm")):
                reduce.add(f"{fname}: {ext}")
    return gemm, sorted(reduce)


def _pipeline_and_launch(kernel) -> tuple[dict, dict]:
    stages: dict = {}

    def visit(node):
        if isinstance(node, tvm.tirx.For) and "num_stages" in node.annotations:
            stages[node.loop_var.name] = int(node.annotations["num_stages"])

    tvm.tirx.stmt_functor.post_order_visit(kernel.prim_func.body, visit)
    launch: dict = {}
    for fname, func in device_functions(kernel.device_mod):
        attrs = func.attrs or {}
        warp_specialized = []
        tvm.tirx.stmt_functor.post_order_visit(
            func.body,
            lambda n: warp_specialized.append(1) if isinstance(n, tvm.tirx.AttrStmt) and n.attr_key == "kWarpSpecializationScope" else None,
        )
        launch[fname] = {
            "thread_extent": {str(k): str(v) for k, v in (attrs["thread_extent"].items() if "thread_extent" in attrs else [])},
            "dyn_shared_memory": str(attrs["dyn_shared_memory_buf"]) if "dyn_shared_memory_buf" in attrs else "0",
            "warp_specialized": bool(warp_specialized),
        }
    return {"num_stages": dict(sorted(stages.items()))}, launch


def _tma(host_mod) -> dict:
    out = {}
    for _, func in device_functions(host_mod):
        attrs = func.attrs or {}
        if "tma_descriptor_args" in attrs:
            for desc, args in attrs["tma_descriptor_args"].items():
                out[desc.name] = [str(a) for a in args]
    return dict(sorted(out.items()))


def record(kernel, numerics: str = "default") -> dict:
    """The order-affecting decisions of one lowered kernel, as JSON-able data."""
    gemm, reduce = _gemm_and_reduce(kernel.device_mod)
    pipeline, launch = _pipeline_and_launch(kernel)
    fast_math = bool((kernel.pass_configs or {}).get("tl.enable_fast_math", False))
    return {
        "layouts": _layouts(kernel.layout_mod),
        "gemm": gemm,
        "reduce": reduce,
        "pipeline": pipeline,
        "launch": launch,
        "tma": _tma(kernel.host_mod),
        "numerics": [*nvcc_flags(numerics), *(["--use_fast_math"] if fast_math else [])],
    }


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def pin_kernel_file(prim_func, options, *, name: str, kernel_file: Path, output: str | Path | None = None) -> Path:
    """Lower ``prim_func`` with ``options``, record its decisions and write the pin file
    (``NAME.pin.json`` beside ``kernel_file`` unless ``output`` is given); returns its path."""
    target = normalize_target(options.target_dict())
    pass_configs = options.pass_config_dict()
    kernel = lower(prim_func, target, pass_configs, name=name)
    import tilelang

    data = {
        "version": PIN_VERSION,
        "kernel": name,
        "target": target,
        "tilelang": tilelang.__version__,
        "pass_configs": {k: _jsonable(v) for k, v in sorted(pass_configs.items())},
        "fragments": _fragments(kernel.layout_mod),
        "decisions": record(kernel, options.numerics),
    }
    path = Path(output) if output is not None else Path(kernel_file).parent / f"{name}.pin.json"
    if path.is_file():  # keep the configurations tlx.autotune recorded in the same file
        previous = json.loads(path.read_text())
        if isinstance(previous, dict) and "autotune" in previous:
            data["autotune"] = previous["autotune"]
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def load_pin(path: str | Path) -> dict:
    """Read and validate a pin file; raises PinFileError naming the file and what is wrong."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise PinFileError(f"pin: file {str(p)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise PinFileError(f"pin: {str(p)!r} is not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("version") != PIN_VERSION:
        got = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise PinFileError(f"pin: {str(p)!r}: expected version {PIN_VERSION}, got {got!r}")
    missing = [k for k in ("pass_configs", "fragments", "decisions") if not isinstance(data.get(k), dict)]
    missing += [f"decisions.{k}" for k in DECISIONS if k not in data.get("decisions", {})]
    if missing:
        raise PinFileError(f"pin: {str(p)!r} lacks {', '.join(missing)}")
    return data


def pinned_pass_configs(requested: dict, pin: dict, path: str = "") -> dict:
    """The requested pass configs plus the pinned ones; a contradiction is a PinMismatchError."""
    merged = dict(requested)
    for key, value in pin["pass_configs"].items():
        if key in requested and _jsonable(requested[key]) != value:
            raise PinMismatchError(
                f"pin {path}: pass config {key} is pinned to {value!r} but this compile requests {requested[key]!r}"
            )
        merged[key] = value
    return merged


def _differences(pinned, actual, where: str) -> list[str]:
    if isinstance(pinned, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(pinned) | set(actual)):
            if k not in actual:
                out.append(f"{where}.{k}: pinned {pinned[k]!r}, now absent")
            elif k not in pinned:
                out.append(f"{where}.{k}: not in the pin, now {actual[k]!r}")
            else:
                out += _differences(pinned[k], actual[k], f"{where}.{k}")
        return out
    return [] if pinned == actual else [f"{where}: pinned {pinned!r}, now {actual!r}"]


def lower_pinned(prim_func, target: dict, pass_configs: dict, path: str, name: str):
    """Lower ``prim_func`` under pin ``path``: its pass configs merged into ``pass_configs`` and
    its fragment layouts annotated. Returns the lowered kernel; its ``pass_configs`` are the
    merged ones, which code generation and nvcc then use too. ``prim_func`` stays the program
    as written (the host launcher is generated from it)."""
    pin = load_pin(path)
    merged = pinned_pass_configs(pass_configs, pin, path)
    annotated = annotate_fragments(prim_func, pin["fragments"], path) if pin["fragments"] else prim_func
    try:
        kernel = lower(annotated, target, merged, name=name)
    except tvm.error.InternalError as e:
        lines = [line.strip() for line in str(e).strip().splitlines()]
        conflict = next((line for line in lines if "different layout for" in line), None)
        what = (f"fragment {conflict.rsplit(' ', 1)[-1]}: the pinned layout conflicts with the one TileLang now "
                f"requires ({next((line for line in lines if line.startswith('current layout')), '')})") if conflict else lines[0]  # fmt: skip
        raise PinMismatchError(f"pin {path}: kernel {name!r} can no longer honour the pin: {what}") from None
    return dataclasses.replace(kernel, prim_func=prim_func)


def pin_pass(kernel, ctx):
    """Compare every decision of ``kernel`` (lowered by :func:`lower_pinned`) with the pin's."""
    path = str(ctx.options.pin)
    pin = load_pin(path)
    actual = json.loads(json.dumps(record(kernel, ctx.options.numerics)))
    for name in pin["fragments"]:
        # A re-applied fragment prints as an annotation (absolute thread expression, no range),
        # not as inferred; LayoutInference holds annotated layouts strictly (a conflict raises
        # in lower_pinned), so a present fragment is the pinned one.
        if name in actual["layouts"] and name in pin["decisions"]["layouts"]:
            actual["layouts"][name] = pin["decisions"]["layouts"][name]
    diffs = _differences(pin["decisions"], actual, "decisions")
    if diffs:
        raise PinMismatchError(
            f"pin {path}: kernel {kernel.name!r} no longer compiles to the pinned decisions "
            f"({len(diffs)} differ):\n  " + "\n  ".join(diffs[:20])
        )
    ctx.reports["pin"] = {
        "file": path,
        "reapplied_pass_configs": sorted(pin["pass_configs"]),
        "reapplied_fragments": sorted(pin["fragments"]),
        "decisions_checked": len(DECISIONS),
    }
    return kernel
