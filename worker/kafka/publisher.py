"""Result publisher: an idempotent aiokafka producer behind the ``Publisher`` port."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

from worker.kafka.security import check_access, diagnose_login
from worker.ports import PublishError

__all__ = ["KafkaPublisher"]

# How long an unknown reply topic may take to appear before the result is dead-lettered.
_TOPIC_WAIT_S = 10.0


class KafkaPublisher:
    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str,
        linger_ms: int,
        max_request_size: int,
        security: Mapping[str, Any] | None = None,
    ) -> None:
        """``security``: aiokafka security options (``worker.kafka.security.client_options``)."""
        self._bootstrap_servers = bootstrap_servers
        self._security = dict(security or {})
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
            **self._security,
            client_id=client_id,
            acks="all",
            # Not idempotent: delivery is at least once by design (clients drop duplicate
            # results by id), and aiokafka 0.14's idempotent producer was seen to stall
            # concurrent first sends to a new partition for request_timeout_ms.
            enable_idempotence=False,
            linger_ms=linger_ms,
            max_request_size=max_request_size,
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

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        try:
            partitions = await asyncio.wait_for(self._producer.partitions_for(topic), _TOPIC_WAIT_S)
        except (TimeoutError, KafkaError) as exc:
            raise PublishError(
                f"topic {topic!r} is not available: {exc!r}", retriable=False
            ) from exc
        if partition is not None and partition not in partitions:
            raise PublishError(
                f"partition {partition} does not exist in topic {topic!r}", retriable=False
            )
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
