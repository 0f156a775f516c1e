"""The model catalog: which models the workers serve, on a compacted Kafka topic.

Each worker writes one *model card* per model it serves to the catalog topic (default
``embed.models``), keyed ``"{group_id}/{instance}/{model name}"``, and writes it again every
``interval_ms`` so that readers can tell live entries from those of a worker that died
without saying so; on a graceful shutdown it writes a tombstone (a null value) for each of
its keys. The layout is specified in ``schemas/README.md`` ("Model catalog").

Encoding is canonical (keys in the order of the README's table); decoding accepts any key
order, ignores unknown keys, treats an explicit nil as absent, and raises
:class:`~schemas.errors.SchemaError` (and nothing else) for anything that is not a valid
card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import msgpack

from schemas.errors import ErrorCode, SchemaError
from schemas.fields import (
    MistypedError,
    fail,
    integer,
    kind_name,
    non_empty,
    non_negative,
    optional,
    positive,
    required,
    string,
    topic_name,
)
from schemas.kinds import Kind

__all__ = [
    "CARD_VERSION",
    "DEFAULT_CATALOG_TOPIC",
    "STALE_AFTER_INTERVALS",
    "ModelCard",
    "ModelDescription",
    "catalog_key",
    "decode_card",
    "encode_card",
]

CARD_VERSION = 1
DEFAULT_CATALOG_TOPIC = "embed.models"
STALE_AFTER_INTERVALS = 3
"""A card not re-written within this many of its intervals belongs to a dead worker."""

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """One served model as clients see it: the properties a worker states of each model.

    The one description of a model: the worker builds it from what it loaded, hands it to
    its announcer, which adds its own identity and timing to make the :class:`ModelCard`,
    and shows it (with facts of its own) in ``/info``; a client's catalog entry
    (``producer_sdk.CatalogModel``) is it merged over the workers that serve the model.
    """

    name: str
    aliases: tuple[str, ...]
    dim: int
    max_seq_length: int
    pooling: str
    dtype: str
    quantization: str
    device: str
    prompts: Mapping[str, str]
    default_prompt_name: str | None
    requests_topic: str
    bulk_topic: str | None
    kind: str = field(default=Kind.EMBED.value, kw_only=True)
    """What the model computes: ``embed`` (vectors for texts, an embedding model) or
    ``rerank`` (a relevance score per (query, document) pair, a cross-encoder); it answers
    requests of its own kind only."""

    def description_fields(self) -> dict[str, Any]:
        """The fields of the description by name, in order (those a subclass adds left out):
        what a :class:`ModelCard` or a catalog entry is built from."""
        return {field.name: getattr(self, field.name) for field in fields(ModelDescription)}

    def as_json(self) -> dict[str, Any]:
        """The description as a JSON object (arrays as lists, maps as dicts)."""
        return self.description_fields() | {
            "aliases": list(self.aliases),
            "prompts": dict(self.prompts),
        }

    def card(
        self, *, group_id: str, instance: str, announced_ms: int, interval_ms: int
    ) -> ModelCard:
        """The card a worker instance writes for this model."""
        return ModelCard(
            **self.description_fields(),
            group_id=group_id,
            instance=instance,
            announced_ms=announced_ms,
            interval_ms=interval_ms,
        )


@dataclass(frozen=True, slots=True)
class ModelCard(ModelDescription):
    """One model as one worker instance serves it: its description, and which worker
    announced it when."""

    group_id: str
    instance: str
    announced_ms: int
    """When the worker wrote this card, Unix epoch milliseconds (the worker's clock)."""
    interval_ms: int
    """How often the worker re-writes it."""

    @property
    def expires_ms(self) -> int:
        """After this instant the card is stale: its worker stopped refreshing it."""
        return self.announced_ms + STALE_AFTER_INTERVALS * self.interval_ms

    def is_live(self, now_ms: int) -> bool:
        return now_ms <= self.expires_ms

    @property
    def key(self) -> bytes:
        return catalog_key(self.group_id, self.instance, self.name)


def catalog_key(group_id: str, instance: str, name: str) -> bytes:
    """The record key of a card: unique per (group, worker instance, model), so compaction
    keeps the latest card of each. Readers treat it as opaque (model names may hold ``/``)."""
    return f"{group_id}/{instance}/{name}".encode()


def encode_card(card: ModelCard) -> bytes:
    body: dict[str, Any] = {
        "v": CARD_VERSION,
        "name": card.name,
        "aliases": list(card.aliases),
        "dim": card.dim,
        "max_seq_length": card.max_seq_length,
        "pooling": card.pooling,
        "dtype": card.dtype,
        "quantization": card.quantization,
        "device": card.device,
        "prompts": dict(card.prompts),
        "default_prompt_name": card.default_prompt_name,
        "requests_topic": card.requests_topic,
        "bulk_topic": card.bulk_topic,
        "group_id": card.group_id,
        "instance": card.instance,
        "announced_ms": card.announced_ms,
        "interval_ms": card.interval_ms,
        "kind": card.kind,
    }
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def decode_card(data: bytes) -> ModelCard:
    """Parse and validate one card; raise SchemaError when it is not a valid v1 card."""
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 (msgpack raises many types for garbage; all mean "invalid")
        fail("card is not valid msgpack")
    if not isinstance(body, dict):
        fail("card must be a msgpack map")
    version = required(body, "v", integer, nil_is_missing=True)
    if version > CARD_VERSION:
        raise SchemaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"card version {version} is not supported; this reader speaks v{CARD_VERSION}",
        )
    if version != CARD_VERSION:
        fail(f"'v' must be {CARD_VERSION}")
    return ModelCard(
        name=required(body, "name", non_empty, nil_is_missing=True),
        aliases=optional(body, "aliases", _aliases) or (),
        dim=required(body, "dim", positive, nil_is_missing=True),
        max_seq_length=required(body, "max_seq_length", positive, nil_is_missing=True),
        pooling=required(body, "pooling", string, nil_is_missing=True),
        dtype=required(body, "dtype", string, nil_is_missing=True),
        quantization=_default(optional(body, "quantization", string), "none"),
        device=required(body, "device", string, nil_is_missing=True),
        prompts=optional(body, "prompts", _prompts) or {},
        default_prompt_name=optional(body, "default_prompt_name", string),
        requests_topic=required(body, "requests_topic", topic_name, nil_is_missing=True),
        bulk_topic=optional(body, "bulk_topic", topic_name),
        group_id=required(body, "group_id", non_empty, nil_is_missing=True),
        instance=required(body, "instance", non_empty, nil_is_missing=True),
        announced_ms=required(body, "announced_ms", non_negative, nil_is_missing=True),
        interval_ms=required(body, "interval_ms", positive, nil_is_missing=True),
        kind=_default(optional(body, "kind", kind_name), Kind.EMBED.value),
    )


def _default(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _aliases(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise MistypedError("must be an array of non-empty strings")
    return tuple(value)


def _prompts(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise MistypedError("must be a map of strings to strings")
    return dict(value)
