"""Global-memory races between kernels that synchronise across streams, CTAs and ranks.

``races.py`` decides races inside one kernel's shared memory. A protocol such as MegaMoE's
(``kernels/moe/mega/layer.py``) orders its global-memory traffic between kernels instead: by
stream order, by a stream waiting for another, and by flags that one kernel releases and another
acquires (system-scope release / acquire, compared for equality with a per-call epoch). This
module decides, for such a protocol written as a list of :class:`Segment` in host enqueue
order, whether every two accesses to one region of one buffer, at least one a write, are
ordered by happens-before; an unordered pair is a race, reported with both segments.

Model. A segment is a kernel, or the part of a persistent kernel between two of its flag
releases, on one (rank, stream). Happens-before is the transitive closure of: program order on
a stream (segments in the order they were enqueued there); ``joins`` (the stream waits for
everything enqueued so far on each named stream, as ``wait_stream`` and events do); and flags: a
segment that ``sets`` a flag (a release after all of its accesses) happens before every segment
that ``awaits`` the same flag (an acquire before all of its accesses). Flags carry the call in
their key, so a wait of call c is satisfied by call c's release only (the epoch scheme). A wait
that times out leaves its outputs unspecified and the caller raises, so a wait is assumed to
arrive; the flags themselves are the synchronisation and are not data. A kernel launched as a
programmatic dependent (``T.pdl_sync()``, ``tlx/passes/pdl.py``) is two segments: a
``programmatic`` one, its accesses before its grid-dependency wait, which follows only what the
stream's last ordinary launch followed (the grids since then may still run: the kernel may start
once they have all started), and the next segment on its stream, the rest of it, which follows the
grid before it as an ordinary launch does and ends after it (each of its CTAs waits, so a grid of a
dependent never ends before the grid before it). Regions are a buffer of a
rank and a part of it (``None``: all of it; two parts overlap when either is ``None`` or they
are equal). Accesses within one segment are the kernel's own business (``races.py`` and the
bounds verifier); two segments may still be the same kernel run twice, in two calls.

What this does not decide: whether the kernels really access what their segments say (the
caller's table; ``tests/kernels/moe/mega`` checks the MegaMoE table against the kernels' own
reads and writes), and memory-model details below release / acquire (a stale line of a
non-coherent cache: the MegaMoE layer reads peer data only in kernels launched after the
acquiring one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Access:
    """One segment's reads or writes of ``buffer`` (a hashable key naming the owner too) in
    ``part`` (None: the whole buffer)."""

    buffer: tuple
    part: object = None
    write: bool = False


@dataclass(frozen=True)
class Segment:
    """A kernel (or part of one) enqueued on ``stream`` (a hashable key, e.g. (rank, "compute")).
    ``joins``: streams this one waits for, everything enqueued on them so far, before it;
    ``awaits`` / ``sets``: flag keys acquired before its accesses / released after them;
    ``programmatic``: the accesses of a programmatic dependent launch before its grid-dependency
    wait (no joins, flags or release of its own); the next segment on the stream is the rest of it."""

    name: str
    stream: tuple
    accesses: tuple[Access, ...] = ()
    awaits: tuple = ()
    sets: tuple = ()
    joins: tuple = ()
    programmatic: bool = False


@dataclass
class Race:
    first: Segment
    second: Segment
    buffer: tuple
    part: object
    kinds: str = field(default="")  # "write/write" or "write/read"

    def __str__(self) -> str:
        where = f"{self.buffer}" + (f" part {self.part}" if self.part is not None else "")
        return (f"race on {where} ({self.kinds}): {self.first.name} on {self.first.stream} and "
                f"{self.second.name} on {self.second.stream} are not ordered")


def happens_before(segments: Sequence[Segment]) -> list[int]:
    """Per segment i, a bit set of the segments that happen before it (bit j: j before i)."""
    preds: list[set[int]] = [set() for _ in segments]
    last: dict = {}  # stream -> index of its last segment so far
    setters: dict = {}
    for i, seg in enumerate(segments):
        for flag in seg.sets:
            setters.setdefault(flag, []).append(i)
    floor: dict = {}  # stream -> what its last ordinary launch followed (a dependent's early part follows that)
    early: dict = {}  # stream -> the early part of the dependent launch whose rest comes next
    for i, seg in enumerate(segments):
        if seg.programmatic:
            if seg.joins or seg.awaits or seg.sets or seg.stream in early:
                raise ValueError(f"{seg.name} on {seg.stream}: the early part of a programmatic dependent launch has no "
                                 f"joins or flags and is followed by the rest of its kernel")
            preds[i] = set(floor.get(seg.stream, ()))
            early[seg.stream] = i
            continue  # the stream's last grid may still run
        if seg.stream in last:
            preds[i].add(last[seg.stream])
        rest_of_dependent = seg.stream in early
        if rest_of_dependent:
            preds[i].add(early.pop(seg.stream))
        for other in seg.joins:
            if other in last:
                preds[i].add(last[other])
        for flag in seg.awaits:
            if flag not in setters:
                raise ValueError(f"{seg.name} on {seg.stream} awaits {flag}, which no segment sets")
            preds[i].update(setters[flag])
        if not rest_of_dependent:
            floor[seg.stream] = set(preds[i])
        last[seg.stream] = i
    if early:
        stream, i = next(iter(early.items()))
        raise ValueError(f"{segments[i].name} on {stream}: the early part of a programmatic dependent launch is the last "
                         f"segment of its stream (the rest of its kernel must follow)")
    # a flag's setter may be enqueued after its waiter (another stream, another host order):
    # close over the graph to a fixed point, not in one pass over the enqueue order
    before = [0] * len(segments)
    changed = True
    while changed:
        changed = False
        for i, ps in enumerate(preds):
            bits = before[i]
            for j in ps:
                bits |= before[j] | (1 << j)
            if bits != before[i]:
                if bits >> i & 1:
                    raise ValueError(f"{segments[i].name} on {segments[i].stream} waits for itself (a cycle of flags)")
                before[i] = bits
                changed = True
    return before


def _overlap(a: object, b: object) -> bool:
    return a is None or b is None or a == b


def find_races(segments: Sequence[Segment]) -> list[Race]:
    """Every pair of accesses of two segments to overlapping regions of one buffer, at least one
    a write, that happens-before does not order (one race per segment pair and buffer)."""
    before = happens_before(segments)
    by_buffer: dict = {}
    for i, seg in enumerate(segments):
        for acc in seg.accesses:
            by_buffer.setdefault(acc.buffer, []).append((i, acc))
    races, seen = [], set()
    for buffer, accs in by_buffer.items():
        for x, (i, a) in enumerate(accs):
            for j, b in accs[x + 1:]:
                if i == j or not (a.write or b.write) or not _overlap(a.part, b.part):
                    continue
                if before[j] >> i & 1 or before[i] >> j & 1 or (i, j, buffer) in seen:
                    continue
                seen.add((i, j, buffer))
                kinds = "write/write" if a.write and b.write else "write/read"
                races.append(Race(segments[i], segments[j], buffer, a.part if a.part is not None else b.part, kinds))
    return races

