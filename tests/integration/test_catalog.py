"""The model catalog against the real broker: workers' announcers write model cards, the
SDK lists the live models and routes requests by model, `kembed models` shows them.

The announcers here are the worker's own (`kembed_shared.kafka.catalog`) over real producers; what
a worker process announces is tested end to end once the worker starts its announcer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from kembed_shared.kafka.catalog import Announcer, start_announcer
from producer_sdk import CatalogModel, EmbedClient, EmbedTimeoutError
from producer_sdk.catalog import read_catalog
from producer_sdk.config import ClientConfig
from schemas.catalog import ModelDescription, decode_card
from scripts.kafka_local import CATALOG_TOPIC_CONFIG, LocalKafka, TopicSpec
from tests.catalog_models import described
from tests.conftest import embed_request
from tests.integration.kafka_io import read_all
from tests.support.cli import run_kembed, without_kembed_env
from worker.settings import WorkerSettings

pytestmark = pytest.mark.integration


def served(name: str, requests_topic: str, **fields: Any) -> ModelDescription:
    """A model as the worker describes it to its announcer (no bulk lane unless given)."""
    return described(name, **({"requests_topic": requests_topic, "bulk_topic": None} | fields))


def new_catalog(kafka: LocalKafka) -> str:
    topic = f"catalog.{uuid.uuid4().hex[:8]}"
    kafka.create_topics([TopicSpec(topic, 1, CATALOG_TOPIC_CONFIG)])
    return topic


def worker_settings(kafka: LocalKafka, catalog: str, **fields: Any) -> WorkerSettings:
    return WorkerSettings(
        bootstrap_servers=kafka.bootstrap_servers, catalog_topic=catalog, **fields
    )


async def models(kafka: LocalKafka, catalog: str) -> dict[str, CatalogModel]:
    config = ClientConfig(kafka.bootstrap_servers, catalog_topic=catalog)
    return {model.name: model for model in await read_catalog(config, timeout=20)}


@asynccontextmanager
async def raw_producer(kafka: LocalKafka) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def test_two_workers_are_listed_merged_and_withdrawn_on_stop(kafka: LocalKafka) -> None:
    """Worker A serves minilm and only-a, worker B minilm and e5 (another topic): the SDK
    lists three models, minilm once with two workers. A stops: only-a is gone and minilm
    has one worker left; B stops: the catalog is empty."""
    catalog = new_catalog(kafka)
    a = await start_announcer(
        worker_settings(kafka, catalog, group_id="fleet", client_id="worker-a"),
        [
            served("minilm", "embed.requests", aliases=("mini",)),
            served("only-a", "embed.requests", dim=128, pooling="cls", quantization="int8"),
        ],
    )
    b = await start_announcer(
        worker_settings(kafka, catalog, group_id="fleet-e5", client_id="worker-b"),
        [
            served("minilm", "embed.requests", aliases=("mini",)),
            served("e5", "requests.e5", dim=1024, dtype="float16", bulk_topic="bulk.e5"),
        ],
    )
    assert a is not None
    assert b is not None
    try:
        async with EmbedClient(kafka.bootstrap_servers, catalog_topic=catalog) as client:
            listed = await client.models()
        assert [m.name for m in listed] == ["e5", "minilm", "only-a"]
        e5, minilm, only_a = listed
        assert (e5.workers, e5.requests_topic, e5.bulk_topic, e5.dim, e5.dtype) == (
            1,
            "requests.e5",
            "bulk.e5",
            1024,
            "float16",
        )
        assert e5.group_id == "fleet-e5"
        assert (minilm.workers, minilm.requests_topic, minilm.aliases) == (
            2,
            "embed.requests",
            ("mini",),
        )
        assert len(set(minilm.instances)) == 2
        assert {i.split("-")[1] for i in minilm.instances} == {"a", "b"}  # worker-a, worker-b
        assert (only_a.workers, only_a.dim, only_a.pooling, only_a.quantization) == (
            1,
            128,
            "cls",
            "int8",
        )

        await a.stop()
        after = await models(kafka, catalog)
        assert sorted(after) == ["e5", "minilm"]
        assert after["minilm"].workers == 1
        assert after["minilm"].instances == tuple(i for i in minilm.instances if "-b-" in i)
    finally:
        await a.stop()
        await b.stop()
    assert await models(kafka, catalog) == {}
    # What a stop leaves on the topic: a tombstone per key, after the cards.
    records = await read_all(kafka.bootstrap_servers, catalog)
    last_by_key = {r.key: r.value for r in records}
    assert len(last_by_key) == 4
    assert all(value is None for value in last_by_key.values())


async def test_cards_are_refreshed_and_a_dead_workers_card_goes_stale(kafka: LocalKafka) -> None:
    """A running announcer re-writes its card every interval, so it stays listed well past
    3 intervals; one written once and then left (a SIGKILLed worker: no refresh, no
    tombstone) is listed until 3 intervals have passed and not after."""
    catalog = new_catalog(kafka)
    interval = 1.0
    async with raw_producer(kafka) as producer:
        live, dead = (
            Announcer(
                producer,
                topic=catalog,
                group_id="g",
                instance=instance,
                interval_s=interval,
                models=[served(model, "embed.requests")],
            )
            for instance, model in (("alive", "kept"), ("killed", "lost"))
        )
        await live.start()
        try:
            assert await dead.announce()
            announced = time.time()
            assert sorted(await models(kafka, catalog)) == ["kept", "lost"]
            await asyncio.sleep(announced + 3 * interval + 0.3 - time.time())
            assert sorted(await models(kafka, catalog)) == ["kept"]
            assert live.rounds >= 3
        finally:
            await live.stop()
    cards = [
        decode_card(r.value) for r in await read_all(kafka.bootstrap_servers, catalog) if r.value
    ]
    assert sum(1 for c in cards if c.name == "lost") == 1
    assert sum(1 for c in cards if c.name == "kept") >= 3


async def test_requests_are_routed_to_the_catalogs_topic(kafka: LocalKafka) -> None:
    """embed(model=...) publishes to the topic the catalog names for the model (by name or
    alias); model_topics overrides it; a model nobody announces goes to requests_topic.
    Seen on the topics themselves (no worker runs, so the calls time out)."""
    catalog = new_catalog(kafka)
    prefix = f"route.{uuid.uuid4().hex[:6]}"
    routed, pinned, default = f"{prefix}.routed", f"{prefix}.pinned", f"{prefix}.default"
    kafka.create_topics([TopicSpec(routed, 2), TopicSpec(pinned, 1), TopicSpec(default, 1)])
    announcer = await start_announcer(
        worker_settings(kafka, catalog, client_id="router-test"),
        [served("big-model", routed, aliases=("big",))],
    )
    assert announcer is not None
    try:
        async with EmbedClient(
            kafka.bootstrap_servers,
            catalog_topic=catalog,
            requests_topic=default,
            model_topics={"pinned-model": pinned},
        ) as client:
            assert await client.request_topic("big") == routed
            calls = [
                ("big", "by alias"),
                ("big-model", "by name"),
                ("pinned-model", "pinned"),
                ("nobody-serves-it", "default"),
            ]
            for model, text in calls:
                with pytest.raises(EmbedTimeoutError):
                    await client.embed([text], model=model, timeout=0.5)
            with pytest.raises(EmbedTimeoutError):
                await client.embed_result(["no model"], timeout=0.5)
        async with EmbedClient(
            kafka.bootstrap_servers, catalog_topic=None, requests_topic=default
        ) as blind:
            with pytest.raises(EmbedTimeoutError):
                await blind.embed(["discovery off"], model="big", timeout=0.5)
            with pytest.raises(ValueError, match="catalog_topic"):
                await blind.models()
    finally:
        await announcer.stop()

    def seen(topic: str) -> list[tuple[str | None, str]]:
        return [
            (request.model, request.inputs[0])
            for request in (embed_request(r.value) for r in records[topic])
        ]

    records = {t: await read_all(kafka.bootstrap_servers, t) for t in (routed, pinned, default)}
    assert sorted(seen(routed)) == [("big", "by alias"), ("big-model", "by name")]
    assert seen(pinned) == [("pinned-model", "pinned")]
    assert seen(default) == [
        ("nobody-serves-it", "default"),
        (None, "no model"),
        ("big", "discovery off"),
    ]


def kembed_models(*args: str) -> subprocess.CompletedProcess[str]:
    return run_kembed("models", *args, env=without_kembed_env(), timeout=60)


async def test_kembed_models_lists_the_live_models(kafka: LocalKafka) -> None:
    """`kembed models` prints the table and, with --json, every field; an empty catalog
    says so; an unreachable broker exits 2."""
    catalog = new_catalog(kafka)
    flags = ["--bootstrap-servers", kafka.bootstrap_servers, "--catalog-topic", catalog]
    empty = await asyncio.to_thread(kembed_models, *flags)
    assert empty.returncode == 0, empty.stderr
    assert f"no live models on {catalog}" in empty.stdout
    announcer = await start_announcer(
        worker_settings(kafka, catalog),
        [served("minilm", "embed.requests", aliases=("mini", "small"), quantization="nf4")],
    )
    assert announcer is not None
    try:
        table = await asyncio.to_thread(kembed_models, *flags)
        as_json = await asyncio.to_thread(kembed_models, *flags, "--json")
    finally:
        await announcer.stop()
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "name", "kind", "aliases", "dim", "pooling", "dtype", "quantization", "workers", "topic",
    ]  # fmt: skip
    assert row.split() == [
        "minilm", "embed", "mini,", "small", "384", "mean", "float32", "nf4", "1",
        "embed.requests",
    ]  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    (entry,) = json.loads(as_json.stdout)
    assert entry["name"] == "minilm"
    assert entry["kind"] == "embed"
    assert entry["workers"] == 1
    assert entry["group_id"] == "kembed-workers"
    assert entry["instances"][0].startswith("kembed-worker-")

    unreachable = await asyncio.to_thread(
        kembed_models, "--bootstrap-servers", "127.0.0.1:1", "--timeout", "5"
    )
    assert unreachable.returncode == 2
    assert "cannot reach Kafka at 127.0.0.1:1" in unreachable.stderr


async def test_announcing_is_off_without_a_catalog_topic(kafka: LocalKafka) -> None:
    assert await start_announcer(worker_settings(kafka, ""), [served("m", "t")]) is None


async def test_local_broker_creates_a_compacted_catalog_topic(kafka: LocalKafka) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "embed.models")]
        )
    finally:
        await admin.close()
    (resource,) = response.resources
    configs = {entry[0]: entry[1] for entry in resource[4]}
    assert configs["cleanup.policy"] == "compact,delete"
    assert configs["retention.ms"] == str(24 * 60 * 60 * 1000)
