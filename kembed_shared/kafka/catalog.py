"""Announcing the models a worker serves on the catalog topic.

Once its models are loaded, a worker writes one model card per model to the compacted
catalog topic (``KEMBED_CATALOG_TOPIC``, default ``embed.models``; the card is specified in
``schemas/README.md``, "Model catalog"), re-writes them every ``catalog_interval_s`` so
that readers can tell a live worker from one that died, and tombstones them when it stops.

The cards go through a small producer of their own, not the results publisher: it is never
transactional (an exactly-once worker's publisher may only write inside transactions),
and its failures stay out of the delivery path. Announcing is best effort: a failure is
logged as a warning and the worker serves on; the next interval tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas import SchemaError
from schemas.catalog import ModelCard, ModelDescription, decode_card, encode_card

__all__ = [
    "Announcer",
    "AnnouncerSettings",
    "CardProducer",
    "instance_id",
    "start_announcer",
]

log = structlog.get_logger("kembed.catalog")

# Bounds on one round of writes, so that announcing never holds up a start or a shutdown.
_SEND_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0


class AnnouncerSettings(Protocol):
    """The settings the announcer reads (a worker's ``WorkerSettings`` has them)."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def catalog_topic(self) -> str: ...
    @property
    def catalog_interval_s(self) -> float: ...


class CardProducer(Protocol):
    """What the announcer needs of a producer (an ``AIOKafkaProducer`` has it)."""

    async def send_and_wait(
        self, topic: str, value: bytes | None = None, key: bytes | None = None
    ) -> Any: ...


def instance_id(client_id: str) -> str:
    """A worker process's identity in the catalog: unique per start."""
    return f"{client_id}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(slots=True, eq=False)
class Announcer:
    """Keeps one worker instance's model cards on the catalog topic.

    ``models``: the description of each served model. Raises ValueError for one that no
    valid card can carry (readers would drop it as malformed).
    """

    producer: CardProducer
    _: KW_ONLY
    topic: str
    group_id: str
    instance: str
    interval_s: float
    models: Sequence[ModelDescription]
    clock: Callable[[], float] = time.time
    _task: asyncio.Task[None] | None = field(init=False, default=None)
    rounds: int = field(init=False, default=0)
    """Rounds of cards the broker acknowledged."""

    def __post_init__(self) -> None:
        self.models = tuple(self.models)
        for card in self._cards(0):  # a model a card cannot describe fails here, not later
            _check(card)

    @property
    def keys(self) -> list[bytes]:
        return [card.key for card in self._cards(0)]

    async def start(self) -> None:
        """Announce now (waiting at most ~10 s for the broker), then every interval."""
        await self.announce()
        self._task = asyncio.create_task(self._refresh_loop(), name="kembed-catalog")

    async def stop(self) -> None:
        """Stop refreshing and withdraw the cards (tombstones), within a few seconds."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await asyncio.gather(
                    *(self.producer.send_and_wait(self.topic, None, key) for key in self.keys)
                )
        except Exception as exc:  # noqa: BLE001 (best effort: the worker stops anyway)
            log.warning(
                "catalog.withdraw_failed", topic=self.topic, error=_describe(exc),
                note="readers drop the cards once they are 3 intervals old",
            )  # fmt: skip
        else:
            log.info("catalog.withdrawn", topic=self.topic, models=len(self.models))

    async def announce(self) -> bool:
        """Write every card once; True when the broker acknowledged them all."""
        cards = self._cards(int(self.clock() * 1000))
        try:
            async with asyncio.timeout(_SEND_TIMEOUT_S):
                await asyncio.gather(
                    *(
                        self.producer.send_and_wait(self.topic, encode_card(card), card.key)
                        for card in cards
                    )
                )
        except Exception as exc:  # noqa: BLE001 (never fatal: the worker serves without it)
            log.warning("catalog.announce_failed", topic=self.topic, error=_describe(exc))
            return False
        if self.rounds == 0:
            log.info(
                "catalog.announced",
                topic=self.topic,
                instance=self.instance,
                models=[card.name for card in cards],
                interval_s=self.interval_s,
            )
        self.rounds += 1
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.announce()

    def _cards(self, now_ms: int) -> list[ModelCard]:
        interval_ms = max(1, round(self.interval_s * 1000))
        return [
            model.card(
                group_id=self.group_id,
                instance=self.instance,
                announced_ms=now_ms,
                interval_ms=interval_ms,
            )
            for model in self.models
        ]


def _check(card: ModelCard) -> None:
    try:
        decode_card(encode_card(card))
    except SchemaError as exc:
        raise ValueError(f"model {card.name!r} cannot be announced: {exc.message}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no acknowledgement from Kafka in time"
    return f"{type(exc).__name__}: {exc}"


async def start_announcer(
    settings: AnnouncerSettings,
    models: Sequence[ModelDescription],
    security: Mapping[str, Any] | None = None,
) -> Announcer | None:
    """Start announcing ``models`` (the descriptions of the models it serves) for this
    worker, or return None when ``settings.catalog_topic`` is empty or announcing cannot
    start (logged as a warning: the worker serves anyway). ``security``: aiokafka options
    (``kembed_shared.kafka.security.client_options``). Call ``stop()`` on the result when the
    worker stops; it also stops the announcer's producer."""
    if not settings.catalog_topic:
        return None
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        **dict(security or {}),
        client_id=f"{settings.client_id}-catalog",
        acks="all",
        enable_idempotence=False,
    )
    try:
        announcer = _OwningAnnouncer(
            producer,
            topic=settings.catalog_topic,
            group_id=settings.group_id,
            instance=instance_id(settings.client_id),
            interval_s=settings.catalog_interval_s,
            models=models,
        )
        async with asyncio.timeout(_SEND_TIMEOUT_S):
            await producer.start()
        await announcer.start()
    except (KafkaError, TimeoutError, ValueError) as exc:
        log.warning("catalog.disabled", topic=settings.catalog_topic, error=_describe(exc))
        with contextlib.suppress(Exception):
            await producer.stop()
        return None
    return announcer


class _OwningAnnouncer(Announcer):
    """An announcer that stops its own producer when it stops."""

    def __init__(self, producer: AIOKafkaProducer, **options: Any) -> None:
        super().__init__(producer, **options)
        self._owned = producer

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_STOP_TIMEOUT_S):
                    await self._owned.stop()
