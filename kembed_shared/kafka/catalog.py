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
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.catalog import ModelCard, encode_card

__all__ = [
    "MODEL_FIELDS",
    "Announcer",
    "AnnouncerSettings",
    "CardProducer",
    "instance_id",
    "start_announcer",
]

log = structlog.get_logger("kembed.catalog")

MODEL_FIELDS = (
    "name",
    "aliases",
    "dim",
    "max_seq_length",
    "pooling",
    "dtype",
    "quantization",
    "device",
    "prompts",
    "default_prompt_name",
    "requests_topic",
    "bulk_topic",
)
"""The keys of each model dict the worker hands to the announcer (and shows in /info)."""

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


class Announcer:
    """Keeps one worker instance's model cards on the catalog topic.

    ``models``: one dict per served model with exactly the keys of :data:`MODEL_FIELDS`.
    Raises ValueError if a dict has other keys or a value a card cannot hold.
    """

    def __init__(
        self,
        producer: CardProducer,
        *,
        topic: str,
        group_id: str,
        instance: str,
        interval_s: float,
        models: Sequence[Mapping[str, Any]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._interval_s = interval_s
        self._clock = clock
        self._group_id = group_id
        self._instance = instance
        self._models = [_checked(model) for model in models]
        self._cards(0)  # a model a card cannot describe fails here, not in the loop
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        """Rounds of cards the broker acknowledged."""

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
                    *(self._producer.send_and_wait(self._topic, None, key) for key in self.keys)
                )
        except Exception as exc:  # noqa: BLE001 (best effort: the worker stops anyway)
            log.warning(
                "catalog.withdraw_failed", topic=self._topic, error=_describe(exc),
                note="readers drop the cards once they are 3 intervals old",
            )  # fmt: skip
        else:
            log.info("catalog.withdrawn", topic=self._topic, models=len(self._models))

    async def announce(self) -> bool:
        """Write every card once; True when the broker acknowledged them all."""
        cards = self._cards(int(self._clock() * 1000))
        try:
            async with asyncio.timeout(_SEND_TIMEOUT_S):
                await asyncio.gather(
                    *(
                        self._producer.send_and_wait(self._topic, encode_card(card), card.key)
                        for card in cards
                    )
                )
        except Exception as exc:  # noqa: BLE001 (never fatal: the worker serves without it)
            log.warning("catalog.announce_failed", topic=self._topic, error=_describe(exc))
            return False
        if self.rounds == 0:
            log.info(
                "catalog.announced",
                topic=self._topic,
                instance=self._instance,
                models=[card.name for card in cards],
                interval_s=self._interval_s,
            )
        self.rounds += 1
        return True

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.announce()

    def _cards(self, now_ms: int) -> list[ModelCard]:
        try:
            return [
                ModelCard(
                    name=str(model["name"]),
                    aliases=tuple(str(alias) for alias in model["aliases"] or ()),
                    dim=int(model["dim"]),
                    max_seq_length=int(model["max_seq_length"]),
                    pooling=str(model["pooling"]),
                    dtype=str(model["dtype"]),
                    quantization=str(model["quantization"] or "none"),
                    device=str(model["device"]),
                    prompts={str(k): str(v) for k, v in (model["prompts"] or {}).items()},
                    default_prompt_name=_optional_str(model["default_prompt_name"]),
                    requests_topic=str(model["requests_topic"]),
                    bulk_topic=_optional_str(model["bulk_topic"]),
                    group_id=self._group_id,
                    instance=self._instance,
                    announced_ms=now_ms,
                    interval_ms=max(1, round(self._interval_s * 1000)),
                )
                for model in self._models
            ]
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"a served model cannot be described as a card: {exc}") from None


def _checked(model: Mapping[str, Any]) -> Mapping[str, Any]:
    if set(model) != set(MODEL_FIELDS):
        missing = sorted(set(MODEL_FIELDS) - set(model))
        unknown = sorted(set(model) - set(MODEL_FIELDS))
        raise ValueError(f"model dict: missing keys {missing}, unknown keys {unknown}")
    return model


def _optional_str(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no acknowledgement from Kafka in time"
    return f"{type(exc).__name__}: {exc}"


async def start_announcer(
    settings: AnnouncerSettings,
    models: Sequence[Mapping[str, Any]],
    security: Mapping[str, Any] | None = None,
) -> Announcer | None:
    """Start announcing ``models`` (dicts with the keys of :data:`MODEL_FIELDS`) for this
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
