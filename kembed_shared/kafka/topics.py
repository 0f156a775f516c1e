"""The topics a kembed fleet needs: creating the plan (:mod:`.topic_plan`), describing a
cluster to check it against the plan, and waiting for the topics a consumer reads.

``kembed topics create|check`` and the local test broker (``scripts.kafka_local``) use the
same plan and the same creation code. The plan comes from plain values
(:class:`TopicNeeds`), so this module knows nothing of the worker's or the sink's settings.

"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError, KafkaConnectionError, KafkaError

from kembed_shared.kafka.topic_plan import (
    CATALOG_TOPIC_CONFIG,
    DEFAULT_PARTITIONS,
    DEFAULT_SINK_RETENTION_MS,
    LOG_APPEND_TIME,
    PLAN_HEADROOM,
    RECORD_OVERHEAD,
    FoundTopic,
    TopicNeeds,
    TopicSpec,
    compare,
    default_replication,
    plan,
    problems_of,
    replicated,
)

__all__ = [
    "CATALOG_TOPIC_CONFIG",
    "DEFAULT_PARTITIONS",
    "DEFAULT_SINK_RETENTION_MS",
    "LOG_APPEND_TIME",
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
