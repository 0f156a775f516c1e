"""Result publishers behind the ``Publisher`` and ``TransactionalPublisher`` ports.

``KafkaPublisher`` (at least once) acknowledges each message on its own.
``KafkaTransactionalPublisher`` (exactly once) writes messages and consumer offsets in
Kafka transactions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Required, TypedDict, Unpack

from aiokafka import AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTP
from aiokafka.errors import (
    InvalidTopicError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)
from aiokafka.protocol.metadata import MetadataRequest

from kembed_shared.kafka.security import check_access, diagnose_login, principal_of
from kembed_shared.ports import KafkaAccessError, PublishError, TopicPartition

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "KafkaPublisher",
    "KafkaTransactionalPublisher",
    "ProducerOptions",
]

# How long one try waits for a reply topic's metadata (a broker's answer about a topic the
# producer has not written yet). A try that runs out is transient: the caller retries it.
_TOPIC_WAIT_S = 10.0
# What a broker may say about a topic that no retry can change: it does not exist, its name
# is not valid, or this principal may not use it.
_PERMANENT_TOPIC_ERRORS = {
    UnknownTopicOrPartitionError.errno: "does not exist",
    InvalidTopicError.errno: "is not a valid topic name",
    TopicAuthorizationFailedError.errno: "may not be written (no ACL allows it)",
}
# Retry back-off of the transactional producer. Right after a commit the coordinator is
# still writing the previous transaction's markers and answers the next transaction's first
# requests with CONCURRENT_TRANSACTIONS (NOT_ENOUGH_REPLICAS for produce requests of
# aiokafka's version); aiokafka's default 100 ms back-off then dominates the latency of
# back-to-back transactions. 20 ms is what aiokafka itself waits between transactions.
_TXN_RETRY_BACKOFF_MS = 20


DEFAULT_BATCH_BYTES = 1024 * 1024
"""The producer's batch per partition (aiokafka's max_batch_size). While one produce
request is in flight, the results finished meanwhile gather in the next batch, up to this
size; a larger message still goes alone. aiokafka's default, 16 KiB, is smaller than one
result of 32 MiniLM vectors (49 KiB): every result then went in a batch of its own, and
each send waited for the partition's previous batch to leave. Keep it within what the
destination topics accept (max.message.bytes limits a whole batch): the worker uses its
max_result_bytes, capped at this."""


class _ExpectedRetries(logging.Filter):
    """Drops aiokafka's warning for the produce retry above (NOT_ENOUGH_REPLICAS while the
    previous transaction completes): expected, harmless, and frequent under load. A
    genuine shortage of replicas still shows, as transactions that fail."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            str(record.msg).startswith("Got error produce response")
            and isinstance(record.args, tuple)
            and NotEnoughReplicasError in record.args
        )


_EXPECTED_RETRIES = _ExpectedRetries()


class ProducerOptions(TypedDict, total=False):
    """What either publisher is made with, besides its bootstrap servers."""

    client_id: Required[str]
    linger_ms: Required[int]
    max_request_size: Required[int]
    batch_bytes: int
    """The producer's batch per partition: see :data:`DEFAULT_BATCH_BYTES` (the default)."""
    security: Mapping[str, Any] | None
    """aiokafka security options (``kembed_shared.kafka.security.client_options``)."""


class _Producer:
    """What both publishers share: an aiokafka producer with the worker's security options,
    a start that explains a rejected login, and the access check."""

    def __init__(self, bootstrap_servers: str, options: ProducerOptions, **extra: Any) -> None:
        """``extra``: aiokafka options of one kind of publisher."""
        self._bootstrap_servers = bootstrap_servers
        self._security = dict(options.get("security") or {})
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            **self._security,
            acks="all",
            client_id=options["client_id"],
            linger_ms=options["linger_ms"],
            max_request_size=options["max_request_size"],
            max_batch_size=options.get("batch_bytes", DEFAULT_BATCH_BYTES),
            **extra,
        )

    async def start(self) -> None:
        """Connect; raise KafkaAccessError if Kafka rejects the login."""
        try:
            await self._producer.start()
        except KafkaConnectionError:
            await self._producer.stop()
            await diagnose_login(self._bootstrap_servers, self._security)
            raise

    async def check_access(
        self, needs: Mapping[str, Iterable[str]], group_id: str | None = None
    ) -> None:
        """Raise KafkaAccessError if the principal lacks any of ``needs`` (topic -> ops) or
        may not use the consumer group ``group_id``."""
        await check_access(self._producer.client, needs, self._security, group_id)

    async def stop(self) -> None:
        await self._producer.stop()


class KafkaPublisher(_Producer):
    def __init__(self, bootstrap_servers: str, **options: Unpack[ProducerOptions]) -> None:
        # Not idempotent: delivery is at least once by design (clients drop duplicate
        # results by id), and aiokafka 0.14's idempotent producer was seen to stall
        # concurrent first sends to a new partition for request_timeout_ms.
        super().__init__(bootstrap_servers, options, enable_idempotence=False)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        await _check_destination(self._producer, topic, partition)
        try:
            future = await self._producer.send(
                topic, value, key=key, partition=partition, headers=list(headers)
            )
            await future
        except KafkaError as exc:
            # A batch that timed out waiting for a broker (restarting, unreachable) is as
            # transient as the retriable errors, though aiokafka does not mark it so.
            retriable = bool(getattr(exc, "retriable", False)) or isinstance(exc, KafkaTimeoutError)
            raise PublishError(f"{type(exc).__name__}: {exc}", retriable=retriable) from exc


class KafkaTransactionalPublisher(_Producer):
    """A transactional (hence idempotent) producer.

    ``warm_topics`` (the results and dead-letter topics) have their metadata fetched at
    start, before any transaction: a transaction's sends then never wait for metadata, and
    the first sends to each partition do not race a metadata fetch (aiokafka 0.14's
    idempotent producer was seen to stall such sends for request_timeout_ms).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        transactional_id: str,
        transaction_timeout_ms: int,
        warm_topics: Sequence[str] = (),
        **options: Unpack[ProducerOptions],
    ) -> None:
        super().__init__(
            bootstrap_servers,
            options,
            transactional_id=transactional_id,
            transaction_timeout_ms=transaction_timeout_ms,
            retry_backoff_ms=_TXN_RETRY_BACKOFF_MS,
        )
        self._transactional_id = transactional_id
        self._warm_topics = list(warm_topics)
        self._stop_timeout = transaction_timeout_ms / 1000
        logging.getLogger("aiokafka.producer.sender").addFilter(_EXPECTED_RETRIES)

    async def start(self) -> None:
        """Start, fencing any earlier producer with the same transactional id (its open
        transaction is aborted), and fetch the metadata of ``warm_topics``. Raises
        KafkaAccessError if the principal may not use the transactional id."""
        try:
            await super().start()
        except TransactionalIdAuthorizationFailed:
            await self._producer.stop()
            raise KafkaAccessError(
                "authorization",
                f"{principal_of(self._security)} is not authorized for WRITE on transactional "
                f"id {self._transactional_id!r} (exactly_once delivery): it needs an ACL "
                "allowing it",
            ) from None
        for topic in self._warm_topics:
            # A missing topic is not fatal here: answers bound for it are dead-lettered (or,
            # for the dead-letter topic itself, fail the worker) as at least once does.
            with contextlib.suppress(PublishError):
                await _check_destination(self._producer, topic, None)

    async def stop(self) -> None:
        """Stop within the transaction timeout: after a failed transaction a message may
        still wait for the broker (up to request_timeout_ms), and the worker should exit
        rather than wait for it. Nothing is lost: what is not committed is redelivered."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._producer.stop(), self._stop_timeout)

    async def check_destination(self, topic: str, partition: int | None) -> None:
        known = self._producer.client.cluster.partitions_for_topic(topic)
        if known:  # the usual case, without a suspension: answers join the waiting batch now
            if partition is not None and partition not in known:
                raise PublishError(
                    f"partition {partition} does not exist in topic {topic!r}", retriable=False
                )
            return
        await _check_destination(self._producer, topic, partition)

    async def begin(self) -> None:
        await self._producer.begin_transaction()

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Awaitable[object]:
        future: Awaitable[object] = await self._producer.send(
            topic, value, key=key, partition=partition, headers=list(headers)
        )
        return future

    async def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        await self._producer.send_offsets_to_transaction(
            {KafkaTP(topic, partition): offset for (topic, partition), offset in offsets.items()},
            group_id,
        )

    async def commit(self) -> None:
        await self._producer.commit_transaction()

    async def abort(self) -> None:
        await self._producer.abort_transaction()


async def _check_destination(producer: AIOKafkaProducer, topic: str, partition: int | None) -> None:
    """Raise PublishError unless ``topic`` (and ``partition`` of it, when given) can be
    written.

    Not retriable: the broker says the topic does not exist, has an invalid name or may not
    be written by this principal, or the partition does not exist. Retriable: no broker
    answered in time (restarting, unreachable) or the topic has no leader yet; a broker
    restart looks like that for up to a minute, and the caller retries it."""
    partitions = producer.client.cluster.partitions_for_topic(topic)
    if partitions is None:
        partitions = await _wait_for_topic(producer, topic)
    if partition is not None and partition not in partitions:
        raise PublishError(
            f"partition {partition} does not exist in topic {topic!r}", retriable=False
        )


async def _wait_for_topic(producer: AIOKafkaProducer, topic: str) -> set[int]:
    """The partitions of a topic the producer knows nothing of yet.

    aiokafka's own wait (``partitions_for``) cannot tell a topic that does not exist from
    a broker that does not answer: both end in a timeout. So a broker is asked first, and
    only its answer makes the failure permanent."""
    answered, error = await _topic_error(producer.client, topic)
    if error in _PERMANENT_TOPIC_ERRORS:
        raise PublishError(f"topic {topic!r} {_PERMANENT_TOPIC_ERRORS[error]}", retriable=False)
    if not answered:
        raise PublishError(
            f"topic {topic!r} is not available: no broker answered a metadata request",
            retriable=True,
        )
    try:
        partitions: set[int] = await asyncio.wait_for(producer.partitions_for(topic), _TOPIC_WAIT_S)
    except TopicAuthorizationFailedError as exc:
        message = _PERMANENT_TOPIC_ERRORS[TopicAuthorizationFailedError.errno]
        raise PublishError(f"topic {topic!r} {message}", retriable=False) from exc
    except (TimeoutError, KafkaError) as exc:
        raise PublishError(
            f"topic {topic!r} is not available yet: {type(exc).__name__}", retriable=True
        ) from exc
    return partitions


async def _topic_error(client: Any, topic: str) -> tuple[bool, int | None]:
    """Ask one broker about ``topic``: whether it answered, and its error code for the topic
    (0: it exists). Auto-creation is allowed, as in the producer's own metadata requests."""
    node = client.get_random_node()
    if node is None:
        return False, None
    try:
        request = MetadataRequest([topic])
        response = await asyncio.wait_for(client.send(node, request), _TOPIC_WAIT_S)
    except (TimeoutError, KafkaError):
        return False, None
    if not response.brokers:  # a broker that does not know the cluster yet (just restarted)
        return False, None
    for entry in response.topics:  # (error_code, name, ...) in every version
        if entry[1] == topic:
            return True, int(entry[0])
    return False, None
