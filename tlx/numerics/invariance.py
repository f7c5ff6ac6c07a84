"""GPU harness for batch invariance and run-to-run determinism.

``check_batch_invariance(fn, make_inputs, batch_sizes)``: every row of ``fn`` on a batch of
b rows must be bitwise identical to the same row computed alone (batch of 1), for every b.
``check_determinism(fn, inputs, runs=100)``: ``fn`` on the same inputs gives the same bits
every run. Both return a report dict (``ok``, counts, the first mismatches with their first
differing element) and never stop at the first difference, so a report shows how widespread
a problem is.

``fn`` takes torch tensors and returns a tensor or a tuple of tensors; batched inputs and
outputs carry the batch in dimension 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["check_batch_invariance", "check_determinism"]

MAX_REPORTED = 10


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _bits(t):
    import torch

    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _difference(actual, expected, name: str) -> str | None:
    """None when the bits agree, else assert_bitwise's description of the first difference."""
    from tlx.numerics.parity import assert_bitwise

    if actual.shape == expected.shape and actual.dtype == expected.dtype and bool((_bits(actual) == _bits(expected)).all()):
        return None
    try:
        assert_bitwise(actual, expected, name=name)
    except AssertionError as e:
        return str(e)
    return None


def check_batch_invariance(
    fn: Callable,
    make_inputs: Callable[[int], Sequence],
    batch_sizes: Sequence[int],
    *,
    batched_args: Sequence[int] | None = None,
) -> dict:
    """Run ``fn`` for each batch size and compare each row with that row computed alone.

    ``make_inputs(n)`` is called once with ``n = max(batch_sizes)``; a batch of b rows is the
    first b rows of every batched input (copied into fresh tensors), so row r is the same data
    in every batch. ``batched_args`` lists which inputs carry the batch dimension; by default
    every tensor whose dimension 0 has size n.
    """
    import torch

    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes: expected positive integers, got {list(batch_sizes)!r}")
    n = sizes[-1]
    inputs = list(make_inputs(n))
    if batched_args is None:
        batched = {i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == n}
    else:
        batched = {int(i) for i in batched_args}
    if not batched:
        raise ValueError(f"make_inputs({n}): expected at least one input with {n} rows in dimension 0 (or pass batched_args)")

    def take(lo: int, hi: int) -> list:
        return [x[lo:hi].clone() if i in batched else x for i, x in enumerate(inputs)]

    alone = [tuple(o.clone() for o in _as_tuple(fn(*take(r, r + 1)))) for r in range(n)]
    mismatches: list[dict] = []
    rows_checked = rows_differing = 0
    for b in sizes:
        outs = _as_tuple(fn(*take(0, b)))
        for r in range(b):
            rows_checked += 1
            for k, (got, want) in enumerate(zip(outs, alone[r])):
                diff = _difference(got[r : r + 1], want, f"output {k}, row {r} of a batch of {b} vs alone")
                if diff is not None:
                    rows_differing += 1
                    if len(mismatches) < MAX_REPORTED:
                        mismatches.append({"batch": b, "row": r, "output": k, "difference": diff})
                    break
    return {"ok": rows_differing == 0, "batch_sizes": sizes, "rows_checked": rows_checked,
            "rows_differing": rows_differing, "mismatches": mismatches}  # fmt: skip


def check_determinism(fn: Callable, inputs: Sequence, runs: int = 100) -> dict:
    """Call ``fn(*inputs)`` ``runs`` times and compare every result with the first.

    Before each run a block of the size of every output is filled with 0xFF bytes and freed,
    so an output the allocator hands back again does not already hold the previous bits.
    """
    import torch

    if runs < 2:
        raise ValueError(f"runs: expected at least 2, got {runs}")
    first = tuple(o.clone() for o in _as_tuple(fn(*inputs)))
    mismatches: list[dict] = []
    runs_differing = 0
    for run in range(1, runs):
        for o in first:
            torch.empty(o.numel() * o.element_size(), dtype=torch.uint8, device=o.device).fill_(0xFF)
        outs = _as_tuple(fn(*inputs))
        for k, (got, want) in enumerate(zip(outs, first)):
            diff = _difference(got, want, f"output {k}, run {run} vs run 0")
            if diff is not None:
                runs_differing += 1
                if len(mismatches) < MAX_REPORTED:
                    mismatches.append({"run": run, "output": k, "difference": diff})
                break
    return {"ok": runs_differing == 0, "runs": runs, "runs_differing": runs_differing, "mismatches": mismatches}
