"""Cold compile time of one kernel through ``tlx.jit`` and through ``tilelang.compile(...,
execution_backend="tvm_ffi")``, side by side on this machine (no GPU needed).

    python3 bench/compile_time.py [--reps 3]

The kernel is the project's pipelined GEMM (tests/tiled_gemm.py) with a dynamic M, for sm_90a
(TMA and wgmma). Each compile runs in a fresh Python process with empty caches (a new
``TLX_CACHE_DIR``; ``TILELANG_CACHE_DIR`` and TileLang's disabled cache), the arms alternating
in an order rotated every repetition (on a shared machine the first of a round runs differently);
the figure is the compile call alone (imports excluded), median over the repetitions, with
tlx's stage times from the build's metadata. The launchers' runtime object is built once per
machine (``TLX_RUNTIME_CACHE_DIR``, shared by the repetitions): the first tlx compile, which
builds it, is reported apart ("tlx first"). Python modules are byte-compiled once into a shared
``PYTHONPYCACHEPREFIX`` (an installed package ships its ``.pyc``; a checkout run under
``PYTHONDONTWRITEBYTECODE`` would recompile tlx's sources in every process), and every arm runs
once uncounted before the repetitions. ``tilelang`` times ``tilelang.compile`` of a built
``PrimFunc``; ``tilelang.jit`` and the tlx arms time the decorated factory's call, which builds
the ``PrimFunc`` too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# CPU seconds of the process and of the tools it ran (nvcc, c++): on a shared 2-core machine
# the wall time depends on the other load, the CPU time far less.
_CPU = """
def _cpu():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))
"""

_CHILD = {
    "tlx": """
import json, resource, time
import tilelang.language as T
import tlx
from tests.tiled_gemm import tiled_gemm
jf = tlx.jit(out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"}, verify="off")(tiled_gemm)
cpu0 = _cpu()
t0 = time.perf_counter()
k = jf(T.dynamic("M"), 1024, 1024)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": _cpu() - cpu0, "stages": k.metadata["stage_seconds"]}))
""",
    "tlx+verify": """
import json, resource, time
import tilelang.language as T
import tlx
from tests.tiled_gemm import tiled_gemm
jf = tlx.jit(out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"})(tiled_gemm)
cpu0 = _cpu()
t0 = time.perf_counter()
k = jf(T.dynamic("M"), 1024, 1024)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": _cpu() - cpu0, "stages": k.metadata["stage_seconds"]}))
""",
    "tilelang": """
import json, resource, time
import tilelang, tilelang.language as T
from tests.tiled_gemm import tiled_gemm
prim = tiled_gemm(T.dynamic("M"), 1024, 1024)
cpu0 = _cpu()
t0 = time.perf_counter()
k = tilelang.compile(prim, out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"}, execution_backend="tvm_ffi")
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": _cpu() - cpu0}))
""",
    # the drop-in comparison: the same decorator call as the tlx arms (the factory runs inside the timing)
    "tilelang.jit": """
import json, resource, time
import tilelang, tilelang.language as T
from tests.tiled_gemm import tiled_gemm
jf = tilelang.jit(out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"}, execution_backend="tvm_ffi")(tiled_gemm)
cpu0 = _cpu()
t0 = time.perf_counter()
k = jf(T.dynamic("M"), 1024, 1024)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": _cpu() - cpu0}))
""",
}


def run(arm: str, machine_dir: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TLX_CACHE_DIR": f"{tmp}/tlx", "TILELANG_CACHE_DIR": f"{tmp}/tl", "TILELANG_DISABLE_CACHE": "1",
               "PYTHONPATH": str(ROOT), "TLX_RUNTIME_CACHE_DIR": f"{machine_dir}/runtime",
               # tlx's modules byte-compiled once, as an installed package's are (TileLang's are, in site-packages)
               "PYTHONPYCACHEPREFIX": f"{machine_dir}/pycache"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        out = subprocess.run([sys.executable, "-c", _CPU + _CHILD[arm]], env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{arm}: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--arms", default="tilelang,tilelang.jit,tlx,tlx+verify")
    args = parser.parse_args()
    arms = args.arms.split(",")
    results = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as machine_dir:
        first = run("tlx", machine_dir)  # builds the runtime object, as the first compile on a machine does
        for arm in arms:  # warm-up, not counted: every arm's modules byte-compiled
            run(arm, machine_dir)
        for rep in range(args.reps):
            for arm in arms[rep % len(arms):] + arms[:rep % len(arms)]:  # rotated: no arm always runs first
                results[arm].append(run(arm, machine_dir))
    print(f"tlx first    {first['seconds']:.2f} s  CPU {first['cpu']:.2f} s (builds the launchers' runtime, once per machine)")
    base = statistics.median(r["seconds"] for r in results["tilelang"]) if "tilelang" in results else None
    base_cpu = statistics.median(r["cpu"] for r in results["tilelang"]) if "tilelang" in results else None
    for arm, runs in results.items():
        med = statistics.median(r["seconds"] for r in runs)
        ratio = f" ({med / base:.2f}x tilelang)" if base and arm != "tilelang" else ""
        stages = ""
        if "stages" in runs[0]:
            names = runs[0]["stages"]
            stages = "  stages: " + ", ".join(f"{s} {statistics.median(r['stages'][s] for r in runs):.2f}" for s in names)
        each = ", ".join(f"{r['seconds']:.2f}" for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        cpu_each = ", ".join(f"{r['cpu']:.2f}" for r in runs)
        cpu_ratio = f" ({cpu / base_cpu:.2f}x tilelang)" if base_cpu and arm != "tilelang" else ""
        print(f"{arm:12s} {med:.2f} s{ratio}  [{each}]  CPU {cpu:.2f} s{cpu_ratio} [{cpu_each}]{stages}")


if __name__ == "__main__":
    main()
