"""The model catalog, read by clients: which models are served, and on which topic.

Workers announce each model they serve on a compacted topic (``embed.models``; the card
format is in ``schemas/README.md``, "Model catalog"). :func:`read_catalog` reads that topic
from its beginning up to the end offsets it saw when called (every partition, no
consumer group), keeps the latest card per key, drops tombstoned and stale cards, and
merges the cards of one model name over the workers that serve it (:func:`merge_cards`).
:class:`ModelRouter` caches the result for :class:`~producer_sdk.EmbedClient`, which sends a
request naming a model to the topic the catalog gives for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAuthorizationFailedError

from kembed_shared.kafka.security import client_options, diagnose_login, principal_of
from producer_sdk.config import ClientConfig
from producer_sdk.errors import AuthenticationError, AuthorizationError, CatalogUnavailableError
from schemas import SchemaError
from schemas.catalog import ModelCard, ModelDescription, decode_card

__all__ = [
    "CatalogModel",
    "CatalogUnavailableError",
    "ModelRouter",
    "live_cards",
    "merge_cards",
    "read_catalog",
    "resolve",
]

log = structlog.get_logger("kembed.sdk.catalog")

Lane = Literal["interactive", "bulk"]


@dataclass(frozen=True, slots=True)
class CatalogModel(ModelDescription):
    """One served model, merged over the workers that announce it: the description of the
    request topic most of its workers read (``requests_topic``; see :func:`merge_cards`),
    with every alias any of its workers accepts, and these facts of its fleet."""

    group_id: str
    topics: tuple[str, ...]
    """Every request topic (either lane) a live worker of this model reads, sorted."""
    workers: int
    """Live worker instances announcing it (on any topic)."""
    instances: tuple[str, ...]
    """Their instance ids, sorted."""
    announced_ms: int
    """The newest announcement among them."""
    interval_ms: int

    def serves(self, model: str) -> bool:
        return model == self.name or model in self.aliases

    def topic(self, lane: Lane = "interactive") -> str:
        """The request topic of ``lane`` (bulk falls back to the interactive topic)."""
        if lane == "bulk" and self.bulk_topic:
            return self.bulk_topic
        return self.requests_topic


def live_cards(cards: Iterable[ModelCard], now_ms: int) -> list[ModelCard]:
    """The cards whose worker refreshed them recently enough (see ``ModelCard.is_live``)."""
    return [card for card in cards if card.is_live(now_ms)]


def merge_cards(cards: Iterable[ModelCard], now_ms: int) -> list[CatalogModel]:
    """One entry per model name over the live ``cards``, sorted by name.

    Workers of one model normally announce the same card; where they differ (a rolling
    upgrade, two fleets on different topics), the entry describes the request topic most
    of its instances read (ties: the most recent announcement), with the fields of that
    topic's newest card, and the aliases of all of them."""
    by_name: dict[str, list[ModelCard]] = {}
    for card in live_cards(cards, now_ms):
        by_name.setdefault(card.name, []).append(card)
    models = []
    for name in sorted(by_name):
        group = by_name[name]
        votes = Counter(card.requests_topic for card in group)
        newest: dict[str, ModelCard] = {}
        for card in group:
            best = newest.get(card.requests_topic)
            if best is None or card.announced_ms > best.announced_ms:
                newest[card.requests_topic] = card
        topic = max(votes, key=lambda t: (votes[t], newest[t].announced_ms))
        chosen = newest[topic]
        aliases = dict.fromkeys(chosen.aliases)
        for card in sorted(group, key=lambda c: -c.announced_ms):
            aliases.update(dict.fromkeys(card.aliases))
        aliases.pop(name, None)
        instances = sorted({card.instance for card in group})
        topics = {card.requests_topic for card in group}
        topics.update(card.bulk_topic for card in group if card.bulk_topic)
        models.append(
            CatalogModel(
                **(chosen.description_fields() | {"aliases": tuple(aliases)}),
                group_id=chosen.group_id,
                topics=tuple(sorted(topics)),
                workers=len(instances),
                instances=tuple(instances),
                announced_ms=max(card.announced_ms for card in group),
                interval_ms=chosen.interval_ms,
            )
        )
    return models


def resolve(models: Sequence[CatalogModel], model: str) -> CatalogModel | None:
    """The entry ``model`` names: by name first, else by alias (the first by name order)."""
    for entry in models:
        if entry.name == model:
            return entry
    for entry in models:
        if model in entry.aliases:
            return entry
    return None


async def read_catalog(
    config: ClientConfig, *, timeout: float | None = None, topic: str | None = None
) -> list[CatalogModel]:
    """The live models announced on the catalog topic (``topic``, default the config's).

    Reads every partition from the beginning to the end offsets seen at the call; a topic
    that does not exist is an empty catalog. Raises CatalogUnavailableError when Kafka does
    not answer within ``timeout`` (default ``config.catalog_timeout``), AuthenticationError
    when it rejects the login, AuthorizationError when the topic may not be read."""
    name = topic or config.catalog_topic
    if not name:
        raise ValueError("no catalog topic: the client's catalog_topic is None")
    wait = config.catalog_timeout if timeout is None else timeout
    try:
        async with asyncio.timeout(wait):
            cards = await _read_cards(config, name)
    except TimeoutError:
        raise CatalogUnavailableError(
            f"catalog topic {name!r} not read within {wait:g} s (Kafka at "
            f"{config.bootstrap_servers})"
        ) from None
    return merge_cards(cards.values(), int(time.time() * 1000))


async def _read_cards(config: ClientConfig, topic: str) -> dict[bytes, ModelCard]:
    """The latest card per key, tombstoned keys removed (compaction's view, done here)."""
    options = client_options(config, tls_error=None)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=config.bootstrap_servers,
        **options,
        client_id=config.client_id,
        group_id=None,
        enable_auto_commit=False,
        isolation_level=config.isolation_level,
        auto_offset_reset="earliest",
        # The broker answers a connection's requests in order, so an idle long-poll fetch
        # would hold up the offset look-ups behind it for its whole wait.
        fetch_max_wait_ms=20,
    )
    try:
        try:
            await consumer.start()
        except KafkaConnectionError:
            await diagnose_login(config.bootstrap_servers, options, AuthenticationError.of)
            raise CatalogUnavailableError(
                f"cannot reach Kafka at {config.bootstrap_servers}"
            ) from None
        try:
            if topic not in await consumer.topics():
                return {}  # not created yet: nothing announced (and reading must not create it)
            # Without a group, a subscription is assigned every partition of the topic by the
            # consumer itself: no coordinator, no rebalance, nothing committed.
            consumer.subscribe([topic])
            while not consumer.assignment():  # noqa: ASYNC110 (aiokafka has no event for it)
                await asyncio.sleep(0.01)
            partitions = sorted(consumer.assignment())
            await consumer.seek_to_beginning(*partitions)
            end = await consumer.end_offsets(partitions)
            cards: dict[bytes, ModelCard] = {}
            waiting = {tp for tp in partitions if end[tp] > await consumer.position(tp)}
            while waiting:
                batches = await consumer.getmany(*waiting, timeout_ms=200)
                for tp, records in batches.items():
                    for record in records:
                        if record.offset < end[tp]:
                            _apply(cards, record.key, record.value)
                for tp in list(waiting):
                    if await consumer.position(tp) >= end[tp]:
                        waiting.discard(tp)
            return cards
        except TopicAuthorizationFailedError:
            raise AuthorizationError(principal_of(options), "read", topic) from None
        except KafkaError as exc:
            raise CatalogUnavailableError(
                f"cannot read catalog topic {topic!r}: {type(exc).__name__}"
            ) from None
    finally:
        # aiokafka 0.14 raises CancelledError when a consumer stops before its background
        # task first ran; one turn of the loop lets it start.
        await asyncio.sleep(0)
        await consumer.stop()


def _apply(cards: dict[bytes, ModelCard], key: bytes | None, value: bytes | None) -> None:
    if key is None:
        return
    if value is None:
        cards.pop(key, None)
        return
    try:
        cards[key] = decode_card(value)
    except SchemaError as exc:
        log.warning("catalog.card_malformed", error=exc.message)


Reader = Callable[[], Awaitable[Sequence[CatalogModel]]]


class ModelRouter:
    """The request topic for a model name, from a cached catalog.

    The catalog is read when a call names a model and the cache is older than
    ``refresh_s`` (or was never read): a call whose model the cache names goes on at once
    with the cached topic while the catalog is re-read in the background; a call whose
    model it lacks waits for the re-read (bounded by the reader's timeout). So a model that
    appears is found within ``refresh_s``, and a client reads the catalog at most once per
    ``refresh_s``. A read that fails is logged and the old cache kept.
    """

    def __init__(
        self,
        read: Reader | None,
        *,
        refresh_s: float,
        overrides: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._refresh_s = refresh_s
        self._overrides = dict(overrides or {})
        self._clock = clock
        self._models: Sequence[CatalogModel] = ()
        self._read_at: float | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self.reads = 0

    def pinned(self, model: str) -> bool:
        """Whether ``model``'s topic is set by ``overrides`` (``model_topics``), not the
        catalog."""
        return model in self._overrides

    async def topic_for(
        self, model: str, lane: Lane = "interactive", current: str | None = None
    ) -> str | None:
        """The topic to send a request for ``model`` to; None when neither an override nor
        the catalog names one (the caller then uses its configured topic). ``current``,
        the caller's configured topic, is kept when a live worker of the model reads it (a
        client configured for the bulk lane, or for its own fleet's topic, stays on it)."""
        if self.pinned(model):
            return self._overrides[model]
        entry = await self.find(model)
        if entry is None:
            return None
        if current is not None and current in entry.topics:
            return current
        return entry.topic(lane)

    async def find(self, model: str) -> CatalogModel | None:
        """The catalog's entry for ``model`` (by name or alias), from the cache (re-read as
        :class:`ModelRouter` says); None without a catalog or when it lacks the model."""
        if self._read is None:
            return None
        entry = resolve(self._models, model)
        if self._due():
            refresh = self._start_refresh()
            if entry is None:
                await asyncio.shield(refresh)
                entry = resolve(self._models, model)
        return entry

    def update(self, models: Sequence[CatalogModel]) -> None:
        """Take a freshly read catalog (``EmbedClient.models()`` shares its read)."""
        self._models = tuple(models)
        self._read_at = self._clock()

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing

    def _due(self) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= self._refresh_s

    def _start_refresh(self) -> asyncio.Task[None]:
        """The catalog read in flight, or a new one: one read at a time."""
        assert self._read is not None
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="kembed-catalog")
        return self._refreshing

    async def _refresh(self) -> None:
        self.reads += 1
        assert self._read is not None
        try:
            models = await self._read()
        except Exception as exc:  # noqa: BLE001 (routing falls back; the call must go on)
            # Keep the old cache; try again after refresh_s, not on every call meanwhile.
            self._read_at = self._clock()
            log.warning("catalog.read_failed", error=str(exc) or type(exc).__name__)
        else:
            self.update(models)
