"""Unit tests for worker.offsets: the committable offset is the first unanswered record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kembed_shared.ports import TopicPartition
from worker.offsets import OffsetTracker

TP: TopicPartition = ("embed.requests", 0)
OTHER: TopicPartition = ("embed.requests", 1)


def test_unseen_partition_has_nothing_to_commit() -> None:
    """A partition that never had a record tracked has no committable offset."""
    tracker = OffsetTracker()
    assert tracker.committable(TP) is None
    assert tracker.in_flight() == 0
    assert tracker.partitions() == []


def test_committable_is_lowest_unanswered_offset() -> None:
    """While records are in flight, the committable offset is the lowest unanswered one."""
    tracker = OffsetTracker()
    for offset in (0, 1, 2):
        tracker.track(TP, offset)
    assert tracker.committable(TP) == 0
    tracker.done(TP, 0)
    assert tracker.committable(TP) == 1
    tracker.done(TP, 1)
    assert tracker.committable(TP) == 2


def test_all_done_commits_one_past_highest() -> None:
    """When every tracked record is answered, the committable offset is high + 1."""
    tracker = OffsetTracker()
    for offset in (40, 41, 42):
        tracker.track(TP, offset)
    for offset in (40, 41, 42):
        tracker.done(TP, offset)
    assert tracker.committable(TP) == 43
    assert tracker.in_flight() == 0


def test_out_of_order_completion_does_not_skip_unanswered() -> None:
    """Later records finishing first never move the committable offset past an earlier one."""
    tracker = OffsetTracker()
    for offset in range(10, 15):
        tracker.track(TP, offset)
    tracker.done(TP, 14)
    tracker.done(TP, 12)
    tracker.done(TP, 11)
    assert tracker.committable(TP) == 10
    tracker.done(TP, 10)
    assert tracker.committable(TP) == 13
    tracker.done(TP, 13)
    assert tracker.committable(TP) == 15


def test_offset_gaps_are_skipped() -> None:
    """Offsets need not be contiguous (compaction, transaction markers): gaps never block."""
    tracker = OffsetTracker()
    for offset in (3, 7, 20):
        tracker.track(TP, offset)
    tracker.done(TP, 3)
    assert tracker.committable(TP) == 7
    tracker.done(TP, 20)
    assert tracker.committable(TP) == 7
    tracker.done(TP, 7)
    assert tracker.committable(TP) == 21


def test_partitions_are_independent() -> None:
    """An unanswered record in one partition does not hold back another partition."""
    tracker = OffsetTracker()
    tracker.track(TP, 5)
    tracker.track(TP, 6)
    tracker.track(OTHER, 100)
    tracker.done(OTHER, 100)
    tracker.done(TP, 6)
    assert tracker.committable(OTHER) == 101
    assert tracker.committable(TP) == 5
    assert sorted(tracker.partitions()) == sorted([TP, OTHER])


def test_done_on_forgotten_partition_is_ignored() -> None:
    """After a partition is forgotten (revoked), late answers for it change nothing."""
    tracker = OffsetTracker()
    tracker.track(TP, 1)
    tracker.track(OTHER, 1)
    tracker.forget([TP])
    tracker.done(TP, 1)
    assert tracker.committable(TP) is None
    assert TP not in tracker.partitions()
    assert tracker.in_flight() == 1
    assert tracker.committable(OTHER) == 1


def test_done_on_never_seen_partition_creates_nothing() -> None:
    """An answer for a partition never tracked neither raises nor registers the partition."""
    tracker = OffsetTracker()
    tracker.done(TP, 9)
    assert tracker.partitions() == []
    assert tracker.committable(TP) is None


def test_reassigned_partition_starts_fresh() -> None:
    """A partition tracked again after forget() starts from its new records only."""
    tracker = OffsetTracker()
    tracker.track(TP, 1)
    tracker.forget([TP])
    tracker.track(TP, 50)
    assert tracker.committable(TP) == 50
    tracker.done(TP, 50)
    assert tracker.committable(TP) == 51


def test_in_flight_counts_all_or_selected_partitions() -> None:
    """in_flight() counts unanswered records overall or in the given partitions only."""
    tracker = OffsetTracker()
    for offset in range(4):
        tracker.track(TP, offset)
    for offset in range(3):
        tracker.track(OTHER, offset)
    tracker.done(TP, 2)  # done but behind an unanswered offset: still not counted
    tracker.done(OTHER, 0)
    assert tracker.in_flight() == 5
    assert tracker.in_flight([TP]) == 3
    assert tracker.in_flight([OTHER]) == 2
    assert tracker.in_flight([("unknown", 0)]) == 0
    assert tracker.in_flight([]) == 0


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    offsets=st.sets(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=60),
)
def test_committable_tracks_smallest_unanswered_in_any_order(
    data: st.DataObject, offsets: set[int]
) -> None:
    """For any completion order, committable never passes the smallest unanswered offset."""
    tracker = OffsetTracker()
    ordered = sorted(offsets)
    for offset in ordered:
        tracker.track(TP, offset)
    order = data.draw(st.permutations(ordered))
    remaining = set(ordered)
    for offset in order:
        tracker.done(TP, offset)
        remaining.discard(offset)
        committable = tracker.committable(TP)
        assert committable is not None
        if remaining:
            assert committable <= min(remaining)
            assert committable == min(remaining)
        assert tracker.in_flight() == len(remaining)
    assert tracker.committable(TP) == max(ordered) + 1


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    offsets=st.sets(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=60),
)
def test_first_unanswered_is_the_smallest_offset_in_flight_and_not_ready(
    data: st.DataObject, offsets: set[int]
) -> None:
    """first_unanswered(tp, ready) is the smallest offset in flight outside ``ready``
    (None if there is none), whatever was answered before (answered offsets may linger
    inside the heap), and it changes nothing."""
    tracker = OffsetTracker()
    ordered = sorted(offsets)
    for offset in ordered:
        tracker.track(TP, offset)
    answered = data.draw(st.sets(st.sampled_from(ordered)))
    for offset in data.draw(st.permutations(sorted(answered))):
        tracker.done(TP, offset)
    in_flight = set(ordered) - answered
    ready = data.draw(st.sets(st.sampled_from(ordered)))
    expected = min(in_flight - ready, default=None)
    before = (tracker.committable(TP), tracker.in_flight())
    assert tracker.first_unanswered(TP, ready) == expected
    assert (tracker.committable(TP), tracker.in_flight()) == before
    assert tracker.first_unanswered(OTHER, ready) is None
