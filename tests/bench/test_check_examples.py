"""bench/check_examples.py without a checkout: a row and the table from a fake ``tlx check --json``
result, including the vectors analysis' branching selects."""

import bench.check_examples as ce


def _result(branches):
    verdict = {"verdict": "ok"}
    return {"exit": 0, "seconds": 2.0, "result": {
        "accesses": 10, "proven": 10, "violations": [], "unknown": [], "preconditions": [], "seconds": 0.1,
        "verdicts": {a: verdict for a in ce.ANALYSES},
        "vectors": {"branches": [{"conditional": c} for c in branches]}}}


def test_rows_count_branching_selects_and_the_table_names_their_examples():
    rows = [ce._row("cast/a.py", _result([False, True])), ce._row("gemm/b.py", _result([])),
            ce._row("norm/c.py", {"status": "not captured", "detail": "no main()"})]
    assert (rows[0]["branching_selects"], rows[0]["branching_selects_unconditional"]) == (2, 1)
    assert (rows[1]["branching_selects"], rows[1]["branching_selects_unconditional"]) == (0, 0)
    table = ce._table(rows)
    assert "branching selects (vectors' note): 2 in 1 examples (1 not on a conditional path); cast/a.py 2" in table
    assert "| 3 | 2 | 20 | 20 | 100.00% |" in table  # examples, checked, accesses, proven, rate


def test_the_table_names_the_unchecked_assumes():
    result = _result([])
    result["result"]["unchecked_assumes"] = [{"condition": "bx < 4", "names": ["bx"]}]
    rows = [ce._row("gemm/a.py", result), ce._row("gemm/b.py", _result([]))]
    assert rows[0]["unchecked_assumes"] == ["bx < 4"] and rows[1]["unchecked_assumes"] == []
    assert "unchecked T.assume (kept on the device, checked nowhere): 1 in 1 examples; gemm/a.py: bx < 4" in ce._table(rows)


def test_the_table_counts_the_late_pollers():
    result = _result([])
    result["result"]["progress"] = {"kernels": [{"kernel": "k", "verdict": "unknown", "detail": f"schedule 0: threads 16 ...: {ce.LATE}"}]}
    rows = [ce._row("gemm/a.py", result), ce._row("gemm/b.py", _result([]))]
    assert [r["progress_late"] for r in rows] == [True, False]
    assert "progress unknown because a polling thread fell two phases behind (a fair schedule finishes): 1 examples" in ce._table(rows)
