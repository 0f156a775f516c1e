"""The sink's pure parts: results to rows (every dtype), target URIs, settings, flags."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from pydantic import SecretStr, ValidationError

from kembed_cli.main import build_parser
from kembed_shared.settings import describe_errors
from schemas import (
    DecodeResult,
    EmbedResult,
    Encoding,
    ErrorCode,
    ErrorInfo,
    ErrorResult,
    RerankResult,
    TokenizeResult,
    encode_result,
)
from schemas.encodings import INT8_NORMALIZED_SCALE
from sink.registry import parse_target
from sink.rows import MAX_ID_BYTES, Refused, Row, RowsOf, jsonable, newest, rows_of
from sink.settings import SinkSettings
from sink.targets import scrub

VECTORS = np.array([[0.6, 0.8, 0.0], [0.0, -1.0, 0.0]], dtype=np.float32)


def result(**fields: object) -> bytes:
    base: dict[str, object] = {
        "id": "req-1",
        "model": "m",
        "dim": 3,
        "vectors": VECTORS.astype("<f4").tobytes(),
        "tokens": (4, 5),
        "keys": ("a", 7),
        "meta": {"source": "s", "docs": [{"title": "A"}, None]},
    }
    base.update(fields)
    return encode_result(EmbedResult(**base))  # type: ignore[arg-type]


def test_float32_result_becomes_one_row_per_key_with_merged_metadata() -> None:
    """Row i: id keys[i] as text, the vector exactly, meta without docs merged with docs[i]
    (a null item counts as {}), the model."""
    outcome = rows_of(result())
    assert isinstance(outcome, RowsOf)
    assert (outcome.request_id, outcome.dim, outcome.dtype) == ("req-1", 3, "float32")
    first, second = outcome.rows
    assert (first.id, second.id) == ("a", "7")
    np.testing.assert_array_equal(first.vector, VECTORS[0])
    assert first.dense.dtype == np.float32
    assert first.metadata == {"source": "s", "title": "A"}
    assert second.metadata == {"source": "s"}
    assert first.model == "m"


def test_rows_are_versioned_by_the_request_time() -> None:
    """A row's version is the result's requested_ms; a result without one (an older
    worker) takes its Kafka record's timestamp; neither known: 0."""
    versioned = rows_of(result(requested_ms=1_767_225_600_123), record_ms=1_767_225_601_000)
    unversioned = rows_of(result(), record_ms=1_767_225_601_000)
    unknown = rows_of(result())
    assert isinstance(versioned, RowsOf)
    assert isinstance(unversioned, RowsOf)
    assert isinstance(unknown, RowsOf)
    assert {row.requested_ms for row in versioned.rows} == {1_767_225_600_123}
    assert {row.requested_ms for row in unversioned.rows} == {1_767_225_601_000}
    assert {row.requested_ms for row in unknown.rows} == {0}


def test_newest_keeps_one_row_per_id_the_largest_version_then_the_last() -> None:
    """Whatever the order: the row of the largest requested_ms; of equal ones, the last."""

    def row(key: str, version: int, name: str) -> Row:
        return Row(key, np.zeros(3, np.float32), {"name": name}, "m", version)

    rows = [row("a", 2, "a2"), row("b", 5, "b5"), row("a", 1, "a1"), row("b", 5, "b5-again")]
    assert [r.metadata["name"] for r in newest(rows)] == ["a2", "b5-again"]
    assert [r.metadata["name"] for r in newest(rows[::-1])] == ["b5", "a2"]


def test_float16_and_int8_results_are_widened_to_float32() -> None:
    half = rows_of(
        result(vectors=VECTORS.astype("<f2").tobytes(), dtype=Encoding.FLOAT16, meta=None)
    )
    assert isinstance(half, RowsOf)
    np.testing.assert_allclose(half.rows[0].dense, VECTORS[0], atol=5e-4)
    codes = np.rint(VECTORS * 127).astype("i1")
    scales = np.full(2, INT8_NORMALIZED_SCALE, "<f4")
    quantized = rows_of(
        result(vectors=codes.tobytes(), dtype=Encoding.INT8, scales=scales.tobytes())
    )
    assert isinstance(quantized, RowsOf)
    assert quantized.rows[1].dense.dtype == np.float32
    np.testing.assert_allclose(quantized.rows[0].dense, VECTORS[0], atol=1 / 254)
    np.testing.assert_allclose(quantized.rows[1].dense, VECTORS[1], atol=1 / 254)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (None, "invalid_result"),
        (b"\xc1", "invalid_result"),
        (b"\x80", "invalid_result"),  # an empty map: no version, no id
        (result(dtype=Encoding.BINARY, vectors=b"\x80\x40"), "unsupported_dtype"),
        (result(keys=None), "missing_keys"),
        (result(keys=("a", "b" * (MAX_ID_BYTES + 1))), "invalid_key"),
        (result(meta={"docs": [{}]}), "invalid_result"),
        (result(meta={"docs": "no"}), "invalid_result"),
    ],
)
def test_unusable_results_are_refused_with_a_code(value: bytes | None, code: str) -> None:
    outcome = rows_of(value)
    assert isinstance(outcome, Refused)
    assert outcome.code == code
    assert not outcome.error_result
    assert outcome.message


def test_error_result_is_refused_with_its_wire_code_and_keys() -> None:
    error = ErrorResult(
        id="req-2",
        error=ErrorInfo(ErrorCode.INPUT_TOO_LONG, "input 1 is too long", index=1),
        keys=("x", 3),
    )
    outcome = rows_of(encode_result(error))
    assert outcome == Refused(
        "input_too_long", "input 1 is too long", request_id="req-2", keys=("x", "3"),
        error_result=True,
    )  # fmt: skip


def test_metadata_is_made_json_safe() -> None:
    assert jsonable({1: b"\x00\x01", "n": [math.nan, 1.5], "t": (1, "a")}) == {
        "1": "AAE=",
        "n": [None, 1.5],
        "t": [1, "a"],
    }


@pytest.mark.parametrize(
    ("uri", "kind", "shown"),
    [
        ("postgresql://sink:pw@db.example:5432/app", "postgres", "postgresql://sink@db.example:5432/app"),
        ("postgres://sink@h/app?sslmode=require&password=pw", "postgres", "postgresql://sink@h/app?sslmode=require"),
        ("milvus:///var/lib/kembed/docs.db", "milvus", "/var/lib/kembed/docs.db"),
        ("http://root:pw@milvus:19530", "milvus", "http://milvus:19530"),
        ("https://in01.example.cloud", "milvus", "https://in01.example.cloud"),
        ("milvus://milvus.svc:19530", "milvus", "http://milvus.svc:19530"),
        ("./local.db", "milvus", "./local.db"),
    ],
)  # fmt: skip
def test_targets_parse_and_never_show_the_password(uri: str, kind: str, shown: str) -> None:
    spec = parse_target(uri)
    assert spec.kind == kind
    assert spec.display == shown
    assert "pw" not in spec.display
    if "pw" in uri:
        assert spec.password is not None
        assert spec.password.get_secret_value() == "pw"
        assert scrub("failed: pw rejected", spec) == "failed: *** rejected"


def test_target_password_setting_wins_over_the_uri_and_lite_is_told_apart() -> None:
    spec = parse_target("postgresql://u:old@h/db", SecretStr("new"))
    assert spec.password is not None
    assert spec.password.get_secret_value() == "new"
    assert parse_target("milvus:///x.db").lite
    assert not parse_target("http://m:19530").lite


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({}, "target"),
        ({"target": "mysql://u:hunter2@h/db"}, "not supported"),
        ({"target": "milvus:///"}, "path"),
        ({"target": "postgresql://h/db", "table": "bad-name"}, "letters, digits"),
        ({"target": "milvus:///x.db", "table": "s.t"}, "Postgres"),
        ({"target": "postgresql://h/db", "dim": 0}, "dim"),
    ],
)
def test_invalid_settings_are_refused_without_their_values(
    settings: dict[str, object], complaint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KEMBED_SINK_TARGET", raising=False)
    with pytest.raises(ValidationError) as caught:
        SinkSettings(**settings)  # type: ignore[arg-type]
    text = describe_errors(caught.value)
    assert complaint in text
    assert "hunter2" not in text


def test_settings_read_kembed_sink_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEMBED_SINK_TARGET", "postgresql://sink@db/app")
    monkeypatch.setenv("KEMBED_SINK_TARGET_PASSWORD", "s3cret")
    monkeypatch.setenv("KEMBED_SINK_RESULTS_TOPIC", "embed.results.docs")
    from_env: dict[str, Any] = {}  # everything from the environment
    settings = SinkSettings(**from_env)
    assert settings.resolved_dlq_topic() == "embed.results.docs.dlq"
    assert "s3cret" not in repr(settings)
    spec = settings.target_spec()
    assert spec.password is not None
    assert spec.password.get_secret_value() == "s3cret"


def test_shared_consumer_fields_keep_each_side_its_prefix_and_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer, HTTP and log fields the sink and the worker both declare (one definition,
    kembed_shared.service_fields) keep each side's env prefix and its own defaults."""
    from worker.settings import WorkerSettings

    for name in list(os.environ):
        if name.startswith("KEMBED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KEMBED_SINK_TARGET", "milvus:///x.db")
    monkeypatch.setenv("KEMBED_SINK_SESSION_TIMEOUT_MS", "10000")
    monkeypatch.setenv("KEMBED_HEARTBEAT_INTERVAL_MS", "1000")
    monkeypatch.setenv("KEMBED_LOG_FORMAT", "json")
    from_env: dict[str, Any] = {}
    sink, worker = SinkSettings(**from_env), WorkerSettings(**from_env)

    assert (sink.session_timeout_ms, worker.session_timeout_ms) == (10_000, 45_000)
    assert (sink.heartbeat_interval_ms, worker.heartbeat_interval_ms) == (3_000, 1_000)
    assert (sink.log_format, worker.log_format) == ("auto", "json")
    assert (sink.client_id, worker.client_id) == ("kembed-sink", "kembed-worker")
    assert (sink.http_port, worker.http_port) == (8081, 8080)
    assert (sink.fetch_max_wait_ms, worker.fetch_max_wait_ms) == (500, 20)
    out_of_range: dict[str, Any] = {"http_port": 70_000}
    with pytest.raises(ValidationError, match="less than or equal to 65535"):
        SinkSettings(**out_of_range)
    out_of_range = {"max_poll_interval_ms": 0}
    with pytest.raises(ValidationError, match="greater than 0"):
        WorkerSettings(**out_of_range)


def test_sink_command_has_sink_and_kafka_flags() -> None:
    argv = ["sink", "--target", "milvus:///x.db", "--max-batch-results", "5"]
    args = build_parser("sink").parse_args([*argv, "--bootstrap-servers", "k:9"])
    assert args.command == "sink"
    assert args.target == "milvus:///x.db"
    assert args.max_batch_results == 5
    assert args.bootstrap_servers == "k:9"


def test_sink_command_exits_2_on_invalid_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from kembed_cli.main import main

    assert main(["sink", "--target", "ftp://u:hunter2@h/x"]) == 2
    err = capsys.readouterr().err
    assert "not supported" in err
    assert "hunter2" not in err


@pytest.mark.parametrize(
    ("result", "holds"),
    [
        (RerankResult("r1", "ce", b"\0" * 4, (0,), (3,)), "a rerank result holds scores"),
        (TokenizeResult("r1", "m", (((101, "[CLS]", True, None, None),),)), "holds tokens"),
        (DecodeResult("r1", "m", ("text",)), "a decode result holds texts"),
    ],
)
def test_results_without_vectors_are_refused_as_invalid(
    result: RerankResult | TokenizeResult | DecodeResult, holds: str
) -> None:
    """A rerank, tokenize or decode result on a sink's topic holds no vectors: refused
    (dead-lettered by the sink) with what it holds, under its request id."""
    outcome = rows_of(encode_result(result))
    assert isinstance(outcome, Refused)
    assert (outcome.code, outcome.request_id) == ("invalid_result", "r1")
    assert holds in outcome.message
    assert "not vectors" in outcome.message
