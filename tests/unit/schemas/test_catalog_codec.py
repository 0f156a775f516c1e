"""Unit tests for schemas.catalog: the model card codec, its key and its staleness rule."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ErrorCode, SchemaError
from schemas.catalog import (
    STALE_AFTER_INTERVALS,
    ModelCard,
    catalog_key,
    decode_card,
    encode_card,
)

CARD = ModelCard(
    name="sentence-transformers/all-MiniLM-L6-v2",
    aliases=("minilm", "all-MiniLM-L6-v2"),
    dim=384,
    max_seq_length=256,
    pooling="mean",
    dtype="float32",
    quantization="none",
    device="cpu",
    prompts={"query": "query: ", "passage": "passage: "},
    default_prompt_name=None,
    requests_topic="embed.requests",
    bulk_topic="embed.requests.bulk",
    group_id="kembed-workers",
    instance="kembed-worker-host-42-a1b2c3",
    announced_ms=1_764_000_000_000,
    interval_ms=30_000,
)

text = st.text(min_size=1, max_size=20)
topic = st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True).filter(
    lambda t: t not in {".", ".."}
)
cards = st.builds(
    ModelCard,
    name=text,
    aliases=st.lists(text, max_size=3).map(tuple),
    dim=st.integers(1, 1 << 20),
    max_seq_length=st.integers(1, 1 << 20),
    pooling=st.text(max_size=10),
    dtype=st.text(max_size=10),
    quantization=st.text(max_size=10),
    device=st.text(max_size=10),
    prompts=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    default_prompt_name=st.none() | st.text(max_size=8),
    requests_topic=topic,
    bulk_topic=st.none() | topic,
    group_id=text,
    instance=text,
    announced_ms=st.integers(0, 1 << 62),
    interval_ms=st.integers(1, 1 << 40),
    kind=st.sampled_from(["embed", "rerank"]),
)


def body(**changes: Any) -> bytes:
    fields = msgpack.unpackb(encode_card(CARD))
    fields.update(changes)
    return bytes(msgpack.packb({k: v for k, v in fields.items() if v is not ...}))


@settings(max_examples=300, deadline=None)
@given(cards)
def test_card_round_trip(card: ModelCard) -> None:
    assert decode_card(encode_card(card)) == card


def test_card_encoding_is_canonical() -> None:
    """Every field is written, in the order of schemas/README.md, nil included."""
    decoded = msgpack.unpackb(encode_card(replace(CARD, bulk_topic=None)))
    assert list(decoded) == [
        "v", "name", "aliases", "dim", "max_seq_length", "pooling", "dtype", "quantization",
        "device", "prompts", "default_prompt_name", "requests_topic", "bulk_topic",
        "group_id", "instance", "announced_ms", "interval_ms", "kind",
    ]  # fmt: skip
    assert decoded["v"] == 1
    assert decoded["bulk_topic"] is None
    assert decoded["default_prompt_name"] is None
    assert encode_card(CARD) == encode_card(CARD)


def test_optional_fields_default_when_absent_or_nil() -> None:
    card = decode_card(body(aliases=..., quantization=None, prompts=..., bulk_topic=None))
    assert card.aliases == ()
    assert card.quantization == "none"
    assert card.prompts == {}
    assert card.bulk_topic is None


def test_unknown_fields_are_ignored() -> None:
    assert decode_card(body(gpu_memory_mib=1234, future={"x": 1})) == CARD


@pytest.mark.parametrize(
    "changes",
    [
        {"name": ...},
        {"name": ""},
        {"dim": 0},
        {"dim": True},
        {"dim": "384"},
        {"max_seq_length": ...},
        {"aliases": ["ok", ""]},
        {"aliases": "minilm"},
        {"prompts": {"query": 1}},
        {"requests_topic": "not a topic"},
        {"requests_topic": ...},
        {"bulk_topic": "a/b"},
        {"group_id": ""},
        {"instance": ...},
        {"announced_ms": -1},
        {"interval_ms": 0},
        {"v": 0},
        {"v": "1"},
    ],
)
def test_invalid_cards_raise_schema_error(changes: dict[str, Any]) -> None:
    with pytest.raises(SchemaError) as raised:
        decode_card(body(**changes))
    assert raised.value.code == ErrorCode.INVALID_REQUEST


def test_newer_card_version_is_unsupported() -> None:
    with pytest.raises(SchemaError) as raised:
        decode_card(body(v=2))
    assert raised.value.code == ErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize("data", [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb("card")])
def test_non_map_input_raises_schema_error(data: bytes) -> None:
    with pytest.raises(SchemaError):
        decode_card(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes_decode_or_raise_schema_error(data: bytes) -> None:
    try:
        card = decode_card(data)
    except SchemaError:
        return
    assert isinstance(card, ModelCard)


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(list(msgpack.unpackb(encode_card(CARD)))), values))
def test_fuzz_card_like_maps_decode_or_raise_schema_error(changes: dict[str, Any]) -> None:
    """Maps with the card's keys and arbitrary values: a valid card or SchemaError."""
    try:
        card = decode_card(body(**changes))
    except SchemaError:
        return
    assert card.name
    assert card.dim >= 1
    assert card.interval_ms >= 1


def test_key_names_group_instance_and_model() -> None:
    assert CARD.key == b"kembed-workers/kembed-worker-host-42-a1b2c3/" + CARD.name.encode()
    assert catalog_key("g", "i", "m\u00e9") == "g/i/m\u00e9".encode()


def test_a_card_is_live_for_three_intervals() -> None:
    assert STALE_AFTER_INTERVALS == 3
    last_live = CARD.announced_ms + 3 * CARD.interval_ms
    assert CARD.expires_ms == last_live
    assert CARD.is_live(CARD.announced_ms)
    assert CARD.is_live(last_live)
    assert not CARD.is_live(last_live + 1)
