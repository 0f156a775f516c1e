"""The project's topics and creating them (aiokafka is async; ``run_sync`` makes it callable
from sync code)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

_T = TypeVar("_T")


@dataclass(frozen=True)
class TopicSpec:
    """A topic the local broker should have: name, partition count and topic-level config."""

    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


# Request topics (and the DLQ, which copies requests) take messages above the worker's
# max_request_bytes (4 MiB), so an oversized request reaches the worker and is answered
# with message_too_large instead of being refused by the broker with no answer at all.
_LARGE_MESSAGES = {"max.message.bytes": str(8 * 1024 * 1024)}

# The model catalog keeps the latest card per key (compact) and drops what a day has not
# refreshed (delete): workers re-announce every 30 s, so a day-old card is long dead.
CATALOG_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(24 * 60 * 60 * 1000),
}

DEFAULT_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("embed.requests", 4, _LARGE_MESSAGES),
    TopicSpec("embed.results", 8),
    TopicSpec("embed.requests.bulk", 4, _LARGE_MESSAGES),
    TopicSpec("embed.requests.dlq", 1, _LARGE_MESSAGES),
    TopicSpec("embed.models", 1, CATALOG_TOPIC_CONFIG),
)


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


async def create_topics_async(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Create ``specs`` (existing topics are left alone) and wait until all have leaders.

    ``client_config`` holds aiokafka security options (a secured broker's admin login).
    Has no deadline of its own; callers bound it with ``asyncio.timeout``.
    """
    if not specs:
        return
    names = [spec.name for spec in specs]
    new_topics = [NewTopic(s.name, s.partitions, 1, topic_configs=dict(s.config)) for s in specs]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **(client_config or {}))
    try:
        await admin.start()
        _check_create_response(await admin.create_topics(new_topics))
        # The controller acknowledges before the broker has loaded the new partitions;
        # waiting for leaders means producers never see UNKNOWN_TOPIC_OR_PARTITION.
        while True:
            if await _leaders_ready(admin, names):
                return
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


def create_topics(
    bootstrap_servers: str,
    specs: Sequence[TopicSpec],
    timeout: float = 30,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Sync version of ``create_topics_async``, bounded by ``timeout`` seconds."""

    async def bounded() -> None:
        async with asyncio.timeout(timeout):
            await create_topics_async(bootstrap_servers, specs, client_config)

    run_sync(bounded)
