"""Cost and reach of the bounds verifier over its corpus (CPU; GPU kernel timings when a GPU is present).

Measures, per kernel of the corpus (correct kernels, planted bugs, the project's kernels):
verification time (verify + precondition derivation, median of ``--repeat`` runs), the
share of accesses proven with and without the derived preconditions, and whether every
planted bug is caught. Then the compile-time overhead of ``verify="error"`` against
``verify="off"`` (full compile to cubin, no cache), and guard elimination on the
dynamic-shape kernels (guards seen/removed, predicates in the CUDA source; kernel time
with and without elimination when a GPU is visible).

``python bench/verify_cost.py --out results.json`` prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

warnings.simplefilter("ignore")

from tests.passes.corpus.bugs import BUGS  # noqa: E402
from tests.passes.corpus.correct import CORRECT  # noqa: E402
from tlx.lowering import codegen_cuda, lower  # noqa: E402
from tlx.passes.preconditions import derive_preconditions  # noqa: E402
from tlx.passes.verification import verify_kernel  # noqa: E402
from tlx.passes.guards import count_predicates, eliminate_guards  # noqa: E402

# Dynamic-shape kernels and the divisibility their callers guarantee (enforced by the launcher).
GUARD_CASES = [
    ("add_dynamic", ("N % 128 == 0",), {"N": 1 << 24}),
    ("guarded_threads", ("N % 128 == 0",), {"N": 1 << 24}),
    ("row_sum", ("M % 4 == 0",), {"M": 1 << 14}),
    ("softmax_rows", ("M % 2 == 0",), {"M": 1 << 15}),
    ("gemm_pipelined", ("M % 128 == 0", "K % 32 == 0"), {"M": 4096, "K": 4096}),
]


def _p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def _corpus(with_team: bool):
    out = [("correct", e[0], e[1], e[2], e[3]) for e in CORRECT]
    out += [("bug", e[0], e[1], e[2], e[3]) for e in BUGS]
    if with_team:
        from tests.passes.corpus.team import TEAM

        out += [("team", e[0], e[1], e[2], e[3]) for e in TEAM]
    return out


def measure_verification(corpus, repeat: int) -> list[dict]:
    rows = []
    for group, name, fn, params, assume in corpus:
        t0 = time.perf_counter()
        try:
            kernel = lower(fn.get_tir(**params), fn.options.target_dict(), fn.options.pass_config_dict())
        except Exception as e:  # another team's kernel changed its signature: report, keep going
            print(f"  {name}: could not build ({e!r})", file=sys.stderr, flush=True)
            continue
        lower_s = time.perf_counter() - t0
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            report = verify_kernel(kernel, assume)
            pre, final = derive_preconditions(kernel, report, assume) if report.violations() or report.unknowns() else ([], report)
            times.append(time.perf_counter() - t0)
        rows.append({
            "group": group,
            "kernel": name,
            "lower_s": round(lower_s, 3),
            "verify_s": round(statistics.median(times), 3),
            "accesses": final.checked,
            "proven_unconditional": report.proven,
            "proven": final.proven,
            "violations": len(final.violations()),
            "data_dependent": sum(a.data_dependent for a in final.violations()),
            "unknown": len(final.unknowns()),
            "bug_found": bool(report.violations()) if group == "bug" else None,
            "preconditions": [p.text for p in pre],
            "queries": report.queries,
        })
        print(f"  {name}: {rows[-1]['verify_s']} s, {final.proven}/{final.checked} proven", file=sys.stderr, flush=True)
    return rows


def measure_compile(names: list[str]) -> list[dict]:
    """Full compile (lower, every tlx pass, CUDA, nvcc, launcher) with verify off vs error, no cache."""
    from tlx.compiler import compile_artifacts
    from tlx.options import Options

    rows = []
    for name in names:
        _, fn, params, assume = next(e for e in CORRECT if e[0] == name)
        prim = fn.get_tir(**params)
        warnings.simplefilter("ignore")
        base = dict(out_idx=list(fn.options.out_idx), target=fn.options.target_dict(), pass_configs=fn.options.pass_config_dict(), assume=list(assume))
        result = {"kernel": name}
        try:
            for mode, extra in (("off", {"verify": "off", "eliminate_guards": False}), ("error", {"verify": "error", "eliminate_guards": True})):
                t0 = time.perf_counter()
                _, build = compile_artifacts(prim, Options.make(**base, **extra), name=name, stop_after="cubin")
                result[f"{mode}_s"] = round(time.perf_counter() - t0, 3)
                result[f"{mode}_passes_s"] = build.stage_seconds.get("passes")
        except Exception as e:  # a failure in any pass of the pipeline: record it, measure the rest
            print(f"  compile {name}: failed ({e!r})", file=sys.stderr, flush=True)
            result["error"] = repr(e)[:200]
        if "off_s" not in result:
            continue
        # verify="error" also turns on the other verify-gated analyses (layouts, banks, races);
        # the bounds verifier's own share is its two passes, timed alone on the same kernel.
        result["bounds_guards_s"] = round(_time_bounds_passes(prim, fn, assume), 3)
        result["bounds_overhead"] = round(result["bounds_guards_s"] / result["off_s"], 4)
        if "error_s" in result:
            result["overhead"] = round(result["error_s"] / result["off_s"] - 1, 4)
        rows.append(result)
        print(f"  compile {name}: off {result['off_s']} s, error {result['error_s']} s", file=sys.stderr, flush=True)
    return rows


def _time_bounds_passes(prim, fn, assume) -> float:
    from tlx.passes import PassContext
    from tlx.passes.bounds import bounds_pass
    from tlx.passes.guards import eliminate_guards_pass

    kernel = lower(prim, fn.options.target_dict(), fn.options.pass_config_dict())
    ctx = PassContext(options={"verify": "error", "assume": list(assume), "eliminate_guards": True})
    t0 = time.perf_counter()
    eliminate_guards_pass(bounds_pass(kernel, ctx), ctx)
    return time.perf_counter() - t0


def measure_guards() -> list[dict]:
    rows = []
    for name, assume, _ in GUARD_CASES:
        _, fn, params, _ = next(e for e in CORRECT if e[0] == name)
        kernel = lower(fn.get_tir(**params), fn.options.target_dict(), fn.options.pass_config_dict())
        new, stats = eliminate_guards(kernel, assume)
        rows.append({
            "kernel": name,
            "assume": list(assume),
            "guards_seen": stats["seen"],
            "guards_removed": stats["removed"],
            "predicates_before": count_predicates(codegen_cuda(kernel)),
            "predicates_after": count_predicates(codegen_cuda(new)),
        })
    return rows


def _time_launch(launch, args) -> float:
    """Median microseconds of one launch, launches queued back to back."""
    from bench.timing import median_ms

    return 1000 * median_ms(lambda: launch(*args), reps=50, warmup=10)


def measure_guard_kernel_time() -> list[dict]:
    """Kernel time of each dynamic-shape case with and without guard elimination (same assumptions)."""
    import torch

    import tlx

    rows = []
    for name, assume, shapes in GUARD_CASES:
        _, fn, params, _ = next(e for e in CORRECT if e[0] == name)
        prim = fn.get_tir(**params)
        kernels = {
            flag: tlx.jit(out_idx=list(fn.options.out_idx), target=fn.options.target_dict(), pass_configs=fn.options.pass_config_dict(),
                          assume=list(assume), verify="error", eliminate_guards=flag)(fn.factory)(**params)
            for flag in (False, True)
        }
        args = []
        for i, p in enumerate(prim.params):
            buf = prim.buffer_map[p]
            shape = [int(d) if not hasattr(d, "name") else shapes[d.name] for d in buf.shape]
            dtype = {"float32": torch.float32, "float16": torch.float16, "int32": torch.int32}[str(buf.dtype)]
            t = torch.randint(-100, 100, shape, device="cuda", dtype=dtype) if dtype == torch.int32 else torch.randn(shape, device="cuda", dtype=dtype)
            args.append(t)
        outs = {}
        for flag, k in kernels.items():
            for i in fn.options.out_idx:
                args[i].fill_(float("nan") if args[i].is_floating_point() else -1)
            k.launch(*args)
            torch.cuda.synchronize()
            outs[flag] = [args[i].clone() for i in fn.options.out_idx]
        same = all(torch.equal(a, b) for a, b in zip(outs[False], outs[True]))
        times = {flag: _time_launch(k.launch, args) for flag, k in kernels.items()}
        rows.append({"kernel": name, "shape": shapes, "guarded_us": round(times[False], 2), "eliminated_us": round(times[True], 2),
                     "speedup": round(times[False] / times[True], 3), "outputs_identical": same})
    return rows


def _table(rows, cols):
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--repeat", type=int, default=3, help="verification runs per kernel (median)")
    ap.add_argument("--no-team", action="store_true", help="skip the project's kernels in kernels/")
    ap.add_argument("--compile", default="all", help="comma-separated correct kernels for the compile-overhead run, 'all' or 'none'")
    args = ap.parse_args(argv)

    results: dict = {}
    rows = measure_verification(_corpus(not args.no_team), args.repeat)
    results["kernels"] = rows
    times = [r["verify_s"] for r in rows]
    correct = [r for r in rows if r["group"] == "correct"]
    bugs = [r for r in rows if r["group"] == "bug"]
    summary = {
        "kernels": len(rows),
        "verify_median_s": round(statistics.median(times), 3),
        "verify_p95_s": round(_p95(times), 3),
        "correct_proven_share": round(sum(r["proven"] for r in correct) / sum(r["accesses"] for r in correct), 4),
        "correct_proven_share_without_preconditions": round(sum(r["proven_unconditional"] for r in correct) / sum(r["accesses"] for r in correct), 4),
        "correct_with_violations": sum(r["violations"] > 0 for r in correct),
        "bugs_found": f"{sum(bool(r['bug_found']) for r in bugs)}/{len(bugs)}",
        "all_proven_share": round(sum(r["proven"] for r in rows if r["group"] != "bug") / sum(r["accesses"] for r in rows if r["group"] != "bug"), 4),
    }
    results["summary"] = summary

    names = [e[0] for e in CORRECT] if args.compile == "all" else [] if args.compile == "none" else args.compile.split(",")
    if names:
        results["compile"] = measure_compile(names)
        done = [r for r in results["compile"] if "overhead" in r]
        if done:
            summary["compile_overhead_all_verify_passes"] = round(sum(r["error_s"] for r in done) / sum(r["off_s"] for r in done) - 1, 4)
        timed = [r for r in results["compile"] if "bounds_overhead" in r]
        if timed:
            summary["compile_overhead_bounds_guards"] = round(sum(r["bounds_guards_s"] for r in timed) / sum(r["off_s"] for r in timed), 4)

    results["guards"] = measure_guards()
    seen = sum(r["guards_seen"] for r in results["guards"])
    summary["guards_removed_share"] = round(sum(r["guards_removed"] for r in results["guards"]) / seen, 4) if seen else None

    try:
        import torch

        gpu = torch.cuda.is_available()
    except Exception:
        gpu = False
    if gpu:
        results["guard_kernel_time"] = measure_guard_kernel_time()

    print("## Verification per kernel\n")
    print(_table(rows, ["group", "kernel", "verify_s", "accesses", "proven_unconditional", "proven", "violations", "data_dependent", "unknown", "preconditions"]))
    print("\n## Summary\n")
    print(_table([summary], list(summary)))
    if "compile" in results:
        print("\n## Compile time, verify off vs error (full build, no cache)\n")
        print(_table(results["compile"], ["kernel", "off_s", "error_s", "off_passes_s", "error_passes_s", "overhead", "bounds_guards_s", "bounds_overhead", "error"]))
    print("\n## Guard elimination on dynamic-shape kernels\n")
    print(_table(results["guards"], ["kernel", "assume", "guards_seen", "guards_removed", "predicates_before", "predicates_after"]))
    if "guard_kernel_time" in results:
        print("\n## Kernel time with and without guard elimination (median of 50, CUDA events)\n")
        print(_table(results["guard_kernel_time"], ["kernel", "shape", "guarded_us", "eliminated_us", "speedup", "outputs_identical"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
