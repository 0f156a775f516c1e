"""Unit tests of the catalog's pure parts: merging cards over workers, staleness, alias
resolution, the client's routing cache (fake clock, fake reader), the announcer's cards
(a recording producer), and the `kembed models` table."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from kembed_cli.commands.models import models_json, render_models
from kembed_shared.kafka.catalog import Announcer, instance_id
from producer_sdk.catalog import CatalogModel, ModelRouter, live_cards, merge_cards, resolve
from schemas.catalog import ModelCard, ModelDescription, decode_card, encode_card
from tests.catalog_models import described

NOW = 1_764_000_000_000
INTERVAL = 30_000


def card(name: str, instance: str, *, age_ms: int = 0, **fields: Any) -> ModelCard:
    base = described(name).card(
        group_id="kembed-workers",
        instance=instance,
        announced_ms=NOW - age_ms,
        interval_ms=INTERVAL,
    )
    return replace(base, **fields)


def test_cards_older_than_three_intervals_are_dropped() -> None:
    fresh = card("a", "w1", age_ms=3 * INTERVAL)
    stale = card("b", "w2", age_ms=3 * INTERVAL + 1)
    assert live_cards([fresh, stale], NOW) == [fresh]
    assert [m.name for m in merge_cards([fresh, stale], NOW)] == ["a"]


def test_the_same_model_on_several_workers_is_one_entry() -> None:
    cards = [
        card("minilm", "w2", age_ms=1000, aliases=("small",)),
        card("minilm", "w1", aliases=("mini",)),
        card("e5", "w1", dim=768, requests_topic="embed.requests.e5"),
    ]
    models = merge_cards(cards, NOW)
    assert [m.name for m in models] == ["e5", "minilm"]
    e5, minilm = models
    assert (e5.workers, e5.instances, e5.dim, e5.requests_topic) == (
        1,
        ("w1",),
        768,
        "embed.requests.e5",
    )
    assert (minilm.workers, minilm.instances) == (2, ("w1", "w2"))
    assert minilm.announced_ms == NOW
    assert minilm.aliases == ("mini", "small")  # the newest card's first, then the others'


def test_a_stale_worker_does_not_count() -> None:
    cards = [card("minilm", "w1"), card("minilm", "dead", age_ms=10 * INTERVAL)]
    (minilm,) = merge_cards(cards, NOW)
    assert (minilm.workers, minilm.instances) == (1, ("w1",))


def test_when_workers_disagree_the_majority_topic_wins() -> None:
    cards = [
        card("m", "w1", requests_topic="old.topic", age_ms=5000),
        card("m", "w2", requests_topic="old.topic", age_ms=4000, dim=100),
        card("m", "w3", requests_topic="new.topic", dim=200),
    ]
    (m,) = merge_cards(cards, NOW)
    assert m.requests_topic == "old.topic"
    assert m.dim == 100  # the newest card on that topic
    assert m.workers == 3
    assert m.topics == ("embed.requests.bulk", "new.topic", "old.topic")
    # One each: the most recent announcement breaks the tie.
    (m,) = merge_cards(cards[1:], NOW)
    assert (m.requests_topic, m.dim) == ("new.topic", 200)


def test_resolve_by_name_then_alias() -> None:
    models = merge_cards(
        [card("a", "w", aliases=("b", "shared")), card("b", "w"), card("c", "w", aliases=("x",))],
        NOW,
    )
    assert resolve(models, "a") is models[0]
    assert resolve(models, "b") is models[1]  # a name beats another model's alias
    assert resolve(models, "x") is models[2]
    assert resolve(models, "shared") is models[0]
    assert resolve(models, "nope") is None
    assert models[0].serves("shared")
    assert not models[0].serves("c")


def test_topic_per_lane() -> None:
    (m,) = merge_cards([card("m", "w")], NOW)
    assert m.topic() == "embed.requests"
    assert m.topic("bulk") == "embed.requests.bulk"
    (m,) = merge_cards([card("m", "w", bulk_topic=None)], NOW)
    assert m.topic("bulk") == "embed.requests"


class FakeCatalog:
    """A reader whose answer the test sets, counting reads, and a clock the test moves."""

    def __init__(self, *cards: ModelCard) -> None:
        self.cards = list(cards)
        self.reads = 0
        self.fail = False
        self.now = 100.0
        self.gate: asyncio.Event | None = None

    async def read(self) -> Sequence[CatalogModel]:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise OSError("broker unreachable")
        return merge_cards(self.cards, NOW)

    def clock(self) -> float:
        return self.now


async def test_router_reads_once_per_refresh_interval_and_on_a_miss() -> None:
    fake = FakeCatalog(card("m", "w", requests_topic="topic.m", aliases=("alias-m",)))
    router = ModelRouter(fake.read, refresh_s=10, clock=fake.clock)
    assert await router.topic_for("m") == "topic.m"  # first call: reads, waits
    assert await router.topic_for("alias-m") == "topic.m"
    assert await router.topic_for("unknown") is None  # a miss within refresh_s: no read
    assert fake.reads == 1

    fake.cards.append(card("n", "w", requests_topic="topic.n"))
    fake.now += 10
    assert await router.topic_for("n") == "topic.n"  # a miss after refresh_s waits for a read
    assert fake.reads == 2

    fake.cards[0] = card("m", "w", requests_topic="moved.m")
    fake.now += 10
    # A hit after refresh_s: the cached topic at once, the catalog re-read in the background.
    assert await router.topic_for("m") == "topic.m"
    await asyncio.sleep(0)
    assert await router.topic_for("m") == "moved.m"
    assert fake.reads == 3
    await router.close()


async def test_router_shares_one_read_between_concurrent_misses() -> None:
    fake = FakeCatalog(card("m", "w", requests_topic="topic.m"))
    fake.gate = asyncio.Event()
    router = ModelRouter(fake.read, refresh_s=10, clock=fake.clock)
    calls = [asyncio.create_task(router.topic_for("m")) for _ in range(5)]
    await asyncio.sleep(0.01)
    fake.gate.set()
    assert await asyncio.gather(*calls) == ["topic.m"] * 5
    assert fake.reads == 1


async def test_router_overrides_and_failures() -> None:
    fake = FakeCatalog(card("m", "w", requests_topic="topic.m"))
    fake.fail = True
    router = ModelRouter(fake.read, refresh_s=10, clock=fake.clock, overrides={"m": "pinned"})
    assert await router.topic_for("m") == "pinned"  # an override needs no catalog
    assert fake.reads == 0
    assert await router.topic_for("other") is None  # the read fails: fall back, no raise
    assert await router.topic_for("other") is None  # ... and is not retried at once
    assert fake.reads == 1
    fake.fail = False
    fake.now += 10
    assert await router.topic_for("m2") is None
    assert fake.reads == 2

    no_catalog = ModelRouter(None, refresh_s=10, overrides={"m": "pinned"})
    assert await no_catalog.topic_for("m") == "pinned"
    assert await no_catalog.topic_for("x") is None


async def test_router_keeps_a_configured_topic_the_model_is_served_on() -> None:
    fake = FakeCatalog(card("m", "w", requests_topic="m.fast", bulk_topic="m.bulk"))
    router = ModelRouter(fake.read, refresh_s=10, clock=fake.clock)
    assert await router.topic_for("m", current="m.bulk") == "m.bulk"
    assert await router.topic_for("m", current="embed.requests") == "m.fast"
    assert await router.topic_for("m", "bulk", current="embed.requests") == "m.bulk"
    # Another fleet serves m on its own topic: a client configured for it stays there.
    fake.cards.append(card("m", "w2", requests_topic="own.fleet", bulk_topic=None))
    fake.now += 10
    await router.topic_for("x")  # a miss: re-read
    assert await router.topic_for("m", current="own.fleet") == "own.fleet"
    assert await router.topic_for("m", current="embed.requests") == "m.fast"


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> None:
        self.sent.append((topic, value, key))


def served(name: str, **fields: Any) -> ModelDescription:
    """A model with an alias and a prompt, for the announcer to carry into its cards."""
    extras: dict[str, Any] = {"aliases": ("alias-" + name,), "prompts": {"query": "query: "}}
    return described(name, **(extras | fields))


async def test_announcer_writes_one_card_per_model_then_tombstones() -> None:
    producer = RecordingProducer()
    announcer = Announcer(
        producer,
        topic="embed.models",
        group_id="g",
        instance="w-1",
        interval_s=0.05,
        models=[served("a"), served("b", bulk_topic=None)],
        clock=lambda: NOW / 1000,
    )
    await announcer.start()
    await asyncio.sleep(0.12)  # two more rounds
    await announcer.stop()
    cards = [(key, decode_card(value)) for _, value, key in producer.sent if value is not None]
    assert len(cards) >= 6
    assert len(cards) % 2 == 0
    assert {key for key, _ in cards} == {b"g/w-1/a", b"g/w-1/b"}
    first = dict(cards[:2])
    a, b = first[b"g/w-1/a"], first[b"g/w-1/b"]
    assert (a.name, a.aliases, a.dim, a.prompts, a.interval_ms) == (
        "a",
        ("alias-a",),
        384,
        {"query": "query: "},
        50,
    )
    assert (a.group_id, a.instance, a.announced_ms) == ("g", "w-1", NOW)
    assert b.bulk_topic is None
    assert b.description_fields() == served("b", bulk_topic=None).description_fields()
    tombstones = [key for _, value, key in producer.sent if value is None]
    assert producer.sent[-2:] == [("embed.models", None, k) for k in tombstones]
    assert sorted(k or b"" for k in tombstones) == [b"g/w-1/a", b"g/w-1/b"]
    assert {topic for topic, _, _ in producer.sent} == {"embed.models"}


async def test_announcer_failures_are_logged_not_raised() -> None:
    class Broken:
        async def send_and_wait(self, *args: Any, **kwargs: Any) -> None:
            raise OSError("no broker")

    announcer = Announcer(
        Broken(), topic="t", group_id="g", instance="i", interval_s=0.01, models=[served("a")]
    )
    await announcer.start()  # does not raise
    await asyncio.sleep(0.05)
    assert announcer.rounds == 0
    await announcer.stop()  # does not raise either


def test_announcer_refuses_a_model_no_valid_card_can_carry() -> None:
    for bad in (served("a", requests_topic="no spaces"), served("a", dim=0), served("")):
        with pytest.raises(ValueError, match="cannot be announced"):
            Announcer(
                RecordingProducer(), topic="t", group_id="g", instance="i", interval_s=1,
                models=[bad],
            )  # fmt: skip


def test_a_card_is_its_description_and_its_worker() -> None:
    model = served("a", bulk_topic=None, default_prompt_name="query")
    card = model.card(group_id="g", instance="w-1", announced_ms=NOW, interval_ms=INTERVAL)
    assert decode_card(encode_card(card)) == card
    assert card.description_fields() == model.description_fields()
    assert (card.group_id, card.instance, card.announced_ms) == ("g", "w-1", NOW)
    assert model.as_json()["aliases"] == ["alias-a"]  # JSON-ready
    assert model.as_json().keys() == model.description_fields().keys()


def test_instance_ids_are_unique_per_start() -> None:
    first, second = instance_id("kembed-worker"), instance_id("kembed-worker")
    assert first.startswith("kembed-worker-")
    assert first != second
    assert "/" not in first


def test_models_table_and_json() -> None:
    models = merge_cards(
        [
            card("minilm", "w1", aliases=("mini", "small")),
            card("minilm", "w2"),
            card("e5-large", "w3", dim=1024, dtype="float16", quantization="int8",
                 requests_topic="embed.requests.e5"),
            card("ms-marco", "w4", dim=1, kind="rerank", requests_topic="rerank.requests"),
        ],
        NOW,
    )  # fmt: skip
    lines = render_models(models).splitlines()
    assert lines[0].split() == [
        "name", "kind", "aliases", "dim", "pooling", "dtype", "quantization", "workers", "topic",
    ]  # fmt: skip
    assert lines[1].split() == [
        "e5-large", "embed", "-", "1024", "mean", "float16", "int8", "1", "embed.requests.e5",
    ]  # fmt: skip
    assert lines[2].split() == [
        "minilm", "embed", "mini,", "small", "384", "mean", "float32", "none", "2",
        "embed.requests",
    ]  # fmt: skip
    assert lines[3].split() == [
        "ms-marco", "rerank", "-", "1", "mean", "float32", "none", "1", "rerank.requests",
    ]  # fmt: skip
    as_json = models_json(models)
    assert list(as_json[1]) == [
        "name", "aliases", "dim", "max_seq_length", "pooling", "dtype", "quantization",
        "device", "prompts", "default_prompt_name", "requests_topic", "bulk_topic", "kind",
        "group_id", "topics", "workers", "instances", "announced_ms", "interval_ms",
    ]  # fmt: skip
    assert as_json[1]["instances"] == ["w1", "w2"]
    assert [entry["kind"] for entry in as_json] == ["embed", "embed", "rerank"]
    assert as_json[1]["workers"] == 2
    assert as_json[1]["aliases"] == ["mini", "small"]
