"""Unit tests for worker.batcher: token-budgeted, length-homogeneous, starvation-free batches."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.batcher import Batcher, Item


def make_item(length: int, enqueued: float = 0.0, job: int = 0, index: int = 0) -> Item[int]:
    return Item(job=job, index=index, ids=[7] * length, enqueued=enqueued)


def padded_cost(batch: list[Item[int]]) -> int:
    return len(batch) * max(item.length for item in batch)


def assert_within_limits(batch: list[Item[int]], batcher: Batcher[int]) -> None:
    assert 1 <= len(batch) <= batcher.max_batch_size
    if len(batch) > 1:
        assert padded_cost(batch) <= batcher.max_batch_tokens


def drain(batcher: Batcher[int]) -> list[list[Item[int]]]:
    batches = []
    while len(batcher):
        batch = batcher.next_batch()
        assert batch, "next_batch returned nothing while items wait"
        batches.append(batch)
    return batches


def test_limits_must_be_positive() -> None:
    """A batcher with a zero token budget or batch size is refused."""
    with pytest.raises(ValueError, match="positive"):
        Batcher[int](0, 8)
    with pytest.raises(ValueError, match="positive"):
        Batcher[int](100, 0)


def test_next_batch_of_empty_batcher_is_empty() -> None:
    """Cutting a batch when nothing waits returns an empty list."""
    batcher = Batcher[int](100, 4)
    assert batcher.next_batch() == []
    assert len(batcher) == 0
    assert batcher.waiting_tokens == 0


def test_padded_cost_never_exceeds_budget() -> None:
    """Every multi-item batch costs at most max_batch_tokens as len(batch) * longest."""
    rng = random.Random(1)
    batcher = Batcher[int](max_batch_tokens=512, max_batch_size=64)
    for i in range(400):
        batcher.add(make_item(rng.randint(1, 200), index=i))
    batches = drain(batcher)
    assert sum(len(b) for b in batches) == 400
    for batch in batches:
        assert_within_limits(batch, batcher)
    # The budget is actually used: some batch holds more than one item.
    assert any(len(b) > 1 for b in batches)


def test_over_budget_item_forms_its_own_batch() -> None:
    """An input longer than the budget is cut alone and is never joined by another input."""
    batcher = Batcher[int](max_batch_tokens=100, max_batch_size=8)
    big = make_item(150)
    small = [make_item(10) for _ in range(3)]
    batcher.add(big)
    for item in small:
        batcher.add(item)
    first = batcher.next_batch()
    assert first == [big]
    second = batcher.next_batch()
    assert sorted(id(i) for i in second) == sorted(id(i) for i in small)
    assert len(batcher) == 0


def test_over_budget_item_behind_others_still_alone() -> None:
    """A too-long input that is not the oldest is not padded into the short inputs' batch."""
    batcher = Batcher[int](max_batch_tokens=100, max_batch_size=8)
    first_small, big, second_small = make_item(10), make_item(150), make_item(10)
    for item in (first_small, big, second_small):
        batcher.add(item)
    assert batcher.next_batch() == [first_small, second_small]
    assert batcher.next_batch() == [big]


def test_batch_never_exceeds_max_batch_size() -> None:
    """Identical short inputs that fit the token budget are still capped at max_batch_size."""
    batcher = Batcher[int](max_batch_tokens=10_000, max_batch_size=5)
    for i in range(23):
        batcher.add(make_item(3, index=i))
    sizes = [len(b) for b in drain(batcher)]
    assert sizes == [5, 5, 5, 5, 3]


def test_oldest_item_is_in_every_batch() -> None:
    """Each cut batch contains the item that has waited longest."""
    rng = random.Random(2)
    batcher = Batcher[int](max_batch_tokens=600, max_batch_size=16)
    waiting: list[Item[int]] = []  # insertion order
    for step in range(300):
        for _ in range(rng.randint(0, 5)):
            item = make_item(rng.choice([1, 2, 5, 40, 120, 300]), index=step)
            batcher.add(item)
            waiting.append(item)
        if not waiting:
            continue
        batch = batcher.next_batch()
        assert any(item is waiting[0] for item in batch)
        taken = {id(item) for item in batch}
        waiting = [item for item in waiting if id(item) not in taken]


def test_no_starvation_in_long_mixed_stream() -> None:
    """In a long stream of mixed lengths, no input waits more batches than inputs were ahead."""
    rng = random.Random(3)
    batcher = Batcher[int](max_batch_tokens=1024, max_batch_size=32)
    ahead_at_enqueue: dict[int, int] = {}
    enqueued_at: dict[int, int] = {}
    waited: dict[int, int] = {}
    serial = 0
    for step in range(2000):
        for _ in range(rng.randint(0, 8)):
            # Mostly short, often very long: the long ones are the starvation risk.
            length = rng.randint(1, 30) if rng.random() < 0.6 else rng.randint(200, 300)
            ahead_at_enqueue[serial] = len(batcher)
            enqueued_at[serial] = step
            batcher.add(make_item(length, index=serial))
            serial += 1
        for item in batcher.next_batch():
            waited[item.index] = step - enqueued_at[item.index]
    for extra, item_list in enumerate(drain(batcher)):
        for item in item_list:
            waited[item.index] = 2000 + extra - enqueued_at[item.index]
    assert len(waited) == serial
    for index, wait in waited.items():
        assert wait <= ahead_at_enqueue[index], (index, wait, ahead_at_enqueue[index])
    # The load is sustainable but not trivial: some inputs do wait, none waits long.
    assert 2 <= max(waited.values()) <= 12


def test_small_window_still_serves_the_oldest() -> None:
    """With a candidate window smaller than the queue, the oldest input is still taken first."""
    batcher = Batcher[int](max_batch_tokens=1000, max_batch_size=4, window=2)
    items = [make_item(length, index=i) for i, length in enumerate([300, 5, 5, 5, 300])]
    for item in items:
        batcher.add(item)
    first = batcher.next_batch()
    assert items[0] in first
    assert len(first) <= 2  # only the window's two oldest were candidates


def test_batches_are_length_homogeneous() -> None:
    """Interleaved 5- and 200-token inputs are never mixed while enough of each wait."""
    batcher = Batcher[int](max_batch_tokens=1000, max_batch_size=16)
    for i in range(50):
        batcher.add(make_item(5, index=2 * i))
        batcher.add(make_item(200, index=2 * i + 1))
    remaining = Counter({5: 50, 200: 50})
    while len(batcher):
        enough = remaining[5] >= 16 and remaining[200] >= 5
        batch = batcher.next_batch()
        lengths = {item.length for item in batch}
        if enough:
            assert len(lengths) == 1, lengths
        for item in batch:
            remaining[item.length] -= 1
    assert remaining == Counter({5: 0, 200: 0})


def test_mixed_batch_prefers_neighbours_of_similar_length() -> None:
    """Around the oldest input, the batch grows towards the length that wastes less padding."""
    batcher = Batcher[int](max_batch_tokens=10_000, max_batch_size=2)
    oldest = make_item(100)
    batcher.add(oldest)
    batcher.add(make_item(10))
    near = make_item(104)
    batcher.add(near)
    batcher.add(make_item(300))
    assert batcher.next_batch() == [oldest, near]


def test_ready_false_when_empty() -> None:
    """An empty batcher is never ready, whatever the clock says."""
    batcher = Batcher[int](100, 4)
    assert not batcher.ready(now=1e9, max_wait=0.0)


def test_ready_after_oldest_waited_max_wait() -> None:
    """ready() turns true exactly when the oldest input has waited max_wait."""
    batcher = Batcher[int](max_batch_tokens=1000, max_batch_size=10)
    batcher.add(make_item(3, enqueued=10.0))
    batcher.add(make_item(3, enqueued=10.5))
    assert not batcher.ready(now=10.0019, max_wait=0.002)
    assert batcher.ready(now=10.002, max_wait=0.002)
    assert batcher.ready(now=11.0, max_wait=0.002)


def test_ready_when_max_batch_size_items_wait() -> None:
    """ready() is true once max_batch_size inputs wait, even before max_wait."""
    batcher = Batcher[int](max_batch_tokens=10_000, max_batch_size=3)
    batcher.add(make_item(2, enqueued=5.0))
    batcher.add(make_item(2, enqueued=5.0))
    assert not batcher.ready(now=5.0, max_wait=1.0)
    batcher.add(make_item(2, enqueued=5.0))
    assert batcher.ready(now=5.0, max_wait=1.0)


def test_ready_when_padded_cost_reaches_budget() -> None:
    """ready() is true once len(waiting) * longest reaches max_batch_tokens."""
    batcher = Batcher[int](max_batch_tokens=100, max_batch_size=10)
    batcher.add(make_item(10, enqueued=0.0))
    assert not batcher.ready(now=0.0, max_wait=1.0)  # 1 * 10
    batcher.add(make_item(49, enqueued=0.0))
    assert not batcher.ready(now=0.0, max_wait=1.0)  # 2 * 49 = 98
    batcher.add(make_item(1, enqueued=0.0))
    assert batcher.ready(now=0.0, max_wait=1.0)  # 3 * 49 = 147


def test_ready_when_single_item_fills_budget() -> None:
    """A single input as long as the budget makes the batcher ready at once."""
    batcher = Batcher[int](max_batch_tokens=100, max_batch_size=10)
    batcher.add(make_item(100, enqueued=0.0))
    assert batcher.ready(now=0.0, max_wait=1.0)


def test_oldest_enqueued_tracks_the_oldest_waiting() -> None:
    """oldest_enqueued() reports the earliest enqueue time still waiting, None when empty."""
    batcher = Batcher[int](max_batch_tokens=1000, max_batch_size=1)
    assert batcher.oldest_enqueued() is None
    batcher.add(make_item(4, enqueued=1.0))
    batcher.add(make_item(4, enqueued=2.0))
    assert batcher.oldest_enqueued() == 1.0
    batcher.next_batch()
    assert batcher.oldest_enqueued() == 2.0
    batcher.next_batch()
    assert batcher.oldest_enqueued() is None


def test_len_and_waiting_tokens_stay_consistent() -> None:
    """len() and waiting_tokens always equal the count and token sum of waiting inputs."""
    rng = random.Random(4)
    batcher = Batcher[int](max_batch_tokens=300, max_batch_size=8)
    waiting: dict[int, int] = {}
    for step in range(500):
        if rng.random() < 0.6:
            item = make_item(rng.randint(1, 120), index=step)
            batcher.add(item)
            waiting[step] = item.length
        else:
            for item in batcher.next_batch():
                del waiting[item.index]
        assert len(batcher) == len(waiting)
        assert batcher.waiting_tokens == sum(waiting.values())


operations = st.lists(
    st.one_of(st.integers(min_value=1, max_value=300), st.none()),  # None: cut a batch
    max_size=250,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=operations,
    max_batch_tokens=st.integers(min_value=1, max_value=5000),
    max_batch_size=st.integers(min_value=1, max_value=64),
    window=st.integers(min_value=0, max_value=40),
)
def test_every_item_comes_out_exactly_once(
    ops: list[int | None], max_batch_tokens: int, max_batch_size: int, window: int
) -> None:
    """Whatever the lengths and limits, draining yields each input once, in legal batches."""
    batcher = Batcher[int](max_batch_tokens, max_batch_size, window=window)
    added: list[Item[int]] = []
    out: list[Item[int]] = []

    def cut() -> None:
        oldest = min(
            (item for item in added if all(item is not o for o in out)),
            key=lambda it: it.seq,
        )
        batch = batcher.next_batch()
        assert_within_limits(batch, batcher)
        assert any(item is oldest for item in batch)
        out.extend(batch)
        assert len(batcher) == len(added) - len(out)
        assert batcher.waiting_tokens == sum(i.length for i in added) - sum(i.length for i in out)

    for op in ops:
        if op is None:
            if len(batcher):
                cut()
            else:
                assert batcher.next_batch() == []
        else:
            item = make_item(op, index=len(added))
            batcher.add(item)
            added.append(item)
    while len(batcher):
        cut()
    assert batcher.next_batch() == []
    assert batcher.waiting_tokens == 0
    assert Counter(id(i) for i in out) == Counter(id(i) for i in added)
    assert all(count == 1 for count in Counter(id(i) for i in out).values())


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.one_of(st.integers(1, 300), st.sampled_from(["cut", "back"])), max_size=80),
    max_batch_tokens=st.integers(min_value=1, max_value=2000),
    window=st.integers(min_value=0, max_value=12),
)
def test_oldest_is_in_every_batch_when_batches_are_put_back(
    ops: list[int | str], max_batch_tokens: int, window: int
) -> None:
    """Batches cut and put back (a prepared batch preempted) keep the queue oldest first:
    every batch still holds the oldest waiting input, and nothing is lost or doubled."""
    batcher = Batcher[int](max_batch_tokens, 8, window=window)
    waiting: list[Item[int]] = []  # oldest first
    out: list[Item[int]] = []
    for serial, op in enumerate(ops):
        if isinstance(op, int):
            item = make_item(op, index=serial)
            batcher.add(item)
            waiting.append(item)
        elif waiting:
            batch = batcher.next_batch()
            assert any(item is waiting[0] for item in batch)
            if op == "back":
                batcher.put_back(batch)
            else:
                out.extend(batch)
                taken = {id(item) for item in batch}
                waiting = [item for item in waiting if id(item) not in taken]
    assert len(batcher) == len(waiting)
    assert batcher.waiting_tokens == sum(item.length for item in waiting)


def test_an_items_length_is_its_token_count() -> None:
    assert make_item(17).length == 17
    assert Item(job=0, index=0, ids=[], enqueued=0.0).length == 0
