"""Result publisher: an idempotent aiokafka producer behind the ``Publisher`` port."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError

from worker.ports import PublishError

__all__ = ["KafkaPublisher"]

# How long an unknown reply topic may take to appear before the result is dead-lettered.
_TOPIC_WAIT_S = 10.0


class KafkaPublisher:
    def __init__(
        self, bootstrap_servers: str, *, client_id: str, linger_ms: int, max_request_size: int
    ) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_servers,
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
        await self._producer.start()

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
