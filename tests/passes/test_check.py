"""``check_kernel``: the JSON report's keys, human text pointing at source lines, exit codes."""

import json

import pytest

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
    assert "counterexample: " in text and text.endswith("VIOLATION")


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
    assert r.human().endswith("UNKNOWN")


def test_sections_for_other_analyses():
    r = _check("transpose_shared")
    assert r.exit_code == 0
    r.add_section("bank_conflicts", {"S": {"ways": 32}}, exit_code=3)
    assert r.exit_code == 3
    assert r.to_json()["bank_conflicts"] == {"S": {"ways": 32}}
    with pytest.raises(ValueError, match="reserved"):
        r.add_section("violations", [])
    with pytest.raises(ValueError, match="exit_code"):
        r.add_section("races", [], exit_code=2)
    assert isinstance(r, CheckResult)


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
