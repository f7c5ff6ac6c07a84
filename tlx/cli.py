"""The ``tlx`` command line: show generated code, check, pin and time kernels.

A kernel is named ``FILE.py::NAME`` where NAME is a ``@T.prim_func``, or a ``@tlx.jit`` /
``@tilelang.jit`` kernel factory whose arguments come from ``--param k=v`` (``v`` an
integer, a float, a string, or ``dynamic`` for a symbolic dimension named ``k``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _parse_value(text: str, key: str):
    if text == "dynamic":
        import tilelang.language as T

        return T.dynamic(key)
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text in ("True", "False"):
        return text == "True"
    return text


def _parse_params(items: list[str]) -> dict[str, Any]:
    params = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"tlx: --param expects k=v, got {item!r}")
        k, v = item.split("=", 1)
        params[k] = _parse_value(v, k)
    return params


def load_kernel(spec: str, params: dict[str, Any]):
    """Return (prim_func, tlx Options, source, display name) for ``FILE.py::NAME``; the source
    (the factory, or a prim_func's own definition) gives ``tlx check`` its source lines."""
    from tlx.jit import JITFunction, jit_options, program_options
    from tlx.options import Options
    from tlx.passes.check import KernelSource

    if "::" not in spec:
        raise SystemExit(f"tlx: expected FILE.py::NAME, got {spec!r}")
    path, name = spec.rsplit("::", 1)
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"tlx: no such file: {path}")
    sys.path.insert(0, str(file.resolve().parent))
    mod_spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[file.stem] = module
    _user_code(f"cannot import {path}", lambda: mod_spec.loader.exec_module(module))
    if not hasattr(module, name):
        raise SystemExit(f"tlx: {path} has no attribute {name!r}")
    obj = getattr(module, name)
    from tilelang import tvm

    building = f"cannot build {name}"
    # the options of each kernel with what its program declares (function-level pass configs,
    # T.empty outputs, compile flags) merged in, as a build of it takes them
    if isinstance(obj, JITFunction):
        prim = _user_code(building, lambda: obj.get_tir(**params))
        return prim, obj.build_options(prim), obj, name
    if isinstance(obj, tvm.tirx.PrimFunc):
        if params:
            raise SystemExit(f"tlx: {name} is a prim_func; --param applies to kernel factories only")
        return obj, program_options(Options.make(), obj, {}), KernelSource.named(file, name), name
    if hasattr(obj, "get_tir") and callable(obj.get_tir):  # a ``tilelang.jit`` factory: its own keywords
        prim = _user_code(building, lambda: obj.get_tir(**params))
        options = jit_options({"out_idx": getattr(obj, "out_idx", None), "pass_configs": getattr(obj, "pass_configs", None)},
                              getattr(obj, "compile_flags", None))
        return prim, program_options(options, prim, options.pass_config_dict()), obj, name
    if callable(obj):
        prim = _user_code(building, lambda: obj(**params))
        options = program_options(Options.make(), prim, {}) if isinstance(prim, tvm.tirx.PrimFunc) else Options.make()
        return prim, options, obj, name
    raise SystemExit(f"tlx: {name} is neither a prim_func nor a kernel factory")


class KernelLoadError(Exception):
    """The user's module or kernel factory raised: no verdict, and not a failure of tlx."""


def _user_code(what: str, run):
    """``run()``, with an exception from the user's code (other than a tlx verdict) turned into a
    :class:`KernelLoadError` naming ``what`` failed."""
    from tlx.passes import TlxError

    try:
        return run()
    except (TlxError, SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001  (whatever the user's code raises)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise KernelLoadError(f"{what}: {type(e).__name__}: {first}") from e


def _with_cli_options(options, args):
    """The kernel's options with the command line's target (default sm_90a) and assumptions."""
    changes = {}
    if args.target:
        changes["target"] = {"kind": "cuda", "arch": args.target}
    elif options.target in (None, "auto", "cuda"):  # the machine's GPU, which a check needs none of
        changes["target"] = {"kind": "cuda", "arch": "sm_90a"}
    if args.assume:
        changes["assume"] = (*options.assume, *args.assume)
    return options.replace(**changes)


def _cmd_source(args, stage: str) -> int:
    """Print the source a stage produces ("cuda" or "launcher"), stopping the pipeline there."""
    from tlx.compiler import compile_artifacts

    prim, options, _, name = load_kernel(args.kernel, _parse_params(args.param))
    options = _with_cli_options(options, args)
    source, _ = compile_artifacts(prim, options, name=name, stop_after=stage)
    print(source, end="")
    return 0


def _cmd_check(args) -> int:
    """The compile pipeline up to its passes, reporting instead of raising: the bounds verdict of
    the ``check`` pass, every other pass's report as a section, and the exit status of the
    analyses ``--only`` names (see :mod:`tlx.passes.check`)."""
    import warnings

    from tlx.compiler import compile_artifacts
    from tlx.passes.check import ANALYSES, DECIDING_BY_DEFAULT

    deciding = _only(args)
    prim, options, source, name = load_kernel(args.kernel, _parse_params(args.param))
    chosen = DECIDING_BY_DEFAULT if args.only is None and not args.bounds_only else deciding
    run = set(ANALYSES) if args.only is None and not args.bounds_only else set(deciding)
    skip = [ANALYSES[a][0] for a in ANALYSES if a not in run and a != "bounds"]
    options = _with_cli_options(options, args).replace(verify="warn", eliminate_guards=False, report_only=True, skip_passes=skip)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, build = compile_artifacts(prim, options, name=name, stop_after="passes", source=source)
    result = build.passes.check
    if result is None:
        failure = build.reports.get("check", {}).get("error", "no result")
        raise RuntimeError(f"the bounds verifier failed on {name}: {failure}")
    result.deciding = tuple(a for a in ANALYSES if a in chosen)
    by_pass = {pass_name: (analysis, section) for analysis, (pass_name, section) in ANALYSES.items()}
    for section, report in build.reports.items():
        if section in by_pass and isinstance(report, dict) and report.get("status") == "failed":
            result.errors[by_pass[section][0]] = report.get("error", "failed")  # a pass that raised
        elif section not in ("check", "bounds"):
            result.add_section(section, report)
    print(json.dumps(result.to_json(), indent=1, default=str) if args.json else result.human())
    return result.exit_code


def _only(args) -> tuple[str, ...]:
    """The analyses ``--only`` (or ``--bounds-only``) names, checked against ``ANALYSES``."""
    from tlx.passes.check import ANALYSES

    if args.bounds_only:
        return ("bounds",)
    if args.only is None:
        return tuple(ANALYSES)
    names = tuple(n.strip() for n in args.only.split(",") if n.strip())
    unknown = [n for n in names if n not in ANALYSES]
    if unknown or not names:
        raise UsageError(f"--only: expected a comma-separated list among {', '.join(ANALYSES)}, got {args.only!r}")
    return names


def _cmd_pin(args) -> int:
    from tlx.numerics import pin

    prim, options, source, name = load_kernel(args.kernel, _parse_params(args.param))
    options = _with_cli_options(options, args)
    out = pin.pin_kernel_file(prim, options, name=name, kernel_file=Path(args.kernel.rsplit("::", 1)[0]), output=args.output)
    print(f"wrote {out}")
    return 0


def _cmd_bench(args) -> int:
    import torch

    from tlx.compiler import compile_kernel

    if not torch.cuda.is_available():
        print("tlx bench: no GPU is visible", file=sys.stderr)
        return 2
    prim, options, _, name = load_kernel(args.kernel, _parse_params(args.param))
    options = _with_cli_options(options, args)
    kernel = compile_kernel(prim, options, name=name)
    dims = _parse_params(args.dim)
    inputs = random_arguments(kernel, dims)
    ms = time_kernel(kernel.launch, inputs, args.iters)
    nbytes = sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))
    print(f"| kernel | median ms | GB/s (all arguments once) |\n| --- | --- | --- |\n| {name} | {ms:.4f} | {nbytes / ms / 1e6:.1f} |")
    return 0


def random_arguments(kernel, dims: dict[str, int]) -> list:
    """Fresh random arguments for every parameter, sized by ``dims`` for symbolic extents."""
    import torch

    from tlx.kernel import output_extent, torch_dtype

    args = []
    for p in sorted(kernel.metadata["params"], key=lambda p: p["index"]):
        if p["kind"] == "scalar":
            args.append(1.0 if p["dtype"].startswith("float") else 1)
            continue
        shape = [output_extent(d, kernel.name, p["name"])(dims) for d in p["storage_shape"]]
        dtype = torch_dtype(p["storage_dtype"])
        if dtype.is_floating_point:
            t = torch.randn(shape, device="cuda").to(dtype)
        else:
            t = torch.randint(0, 8, shape, device="cuda", dtype=dtype)
        args.append(t)
    return args


def time_kernel(fn, args, iters: int = 100) -> float:
    """Median milliseconds of ``fn(*args)`` with CUDA events, after warm-up."""
    import statistics

    import torch

    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _add_kernel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("kernel", help="FILE.py::NAME (a prim_func or a @tlx.jit / @tilelang.jit factory)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="factory argument; V=dynamic makes a symbolic dim")
    p.add_argument("--target", default=None, help="CUDA arch, e.g. sm_90a (default: the factory's target, else sm_90a)")
    p.add_argument("--assume", action="append", default=[], metavar="EXPR", help="assumption on shape variables, e.g. 'M %% 128 == 0'")


CHECK_HELP = """\
Prove every access of the kernel in bounds and run tlx's other analyses over it.

Each analysis gives its own verdict (text: the "verdicts:" block; JSON: "verdicts"):
  ok, violation, unknown, error (the analysis itself failed) or not run.
  bounds       every buffer access and index computation, for every shape the launcher accepts
  races        shared-memory data races between threads; global memory a dependent launch
               (T.pdl_sync()) touches before that sync while earlier grids run
  progress     no thread of a CTA waits forever on an mbarrier or named barrier (simulated)
  layouts      fragment layouts are bijective
  vectors      vector accesses are aligned and contiguous
  banks        shared-memory bank conflicts (performance)
  numerics     the numerics mode (no fast-math or approximate intrinsics unless allowed)
  determinism  floating-point atomics, split reductions, batch-dependent reduction order

Exit status, from the analyses that decide it (default: bounds, races, layouts, vectors and
numerics; --only A,B runs only A and B and lets only them decide; banks, progress and
determinism decide only when named):
  0  every deciding analysis is ok (bounds may hold under derived preconditions, which are
     listed and checked by the launcher on every call)
  1  a deciding analysis found a violation (or the kernel fails a check that stops tlx, such as
     its pin)
  2  no verdict: a deciding analysis failed, tlx raised an internal error, the kernel's module
     or factory raised, or bad usage (a one-line message on stderr; TLX_TRACEBACK=1 prints
     the traceback of an internal error)
  3  no violation, but a deciding analysis could not prove everything (unknown)
A violation outranks an error, which outranks an unknown.
"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tlx", description="tlx: TileLang with proofs, generated launchers and exact numerics.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("host", help="print the generated C++ host launcher (no GPU needed)")
    _add_kernel_args(p)
    p = sub.add_parser("device", help="print the CUDA source of the kernel (no GPU needed)")
    _add_kernel_args(p)
    p = sub.add_parser("check", help="prove every access in bounds (and the other analyses) or report counterexamples",
                       description=CHECK_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_kernel_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--only", default=None, metavar="A,B", help="run only these analyses, and let only them decide the exit "
                   "status: bounds, races, progress, layouts, vectors, banks, numerics, determinism")
    p.add_argument("--bounds-only", action="store_true", help="the same as --only bounds")
    p = sub.add_parser("pin", help="record the order-affecting compile decisions into a pin file beside the kernel")
    _add_kernel_args(p)
    p.add_argument("--output", default=None, help="pin file path (default: NAME.pin.json beside FILE)")
    p = sub.add_parser("bench", help="time the kernel on the GPU with fresh random inputs (CUDA events, median)")
    _add_kernel_args(p)
    p.add_argument("--dim", action="append", default=[], metavar="M=4096", help="value of a symbolic dimension")
    p.add_argument("--iters", type=int, default=100)
    return ap


class UsageError(Exception):
    """A command line that cannot be run as given (exit status 2)."""


def main(argv: list[str] | None = None) -> int:
    """Run one command. Its exit status is the command's own (``tlx check``: see CHECK_HELP);
    a verdict about the kernel that stops the command (a ``TlxError``, e.g. a pin mismatch) is
    1; bad usage, a kernel whose module or factory raises, or an exception inside tlx is 2, with
    a one-line message on stderr (``TLX_TRACEBACK=1`` prints the traceback of the last)."""
    import os

    from tlx.passes import EXIT_VIOLATION, TlxError
    from tlx.passes.check import EXIT_ERROR

    args = build_parser().parse_args(argv)
    commands = {"host": lambda: _cmd_source(args, "launcher"), "device": lambda: _cmd_source(args, "cuda"),
                "check": lambda: _cmd_check(args), "pin": lambda: _cmd_pin(args), "bench": lambda: _cmd_bench(args)}
    try:
        return commands[args.command]()
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return EXIT_ERROR
    except (UsageError, KernelLoadError) as e:
        print(f"tlx {args.command}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except TlxError as e:
        print(f"tlx {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_VIOLATION
    except Exception as e:  # noqa: BLE001  (any other exception is tlx's failure, not a verdict)
        if os.environ.get("TLX_TRACEBACK"):
            import traceback

            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"tlx {args.command}: internal error on {getattr(args, 'kernel', '')}: {type(e).__name__}: {first} "
              f"(exit {EXIT_ERROR}; TLX_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
