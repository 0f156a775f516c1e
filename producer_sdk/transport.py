"""Kafka plumbing of the client: a request producer and a reply-partition reader.

Replies are routed by partition: the client reads exactly one partition of the reply topic
(assigned, not subscribed: no consumer group, no rebalances) and asks workers to answer
there (``reply_partition``). Clients that share a partition skip each other's results by
the ``kafka_correlationId`` header without decoding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from kembed_shared.kafka.security import client_options, diagnose_login, principal_of
from producer_sdk.catalog import CatalogModel, read_catalog
from producer_sdk.config import ClientConfig
from producer_sdk.errors import AuthenticationError, AuthorizationError
from schemas.headers import CORRELATION_ID

__all__ = ["ClientTransport", "FailureHandler", "ReplyHandler", "Transport", "TransportFactory"]

ReplyHandler = Callable[[str | None, bytes], None]
"""Takes each result read: its request id (the correlation header, if any) and its bytes."""
FailureHandler = Callable[[AuthorizationError], None]
"""Takes the error that ended reading results (the reply topic turned out unreadable)."""


class ClientTransport(Protocol):
    """What :class:`~producer_sdk.EmbedClient` sends requests and reads results through:
    :class:`Transport` (Kafka), or :class:`producer_sdk.testing.InMemoryTransport`."""

    reply_partition: int
    failure: AuthorizationError | None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        topic: str | None = None,
        key: bytes | None = None,
    ) -> None: ...

    async def read_catalog(self, timeout: float | None) -> list[CatalogModel]: ...


TransportFactory = Callable[[ClientConfig, ReplyHandler, FailureHandler], ClientTransport]
"""Makes a client's transport from its settings and its two handlers."""

_RECORD_OVERHEAD = 16 * 1024


class Transport:
    def __init__(
        self, config: ClientConfig, on_reply: ReplyHandler, on_failure: FailureHandler
    ) -> None:
        self._config = config
        self._on_reply = on_reply
        self._on_failure = on_failure
        self._options = client_options(config, tls_error=None)
        self._principal = principal_of(self._options)
        self.failure: AuthorizationError | None = None
        """Set when the reply topic turned out unreadable: no result can arrive."""
        self._producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            **self._options,
            client_id=config.client_id,
            acks="all",
            enable_idempotence=False,  # a resent request is answered twice; one is dropped
            linger_ms=config.linger_ms,
            # Requests are checked against max_request_bytes before they are sent; this
            # leaves room for the record's headers and framing around such a value.
            max_request_size=config.max_request_bytes + _RECORD_OVERHEAD,
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=config.bootstrap_servers,
            **self._options,
            client_id=config.client_id,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=config.fetch_max_wait_ms,
            isolation_level=config.isolation_level,
        )
        self._reader: asyncio.Task[None] | None = None
        self.reply_partition = -1

    async def start(self) -> None:
        """Connect and take the reply partition. Raises AuthenticationError when Kafka
        rejects the login, AuthorizationError when the reply topic may not be read."""
        try:
            await self._producer.start()
        except KafkaConnectionError:
            await self.stop()
            await diagnose_login(
                self._config.bootstrap_servers, self._options, AuthenticationError.of
            )
            raise
        if not self._config.read_replies:
            return
        try:
            try:
                partitions = await self._producer.partitions_for(self._config.reply_topic)
            except TopicAuthorizationFailedError:
                raise self._denied("read", self._config.reply_topic) from None
            chosen = self._config.reply_partition
            if chosen is None:
                chosen = random.choice(sorted(partitions))
            elif chosen not in partitions:
                raise ValueError(
                    f"reply_partition {chosen} is not a partition of {self._config.reply_topic!r}"
                )
            self.reply_partition = chosen
            await self._consumer.start()
            tp = TopicPartition(self._config.reply_topic, chosen)
            self._consumer.assign([tp])
            # Pin the position before any request goes out, so no reply can slip past it.
            await self._consumer.seek_to_end(tp)
            await self._consumer.position(tp)
        except BaseException:
            await self.stop()
            raise
        self._reader = asyncio.create_task(self._read_replies(), name="kembed-replies")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        await self._consumer.stop()
        await self._producer.stop()

    async def send(
        self,
        value: bytes,
        headers: Sequence[tuple[str, bytes]],
        topic: str | None = None,
        key: bytes | None = None,
    ) -> None:
        """Return once the request is durably in Kafka (acknowledged by all in-sync replicas).

        ``topic`` defaults to the interactive requests topic; ``key``, the message key,
        picks the partition (none: the producer spreads requests). Raises
        AuthorizationError at once if the topic may not be written."""
        topic = topic or self._config.requests_topic
        try:
            await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
        except TopicAuthorizationFailedError:
            raise self._denied("write", topic) from None

    async def read_catalog(self, timeout: float | None) -> list[CatalogModel]:
        """The model catalog (:func:`producer_sdk.catalog.read_catalog`)."""
        return await read_catalog(self._config, timeout=timeout)

    def _denied(self, operation: str, topic: str) -> AuthorizationError:
        return AuthorizationError(self._principal, operation, topic)

    async def _read_replies(self) -> None:
        try:
            await self._read_forever()
        except TopicAuthorizationFailedError:
            # Describe but not read: positioning worked, fetching does not.
            self.failure = self._denied("read", self._config.reply_topic)
            self._on_failure(self.failure)

    async def _read_forever(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    request_id = None
                    for name, value in record.headers or ():
                        if name == CORRELATION_ID:
                            request_id = value.decode("utf-8", "replace")
                    if record.value is not None:
                        self._on_reply(request_id, record.value)
