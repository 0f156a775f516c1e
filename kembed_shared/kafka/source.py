"""Request source: a manually committed aiokafka consumer behind the ``Source`` port.

Auto-commit is off: offsets are committed by the pipeline only up to the first request
whose answer the broker has not acknowledged. Partition revocation is handed to the
pipeline, which finishes (or gives up on) that partition's work before it moves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

from kembed_shared.kafka.security import principal_of
from kembed_shared.kafka.topics import wait_for_topics
from kembed_shared.ports import KafkaAccessError, Record, TopicPartition

__all__ = ["GroupSettings", "KafkaSource"]

log = structlog.get_logger("kembed.worker")

PartitionsHook = Callable[[set[TopicPartition]], Awaitable[None]]

_NO_GENERATION = -1  # aiokafka's generation of a consumer that is not a group member


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self, source: KafkaSource, on_revoked: PartitionsHook, on_assigned: PartitionsHook
    ) -> None:
        self._source = source
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: set[KafkaTP]) -> None:
        await self._on_revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[KafkaTP]) -> None:
        generation, member_id = self._source.membership()
        log.info(
            "group.joined",
            group_id=self._source.group_id,
            generation=generation,
            member_id=member_id,
            group_instance_id=self._source.group_instance_id,
            partitions=sorted(f"{tp.topic}-{tp.partition}" for tp in assigned),
        )
        await self._on_assigned({(tp.topic, tp.partition) for tp in assigned})


class GroupSettings(Protocol):
    """The consumer-group settings a worker's or a sink's settings both hold
    (``kembed_shared.service_fields``)."""

    group_id: str
    client_id: str
    max_poll_interval_ms: int
    session_timeout_ms: int
    heartbeat_interval_ms: int
    fetch_max_wait_ms: int


class KafkaSource:
    def __init__(
        self,
        bootstrap_servers: str,
        topics: list[str],
        group: GroupSettings,
        *,
        fetch_max_wait_ms: int | None = None,
        group_instance_id: str | None = None,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        """A member of ``group.group_id`` reading ``topics``, with the group's timeouts.
        ``fetch_max_wait_ms``: in place of the group's (the sink caps it).
        ``security``: aiokafka security options
        (``kembed_shared.kafka.security.client_options``).
        ``group_instance_id``: Kafka's group.instance.id (static membership), or None."""
        self._topics = topics
        self.group_id = group.group_id
        self.group_instance_id = group_instance_id
        self._security = dict(security or {})
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            **self._security,
            group_id=group.group_id,
            group_instance_id=group_instance_id,
            client_id=group.client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # requests sent before any worker ran still count
            max_poll_interval_ms=group.max_poll_interval_ms,
            session_timeout_ms=group.session_timeout_ms,
            heartbeat_interval_ms=group.heartbeat_interval_ms,
            fetch_max_wait_ms=group.fetch_max_wait_ms
            if fetch_max_wait_ms is None
            else fetch_max_wait_ms,
        )

    async def start(
        self,
        on_revoked: PartitionsHook,
        on_assigned: PartitionsHook,
        *,
        on_missing: Callable[[list[str]], None] = lambda missing: None,
        stopped: Callable[[], bool] = lambda: False,
        every_s: float = 1.0,
    ) -> None:
        """Start, wait until every topic exists, then subscribe.

        A consumer subscribed to a topic that does not exist yet sees it only at its next
        metadata refresh (aiokafka's metadata_max_age_ms, 5 minutes): so the topics are
        looked for every ``every_s`` first, ``on_missing`` told which are missing (see
        :func:`~kembed_shared.kafka.topics.wait_for_topics`). ``stopped()`` ends the wait
        early (the service is shutting down); the consumer subscribes all the same."""
        await self._consumer.start()
        await wait_for_topics(
            self._existing_topics, self._topics, on_missing, stopped=stopped, every_s=every_s
        )
        self._consumer.subscribe(self._topics, listener=_Listener(self, on_revoked, on_assigned))

    async def _existing_topics(self) -> set[str]:
        # Every topic's metadata (no names): asking for a missing topic by name would let a
        # broker with auto.create.topics.enable create it with the broker's defaults.
        cluster = await self._consumer._client.fetch_all_metadata()
        return set(cluster.topics(exclude_internal_topics=True))

    async def stop(self) -> None:
        """Stop consuming. A dynamic member leaves the group (the broker reassigns its
        partitions at once); a static one (``group_instance_id``) does not: its partitions
        wait, up to the session timeout, for a worker with the same instance id."""
        await self._consumer.stop()

    def membership(self) -> tuple[int, str]:
        """The consumer's group generation and member id (-1 and "" outside the group)."""
        # aiokafka keeps both on its coordinator only; read them without side effects.
        coordinator = getattr(self._consumer, "_coordinator", None)
        generation = getattr(coordinator, "generation", _NO_GENERATION)
        member_id = getattr(coordinator, "member_id", "")
        return (
            generation if isinstance(generation, int) else _NO_GENERATION,
            member_id if isinstance(member_id, str) else "",
        )

    async def poll(self, timeout_ms: int, max_records: int) -> list[Record]:
        """Records fetched; KafkaAccessError if the principal may not read them (ACLs can
        change while the worker runs) or may not use the consumer group."""
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except TopicAuthorizationFailedError as exc:
            raise self._denied(f"READ on topic {_name(exc)}") from None
        except GroupAuthorizationFailedError:
            raise self._denied(f"READ on consumer group {self.group_id!r}") from None
        return [
            Record(
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                value=r.value,
                headers=tuple(r.headers or ()),
                timestamp_ms=r.timestamp,
                key=r.key,
            )
            for records in batches.values()
            for r in records
        ]

    def assignment(self) -> set[TopicPartition]:
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def pause(self, partitions: set[TopicPartition]) -> None:
        self._consumer.pause(*(KafkaTP(t, p) for t, p in partitions))

    def resume(self, partitions: set[TopicPartition]) -> None:
        self._consumer.resume(*(KafkaTP(t, p) for t, p in partitions))

    def lag(self) -> dict[TopicPartition, int]:
        lags = {}
        for tp in self._consumer.assignment():
            highwater = self._consumer.highwater(tp)
            position = self._position(tp)
            if highwater is not None and position is not None:
                lags[(tp.topic, tp.partition)] = max(0, highwater - position)
        return lags

    def _position(self, tp: KafkaTP) -> int | None:
        # aiokafka's public position() is a coroutine that may reset the offset; the fetch
        # position it keeps is all a lag gauge needs, and is read without side effects.
        try:
            state = self._consumer._subscription.subscription.assignment.state_value(tp)
            if state is None or not state.has_valid_position:
                return None
            position: int = state.position
        except (AttributeError, AssertionError):
            return None
        return position

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        await self._consumer.commit({KafkaTP(t, p): o for (t, p), o in offsets.items()})

    def in_group(self) -> bool:
        # aiokafka has no public accessor: when a heartbeat or commit learns that this member
        # was expelled (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), the coordinator resets its
        # generation to -1 before the rebalance listener sees the partitions go.
        coordinator = getattr(self._consumer, "_coordinator", None)
        return coordinator is None or getattr(coordinator, "generation", 0) != _NO_GENERATION

    def _denied(self, what: str) -> KafkaAccessError:
        return KafkaAccessError(
            "authorization",
            f"{principal_of(self._security)} is not authorized for {what}: it needs an ACL "
            "allowing it",
        )


def _name(error: TopicAuthorizationFailedError) -> str:
    """The topic(s) an aiokafka authorization error names."""
    names: list[str] = []
    for arg in error.args:
        names.extend(sorted(map(str, arg)) if isinstance(arg, set | frozenset) else [str(arg)])
    return ", ".join(repr(name) for name in names) or "(unnamed)"
