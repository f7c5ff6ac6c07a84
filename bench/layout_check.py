"""Cost and findings of the layout analyses (layouts, bank conflicts, vectors, races) per kernel.

CPU part: for each kernel of the layout corpus and of the project's own kernels, the
seconds each analysis takes (median of ``--repeat`` runs, default 1) and its verdict. GPU part (when
a GPU and ``ncu`` are present): for every ``NCU_CASES`` kernel, the statically predicted
shared-memory bank-conflict counters against Nsight Compute's measurement.

``python bench/layout_check.py --out results.json`` prints markdown tables.
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

from tests.passes.layout_corpus import kernels as K  # noqa: E402
from tlx.lowering import lower  # noqa: E402
from tlx.ir.program import collect_program  # noqa: E402
from tlx.passes.banks import banks_report, predict_ncu  # noqa: E402
from tlx.passes.layouts import layouts_report  # noqa: E402
from tlx.passes.races import races_report  # noqa: E402
from tlx.passes.vectors import vectors_report  # noqa: E402

TARGET = {"kind": "cuda", "arch": "sm_90a"}

CORPUS = {
    "gemm_tma": lambda: K.gemm(),
    "gemm_cp_async": lambda: K.gemm(configs=K.GEMM_SIMT_COPY),
    "row_sum": lambda: K.row_sum(),
    "scale_add": lambda: K.scale_add(),
    "swizzled_copy": lambda: K.swizzled_copy(),
    "transpose_padded": lambda: K.transpose(pad=1),
    "bug_transpose_unpadded": lambda: K.transpose(pad=0),
    "bug_transpose_no_sync": lambda: K.transpose(sync=False),
    "bug_cp_async_no_sync": lambda: K.gemm(configs={**K.GEMM_SIMT_COPY, "tl.disable_thread_storage_sync": True}),
}


def team_kernels():
    """The project's kernels as listed for the verifier's corpus (skipped where they do not build)."""
    try:
        from tests.passes.corpus.team import TEAM
    except Exception:
        return {}
    out = {}
    for name, fn, params, _ in TEAM:
        out[name] = (lambda fn=fn, params=params: (fn.get_tir(**params), fn.options.pass_config_dict(), fn.options.target_dict() or TARGET))
    return out


def verdicts(kernel) -> tuple[dict, dict]:
    progs = collect_program(kernel)
    seconds, found = {}, {}
    for key, fn in (("layouts", layouts_report), ("banks", banks_report), ("vectors", vectors_report), ("races", races_report)):
        t0 = time.perf_counter()
        r = fn(kernel) if fn is layouts_report else fn(kernel, progs)
        seconds[key] = time.perf_counter() - t0
        found[key] = r
    return seconds, found


def summary(found: dict) -> dict:
    lay, banks, vec, races = found["layouts"], found["banks"], found["vectors"], found["races"]
    return {
        "layouts": f"{lay['checked'] - lay['invalid'] - lay['unknown']}/{lay['checked']} ok",
        "max_bank_degree": banks["max_degree"],
        "vectors": f"{vec['checked'] - vec['misaligned'] - vec['unknown']}/{vec['checked']} legal, {len(vec['missed'])} missed",
        "races": races["verdict"],
    }


def run_cpu(repeat: int) -> list[dict]:
    rows = []
    cases = {name: (lambda make=make: (*make(), TARGET)) for name, make in CORPUS.items()}
    cases.update(team_kernels())
    for name, make in cases.items():
        try:
            func, configs, target = make()
            kernel = lower(func, target, configs)
        except Exception as exc:  # a kernel of another area that does not build here is reported, not fatal
            rows.append({"kernel": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        times: dict[str, list[float]] = {}
        for _ in range(repeat):
            seconds, found = verdicts(kernel)
            for k, v in seconds.items():
                times.setdefault(k, []).append(v)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"kernel": name, "seconds": med, "total_seconds": sum(med.values()), **summary(found)})
    return rows


def run_gpu() -> list[dict]:
    import shutil

    import torch

    if not torch.cuda.is_available() or shutil.which("ncu") is None:
        return []
    sys.path.insert(0, str(ROOT / "tests" / "passes"))
    from tests.passes.test_layout_ncu import measure

    rows = []
    for name, make in K.NCU_CASES.items():
        func, configs = make()
        predicted = predict_ncu(lower(func, TARGET, configs))
        try:
            measured = measure(name)
        except BaseException as exc:  # pytest.skip / failures become a row, not a crash
            measured = {"error": str(exc)[:200]}
        rows.append({"kernel": name, "predicted": predicted, "measured": measured, "equal": predicted == measured})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--repeat", type=int, default=1, help="runs per analysis (median); the analyses are deterministic")
    args = ap.parse_args()
    cpu = run_cpu(args.repeat)
    print("| kernel | layouts | max bank degree | vectors | races | layouts s | banks s | vectors s | races s | total s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in cpu:
        if "error" in r:
            print(f"| {r['kernel']} | not built: {r['error']} | | | | | | | | |")
            continue
        s = r["seconds"]
        print(f"| {r['kernel']} | {r['layouts']} | {r['max_bank_degree']} | {r['vectors']} | {r['races']} | "
              f"{s['layouts']:.2f} | {s['banks']:.2f} | {s['vectors']:.2f} | {s['races']:.2f} | {r['total_seconds']:.2f} |")
    totals = sorted(r["total_seconds"] for r in cpu if "error" not in r)
    if totals:
        print(f"\nmedian seconds per kernel (all four analyses): {statistics.median(totals):.2f}; max {totals[-1]:.2f}")
    gpu = run_gpu()
    if gpu:
        print("\n| kernel | predicted ld/st conflicts | measured (ncu) | equal |")
        print("| --- | --- | --- | --- |")
        for r in gpu:
            print(f"| {r['kernel']} | {r['predicted']} | {r['measured']} | {r['equal']} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"cpu": cpu, "ncu": gpu}, indent=1, default=str))


if __name__ == "__main__":
    main()
