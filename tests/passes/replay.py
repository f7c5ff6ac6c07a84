"""Run one corpus kernel on the GPU with the shapes (and data) of the verifier's counterexample.

``python tests/passes/replay.py NAME [VAR=VALUE ...]`` — meant to run under
``compute-sanitizer --tool memcheck`` (see ``test_bounds_replay_gpu.py``). For a planted
bug the shape variables and data-dependent values come from the counterexample the
verifier finds on the CPU; for a correct kernel from ``VAR=VALUE`` arguments. Prints
``REPLAYED`` after the kernel finished and the device synchronized.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tests.passes.corpus import entry, lowered  # noqa: E402
from tilelang import tvm  # noqa: E402
from tlx.passes.assume import shape_vars  # noqa: E402
from tlx.passes.verification import verify_kernel  # noqa: E402

tir = tvm.tirx

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}


def _dims(buf, env):
    out = []
    for d in buf.shape:
        if isinstance(d, tir.IntImm):
            out.append(int(d.value))
        else:
            subst = {v: tir.IntImm(v.dtype, env[v.name]) for v in shape_vars_of(d)}
            out.append(int(tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(d, subst)).value))
    return out


def shape_vars_of(expr):
    found = []
    tir.stmt_functor.post_order_visit(tir.Evaluate(expr), lambda n: found.append(n) if isinstance(n, tir.Var) else None)
    return found


def counterexample(name):
    """The first refutation's counterexample (a planted bug's: a violation, or a data-dependent
    unknown), or {} for a correct kernel."""
    report = verify_kernel(lowered(name), entry(name)[3])
    bad = report.violations() + [a for a in report.unknowns() if a.data_dependent]
    return bad[0].counterexample if bad else {}


def inputs_for(name, env, cex):
    fn, params = entry(name)[1], entry(name)[2]
    prim = fn.get_tir(**params)
    gen = torch.Generator(device="cuda").manual_seed(0)
    tensors = []
    for i, p in enumerate(prim.params):
        if i in fn.options.out_idx:
            continue
        buf = prim.buffer_map[p]
        shape, dtype = _dims(buf, env), _DTYPES[str(buf.dtype)]
        if dtype == torch.int32:
            t = torch.randint(0, 64, shape, dtype=dtype, device="cuda", generator=gen)
        else:
            t = torch.randn(shape, dtype=dtype, device="cuda", generator=gen)
        tensors.append(t)
    if name == "missing_guard":
        # The counterexample's bin id, planted where its block and thread read it.
        ids = tensors[0]
        ids[cex["bx"] * 128 + cex["tx"]] = cex["index"]
    return fn(**params), tensors


def main(argv):
    name = argv[0]
    env = dict(a.split("=", 1) for a in argv[1:])
    env = {k: int(v) for k, v in env.items()}
    cex = counterexample(name)
    for var in shape_vars(lowered(name).prim_func):
        if var in cex:
            env.setdefault(var, cex[var])
    print(f"replaying {name} with shapes {env} (counterexample {cex})", flush=True)
    kernel, tensors = inputs_for(name, env, cex)
    kernel(*tensors)
    torch.cuda.synchronize()
    print("REPLAYED", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
