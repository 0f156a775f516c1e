"""The HTTP gateway against a fake SDK client: every endpoint's shape, every error status
and body of docs/gateway.md, API keys, limits, backpressure and metrics.

The fake stands for :class:`producer_sdk.EmbedClient` (what the gateway sends, what the
catalog holds, what a call raises); the integration tests run the same gateway against a
real broker and worker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import structlog
from pydantic import ValidationError

from gateway.app import CLIENT_ID, create_app
from gateway.catalog import CatalogCache
from gateway.errors import KINDS, WIRE_CODES, ApiError
from gateway.settings import GatewaySettings
from kembed_cli.main import main
from kembed_shared.settings import KafkaClientSettings
from producer_sdk.catalog import CatalogModel
from producer_sdk.errors import (
    AuthorizationError,
    CatalogUnavailableError,
    EmbedError,
    EmbedTimeoutError,
    RequestTooLargeError,
)
from schemas import ErrorCode
from tests.conftest import ROOT
from tests.support.cli import run_kembed, without_kembed_env
from tests.support.sdk import (
    ALIAS,
    MODEL,
    FakeClient,
    catalog_entry,
    tokens_of,
    vector_of,
)

DOCS = (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
KEY = "sk-test-key-1"


def gateway_settings(**fields: Any) -> GatewaySettings:
    return GatewaySettings.model_validate(fields)


@asynccontextmanager
async def served(
    **settings: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, FakeClient]]:
    """The app with ``settings`` over a fake client, its lifespan running, and an HTTP
    client for it."""
    FakeClient.made.clear()
    app = create_app(
        gateway_settings(**settings),
        KafkaClientSettings.model_validate({"bootstrap_servers": "kafka:9092"}),
        client_factory=FakeClient,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http, FakeClient.made[-1]


_ANY = object()


def openai_error(
    answer: httpx.Response, status: int, code: str, kind: str, param: object = _ANY
) -> dict[str, Any]:
    """The error of an OpenAI-shaped answer, checked: its status, its body's shape, its
    ``code`` and ``type`` (and ``param``, when given)."""
    assert answer.status_code == status, answer.text
    body: dict[str, Any] = answer.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    error: dict[str, Any] = body["error"]
    assert (error["code"], error["type"]) == (code, kind)
    if param is not _ANY:
        assert error["param"] == param
    return error


def tei_error(answer: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = answer.json()
    assert set(body) == {"error", "error_type"}
    assert isinstance(body["error"], str)
    return body


# ---------------------------------------------------------------------- settings


def documented_settings() -> dict[str, str]:
    """KEMBED_GATEWAY_<NAME> -> documented default, from the settings table of the docs."""
    rows: dict[str, str] = {}
    for line in DOCS.splitlines():
        if not line.startswith("| `KEMBED_GATEWAY_"):
            continue
        names_cell, default_cell = line.split("|")[1:3]
        names = re.findall(r"`(KEMBED_GATEWAY_\w+)`", names_cell)
        defaults = re.findall(r"`([^`]*)`", default_cell) or ["unset"] * len(names)
        rows.update(zip(names, defaults, strict=True))
    return rows


def test_the_settings_are_the_documented_ones_with_the_documented_defaults() -> None:
    documented = documented_settings()
    fields = GatewaySettings.model_fields
    assert set(documented) == {f"KEMBED_GATEWAY_{name.upper()}" for name in fields}
    for env, default in documented.items():
        value = fields[env.removeprefix("KEMBED_GATEWAY_").lower()].default
        if isinstance(value, int | float):
            assert float(default) == value, env
        else:
            assert (str(value) if value is not None else "unset") == default, env


def test_api_keys_come_from_the_list_and_the_file_and_never_print(tmp_path: Path) -> None:
    secret_file = tmp_path / "keys"
    secret_file.write_text("# rotated monthly\nsk-file-1\n\n  sk-file-2  \nsk-one\n")
    settings = gateway_settings(api_keys="sk-one, sk-two,", api_keys_file=str(secret_file))
    assert settings.keys() == ("sk-one", "sk-two", "sk-file-1", "sk-file-2")
    shown = repr(settings) + str(settings) + str(settings.model_dump())
    for key in ("sk-one", "sk-two", "sk-file"):
        assert key not in shown
    assert gateway_settings().keys() == ()
    assert gateway_settings(api_keys="  ").keys() == ()  # an empty env var is unset


def test_api_keys_may_name_a_key_file_and_a_key_starting_with_a_slash_goes_in_a_list(
    tmp_path: Path,
) -> None:
    """KEMBED_GATEWAY_API_KEYS takes a list or the path of a file of keys (a secret)."""
    secret_file = tmp_path / "keys"
    secret_file.write_text("sk-file-1\n# old\nsk-file-2\n")
    assert gateway_settings(api_keys=f" {secret_file} ").keys() == ("sk-file-1", "sk-file-2")
    assert gateway_settings(api_keys=str(secret_file), api_keys_file=str(secret_file)).keys() == (
        "sk-file-1",
        "sk-file-2",
    )
    assert gateway_settings(api_keys="/sk+abc/def,").keys() == ("/sk+abc/def",)
    assert gateway_settings(api_keys=f"{secret_file},sk-two").keys() == (str(secret_file), "sk-two")
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValidationError, match=r"api_keys .* holds no key"):
        gateway_settings(api_keys=str(empty))


def test_an_unusable_key_file_is_a_settings_error_that_shows_no_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot be read"):
        gateway_settings(api_keys_file=str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.write_text("# no keys yet\n\n")
    with pytest.raises(ValidationError, match="holds no key"):
        gateway_settings(api_keys_file=str(empty))
    with pytest.raises(ValidationError, match="holds no key") as refused:
        gateway_settings(api_keys=" , ,")
    assert "sk-" not in str(refused.value)


def test_an_absolute_api_keys_path_that_cannot_be_read_is_a_settings_error_not_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A secret that failed to mount must not become the one valid key: one value that
    starts with / is a key file's path, whether or not it exists; unreadable, the gateway
    does not start (exit 2, one line naming the setting, not the value)."""
    missing = str(tmp_path / "not-mounted" / "keys")
    with pytest.raises(ValidationError, match=r"api_keys .*the key file cannot be read") as refused:
        gateway_settings(api_keys=missing)
    assert missing not in str(refused.value)  # the value might have been a key
    with pytest.raises(ValidationError, match="cannot be read"):
        gateway_settings(api_keys=str(tmp_path))  # a directory
    assert main(["gateway", "--api-keys", missing]) == 2
    err = capsys.readouterr().err
    assert "api_keys (a path: it starts with '/'): the key file cannot be read" in err
    assert missing not in err


def test_kembed_gateway_with_an_unreadable_key_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gateway", "--api-keys-file", str(tmp_path / "absent")]) == 2
    assert "api_keys_file" in capsys.readouterr().err


def test_kembed_gateway_exits_1_with_one_event_when_kafka_cannot_be_reached() -> None:
    """The client starts in the app's lifespan; uvicorn's failed start-up is exit 1."""
    done = run_kembed(
        "gateway",
        "--port",
        "0",
        "--log-format",
        "json",
        env=without_kembed_env(
            {"KEMBED_BOOTSTRAP_SERVERS": "127.0.0.1:1", "KEMBED_GATEWAY_API_KEYS": KEY}
        ),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    (failed,) = [event for event in events if event["event"] == "gateway.kafka_failed"]
    assert failed["bootstrap_servers"] == "127.0.0.1:1"
    assert KEY not in done.stderr


# ---------------------------------------------------------------------- the errors table


def documented_table(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading`` in the docs, cells stripped."""
    section = DOCS[DOCS.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows and not line.startswith("|"):
            break
    return rows[1:]


def test_the_openai_errors_table_of_the_docs_is_the_code_table() -> None:
    documented = {}
    for status, codes, kind, _ in documented_table('Errors: `{"error": {"message"'):
        for code in re.findall(r"`(\w+)`", codes):
            documented[code] = (int(status), kind.strip("`"))
    assert documented == {code: (kind.status, kind.type) for code, kind in KINDS.items()}


def test_the_tei_statuses_of_the_docs_are_the_code_table() -> None:
    paragraph = DOCS[DOCS.index('Errors: `{"error": "...", "error_type"') :]
    paragraph = paragraph[: paragraph.index("\n\n")]
    documented = {
        (int(status), kind)
        for statuses, kind in re.findall(r"((?:\d{3}(?: and )?)+)\s+`(\w+)`", paragraph)
        for status in re.findall(r"\d{3}", statuses)
    }
    assert documented == {(kind.tei_status, kind.tei_type) for kind in KINDS.values()}


def test_every_wire_error_code_has_an_answer() -> None:
    assert set(WIRE_CODES) == set(ErrorCode)
    assert set(WIRE_CODES.values()) <= set(KINDS)
    with pytest.raises(ValueError, match="unknown gateway error code"):
        ApiError("teapot", "no")


# ---------------------------------------------------------------------- endpoints


async def test_health_and_the_openapi_page() -> None:
    async with served() as (http, _):
        assert (await http.get("/health")).json() == {"status": "ok"}
        document = (await http.get("/openapi.json")).json()
        assert {"/v1/embeddings", "/v1/models", "/embed", "/ready", "/metrics"} <= set(
            document["paths"]
        )
        page = await http.get("/docs")
        assert page.status_code == 200
        assert "swagger" in page.text.lower()


async def test_ready_needs_kafka_and_a_live_model_and_caches_the_answer() -> None:
    async with served() as (http, fake):
        answer = await http.get("/ready")
        assert (answer.status_code, answer.json()) == (200, {"status": "ready", "models": [MODEL]})
        reads = fake.catalog_reads
        assert (await http.get("/ready")).status_code == 200
        assert fake.catalog_reads == reads  # answered from the cache
    async with served() as (http, fake):
        fake.catalog = []
        answer = await http.get("/ready")
        assert answer.status_code == 503
        assert answer.json()["reason"] == "no live model in the catalog"
    async with served() as (http, fake):
        fake.catalog_error = CatalogUnavailableError("no broker answered")
        answer = await http.get("/ready")
        assert answer.status_code == 503
        assert "Kafka" in answer.json()["reason"]


async def test_the_lifespan_starts_one_client_with_the_kafka_settings_and_closes_it() -> None:
    async with served(requests_topic="rq", reply_topic="rp", catalog_topic="cat") as (_, fake):
        assert fake.started
        assert not fake.closed
        assert fake.bootstrap_servers == "kafka:9092"
        assert fake.options["client_id"] == CLIENT_ID == "kembed-gateway"
        assert fake.options["requests_topic"] == "rq"
        assert fake.options["reply_topic"] == "rp"
        assert fake.options["catalog_topic"] == "cat"
        assert fake.options["security_protocol"] == "PLAINTEXT"
        assert fake.options["ssl_check_hostname"] is True
    assert fake.closed


async def test_v1_models_lists_names_and_aliases_from_the_catalog() -> None:
    async with served() as (http, fake):
        fake.catalog = [catalog_entry(), catalog_entry("other/model", aliases=())]
        answer = await http.get("/v1/models")
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    assert [entry["id"] for entry in body["data"]] == [MODEL, ALIAS, "other/model"]
    for entry in body["data"]:
        assert entry == {
            "id": entry["id"],
            "object": "model",
            "created": 1_760_000_000,
            "owned_by": "kembed",
        }


async def test_v1_embeddings_float_answers_openais_shape_in_input_order() -> None:
    texts = [f"text number {i}" for i in range(100)]
    async with served() as (http, fake):
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": texts})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["object"] == "list"
    assert body["model"] == MODEL
    assert [item["index"] for item in body["data"]] == list(range(100))
    for item, text in zip(body["data"], texts, strict=True):
        assert item["object"] == "embedding"
        assert item["embedding"] == vector_of(text).tolist()
    tokens = sum(tokens_of(text) for text in texts)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    ((sent, options),) = fake.calls
    assert sent == texts
    assert options["model"] == MODEL
    assert options["truncate"] is False  # over-long inputs are an error, as with OpenAI
    assert options["timeout"] == pytest.approx(30.0, abs=1.0)


async def test_v1_embeddings_base64_is_little_endian_float32() -> None:
    texts = ["first", "second"]
    async with served() as (http, _):
        answer = await http.post(
            "/v1/embeddings",
            json={"model": ALIAS, "input": texts, "encoding_format": "base64", "user": "u1"},
        )
    assert answer.status_code == 200
    for item, text in zip(answer.json()["data"], texts, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, vector_of(text))


async def test_one_string_is_one_input_and_dimensions_reach_the_sdk() -> None:
    async with served() as (http, fake):
        answer = await http.post(
            "/v1/embeddings", json={"model": MODEL, "input": "just one", "dimensions": 4}
        )
    assert answer.status_code == 200
    (item,) = answer.json()["data"]
    assert item["embedding"] == vector_of("just one")[:4].tolist()
    assert fake.calls[0][0] == ["just one"]
    assert fake.calls[0][1]["dimensions"] == 4


@pytest.mark.parametrize("tokens", [[101, 2023, 102], [[101, 2023], [101, 102]]])
async def test_token_id_arrays_are_refused_with_400(tokens: list[Any]) -> None:
    async with served() as (http, fake):
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": tokens})
        tei = await http.post("/embed", json={"inputs": tokens})
    error = openai_error(answer, 400, "invalid_request", "invalid_request_error", param="input")
    assert "token ids are not supported" in error["message"]
    assert tei.status_code == 422
    assert tei_error(tei)["error_type"] == "Validation"
    assert fake.calls == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": ["ok", ""]}, "input"),
        ({"input": "no model"}, "model"),
        ({"model": MODEL, "input": "x", "encoding_format": "SECRET-FORMAT"}, "encoding_format"),
        ({"model": MODEL, "input": "x", "dimensions": 0}, "dimensions"),
        ({"model": MODEL, "input": 17}, "input"),
    ],
)
async def test_invalid_requests_are_400_naming_the_field_without_repeating_it(
    body: dict[str, Any], param: str
) -> None:
    async with served() as (http, fake):
        answer = await http.post("/v1/embeddings", json=body)
    openai_error(answer, 400, "invalid_request", "invalid_request_error", param=param)
    assert "SECRET-FORMAT" not in answer.text
    assert fake.calls == []


async def test_no_input_at_all_is_openai_400_and_tei_400_empty() -> None:
    """TEI answers an empty batch 400 ``Empty`` ("Batch is empty"); OpenAI's shape says
    400 with the code ``empty_input``. Nothing is sent."""
    async with served() as (http, fake):
        openai = await http.post("/v1/embeddings", json={"model": MODEL, "input": []})
        tei = await http.post("/embed", json={"inputs": []})
    openai_error(openai, 400, "empty_input", "invalid_request_error", param="input")
    assert tei.status_code == 400
    assert tei_error(tei)["error_type"] == "Empty"
    assert fake.calls == []


async def test_a_lone_surrogate_is_400() -> None:
    body = b'{"model": "' + MODEL.encode() + b'", "input": "\\udc80 private words"}'
    async with served() as (http, fake):
        answer = await http.post(
            "/v1/embeddings", content=body, headers={"content-type": "application/json"}
        )
    error = openai_error(answer, 400, "invalid_request", "invalid_request_error", param="input")
    assert "surrogate" in error["message"]
    assert "private" not in answer.text
    assert fake.calls == []


async def test_a_body_the_framework_cannot_parse_answers_in_the_apis_shape() -> None:
    """Bytes that are not UTF-8 make the framework give up before validation: still the
    API's error shape (OpenAI 400, TEI 422), never FastAPI's {"detail": ...}; and so are
    an unknown path (404) and a method a path does not take (405, with Allow)."""
    headers = {"content-type": "application/json"}
    async with served() as (http, fake):
        openai = await http.post("/v1/embeddings", content=b'{"input": "\xff"}', headers=headers)
        tei = await http.post("/embed", content=b'{"inputs": "\xff"}', headers=headers)
        missing = await http.get("/v1/embedding")
        wrong = await http.get("/rerank")
    openai_error(openai, 400, "invalid_request", "invalid_request_error", param=None)
    assert (tei.status_code, tei_error(tei)["error_type"]) == (422, "Validation")
    openai_error(missing, 404, "not_found", "invalid_request_error")
    assert (wrong.status_code, tei_error(wrong)["error_type"]) == (405, "Validation")
    assert wrong.headers["allow"] == "POST"
    assert fake.calls == []


async def test_a_body_that_is_not_json_is_400_or_tei_422() -> None:
    headers = {"content-type": "application/json"}
    async with served() as (http, _):
        answer = await http.post("/v1/embeddings", content=b"{not json", headers=headers)
        tei = await http.post("/embed", content=b"[1, 2", headers=headers)
    openai_error(answer, 400, "invalid_request", "invalid_request_error")
    assert tei.status_code == 422
    assert tei_error(tei)["error_type"] == "Validation"


async def test_a_body_sent_as_a_form_is_400_saying_to_send_json() -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    async with served() as (http, _):
        answer = await http.post("/v1/embeddings", content=b'{"input": "x"}', headers=form)
        array = await http.post("/v1/embeddings", json=["x"])
    error = openai_error(answer, 400, "invalid_request", "invalid_request_error", param=None)
    assert "Content-Type: application/json" in error["message"]
    error = openai_error(array, 400, "invalid_request", "invalid_request_error", param=None)
    assert error["message"] == "the body must be a JSON object"


async def test_an_unknown_model_is_404_before_anything_is_sent() -> None:
    async with served() as (http, fake):
        answer = await http.post("/v1/embeddings", json={"model": "nope/model", "input": "x"})
        reads = fake.catalog_reads
    error = openai_error(answer, 404, "model_not_found", "invalid_request_error", param="model")
    assert "nope/model" in error["message"]
    assert fake.calls == []
    assert reads >= 1


async def test_a_model_that_just_came_up_is_found_by_reading_the_catalog_again() -> None:
    async with served() as (http, fake):
        fake.catalog = []
        assert (await http.get("/ready")).status_code == 503  # caches the empty catalog
        fake.catalog = [catalog_entry()]
        await asyncio.sleep(1.0)
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert answer.status_code == 200


# ---------------------------------------------------------------------- SDK errors


WIRE_ERRORS = [
    ("invalid_request", 400, "invalid_request", "invalid_request_error", 422, "Validation"),
    ("too_many_inputs", 400, "too_many_inputs", "invalid_request_error", 413, "Validation"),
    ("input_too_long", 400, "input_too_long", "invalid_request_error", 422, "Validation"),
    ("message_too_large", 413, "request_too_large", "invalid_request_error", 413, "Validation"),
    ("unknown_model", 404, "model_not_found", "invalid_request_error", 503, "Unhealthy"),
    ("result_too_large", 500, "result_too_large", "server_error", 424, "Backend"),
    ("internal", 500, "internal", "server_error", 424, "Backend"),
    ("unsupported_version", 500, "internal", "server_error", 424, "Backend"),
    ("deadline_exceeded", 504, "deadline_exceeded", "server_error", 504, "Unhealthy"),
    ("a_code_from_the_future", 500, "internal", "server_error", 424, "Backend"),
]


@pytest.mark.parametrize(("wire", "status", "code", "kind", "tei_status", "tei_kind"), WIRE_ERRORS)
async def test_a_workers_error_result_is_the_documented_status_and_body(
    wire: str, status: int, code: str, kind: str, tei_status: int, tei_kind: str
) -> None:
    async with served() as (http, fake):
        fake.error = EmbedError(wire, "the worker's words", index=1)
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
        tei = await http.post("/embed", json={"inputs": ["a", "b"]})
    error = openai_error(answer, status, code, kind)
    assert tei.status_code == tei_status
    assert tei_error(tei)["error_type"] == tei_kind
    if status < 500:
        assert error["message"] == "the worker's words (input 1)"


async def test_a_timeout_with_a_live_worker_is_504_and_with_none_503() -> None:
    async with served(timeout_s=2.5) as (http, fake):
        fake.error = EmbedTimeoutError("r1", 2.5)
        slow = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
        tei_slow = await http.post("/embed", json={"inputs": "x"})
        fake.catalog = []  # every worker stopped meanwhile
        await asyncio.sleep(1.0)  # the catalog is read again when older than a second
        gone = await http.post("/embed", json={"inputs": "x"})
    openai_error(slow, 504, "deadline_exceeded", "server_error")
    assert (tei_slow.status_code, tei_error(tei_slow)["error_type"]) == (504, "Unhealthy")
    assert (gone.status_code, tei_error(gone)["error_type"]) == (503, "Unhealthy")
    assert fake.calls[0][1]["timeout"] == pytest.approx(2.5, abs=0.5)


async def test_a_timeout_for_a_model_no_worker_serves_any_more_is_503_no_worker() -> None:
    async with served() as (http, fake):
        fake.gate = asyncio.Event()
        call = asyncio.create_task(http.post("/v1/embeddings", json={"model": MODEL, "input": "x"}))
        await fake.arrivals.get()
        fake.error = EmbedTimeoutError("r2", 30)
        fake.catalog = []
        await asyncio.sleep(1.0)  # the catalog is read again when older than a second
        fake.gate.set()
        answer = await call
    openai_error(answer, 503, "no_worker", "server_error")


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (RequestTooLargeError(5_000_000, 4_194_304), 413, "request_too_large"),
        (CatalogUnavailableError("no broker"), 503, "kafka_unavailable"),
        (AuthorizationError("User:gw", "write", "embed.requests"), 500, "internal"),
        (RuntimeError("a bug"), 500, "internal"),
    ],
)
async def test_sdk_exceptions_are_the_documented_status(
    error: BaseException, status: int, code: str
) -> None:
    async with served() as (http, fake):
        fake.error = error
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    openai_error(answer, status, code, "invalid_request_error" if status < 500 else "server_error")
    assert "User:gw" not in answer.text
    assert "a bug" not in answer.text


async def test_an_unreadable_catalog_is_503_for_embeddings_and_models() -> None:
    async with served() as (http, fake):
        fake.catalog_error = CatalogUnavailableError("no broker answered")
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
        models = await http.get("/v1/models")
    for each in (answer, models):
        openai_error(each, 503, "kafka_unavailable", "server_error")


# ---------------------------------------------------------------------- TEI


async def test_tei_embed_answers_a_list_of_float_lists_with_its_options() -> None:
    async with served(model=ALIAS) as (http, fake):
        answer = await http.post(
            "/embed",
            json={
                "inputs": ["What is Deep Learning?", "And this"],
                "normalize": False,
                "truncate": True,
                "truncation_direction": "Left",
                "prompt_name": "query",
                "dimensions": 4,
            },
        )
        single = await http.post("/embed", json={"inputs": "What is Deep Learning?"})
    assert answer.status_code == 200
    assert answer.json() == [
        vector_of("What is Deep Learning?")[:4].tolist(),
        vector_of("And this")[:4].tolist(),
    ]
    assert single.json() == [vector_of("What is Deep Learning?").tolist()]
    options = fake.calls[0][1]
    assert options["model"] == ALIAS
    assert options["normalize"] is False
    assert options["truncate"] is True
    assert options["truncation_direction"] == "left"
    assert options["prompt_name"] == "query"
    assert options["dimensions"] == 4
    defaults = fake.calls[1][1]
    assert (defaults["normalize"], defaults["truncate"]) == (True, False)
    assert defaults["truncation_direction"] == "right"


async def test_tei_without_a_configured_model_asks_for_the_workers_default() -> None:
    async with served() as (http, fake):
        fake.catalog = []  # no model is named, so the catalog is not asked
        answer = await http.post("/embed", json={"inputs": "x"})
    assert answer.status_code == 200
    assert fake.calls[0][1]["model"] is None


async def test_tei_with_a_configured_model_nobody_serves_is_503() -> None:
    async with served(model="gone/model") as (http, fake):
        answer = await http.post("/embed", json={"inputs": "x"})
    assert (answer.status_code, tei_error(answer)["error_type"]) == (503, "Unhealthy")
    assert fake.calls == []


# ---------------------------------------------------------------------- API keys


async def test_api_keys_missing_wrong_and_right(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("sk-from-file\n")
    body = {"model": MODEL, "input": "x"}
    async with served(api_keys=f"{KEY},sk-other", api_keys_file=str(key_file)) as (http, fake):
        missing = await http.post("/v1/embeddings", json=body)
        wrong = await http.post("/v1/embeddings", json=body, headers=bearer("sk-wrong"))
        basic = await http.post(
            "/v1/embeddings", json=body, headers={"Authorization": f"Basic {KEY}"}
        )
        tei = await http.post("/embed", json={"inputs": "x"}, headers=bearer(KEY[:-1]))
        models = await http.get("/v1/models")
        docs = await http.get("/openapi.json")
        assert fake.calls == []
        right = await http.post("/v1/embeddings", json=body, headers=bearer(KEY))
        other = await http.post("/v1/embeddings", json=body, headers=bearer("sk-other"))
        from_file = await http.post("/embed", json={"inputs": "x"}, headers=bearer("sk-from-file"))
        listed = await http.get("/v1/models", headers=bearer(KEY))
        public = [await http.get(path) for path in ("/health", "/ready", "/metrics")]
    for refused in (missing, wrong, basic, models, docs):
        openai_error(refused, 401, "invalid_api_key", "invalid_request_error")
        assert refused.headers["www-authenticate"] == "Bearer"
        assert KEY not in refused.text
    assert (tei.status_code, tei_error(tei)["error_type"]) == (401, "Validation")
    for allowed in (right, other, from_file, listed, *public):
        assert allowed.status_code == 200, allowed.text


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_without_keys_every_client_is_served_and_a_warning_says_so() -> None:
    with structlog.testing.capture_logs() as logs:
        async with served() as (http, _):
            answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert answer.status_code == 200
    assert "gateway.no_api_keys" in [entry["event"] for entry in logs]
    with structlog.testing.capture_logs() as logs:
        async with served(api_keys=KEY):
            pass
    assert "gateway.no_api_keys" not in [entry["event"] for entry in logs]


# ---------------------------------------------------------------------- limits


async def test_a_body_over_the_limit_is_413_by_its_length_or_as_it_streams() -> None:
    big = {"model": MODEL, "input": "x" * 2_000}

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b" " * 300  # JSON whitespace: valid, and over the limit by the 4th chunk
        yield b'{"model": "m", "input": "x"}'

    async with served(max_body_bytes=1_000) as (http, fake):
        declared = await http.post("/v1/embeddings", json=big)
        tei = await http.post("/embed", json={"inputs": "x" * 2_000})
        streamed = await http.post("/v1/embeddings", content=chunks())
        small = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x" * 900})
    openai_error(declared, 413, "request_too_large", "invalid_request_error")
    assert (tei.status_code, tei_error(tei)["error_type"]) == (413, "Validation")
    assert streamed.status_code == 413
    assert "content-length" not in streamed.request.headers
    assert small.status_code == 200
    assert len(fake.calls) == 1


async def test_more_inputs_than_max_inputs_is_400_or_tei_413() -> None:
    async with served(max_inputs=3) as (http, fake):
        answer = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 4})
        tei = await http.post("/embed", json={"inputs": ["a"] * 4})
        three = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 3})
    openai_error(answer, 400, "too_many_inputs", "invalid_request_error", param="input")
    assert (tei.status_code, tei_error(tei)["error_type"]) == (413, "Validation")
    assert three.status_code == 200
    assert len(fake.calls) == 1


async def test_past_max_in_flight_a_request_is_429_at_once_with_retry_after() -> None:
    async with served(max_in_flight=2) as (http, fake):
        fake.gate = asyncio.Event()
        body = {"model": MODEL, "input": "x"}
        waiting = [asyncio.create_task(http.post("/v1/embeddings", json=body)) for _ in range(2)]
        for _ in waiting:
            await fake.arrivals.get()
        refused = await http.post("/v1/embeddings", json=body)
        tei = await http.post("/embed", json={"inputs": "x"})
        gauge = metric_value(await http.get("/metrics"), "kembed_gateway_in_flight")
        fake.gate.set()
        answers = await asyncio.gather(*waiting)
        after = await http.post("/v1/embeddings", json=body)
    openai_error(refused, 429, "overloaded", "rate_limit_error")
    assert refused.headers["retry-after"] == "1"
    assert (tei.status_code, tei_error(tei)["error_type"]) == (429, "Overloaded")
    assert tei.headers["retry-after"] == "1"
    assert gauge == 2
    assert [answer.status_code for answer in answers] == [200, 200]
    assert after.status_code == 200
    assert len(fake.calls) == 3


# ---------------------------------------------------------------------- metrics, logs


def metric_value(answer: httpx.Response, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    series = f"{name}{{{wanted}}}" if labels else name
    for line in answer.text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


async def test_metrics_count_requests_by_endpoint_model_and_status() -> None:
    async with served(api_keys=KEY) as (http, fake):
        auth = bearer(KEY)
        for _ in range(2):
            await http.post("/v1/embeddings", json={"model": ALIAS, "input": "x"}, headers=auth)
        await http.post("/v1/embeddings", json={"model": "random-name", "input": "x"}, headers=auth)
        await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
        await http.post("/embed", json={"inputs": "x"}, headers=auth)
        fake.error = EmbedTimeoutError("r", 30)
        await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=auth)
        await http.get("/v1/models", headers=auth)
        await http.get("/health")
        scrape = await http.get("/metrics")
    assert scrape.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    count = "kembed_gateway_requests_total"
    embeddings = "/v1/embeddings"
    assert metric_value(scrape, count, endpoint=embeddings, model=MODEL, status="200") == 2
    assert metric_value(scrape, count, endpoint=embeddings, model="", status="404") == 1
    assert metric_value(scrape, count, endpoint=embeddings, model="", status="401") == 1
    assert metric_value(scrape, count, endpoint=embeddings, model=MODEL, status="504") == 1
    assert metric_value(scrape, count, endpoint="/embed", model=MODEL, status="200") == 1
    assert metric_value(scrape, count, endpoint="/v1/models", model="", status="200") == 1
    assert "random-name" not in scrape.text  # clients cannot make series
    assert "/health" not in scrape.text
    seconds = "kembed_gateway_request_seconds_count"
    assert metric_value(scrape, seconds, endpoint=embeddings) == 5
    assert metric_value(scrape, "kembed_gateway_in_flight") == 0


async def test_logs_hold_neither_request_text_nor_keys() -> None:
    text = "confidential patient note 4711"
    with structlog.testing.capture_logs() as logs:
        async with served(api_keys=KEY) as (http, fake):
            auth = bearer(KEY)
            await http.post("/v1/embeddings", json={"model": MODEL, "input": text}, headers=auth)
            await http.post("/v1/embeddings", json={"model": MODEL, "input": text})
            fake.error = EmbedError("internal", "worker failed")
            await http.post("/v1/embeddings", json={"model": MODEL, "input": text}, headers=auth)
            fake.error = RuntimeError("boom")
            await http.post("/embed", json={"inputs": [text]}, headers=auth)
    events = [entry["event"] for entry in logs]
    assert "gateway.request" in events
    assert "gateway.embed_failed" in events
    dumped = repr(logs)
    assert "patient" not in dumped
    assert KEY not in dumped


# ---------------------------------------------------------------------- the catalog cache


async def test_the_catalog_cache_shares_one_read_and_keeps_a_failure_as_long() -> None:
    now = [0.0]
    reads: list[int] = []
    failing = [False]
    gate = asyncio.Event()

    async def read() -> list[CatalogModel]:
        reads.append(1)
        await gate.wait()
        if failing[0]:
            raise CatalogUnavailableError("down")
        return [catalog_entry()]

    cache = CatalogCache(read, max_age_s=3.0, clock=lambda: now[0])
    callers = [asyncio.create_task(cache.models()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert all(len(models) == 1 for models in await asyncio.gather(*callers))
    assert len(reads) == 1
    now[0] = 2.9
    assert (await cache.find(ALIAS)) is not None
    assert len(reads) == 1
    assert (await cache.find("absent")) is None  # older than a second: read again
    assert len(reads) == 2
    now[0] = 6.0  # old: a known model is answered from the cache, and a read starts
    gate.clear()
    assert (await cache.find(MODEL)) is not None
    await asyncio.sleep(0)  # the background read starts
    assert len(reads) == 3
    failing[0] = True
    gate.set()
    with pytest.raises(CatalogUnavailableError):
        await cache.models()  # the read in flight failed
    with pytest.raises(CatalogUnavailableError):
        await cache.models()  # and that is the answer until it is old
    with pytest.raises(CatalogUnavailableError):
        await cache.find(MODEL)
    assert len(reads) == 3
    await cache.close()


@pytest.fixture(autouse=True)
def _no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings under test come from the test, not from the shell."""
    for name in list(os.environ):
        if name.startswith("KEMBED_GATEWAY_"):
            monkeypatch.delenv(name)


async def test_a_text_over_max_input_chars_is_input_too_long_in_both_shapes() -> None:
    """A text of more than max_input_chars characters: OpenAI's 400 input_too_long naming
    the input, TEI's 422 Validation; nothing is sent, a text at the limit is; the client is
    made with the same limit."""
    async with served(max_input_chars=10) as (http, fake):
        openai = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b" * 11]})
        tei = await http.post("/embed", json={"inputs": "c" * 11})
        assert fake.calls == []
        fits = await http.post("/v1/embeddings", json={"model": MODEL, "input": "d" * 10})
    error = openai_error(openai, 400, "input_too_long", "invalid_request_error", param="input")
    assert "input[1] has 11 characters, above this gateway's limit of 10" in error["message"]
    assert tei.status_code == 422
    assert tei_error(tei)["error_type"] == "Validation"
    assert "has 11 characters" in tei_error(tei)["error"]
    assert fits.status_code == 200
    assert fake.options["max_input_chars"] == 10
