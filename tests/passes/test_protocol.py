"""tlx/passes/protocol.py on small protocols: stream order, stream joins and flags order what they
should, a missing acquire or a reused buffer without a flag back is a race with both segments
named, a flag nobody sets or a cycle of flags is refused."""

import pytest

from tlx.passes.protocol import Access, Segment, find_races, happens_before


def _producer_consumer(acquire: bool = True, calls: int = 1, flag_back: bool = True):
    """Rank 0 writes buf and releases READY; rank 1 acquires it and reads buf, then releases
    TAKEN, which rank 0 acquires before it writes buf again in the next call."""
    segs = []
    for c in range(calls):
        segs.append(Segment(f"write {c}", (0, "s"), (Access(("buf", 0), write=True),), sets=(("READY", c),),
                            awaits=(("TAKEN", c - 1),) if c and flag_back else ()))
        segs.append(Segment(f"read {c}", (1, "s"), (Access(("buf", 0)),), awaits=(("READY", c),) if acquire else (),
                            sets=(("TAKEN", c),)))
    return segs


def test_a_flag_orders_a_write_before_the_read_it_publishes():
    assert find_races(_producer_consumer()) == []
    before = happens_before(_producer_consumer())
    assert before[1] >> 0 & 1 and not before[0] >> 1 & 1


def test_a_read_without_the_acquire_races_with_the_write():
    [race] = find_races(_producer_consumer(acquire=False))
    assert (race.first.name, race.second.name, race.buffer, race.kinds) == ("write 0", "read 0", ("buf", 0), "write/read")
    assert str(race) == "race on ('buf', 0) (write/read): write 0 on (0, 's') and read 0 on (1, 's') are not ordered"


def test_reuse_in_the_next_call_needs_the_flag_back():
    assert find_races(_producer_consumer(calls=3)) == []
    races = find_races(_producer_consumer(calls=2, flag_back=False))
    assert [(r.first.name, r.second.name) for r in races] == [("read 0", "write 1")]  # the next write may overtake the read


def test_stream_order_and_joins_order_segments_but_not_across_streams_alone():
    write = Segment("write", ("a",), (Access(("x",), write=True),))
    read_same = Segment("read on a", ("a",), (Access(("x",)),))
    read_other = Segment("read on b", ("b",), (Access(("x",)),))
    read_joined = Segment("read on c", ("c",), (Access(("x",)),), joins=(("a",),))
    races = find_races([write, read_same, read_other, read_joined])
    assert [(r.first.name, r.second.name) for r in races] == [("write", "read on b")]


def test_parts_of_a_buffer_are_separate_regions_and_none_is_all_of_it():
    w0 = Segment("w0", ("a",), (Access(("x",), 0, True),))
    r1 = Segment("r1", ("b",), (Access(("x",), 1),))
    r_all = Segment("r_all", ("c",), (Access(("x",)),))
    assert [(r.first.name, r.second.name, r.part) for r in find_races([w0, r1, r_all])] == [("w0", "r_all", 0)]


def test_a_flag_set_later_in_host_order_still_orders():
    """The waiter may be enqueued before its setter (another stream): the closure is a fixed point."""
    read = Segment("read", ("b",), (Access(("x",)),), awaits=(("F",),))
    write = Segment("write", ("a",), (Access(("x",), write=True),), sets=(("F",),))
    assert find_races([read, write]) == []


def test_unset_flags_and_cycles_are_refused():
    with pytest.raises(ValueError, match=r"read on \('b',\) awaits \('F',\), which no segment sets"):
        find_races([Segment("read", ("b",), awaits=(("F",),))])
    with pytest.raises(ValueError, match="waits for itself"):
        find_races([Segment("x", ("a",), awaits=(("G",),), sets=(("F",),)), Segment("y", ("b",), awaits=(("F",),), sets=(("G",),))])


def _dependent(name, stream, early, rest):
    """A programmatic dependent launch: its accesses before and after its grid-dependency wait."""
    return [Segment(f"{name} early", stream, early, programmatic=True), Segment(name, stream, rest)]


def test_a_dependent_launch_overlaps_the_grid_before_it_until_its_wait():
    """Before its wait a dependent kernel may run beside the grid before it: reading what that grid
    writes is a race, reading what an earlier, ordinary launch wrote is not; after its wait it
    follows that grid, and the next ordinary launch follows both of its parts."""
    meta, act, w, out = Access(("meta",), write=True), Access(("act",), write=True), Access(("w",)), Access(("out",), write=True)
    base = [Segment("metadata", ("s",), (meta,)), Segment("dispatch", ("s",), (Access(("meta",)), act))]
    ok = base + _dependent("gemm", ("s",), (w, Access(("meta",))), (Access(("act",)), out)) + [
        Segment("next call's metadata", ("s",), (meta, Access(("w",), write=True)))]
    assert find_races(ok) == []
    early_act = base + _dependent("gemm", ("s",), (Access(("act",)),), (out,))
    [race] = find_races(early_act)
    assert (race.first.name, race.second.name, race.buffer) == ("dispatch", "gemm early", ("act",))


def test_a_chain_of_dependents_overlaps_back_to_the_last_ordinary_launch():
    """L2 as a dependent of L1, itself a dependent of the dispatch: L2 may start once every L1 CTA
    has started, possibly before the dispatch has finished, so its early read of the dispatch's
    output races; its read after the wait does not (L1's grid ends after the dispatch's)."""
    act = Access(("act",), write=True)
    chain = ([Segment("dispatch", ("s",), (act,))] + _dependent("l1", ("s",), (), (Access(("act",)), Access(("h",), True)))
             + _dependent("l2", ("s",), (Access(("act",)),), (Access(("h",)),)))
    assert [(r.first.name, r.second.name) for r in find_races(chain)] == [("dispatch", "l2 early")]
    chain[-2] = Segment("l2 early", ("s",), (), programmatic=True)
    chain[-1] = Segment("l2", ("s",), (Access(("h",)), Access(("act",))))
    assert find_races(chain) == []


def test_an_early_part_must_be_plain_and_followed_by_its_kernel():
    lone = Segment("early", ("s",), (), programmatic=True)
    for bad in (Segment("early", ("s",), (), joins=(("t",),), programmatic=True),
                Segment("early", ("s",), (), sets=(("F",),), programmatic=True)):
        with pytest.raises(ValueError, match="has no joins or flags"):
            happens_before([bad, Segment("rest", ("s",))])
    with pytest.raises(ValueError, match="has no joins or flags"):
        happens_before([lone, lone, Segment("rest", ("s",))])
    with pytest.raises(ValueError, match="the last segment of its stream"):
        happens_before([lone])
