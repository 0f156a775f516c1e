"""LaneScheduler: interactive first, bulk never starved; Batcher.put_back keeps order."""

from __future__ import annotations

import pytest

from worker.batcher import BULK, INTERACTIVE, Batcher, Item, LaneScheduler


def _item(name: str, length: int = 10, at: float = 0.0) -> Item[str]:
    return Item(name, 0, [1] * length, at)


def _scheduler(bulk_every: int = 4) -> LaneScheduler[str]:
    return LaneScheduler(max_batch_tokens=40, max_batch_size=4, bulk_every=bulk_every)


def test_interactive_goes_first_when_both_lanes_are_ready() -> None:
    """With full batches waiting in both lanes, the next batch is interactive."""
    lanes = _scheduler()
    for i in range(8):
        lanes.add(BULK, _item(f"b{i}"))
        lanes.add(INTERACTIVE, _item(f"i{i}"))
    chosen = lanes.next_batch(now=0.0, max_wait=1.0)
    assert chosen is not None
    assert chosen[0] == INTERACTIVE
    assert {item.job for item in chosen[1]} == {"i0", "i1", "i2", "i3"}


def test_bulk_gets_one_batch_in_every_bulk_every() -> None:
    """Under a flood of interactive work, every bulk_every-th batch is bulk."""
    lanes = _scheduler(bulk_every=3)
    for i in range(40):
        lanes.add(BULK, _item(f"b{i}"))
        lanes.add(INTERACTIVE, _item(f"i{i}"))
    order = []
    for _ in range(9):
        chosen = lanes.next_batch(now=0.0, max_wait=1.0)
        assert chosen is not None
        order.append(chosen[0])
    assert order == [INTERACTIVE, INTERACTIVE, BULK] * 3


def test_bulk_runs_alone_when_no_interactive_work_waits() -> None:
    """Bulk batches are cut back to back when the interactive lane is empty."""
    lanes = _scheduler()
    for i in range(12):
        lanes.add(BULK, _item(f"b{i}"))
    lanes_seen = [lanes.next_batch(now=0.0, max_wait=1.0) for _ in range(3)]
    assert [c[0] for c in lanes_seen if c] == [BULK, BULK, BULK]
    assert lanes.next_batch(now=0.0, max_wait=1.0) is None


def test_a_lone_input_waits_for_max_wait_before_its_batch_is_cut() -> None:
    """A single small input is not ready before max_wait, and is at max_wait."""
    lanes = _scheduler()
    lanes.add(INTERACTIVE, _item("i", at=10.0))
    assert lanes.next_batch(now=10.001, max_wait=0.002) is None
    assert lanes.wake_at(None, 0.002) == 10.002
    chosen = lanes.next_batch(now=10.002, max_wait=0.002)
    assert chosen is not None
    assert chosen[0] == INTERACTIVE


def test_prepared_bulk_batch_yields_to_ready_interactive_work() -> None:
    """A bulk batch cut while interactive was idle is preemptible once interactive is
    ready; one cut as bulk's owed share is not."""
    lanes = _scheduler(bulk_every=2)
    for i in range(8):
        lanes.add(BULK, _item(f"b{i}"))
    chosen = lanes.next_batch(now=0.0, max_wait=1.0)
    assert chosen is not None
    assert chosen[0] == BULK
    assert not lanes.preemptible(BULK, now=0.0, max_wait=1.0)  # nothing interactive yet
    for i in range(4):
        lanes.add(INTERACTIVE, _item(f"i{i}"))
    assert lanes.preemptible(BULK, now=0.0, max_wait=1.0)
    lanes.put_back(BULK, chosen[1])
    interactive = lanes.next_batch(now=0.0, max_wait=1.0)
    assert interactive is not None
    assert interactive[0] == INTERACTIVE
    for i in range(4):
        lanes.add(INTERACTIVE, _item(f"j{i}"))
    owed = lanes.next_batch(now=0.0, max_wait=1.0)
    assert owed is not None
    assert owed[0] == BULK  # bulk_every=2: after one interactive batch, bulk is owed
    assert not lanes.preemptible(BULK, now=0.0, max_wait=1.0)


def test_put_back_restores_age_order_and_token_count() -> None:
    """Items put back are served again in their original age order, tokens accounted."""
    batcher: Batcher[str] = Batcher(max_batch_tokens=1000, max_batch_size=2)
    for i in range(4):
        batcher.add(_item(f"x{i}", length=10, at=float(i)))
    first = batcher.next_batch()
    assert [item.job for item in first] == ["x0", "x1"]
    assert batcher.waiting_tokens == 20
    batcher.put_back(first)
    assert batcher.waiting_tokens == 40
    assert batcher.oldest_enqueued() == 0.0
    assert [item.job for item in batcher.next_batch()] == ["x0", "x1"]


def test_bulk_batches_shrink_while_interactive_traffic_is_recent() -> None:
    """Bulk batches use the full budget when interactive is quiet, and busy_bulk_tokens
    within interactive_recent_s of the last interactive input."""
    lanes: LaneScheduler[str] = LaneScheduler(
        max_batch_tokens=100, max_batch_size=100, bulk_every=4, busy_bulk_tokens=30
    )
    for i in range(40):
        lanes.add(BULK, _item(f"b{i}", length=10))
    quiet = lanes.next_batch(now=0.0, max_wait=0.0)
    assert quiet is not None
    assert len(quiet[1]) == 10  # 100-token budget
    lanes.add(INTERACTIVE, _item("i", length=10, at=5.0))
    first = lanes.next_batch(now=5.0, max_wait=0.0)
    assert first is not None
    assert first[0] == INTERACTIVE
    busy = lanes.next_batch(now=5.5, max_wait=0.0)
    assert busy is not None
    assert busy[0] == BULK
    assert len(busy[1]) == 3  # 30-token budget while interactive is recent
    later = lanes.next_batch(now=7.0, max_wait=0.0)
    assert later is not None
    assert len(later[1]) == 10


def _models(bulk_every: int = 4) -> LaneScheduler[str]:
    return LaneScheduler(
        max_batch_tokens=40, max_batch_size=4, bulk_every=bulk_every, models=("a", "b")
    )


def _picks(lanes: LaneScheduler[str], count: int, now: float = 0.0) -> list[tuple[str, str]]:
    """The (model, lane) of the next ``count`` batches."""
    picks = []
    for _ in range(count):
        chosen = lanes.next_model_batch(now=now, max_wait=1.0)
        assert chosen is not None
        picks.append((chosen[0], chosen[1]))
    return picks


def test_a_batch_holds_one_models_inputs() -> None:
    """Inputs of two models waiting together are cut into batches of one model each."""
    lanes = _models()
    for i in range(3):
        lanes.add(INTERACTIVE, _item(f"a{i}", at=i), "a")
        lanes.add(INTERACTIVE, _item(f"b{i}", at=i + 0.5), "b")
    batches = []
    while (chosen := lanes.next_model_batch(now=10.0, max_wait=1.0)) is not None:
        model, lane, items = chosen
        batches.append((model, lane, sorted(item.job for item in items)))
    assert batches == [
        ("a", INTERACTIVE, ["a0", "a1", "a2"]),
        ("b", INTERACTIVE, ["b0", "b1", "b2"]),
    ]


def test_the_model_whose_interactive_input_waited_longest_goes_first() -> None:
    """Across models, interactive batches go in the order their oldest input arrived."""
    lanes = _models()
    lanes.add(INTERACTIVE, _item("b-old", at=1.0), "b")
    lanes.add(INTERACTIVE, _item("a-new", at=2.0), "a")
    assert [model for model, _ in _picks(lanes, 2, now=10.0)] == ["b", "a"]


def test_interactive_work_of_any_model_goes_before_bulk_of_another() -> None:
    """Model a's bulk backlog waits while model b has interactive work (within bulk_every)."""
    lanes = _models(bulk_every=3)
    for i in range(20):
        lanes.add(BULK, _item(f"a-bulk{i}"), "a")
        lanes.add(INTERACTIVE, _item(f"b{i}"), "b")
    assert _picks(lanes, 6) == [("b", INTERACTIVE), ("b", INTERACTIVE), ("a", BULK)] * 2


def test_models_with_bulk_work_take_turns() -> None:
    """With only bulk work, the models' bulk batches alternate."""
    lanes = _models()
    for i in range(12):
        lanes.add(BULK, _item(f"a{i}"), "a")
        lanes.add(BULK, _item(f"b{i}"), "b")
    assert [model for model, _ in _picks(lanes, 6)] == ["a", "b", "a", "b", "a", "b"]


def test_a_prepared_bulk_batch_yields_to_interactive_work_of_another_model() -> None:
    lanes = _models()
    assert not lanes.preemptible(BULK, now=0.0, max_wait=0.0)
    lanes.add(INTERACTIVE, _item("b0"), "b")
    assert lanes.preemptible(BULK, now=0.0, max_wait=0.0)
    assert lanes.ready(INTERACTIVE, now=0.0, max_wait=0.0)
    assert not lanes.ready(INTERACTIVE, now=0.0, max_wait=0.0, model="a")


def test_model_names_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        LaneScheduler(max_batch_tokens=40, max_batch_size=4, bulk_every=2, models=("a", "a"))
