"""The topics a kembed fleet needs: the plan, creating it, checking a cluster against it,
and waiting for the topics a consumer reads.

``kembed topics create|check`` and the local test broker (``scripts.kafka_local``) use the
same plan and the same creation code. The plan comes from plain values
(:class:`TopicNeeds`), so this module knows nothing of the worker's or the sink's settings.

Sizes: a topic takes records of up to its ``max.message.bytes`` (the broker's
``message.max.bytes`` when the topic sets none), the value plus its key, headers and
batch framing. A request topic must take a request of ``max_request_bytes`` and a results
topic a result of ``max_result_bytes`` (plus :data:`RECORD_OVERHEAD`); request topics are
planned at twice ``max_request_bytes`` so that an oversized request still reaches a worker
and is answered ``message_too_large`` instead of being refused by the broker with no answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError, KafkaConnectionError, KafkaError

__all__ = [
    "CATALOG_TOPIC_CONFIG",
    "DEFAULT_PARTITIONS",
    "EnsureReport",
    "PLAN_HEADROOM",
    "RECORD_OVERHEAD",
    "FoundTopic",
    "InvalidReplicationFactorError",
    "KafkaConnectionError",
    "KafkaError",
    "TopicCreationError",
    "TopicNeeds",
    "TopicSpec",
    "compare",
    "create_topics",
    "create_topics_async",
    "default_replication",
    "describe_topics",
    "ensure_topics",
    "plan",
    "problems_of",
    "replicated",
    "run_sync",
    "wait_for_topics",
]

_T = TypeVar("_T")

RECORD_OVERHEAD = 16 * 1024
"""Room for a record's key, headers and batch framing on top of its value: a topic must
take ``limit + RECORD_OVERHEAD`` to hold a value of ``limit`` bytes."""

PLAN_HEADROOM = 64 * 1024
"""What results topics are created with above ``max_result_bytes`` (the worker's producer
allows the same on top of a record's value)."""

DEFAULT_PARTITIONS = 12
"""Partitions of the request, bulk and results topics when ``--partitions`` is not given:
up to 12 workers (and 12 sink replicas) share the work. Dead-letter topics and the catalog
get one."""

BROKER_DEFAULT_MESSAGE_BYTES = 1_048_588  # Kafka's message.max.bytes default

# The model catalog keeps the latest card per key (compact) and drops what a day has not
# refreshed (delete): workers re-announce every 30 s, so a day-old card is long dead.
CATALOG_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(24 * 60 * 60 * 1000),
}

_MAX_MESSAGE_BYTES = "max.message.bytes"
_CLEANUP_POLICY = "cleanup.policy"


@dataclass(frozen=True)
class TopicSpec:
    """A topic as planned: name, partitions and topic-level config. ``role`` says what it
    is for (in check reports), ``needed_message_bytes`` the smallest ``max.message.bytes``
    that works (0: no requirement), ``compacted`` whether it must be compacted."""

    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""
    needed_message_bytes: int = 0
    compacted: bool = False
    size_setting: str = ""


@dataclass(frozen=True)
class TopicNeeds:
    """What a fleet's settings say about its topics (the worker's settings, and the results
    topics of its sinks). Empty names are topics the fleet does without."""

    requests_topics: Sequence[str] = ("embed.requests",)
    bulk_topics: Sequence[str] = ("embed.requests.bulk",)
    results_topic: str = "embed.results"
    dlq_topic: str = "embed.requests.dlq"
    catalog_topic: str = "embed.models"
    max_request_bytes: int = 4 * 1024 * 1024
    max_result_bytes: int = 1_000_000
    sink_results: Sequence[str] = ()
    """Each results topic a sink reads; its dead-letter topic is ``<topic>.dlq``."""


def plan(
    needs: TopicNeeds,
    partitions: int = DEFAULT_PARTITIONS,
    results_partitions: int | None = None,
) -> list[TopicSpec]:
    """The topics ``needs`` asks for, each once, in a stable order."""
    request_need = needs.max_request_bytes + RECORD_OVERHEAD
    request_bytes = max(2 * needs.max_request_bytes, request_need)
    result_need = needs.max_result_bytes + RECORD_OVERHEAD
    result_bytes = needs.max_result_bytes + PLAN_HEADROOM

    def sized(planned: int, needed: int, setting: str) -> Callable[[str, str, int], TopicSpec]:
        def spec(name: str, role: str, count: int) -> TopicSpec:
            config = {_MAX_MESSAGE_BYTES: str(planned)}
            return TopicSpec(name, count, config, role, needed, size_setting=setting)

        return spec

    request = sized(request_bytes, request_need, f"max_request_bytes={needs.max_request_bytes}")
    result = sized(result_bytes, result_need, f"max_result_bytes={needs.max_result_bytes}")

    specs: dict[str, TopicSpec] = {}

    def add(spec: TopicSpec) -> None:
        if spec.name and spec.name not in specs:
            specs[spec.name] = spec

    for name in needs.requests_topics:
        add(request(name, "requests", partitions))
    for name in needs.bulk_topics:
        add(request(name, "bulk requests", partitions))
    add(result(needs.results_topic, "results", results_partitions or partitions))
    add(request(needs.dlq_topic, "request dead letters", 1))
    if needs.catalog_topic:
        catalog = dict(CATALOG_TOPIC_CONFIG)
        add(TopicSpec(needs.catalog_topic, 1, catalog, "model catalog", compacted=True))
    for name in needs.sink_results:
        add(result(name, "results", results_partitions or partitions))
        add(result(f"{name}.dlq", "sink dead letters", 1))
    return list(specs.values())


def default_replication(brokers: int, wanted: int | None = None) -> int:
    """The replication factor: ``wanted``, else 3, or the broker count when smaller."""
    return wanted if wanted is not None else max(1, min(3, brokers))


def replicated(spec: TopicSpec, replication_factor: int) -> TopicSpec:
    """``spec`` as created with ``replication_factor`` replicas: from 3 on, it also sets
    ``min.insync.replicas=2`` (unless it sets its own), so that a write the producers see
    acknowledged (they use acks=all) is on two brokers, and one broker may be down without
    stopping them. Below 3 the broker's default (1) stays: 2 of 2 would stop every write
    while either broker restarts."""
    if replication_factor < 3 or "min.insync.replicas" in spec.config:
        return spec
    return replace(spec, config=spec.config | {"min.insync.replicas": "2"})


# -- comparing what exists with the plan (pure: unit-tested on made-up descriptions) ----------


@dataclass(frozen=True)
class FoundTopic:
    """An existing topic as the cluster describes it: partition count and the effective
    topic configs (DescribeConfigs gives the topic-level value, else the broker's: its
    ``max.message.bytes`` is the broker's ``message.max.bytes`` when the topic sets none)."""

    partitions: int
    config: Mapping[str, str]


def compare(
    specs: Sequence[TopicSpec],
    found: Mapping[str, FoundTopic | str],
    *,
    check_partitions: bool = True,
    broker_message_bytes: int = BROKER_DEFAULT_MESSAGE_BYTES,
) -> list[str]:
    """One line per problem: a planned topic that is missing, has fewer partitions than
    planned (when ``check_partitions``), takes records too small for its settings, or is a
    catalog that is not compacted. ``found`` maps a name to its description, or to why it
    could not be described (a string); topics it lacks are missing."""
    return [
        line
        for spec in specs
        for line in problems_of(
            spec,
            found.get(spec.name),
            check_partitions=check_partitions,
            broker_message_bytes=broker_message_bytes,
        )
    ]


def problems_of(
    spec: TopicSpec,
    topic: FoundTopic | str | None,
    *,
    check_partitions: bool = True,
    broker_message_bytes: int = BROKER_DEFAULT_MESSAGE_BYTES,
) -> list[str]:
    """What is wrong with one planned topic (see :func:`compare`)."""
    what = f"{spec.role} topic {spec.name!r}" if spec.role else f"topic {spec.name!r}"
    if topic is None:
        return [f"{what} is missing"]
    if isinstance(topic, str):
        return [f"{what}: cannot be described ({topic})"]
    problems: list[str] = []
    if check_partitions and topic.partitions < spec.partitions:
        problems.append(
            f"{what} has {topic.partitions} partition(s), fewer than the {spec.partitions} planned"
        )
    if spec.needed_message_bytes:
        size = _int(topic.config.get(_MAX_MESSAGE_BYTES), broker_message_bytes)
        if size < spec.needed_message_bytes:
            problems.append(
                f"{what} has max.message.bytes={size}, below the "
                f"{spec.needed_message_bytes} that {spec.size_setting} needs"
            )
    if spec.compacted:
        policy = topic.config.get(_CLEANUP_POLICY, "delete")
        if "compact" not in {p.strip() for p in policy.split(",")}:
            problems.append(
                f"{what} has cleanup.policy={policy}, not compacted "
                f"(needs {_CLEANUP_POLICY}={CATALOG_TOPIC_CONFIG[_CLEANUP_POLICY]})"
            )
    return problems


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


# -- talking to the cluster ------------------------------------------------------------------


class TopicCreationError(RuntimeError):
    """The broker refused to create a topic for a reason that retrying will not fix."""


def run_sync(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine to completion from sync code, whether or not a loop runs in this thread.

    When called from inside a running event loop (an async test, say) the loop cannot be
    blocked on with a nested loop, so the coroutine gets a private loop in a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _is_startup_transient(error: type[Exception]) -> bool:
    # Right after start the broker may not have registered with its controller yet; the
    # controller then rejects replication factor 1 ("only 0 broker(s) are registered"), which
    # Kafka marks as non-retriable although it resolves itself within a second.
    return bool(getattr(error, "retriable", False)) or (
        error is kafka_errors.InvalidReplicationFactorError
    )


def _check_create_response(response: Any) -> None:
    for topic, code, *message in response.topic_errors:
        error = kafka_errors.for_code(code)
        if code == 0 or error is kafka_errors.TopicAlreadyExistsError:
            continue
        detail = f"creating topic {topic!r} failed: {error.__name__} {' '.join(map(str, message))}"
        if _is_startup_transient(error):
            raise error(detail)
        raise TopicCreationError(detail)


async def _leaders_ready(admin: Any, names: list[str]) -> bool:
    topics = await admin.describe_topics(names)
    return len(topics) == len(names) and all(
        topic["error_code"] == 0
        and topic["partitions"]
        and all(partition["leader"] >= 0 for partition in topic["partitions"])
        for topic in topics
    )


async def _create(admin: Any, specs: Sequence[TopicSpec], replication_factor: int) -> None:
    """Create ``specs`` (existing ones are left alone) and wait until all have leaders."""
    if not specs:
        return
    new_topics = [
        NewTopic(s.name, s.partitions, replication_factor, topic_configs=dict(s.config))
        for s in specs
    ]
    _check_create_response(await admin.create_topics(new_topics))
    # The controller acknowledges before the broker has loaded the new partitions;
    # waiting for leaders means producers never see UNKNOWN_TOPIC_OR_PARTITION.
    names = [spec.name for spec in specs]
    while True:
        if await _leaders_ready(admin, names):
            return
        await asyncio.sleep(0.1)


def _admin(bootstrap_servers: str, client_config: Mapping[str, Any] | None) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **(client_config or {}))


async def create_topics_async(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    client_config: Mapping[str, Any] | None = None,
    replication_factor: int = 1,
) -> None:
    """Create ``specs`` (existing topics are left alone) and wait until all have leaders.

    ``client_config`` holds aiokafka security options (a secured broker's admin login).
    Has no deadline of its own; callers bound it with ``asyncio.timeout``.
    """
    if not specs:
        return
    admin = _admin(bootstrap_servers, client_config)
    try:
        await admin.start()
        await _create(admin, specs, replication_factor)
    finally:
        await admin.close()


def create_topics(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    timeout: float = 30,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Sync version of ``create_topics_async`` (replication 1), bounded by ``timeout`` s."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await create_topics_async(bootstrap_servers, specs, client_config)

    run_sync(bounded)


async def describe_topics(admin: Any, names: Sequence[str]) -> dict[str, FoundTopic | str]:
    """The topics of ``names`` that exist, described (or why one could not be).

    Lists every topic first and describes only existing ones: asking the metadata of a
    topic by name lets a broker with ``auto.create.topics.enable`` create it."""
    existing = set(await admin.list_topics())
    present = [name for name in dict.fromkeys(names) if name in existing]
    if not present:
        return {}
    found: dict[str, FoundTopic | str] = {}
    for topic in await admin.describe_topics(present):
        if topic["error_code"] != 0:
            found[topic["topic"]] = kafka_errors.for_code(topic["error_code"]).__name__
        else:
            found[topic["topic"]] = FoundTopic(len(topic["partitions"]), {})
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in present]
    for response in await admin.describe_configs(resources):
        for code, message, _type, name, entries, *_ in response.resources:
            described = found.get(name)
            if code != 0:
                reason = f"{kafka_errors.for_code(code).__name__} {message or ''}".strip()
                found[name] = f"its configs: {reason}"
            elif isinstance(described, FoundTopic):
                config = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
                found[name] = FoundTopic(described.partitions, config)
    return found


async def broker_count(admin: Any) -> int:
    return len((await admin.describe_cluster())["brokers"])


@dataclass(frozen=True)
class EnsureReport:
    """What ``ensure_topics`` did: topics created, topics that were there already and are
    as planned, and one line per problem with what was there already."""

    created: list[str]
    kept: list[str]
    problems: list[str]
    replication_factor: int


async def ensure_topics(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    *,
    client_config: Mapping[str, Any] | None = None,
    replication_factor: int | None = None,
    create: bool = True,
    check_partitions: bool = True,
) -> EnsureReport:
    """Create the planned topics that are missing (``create``), then compare every planned
    topic with what the cluster has. Existing topics are never changed.

    Raises TopicCreationError for what retrying cannot fix (more replicas than brokers, a
    topic refused); KafkaError for the rest (InvalidReplicationFactorError then means a
    broker that has not registered with its controller yet: try again)."""
    admin = _admin(bootstrap_servers, client_config)
    try:
        await admin.start()
        brokers = await broker_count(admin)
        replication = default_replication(brokers, replication_factor)
        if create and replication > brokers:
            raise TopicCreationError(
                f"replication factor {replication} is more than the cluster's {brokers} broker(s)"
            )
        found = await describe_topics(admin, [spec.name for spec in specs])
        missing = [spec for spec in specs if spec.name not in found]
        created: list[str] = []
        if create and missing:
            await _create(admin, [replicated(s, replication) for s in missing], replication)
            created = [spec.name for spec in missing]
            found = await describe_topics(admin, [spec.name for spec in specs])
        problems: list[str] = []
        kept: list[str] = []
        for spec in specs:
            lines = problems_of(spec, found.get(spec.name), check_partitions=check_partitions)
            problems.extend(lines)
            if not lines and spec.name not in created:
                kept.append(spec.name)
        return EnsureReport(created, kept, problems, replication)
    finally:
        await admin.close()


# -- a consumer waiting for its topics --------------------------------------------------------


async def wait_for_topics(
    existing: Callable[[], Awaitable[set[str]]],
    topics: Sequence[str],
    on_change: Callable[[list[str]], None],
    *,
    stopped: Callable[[], bool] = lambda: False,
    every_s: float = 1.0,
) -> None:
    """Return once every one of ``topics`` is in ``existing()`` (or ``stopped()``).

    ``on_change(missing)`` is called with the missing topics when there are some at the
    first look, each time that list changes, and with ``[]`` when the last one appeared
    (not at all when none was ever missing)."""
    reported: list[str] = []
    while True:
        try:
            names = await existing()
        except (kafka_errors.KafkaError, OSError):
            names = None  # the cluster did not answer: ask again; the consumer will say more
        if names is not None:
            missing = [topic for topic in topics if topic not in names]
            if missing != reported:
                reported = missing
                on_change(missing)
            if not missing:
                return
        if stopped():
            return
        await asyncio.sleep(every_s)
