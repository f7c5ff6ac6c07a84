"""Checks, in a warp-specialized kernel's CUDA, that the consumer releases each pipeline stage only
after its last read of every buffer the producer refills behind that release.

TileLang 0.1.15 guards the producer's plain (non-TMA) shared writes with the back-pressure wait of the
first TMA copy before them, while the consumer arrives on that barrier after its last use of that
copy's buffer only. When the plain-written rows are read later than that, the producer overwrites
them under the consumer (the d 256 dV kernel of dense_bwd did: wrong and different on every run).
The check reads the source text: offsets are positions in the CUDA, loop variables are matched across
the two branches by name up to TileLang's ``_<n>`` suffix."""

import re

CAST = re.compile(r"\(\([\w:]+\*\)(\w+)\)")
WAIT = re.compile(r"(\w+)\[([^\]]*(?:\[[^\]]*\][^\]]*)*)\]\.wait\(")
ARRIVE = re.compile(r"(\w+)\[([^\]]*(?:\[[^\]]*\][^\]]*)*)\]\.arrive(?:_and_expect_tx)?\(")
BRANCH = re.compile(r"\bif \(([^{]*threadIdx\.x[^{]*)\) \{")


def _block_end(cuda: str, open_brace: int) -> int:
    """Offset of the brace that closes the one at ``open_brace``."""
    depth = 0
    for at in range(open_brace, len(cuda)):
        depth += {"{": 1, "}": -1}.get(cuda[at], 0)
        if depth == 0:
            return at
    raise ValueError(f"unbalanced braces from offset {open_brace}")


def _back_pressure(text: str) -> bool:
    """A wait on the inverted parity: a producer waiting for a stage to be released."""
    return re.search(r"\.wait\([^;]*\^ 1\)\);", text) is not None


def warp_specialized_branches(cuda: str) -> list[tuple[int, int, int, int]]:
    """(producer start, producer end, consumer start, consumer end) of every thread-index split
    whose one branch waits for released stages and whose other branch releases them and never waits
    for a release (the innermost such split)."""
    splits = []
    for match in BRANCH.finditer(cuda):
        then_open = match.end() - 1
        then_close = _block_end(cuda, then_open)
        if not cuda.startswith(" else {", then_close + 1):
            continue
        else_open = then_close + len(" else {")
        else_close = _block_end(cuda, else_open)
        first, second = cuda[then_open:then_close], cuda[else_open:else_close]
        for (p0, p1, producer), (c0, c1, consumer) in (
            ((then_open, then_close, first), (else_open, else_close, second)),
            ((else_open, else_close, second), (then_open, then_close, first)),
        ):
            if _back_pressure(producer) and ARRIVE.search(consumer) and not _back_pressure(consumer):
                splits.append((p0, p1, c0, c1))
    return [s for s in splits if not any(o != s and s[0] <= o[0] and o[3] <= s[3] for o in splits)]


def _same_stage(index: str) -> str:
    """A barrier index with TileLang's per-branch variable suffixes (step, step_1) dropped."""
    return re.sub(r"\b([A-Za-z]\w*?)_\d+\b", r"\1", index).replace(" ", "")


def _statements(text: str, start: int):
    """(offset, statement) of every statement in ``text`` (pieces between ';', '{' and '}'),
    offsets from ``start``."""
    for piece in re.finditer(r"[^;{}]+", text):
        stripped = piece.group().lstrip()
        yield start + piece.end() - len(stripped), stripped


def _written_buffer(statement: str) -> str | None:
    """The shared buffer a producer statement writes: a TMA or cp.async destination, or the cast
    pointer on the left of an assignment."""
    if statement.startswith(("tl::tma_load", "tl::cp_async")):
        target = CAST.search(statement)
        return target.group(1) if target else None
    head = statement.split(" = ", 1)
    target = CAST.search(head[0]) if len(head) == 2 else None
    return target.group(1) if target else None


def _enclosing_loop(cuda: str, at: int, lower: int) -> tuple[int, int] | None:
    """Body (start, end) of the innermost ``for`` loop around offset ``at`` that opens after ``lower``."""
    for loop in reversed([m for m in re.finditer(r"\bfor \([^{]*\) \{", cuda[lower:at])]):
        body_open = lower + loop.end() - 1
        body_close = _block_end(cuda, body_open)
        if body_close > at:
            return body_open, body_close
    return None


def _guards(cuda: str, p0: int, p1: int) -> set[tuple[str, str, str]]:
    """(buffer, barrier, stage) of every producer write and the producer's last wait before it."""
    guards = set()
    for offset, statement in _statements(cuda[p0:p1], p0):
        buffer = _written_buffer(statement)
        waits = list(WAIT.finditer(cuda, p0, offset))
        if buffer and waits:
            guards.add((buffer, waits[-1].group(1), _same_stage(waits[-1].group(2))))
    return guards


def early_releases(cuda: str) -> tuple[set[str], list[str]]:
    """The buffers the producer refills behind a release, and every one the consumer releases
    (arrives on the barrier the producer waits before writing it) earlier in a loop iteration than
    its last read of the buffer in that iteration."""
    staged, problems = set(), []
    for p0, p1, c0, c1 in warp_specialized_branches(cuda):
        for buffer, barrier, stage in sorted(_guards(cuda, p0, p1)):
            staged.add(buffer)
            arrives = [m.start() for m in ARRIVE.finditer(cuda, c0, c1)
                       if m.group(1) == barrier and _same_stage(m.group(2)) == stage]
            reads = [m.start() for m in re.finditer(rf"\*\){buffer}\)", cuda[c0:c1])]
            for arrive in arrives:
                loop = _enclosing_loop(cuda, arrive, c0)
                last_read = max((c0 + r for r in reads if loop and loop[0] < c0 + r < loop[1]), default=None)
                if last_read is not None and last_read > arrive:
                    problems.append(f"{buffer}: {barrier}[{stage}] released at {arrive}, last read at {last_read}")
    return staged, problems


def assert_stages_released_after_last_read(cuda: str, staged: set[str]) -> None:
    """Fails when the pipeline does not refill every buffer of ``staged`` (the check would not see
    it) or when a stage is released before the consumer's last read of a buffer refilled behind it."""
    seen, problems = early_releases(cuda)
    assert staged <= seen, f"pipeline buffers {sorted(seen)}, expected {sorted(staged)} among them"
    assert not problems, "; ".join(problems)
