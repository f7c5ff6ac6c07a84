"""``check_kernel``: the JSON report's keys, human text pointing at source lines, exit codes."""

import json

import pytest
import tilelang.language as T

import tlx

from tests.passes.corpus import entry, lowered
from tlx.passes.check import CheckResult, check_kernel

KEYS = {"kernel", "accesses", "proven", "violations", "unknown", "preconditions", "seconds"}
VIOLATION_KEYS = {"buffer", "scope", "index", "extent", "counterexample", "source"}


def _check(name, **options):
    e = entry(name)
    return check_kernel(lowered(name), {"assume": e[3], "source": e[1], **options})


def test_bug_gives_exit_1_json_and_source_line():
    r = _check("off_by_one_tail")
    assert r.exit_code == 1
    out = json.loads(json.dumps(r.to_json()))
    assert KEYS <= set(out)
    assert out["accesses"] == 4 and out["proven"] == 3
    v = out["violations"][0]
    assert VIOLATION_KEYS <= set(v)
    assert v["buffer"] == "S" and v["scope"].startswith("shared")
    assert v["counterexample"]["tx"] == 127 and v["counterexample"]["index"] == 128
    assert v["source"].startswith("bugs.py:")
    text = r.human()
    assert "S[tx + 1] = A[bx * threads + tx]" in text  # the user's line, not the lowered IR
    assert "counterexample: " in text and text.endswith("exit 1: VIOLATION")


def test_correct_kernel_exit_0_with_preconditions():
    r = _check("add_dynamic")
    assert r.exit_code == 0
    out = r.to_json()
    assert out["violations"] == [] and out["unknown"] == []
    assert out["proven"] == out["accesses"] == 3
    assert [p["condition"] for p in out["preconditions"]] == ["N <= 2147483520"]
    assert out["preconditions"][0]["needed_by"], "a precondition lists the accesses that need it"
    assert "safe only when N <= 2147483520" in r.human()


def test_assumption_removes_precondition():
    r = _check("add_dynamic", assume=("N % 128 == 0",))
    assert r.exit_code == 0 and r.to_json()["preconditions"] == []


def test_budget_exhaustion_gives_exit_3():
    r = _check("gemm_no_tma", rlimit=1, derive_preconditions=False)
    assert r.unknown and not r.violations
    assert r.exit_code == 3
    assert r.human().endswith("exit 3: UNKNOWN")


def test_sections_for_other_analyses():
    r = _check("transpose_shared")
    assert r.exit_code == 0
    r.add_section("layouts", {"layouts": []}, exit_code=3)
    assert r.exit_code == 3
    assert r.to_json()["layouts"] == {"layouts": []}
    with pytest.raises(ValueError, match="reserved"):
        r.add_section("violations", [])
    with pytest.raises(ValueError, match="exit_code"):
        r.add_section("races", [], exit_code=2)
    assert isinstance(r, CheckResult)


def test_each_analysis_has_its_verdict_and_only_the_deciding_ones_make_the_exit_status():
    r = _check("transpose_shared")
    r.add_section("races", {"summary": ["tma_load not modelled"], "exit_code": 3})
    r.add_section("bank_conflicts", {"summary": ["worst conflict degree 32"], "conflicted": 4, "max_degree": 32})
    verdicts = r.to_json()["verdicts"]
    assert verdicts["bounds"]["verdict"] == "ok" and verdicts["races"]["verdict"] == "unknown"
    assert verdicts["banks"]["verdict"] == "violation" and not verdicts["banks"]["decides"]
    assert verdicts["determinism"]["verdict"] == "not run"
    assert r.exit_code == 3, "a races UNKNOWN decides by default"
    r.deciding = ("bounds",)
    assert r.exit_code == 0 and r.to_json()["exit_code"] == 0, "but not under --only bounds"
    r.deciding = ("bounds", "banks")
    assert r.exit_code == 1
    r.deciding = ("bounds", "races")
    r.errors["races"] = "ValueError: boom"
    assert r.to_json()["verdicts"]["races"] == {"verdict": "error", "exit_code": 2, "decides": True, "summary": "ValueError: boom"}
    assert r.exit_code == 2 and r.human().endswith("exit 2: ERROR")
    r.add_section("layouts", {"summary": ["1 wrong"], "exit_code": 1})
    r.deciding = ("bounds", "races", "layouts")
    assert r.exit_code == 1, "a violation outranks an error"


def test_loads_and_stores_point_at_their_own_lines():
    r = _check("wrong_stride")
    lines = {a.kind: r.source_lines[a.source] for a in r.violations}
    assert lines["store"].strip() == "S[i * (tile + 1) + tx] = A[i, tx]"
    assert lines["load"].strip() == "B[i, tx] = S[tx * (tile + 1) + i]"


def test_unreadable_source_names_the_device_statement_and_its_loops():
    """Without readable source (a factory from ``python -c``), an item names the statement of the
    device code and the loops around it instead of "unknown line"."""
    r = _check("wrong_stride", source=None)
    sources = {a.kind: a.source for a in r.violations}
    assert sources["store"].startswith("main_kernel: S[") and sources["store"].endswith("(in loops over i)")
    assert sources["load"].startswith("main_kernel: B[") and "(in loops over i)" in sources["load"]
    assert "unknown line" not in r.human()


def test_tilelang_factory_and_prim_func_have_source_lines():
    """A ``@tilelang.jit`` factory (TileLang's JIT wrapper, which ``inspect`` cannot read) and a
    bare ``@T.prim_func`` are traced back to their lines in the file."""
    import tilelang.language as T

    from tests.cli import tilelang_kernels as K
    from tlx.lowering import lower
    from tlx.passes.check import KernelSource, source_locator

    target = {"kind": "cuda", "arch": "sm_90a"}
    r = check_kernel(lower(K.scale.get_tir(N=T.dynamic("N")), target), {"source": K.scale})
    items = [a for p in r.to_json()["preconditions"] for a in p["needed_by"]]
    assert items and all(a["source"].startswith("tilelang_kernels.py:") for a in items), [a["source"] for a in items]
    assert "Y[bx * block + i] = X[bx * block + i] * 2.0" in r.human()
    source = KernelSource.named(K.__file__, "copy256")
    assert source.first == 18 and source.lines[1].startswith("def copy256(")
    locate, texts = source_locator(source)
    assert locate("Y", "store", "bx * 128 + i") == "tilelang_kernels.py:22"
    assert texts["tilelang_kernels.py:22"].strip() == "Y[bx * 128 + i] = X[bx * 128 + i]"


@tlx.jit(out_idx=[1], target={"kind": "cuda", "arch": "sm_90a"}, verify="off")
def shifted_by_remainder(threads=128):
    """Stages its tile shifted by ``N % 8``: in bounds only when ``N % 8 == 0`` (and ``N`` small
    enough for the block count)."""
    N = T.dynamic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((threads,), "float32")
            S[tx + N % 8] = A[bx * threads + tx]
            T.sync_threads()
            B[bx * threads + tx] = S[tx]

    return main


def test_each_precondition_lists_every_access_needing_it_with_a_counterexample():
    from tests.passes.corpus import lower_jit

    r = check_kernel(lower_jit(shifted_by_remainder), {"source": shifted_by_remainder})
    pre = {p["condition"]: p["needed_by"] for p in r.to_json()["preconditions"]}
    assert set(pre) == {"N <= 2147483520", "N % 8 == 0"}, list(pre)
    (shift,) = [a for a in pre["N % 8 == 0"] if a["buffer"] == "S"]
    cex = shift["counterexample"]
    assert shift["kind"] == "store" and cex["N"] % 8 != 0 and cex["index"] >= 128, shift
    assert shift["source"] == "test_check.py:" + str(_line_of("S[tx + N % 8] = A[bx * threads + tx]"))
    assert any(a["kind"] == "overflow" and a["counterexample"] for a in pre["N <= 2147483520"])
    text = r.human()
    assert "without N % 8 == 0:" in text and "S[tx + N % 8] = A[bx * threads + tx]" in text


def _line_of(code: str) -> int:
    lines = open(__file__).read().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if line.strip() == code)
