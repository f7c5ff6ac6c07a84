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
