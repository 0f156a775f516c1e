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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn, TypeVar

import msgpack

from schemas.codec import is_valid_topic
from schemas.errors import ErrorCode, SchemaError
from schemas.kinds import Kind
from schemas.v1 import REQUEST_KINDS

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
        _fail("card is not valid msgpack")
    if not isinstance(body, dict):
        _fail("card must be a msgpack map")
    version = _required(body, "v", _int)
    if version > CARD_VERSION:
        raise SchemaError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"card version {version} is not supported; this reader speaks v{CARD_VERSION}",
        )
    if version != CARD_VERSION:
        _fail(f"'v' must be {CARD_VERSION}")
    return ModelCard(
        name=_required(body, "name", _non_empty),
        aliases=_optional(body, "aliases", _aliases) or (),
        dim=_required(body, "dim", _positive),
        max_seq_length=_required(body, "max_seq_length", _positive),
        pooling=_required(body, "pooling", _str),
        dtype=_required(body, "dtype", _str),
        quantization=_default(_optional(body, "quantization", _str), "none"),
        device=_required(body, "device", _str),
        prompts=_optional(body, "prompts", _prompts) or {},
        default_prompt_name=_optional(body, "default_prompt_name", _str),
        requests_topic=_required(body, "requests_topic", _topic),
        bulk_topic=_optional(body, "bulk_topic", _topic),
        group_id=_required(body, "group_id", _non_empty),
        instance=_required(body, "instance", _non_empty),
        announced_ms=_required(body, "announced_ms", _non_negative),
        interval_ms=_required(body, "interval_ms", _positive),
        kind=_default(_optional(body, "kind", _kind), Kind.EMBED.value),
    )


def _default(value: _T | None, default: _T) -> _T:
    return default if value is None else value


def _fail(message: str) -> NoReturn:
    raise SchemaError(ErrorCode.INVALID_REQUEST, message)


class _MistypedError(Exception):
    pass


def _required(body: dict[Any, Any], key: str, check: Callable[[object], _T]) -> _T:
    if body.get(key) is None:
        _fail(f"missing required field {key!r}")
    return _field(key, body[key], check)


def _optional(body: dict[Any, Any], key: str, check: Callable[[object], _T]) -> _T | None:
    value = body.get(key)
    return None if value is None else _field(key, value, check)


def _field(key: str, value: object, check: Callable[[object], _T]) -> _T:
    try:
        return check(value)
    except _MistypedError as exc:
        _fail(f"{key!r} {exc.args[0]}")


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _MistypedError("must be an integer")
    return value


def _non_negative(value: object) -> int:
    if _int(value) < 0:
        raise _MistypedError("must be >= 0")
    return _int(value)


def _positive(value: object) -> int:
    if _int(value) < 1:
        raise _MistypedError("must be >= 1")
    return _int(value)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise _MistypedError("must be a string")
    return value


def _non_empty(value: object) -> str:
    if not _str(value):
        raise _MistypedError("must not be empty")
    return _str(value)


def _kind(value: object) -> str:
    if _str(value) not in REQUEST_KINDS:
        raise _MistypedError(f"must be one of {', '.join(REQUEST_KINDS)}")
    return _str(value)


def _topic(value: object) -> str:
    if not is_valid_topic(_str(value)):
        raise _MistypedError("is not a valid Kafka topic name")
    return _str(value)


def _aliases(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise _MistypedError("must be an array of non-empty strings")
    return tuple(value)


def _prompts(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _MistypedError("must be a map of strings to strings")
    return dict(value)
