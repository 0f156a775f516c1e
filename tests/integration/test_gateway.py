"""The HTTP gateway against the real broker and a real worker with the real model.

``kembed gateway`` runs as a subprocess (as in production) in front of one fp32 worker;
what it answers is held to ``producer_sdk.EmbedClient`` for the same texts, through the
official ``openai`` client, LangChain's ``OpenAIEmbeddings``, raw HTTP in OpenAI's and
text-embeddings-inference's shapes, and every status docs/gateway.md promises.

The TEI pairs are written from TEI's documented API (its docs/openapi.json and
router/src/http/types.rs): ``EmbedRequest`` {inputs: string | [string], normalize
(default true), truncate (default false), truncation_direction (Left | Right, default
Right), prompt_name, dimensions}; ``EmbedResponse`` [[float]]; ``ErrorResponse`` {error:
string, error_type: Unhealthy | Backend | Overloaded | Validation | Tokenizer | Empty},
with 400 Empty, 413 batch size, 422 Validation/Tokenizer, 424 Backend, 429 Overloaded,
503 Unhealthy.

Two gateways share the worker: ``gateway`` (API keys, small body and input limits) and
``tight_gateway`` (no keys, one request in flight, a 3 s timeout). Tests that pause the
worker (SIGSTOP) resume it before they return; the last test stops it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import signal
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtest.data import passages, stsb_sentences
from producer_sdk import EmbedClient
from producer_sdk.encodings import Embeddings
from scripts.kafka_local import CATALOG_TOPIC_CONFIG, LocalKafka, TopicSpec
from scripts.local_server import LOOPBACK, free_port
from scripts.worker_process import WorkerProcess, variables

pytestmark = pytest.mark.integration

MODEL, ALIAS = "gw-minilm", "gw-mini"
PROMPTS = {"query": "query: "}
KEY_FROM_ENV, KEY_FROM_FILE = "sk-gw-env-93f1c0de", "sk-gw-file-27c4b7aa"
WRONG_KEY = "sk-gw-wrong-5d0e11f2"
# In inputs of many requests below; it must never reach the gateways' logs.
SECRET_TEXT = "quokka marmalade 4417"
MAX_BODY_BYTES = 200_000
MAX_INPUTS = 150
DIM = 384
TEXTS = [
    "A man is playing a guitar.",
    f"The {SECRET_TEXT} recipe needs three lemons.",
    "Kafka keeps records in partitions, in order.",
]


@dataclass(frozen=True)
class Fleet:
    """The broker's topics for this module and the worker that serves them."""

    bootstrap_servers: str
    requests: str
    catalog: str
    gateway_results: str
    sdk_results: str
    worker: WorkerProcess


class GatewayProcess(WorkerProcess):
    """A real ``kembed gateway`` process on a free loopback port, its log captured."""

    def __init__(self, bootstrap_servers: str, log_path: Path, **settings: Any) -> None:
        """``settings`` become ``KEMBED_GATEWAY_*`` variables."""
        self.port = free_port()
        env = {
            "KEMBED_GATEWAY_HOST": LOOPBACK,
            "KEMBED_GATEWAY_PORT": str(self.port),
            "KEMBED_GATEWAY_LOG_FORMAT": "json",
            **variables("KEMBED_GATEWAY_", settings),
        }
        self._run(["kembed_cli", "gateway"], bootstrap_servers, log_path, env)

    @classmethod
    def ready(cls, bootstrap_servers: str, log_path: Path, **settings: Any) -> GatewayProcess:
        """A gateway started and ready (stopped again if it never gets ready)."""
        gateway = cls(bootstrap_servers, log_path, **settings)
        try:
            gateway.wait_ready()
        except BaseException:
            gateway.stop()
            raise
        return gateway

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until GET /ready answers 200 (Kafka reached, a live model in the catalog)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if httpx.get(f"{self.url}/ready", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(
            f"gateway never ready (exit {self.process.poll()}):\n{self.log_text()[-3000:]}"
        )


@pytest.fixture(scope="module")
def fleet(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fp32 worker serving MODEL (alias ALIAS, a "query" prompt) on its own topics,
    announcing it on its own catalog."""
    tag = uuid.uuid4().hex[:6]
    requests, catalog = f"test.gw.requests.{tag}", f"test.gw.catalog.{tag}"
    gateway_results, sdk_results = f"test.gw.results.{tag}", f"test.gw.sdk.{tag}"
    kafka.create_topics(
        [
            TopicSpec(requests, 2),
            TopicSpec(catalog, 1, CATALOG_TOPIC_CONFIG),
            TopicSpec(gateway_results, 2),
            TopicSpec(sdk_results, 2),
        ]
    )
    spec = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "name": MODEL,
        "aliases": [ALIAS],
        "prompts": PROMPTS,
        "requests_topic": requests,
        "bulk_topic": "",
    }
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("gw-worker") / "worker.log",
        dtype="float32",
        models=json.dumps([spec]),
        requests_topic=requests,
        bulk_topic="",
        catalog_topic=catalog,
        group_id=f"gw-{tag}",
    )
    try:
        worker.wait_ready()
        yield Fleet(
            kafka.bootstrap_servers, requests, catalog, gateway_results, sdk_results, worker
        )
    finally:
        worker.process.send_signal(signal.SIGCONT)  # in case a test left it paused
        worker.stop()


def _start(fleet: Fleet, log_path: Path, **settings: Any) -> GatewayProcess:
    return GatewayProcess.ready(
        fleet.bootstrap_servers,
        log_path,
        requests_topic=fleet.requests,
        reply_topic=fleet.gateway_results,
        catalog_topic=fleet.catalog,
        **settings,
    )


@pytest.fixture(scope="module")
def gateway(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """API keys (one from the env var, one from a key file), small limits."""
    folder = tmp_path_factory.mktemp("gateway")
    keys = folder / "keys"
    keys.write_text(f"# a mounted secret\n\n{KEY_FROM_FILE}\n", encoding="utf-8")
    process = _start(
        fleet,
        folder / "gateway.log",
        api_keys=KEY_FROM_ENV,
        api_keys_file=keys,
        max_body_bytes=MAX_BODY_BYTES,
        max_inputs=MAX_INPUTS,
        timeout_s=60,
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def tight_gateway(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """No API keys, one request in flight at most, a 3 s timeout."""
    process = _start(
        fleet,
        tmp_path_factory.mktemp("tight-gateway") / "gateway.log",
        max_in_flight=1,
        timeout_s=3,
    )
    yield process
    process.stop()


# ---------------------------------------------------------------------------- helpers


def sdk(fleet: Fleet, *calls: tuple[Sequence[str], dict[str, Any]]) -> list[Embeddings]:
    """``EmbedClient.embed_result(texts, **options)`` for each call, through one client."""

    async def run() -> list[Embeddings]:
        async with EmbedClient(
            fleet.bootstrap_servers,
            requests_topic=fleet.requests,
            reply_topic=fleet.sdk_results,
            catalog_topic=fleet.catalog,
        ) as client:
            return [
                await client.embed_result(list(texts), timeout=60, **options)
                for texts, options in calls
            ]

    return asyncio.run(run())


def cosines(got: Any, expected: Any) -> npt.NDArray[np.float64]:
    """Row-wise cosine similarity of two (n, dim) arrays of equal shape."""
    a, b = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    result: npt.NDArray[np.float64] = (a * b).sum(axis=1) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    )
    return result


def assert_same_vectors(got: Any, expected: Any) -> None:
    similarity = cosines(got, expected)
    worst = int(np.argmin(similarity))
    assert similarity[worst] > 0.9999, f"input {worst}: cosine {similarity[worst]:.6f}"


def from_base64(text: str) -> npt.NDArray[np.float32]:
    """OpenAI's base64 embedding: little-endian float32 bytes."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def auth(key: str = KEY_FROM_ENV) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def long_text() -> str:
    """Over the model's 256-token limit, with a beginning and an end that differ."""
    sentences = stsb_sentences()
    return " ".join(sentences[:40]) + " " + " ".join(sentences[-40:])


def mixed_batch() -> list[str]:
    """100 distinct texts: 70 STS-B sentences and 30 passages of ~160 tokens, shuffled."""
    sentences = stsb_sentences()
    texts = sentences[:70] + passages(sentences[70:], words=120)[:30]
    random.Random(15).shuffle(texts)
    assert len(texts) == 100 == len(set(texts))
    return texts


def openai_error(response: httpx.Response, status: int, code: str, kind: str) -> dict[str, Any]:
    """The response is OpenAI's error shape with this status, code and type."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["code"], error["type"]) == (code, kind), error
    assert isinstance(error["message"], str), error
    assert error["message"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    return error


def tei_error(response: httpx.Response, status: int, error_type: str) -> str:
    """The response is TEI's ErrorResponse with this status and error_type."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert body["error_type"] == error_type, body
    assert isinstance(body["error"], str), body
    assert body["error"], body
    message: str = body["error"]
    return message


def metric_samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of metric ``name`` (label set, value) on ``url``/metrics."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == name
    ]


def in_flight(url: str) -> float:
    return sum(value for _, value in metric_samples(url, "kembed_gateway_in_flight"))


def statuses_seen(url: str) -> dict[str, float]:
    """kembed_gateway_requests_total summed by status."""
    seen: dict[str, float] = {}
    for labels, value in metric_samples(url, "kembed_gateway_requests_total"):
        assert set(labels) >= {"endpoint", "model", "status"}, labels
        seen[labels["status"]] = seen.get(labels["status"], 0.0) + value
    return seen


class PausedWorker:
    """``with PausedWorker(worker):`` the worker process is stopped (SIGSTOP) inside: live
    in the catalog (its card stays fresh for three announce intervals) but answering
    nothing; it resumes (SIGCONT) on exit."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker

    def __enter__(self) -> None:
        self.worker.process.send_signal(signal.SIGSTOP)

    def __exit__(self, *exc_info: object) -> None:
        self.worker.process.send_signal(signal.SIGCONT)


def worker_outcomes(worker: WorkerProcess, outcome: str) -> float:
    return sum(
        value
        for labels, value in metric_samples(worker.http_url, "kembed_requests_total")
        if labels.get("outcome") == outcome
    )


# ---------------------------------------------------------------------------- the openai client


def test_openai_client_gets_the_sdk_vectors_as_float_base64_and_with_dimensions(
    fleet: Fleet, gateway: GatewayProcess
) -> None:
    """The official client with base_url: float, base64 (asked for: strings the caller
    decodes as little-endian float32; not asked for: the client asks for base64 and
    decodes it), by alias, and dimensions=64 (re-normalized) all equal the SDK's vectors;
    the usage counts the worker's tokens."""
    from openai import OpenAI

    full, short = sdk(fleet, (TEXTS, {}), (TEXTS, {"dimensions": 64}))
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY_FROM_FILE, max_retries=0)
    as_float = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    by_default = client.embeddings.create(model=ALIAS, input=TEXTS)
    shortened = client.embeddings.create(
        model=MODEL, input=TEXTS, dimensions=64, encoding_format="float"
    )

    assert as_float.object == "list"
    assert as_float.model == MODEL
    assert [d.index for d in as_float.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == DIM for d in as_float.data)
    assert_same_vectors([d.embedding for d in as_float.data], full.vectors)

    raw = [d.embedding for d in as_base64.data]
    assert all(isinstance(item, str) for item in raw), raw
    assert_same_vectors([from_base64(cast(str, item)) for item in raw], full.vectors)
    assert_same_vectors([d.embedding for d in by_default.data], full.vectors)

    assert all(len(d.embedding) == 64 for d in shortened.data)
    assert_same_vectors([d.embedding for d in shortened.data], short.vectors)
    norms = np.linalg.norm(np.asarray([d.embedding for d in shortened.data]), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-4), norms

    assert sum(full.tokens) > 0
    for response in (as_float, as_base64, by_default, shortened):
        assert response.usage.prompt_tokens == sum(full.tokens)
        assert response.usage.total_tokens == response.usage.prompt_tokens


def test_openai_client_keeps_the_order_of_a_100_input_batch(
    fleet: Fleet, gateway: GatewayProcess
) -> None:
    """100 inputs of mixed lengths (sentences and ~160-token passages) come back in input
    order: each index holds the SDK's vector for that input."""
    from openai import OpenAI

    texts = mixed_batch()
    [expected] = sdk(fleet, (texts, {}))
    assert max(expected.tokens) < 256  # none truncated: OpenAI's API refuses over-long inputs
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=KEY_FROM_ENV, max_retries=0)
    response = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in response.data] == list(range(100))
    assert_same_vectors([d.embedding for d in response.data], expected.vectors)
    assert response.usage.prompt_tokens == sum(expected.tokens) > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_langchain_embeds_documents_and_a_query(fleet: Fleet, gateway: GatewayProcess) -> None:
    """LangChain's OpenAIEmbeddings, pointed at the gateway with its token-length check off
    (so it sends text and downloads no tokenizer), gets the SDK's vectors."""
    from langchain_openai import OpenAIEmbeddings

    query = "Which recipe needs lemons?"
    documents, expected_query = sdk(fleet, (TEXTS, {}), ([query], {}))
    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{gateway.url}/v1",
        api_key=KEY_FROM_ENV,  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    assert_same_vectors(embeddings.embed_documents(TEXTS), documents.vectors)
    assert_same_vectors([embeddings.embed_query(query)], expected_query.vectors)


# ---------------------------------------------------------------------------- raw HTTP, OpenAI


def test_embeddings_over_raw_http_field_by_field(fleet: Fleet, gateway: GatewayProcess) -> None:
    """POST /v1/embeddings: a string input is one embedding; `user` is accepted; the
    answer has exactly OpenAI's fields; base64 is the float answer's float32 bytes."""
    [expected] = sdk(fleet, ([TEXTS[0]], {}))
    request = {"model": MODEL, "input": TEXTS[0], "user": "user-1234"}
    as_float = httpx.post(f"{gateway.url}/v1/embeddings", json=request, headers=auth())
    assert as_float.status_code == 200, as_float.text
    body = as_float.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert (body["object"], body["model"]) == ("list", MODEL)
    [item] = body["data"]
    assert set(item) == {"object", "index", "embedding"}
    assert (item["object"], item["index"]) == ("embedding", 0)
    assert len(item["embedding"]) == DIM
    assert all(isinstance(x, float) for x in item["embedding"])
    assert_same_vectors([item["embedding"]], expected.vectors)
    assert body["usage"] == {
        "prompt_tokens": expected.tokens[0],
        "total_tokens": expected.tokens[0],
    }

    as_base64 = httpx.post(
        f"{gateway.url}/v1/embeddings",
        json=request | {"encoding_format": "base64"},
        headers=auth(),
    )
    assert as_base64.status_code == 200, as_base64.text
    [encoded] = as_base64.json()["data"]
    assert np.allclose(from_base64(encoded["embedding"]), item["embedding"], atol=1e-6)


def test_models_lists_the_catalog(gateway: GatewayProcess) -> None:
    """GET /v1/models: OpenAI's list shape, the catalog's model and its alias."""
    response = httpx.get(f"{gateway.url}/v1/models", headers=auth())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert all(model["object"] == "model" for model in body["data"]), body
    assert MODEL in {model["id"] for model in body["data"]}, body
    assert ALIAS in response.text, body
    openai_error(
        httpx.get(f"{gateway.url}/v1/models"), 401, "invalid_api_key", "invalid_request_error"
    )


def test_health_ready_and_metrics_need_no_key_the_api_pages_do(gateway: GatewayProcess) -> None:
    """/health, /ready and /metrics answer without a key; /openapi.json (listing the API's
    paths) and /docs (an HTML page) need one, as every other endpoint."""
    for path in ("/health", "/ready"):
        response = httpx.get(f"{gateway.url}{path}")
        assert response.status_code == 200, (path, response.text)
    metrics = httpx.get(f"{gateway.url}/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in (
        "kembed_gateway_requests_total",
        "kembed_gateway_request_seconds",
        "kembed_gateway_in_flight",
    ):
        assert name in metrics.text, name

    for path in ("/openapi.json", "/docs"):
        assert httpx.get(f"{gateway.url}{path}").status_code == 401, path
    document = httpx.get(f"{gateway.url}/openapi.json", headers=auth())
    assert document.status_code == 200, document.text
    assert document.json()["openapi"].startswith("3.")
    assert {"/v1/embeddings", "/v1/models", "/embed"} <= set(document.json()["paths"])
    page = httpx.get(f"{gateway.url}/docs", headers=auth())
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")


LONG_SECRET = "<SECRET_TEXT and a text over the model's limit>"


def with_long_text(value: Any) -> Any:
    """``value`` with each LONG_SECRET replaced (the data set is read when a test runs)."""
    if value == LONG_SECRET:
        return f"{SECRET_TEXT} {long_text()}"
    if isinstance(value, list):
        return [with_long_text(item) for item in value]
    if isinstance(value, dict):
        return {name: with_long_text(item) for name, item in value.items()}
    return value


OPENAI_ERRORS = [
    # (case, key, body or raw bytes, status, code, type)
    ("missing key", None, {"model": MODEL, "input": SECRET_TEXT}, 401, "invalid_api_key"),
    ("wrong key", WRONG_KEY, {"model": MODEL, "input": SECRET_TEXT}, 401, "invalid_api_key"),
    (
        "oversized body",
        KEY_FROM_ENV,
        {"model": MODEL, "input": SECRET_TEXT + "x" * MAX_BODY_BYTES},
        413,
        "request_too_large",
    ),
    (
        "too many inputs",
        KEY_FROM_ENV,
        {"model": MODEL, "input": [SECRET_TEXT] * (MAX_INPUTS + 1)},
        400,
        "too_many_inputs",
    ),
    (
        "token ids",
        KEY_FROM_ENV,
        {"model": MODEL, "input": [[101, 7592, 102]]},
        400,
        "invalid_request",
    ),
    (
        "flat token ids",
        KEY_FROM_ENV,
        {"model": MODEL, "input": [101, 7592, 102]},
        400,
        "invalid_request",
    ),
    (
        "unknown model",
        KEY_FROM_ENV,
        {"model": "no-such-model", "input": SECRET_TEXT},
        404,
        "model_not_found",
    ),
    ("no model", KEY_FROM_ENV, {"input": SECRET_TEXT}, 400, "invalid_request"),
    (
        "an input over the model's limit",
        KEY_FROM_ENV,
        {"model": MODEL, "input": [TEXTS[0], LONG_SECRET]},
        400,
        "input_too_long",
    ),
    (
        "unknown encoding_format",
        KEY_FROM_ENV,
        {"model": MODEL, "input": SECRET_TEXT, "encoding_format": "int4"},
        400,
        "invalid_request",
    ),
    (
        "dimensions over the model's",
        KEY_FROM_ENV,
        {"model": MODEL, "input": SECRET_TEXT, "dimensions": 1000},
        400,
        "invalid_request",
    ),
    ("not JSON", KEY_FROM_ENV, b"{not json", 400, "invalid_request"),
]


@pytest.mark.parametrize(
    ("key", "body", "status", "code"),
    [pytest.param(*case[1:], id=case[0]) for case in OPENAI_ERRORS],
)
def test_embeddings_errors_have_openai_shape_and_status(
    gateway: GatewayProcess, key: str | None, body: Any, status: int, code: str
) -> None:
    """Each refusal docs/gateway.md lists: its status, and OpenAI's error object with the
    documented code and type (invalid_request_error for 4xx)."""
    headers = {} if key is None else auth(key)
    body = with_long_text(body)
    if isinstance(body, bytes):
        headers["Content-Type"] = "application/json"
        response = httpx.post(f"{gateway.url}/v1/embeddings", content=body, headers=headers)
    else:
        response = httpx.post(f"{gateway.url}/v1/embeddings", json=body, headers=headers)
    error = openai_error(response, status, code, "invalid_request_error")
    assert SECRET_TEXT not in error["message"]


# ---------------------------------------------------------------------------- raw HTTP, TEI


def test_tei_embed_request_and_response_field_by_field(
    fleet: Fleet, gateway: GatewayProcess
) -> None:
    """POST /embed in TEI's shape: `inputs` as a string and as a list, `normalize`,
    `truncate`, `truncation_direction`, `prompt_name` and `dimensions` each give the SDK's
    vectors for the same option; the answer is a bare list of float lists."""
    long = long_text()
    plain, single, raw, short, prompted, left, right = sdk(
        fleet,
        (TEXTS, {}),
        ([TEXTS[0]], {}),
        (TEXTS, {"normalize": False}),
        (TEXTS, {"dimensions": 64}),
        (TEXTS, {"prompt_name": "query"}),
        ([long], {"truncation_direction": "left"}),
        ([long], {"truncation_direction": "right"}),
    )

    def embed(request: dict[str, Any]) -> list[list[float]]:
        response = httpx.post(f"{gateway.url}/embed", json=request, headers=auth(), timeout=60)
        assert response.status_code == 200, (request, response.status_code, response.text)
        body = response.json()
        assert isinstance(body, list), body
        assert all(isinstance(row, list) for row in body), body
        assert all(isinstance(x, float) for row in body for x in row)
        return body

    one = embed({"inputs": TEXTS[0]})
    assert len(one) == 1
    assert len(one[0]) == DIM
    assert_same_vectors(one, single.vectors)
    assert_same_vectors(embed({"inputs": TEXTS}), plain.vectors)

    unnormalized = np.asarray(embed({"inputs": TEXTS, "normalize": False}))
    assert_same_vectors(unnormalized, raw.vectors)
    assert np.allclose(
        np.linalg.norm(unnormalized, axis=1), np.linalg.norm(raw.vectors, axis=1), rtol=1e-4
    )
    assert (np.linalg.norm(unnormalized, axis=1) > 1.5).all()  # MiniLM's raw norms are ~3-7

    assert_same_vectors(embed({"inputs": TEXTS, "dimensions": 64}), short.vectors)
    with_prompt = embed({"inputs": TEXTS, "prompt_name": "query"})
    assert_same_vectors(with_prompt, prompted.vectors)
    assert cosines(with_prompt, plain.vectors).min() < 0.999  # the prompt changed them

    kept_end = embed({"inputs": [long], "truncate": True, "truncation_direction": "Left"})
    kept_start = embed({"inputs": [long], "truncate": True, "truncation_direction": "Right"})
    assert_same_vectors(kept_end, left.vectors)
    assert_same_vectors(kept_start, right.vectors)
    assert cosines(kept_end, kept_start)[0] < 0.99
    assert_same_vectors(embed({"inputs": [long], "truncate": True}), right.vectors)


TEI_ERRORS = [
    # (case, key, body, status, error_type)
    ("missing key", None, {"inputs": SECRET_TEXT}, 401, "Validation"),
    ("wrong key", WRONG_KEY, {"inputs": SECRET_TEXT}, 401, "Validation"),
    (
        "truncate false and an input over the limit",
        KEY_FROM_ENV,
        {"inputs": [TEXTS[0], LONG_SECRET], "truncate": False},
        422,
        "Validation",
    ),
    (
        "truncate unset (TEI's default: false) and an input over the limit",
        KEY_FROM_ENV,
        {"inputs": LONG_SECRET},
        422,
        "Validation",
    ),
    (
        "oversized body",
        KEY_FROM_ENV,
        {"inputs": SECRET_TEXT + "x" * MAX_BODY_BYTES},
        413,
        "Validation",
    ),
    (
        "too many inputs",
        KEY_FROM_ENV,
        {"inputs": [SECRET_TEXT] * (MAX_INPUTS + 1)},
        413,
        "Validation",
    ),
    ("empty batch", KEY_FROM_ENV, {"inputs": []}, 400, "Empty"),
    ("no inputs", KEY_FROM_ENV, {"normalize": True}, 422, "Validation"),
    (
        "unknown truncation_direction",
        KEY_FROM_ENV,
        {"inputs": SECRET_TEXT, "truncation_direction": "Middle"},
        422,
        "Validation",
    ),
    (
        "unknown prompt_name",
        KEY_FROM_ENV,
        {"inputs": SECRET_TEXT, "prompt_name": "no-such-prompt"},
        422,
        "Validation",
    ),
    (
        "dimensions over the model's",
        KEY_FROM_ENV,
        {"inputs": SECRET_TEXT, "dimensions": 1000},
        422,
        "Validation",
    ),
]


@pytest.mark.parametrize(
    ("key", "body", "status", "error_type"),
    [pytest.param(*case[1:], id=case[0]) for case in TEI_ERRORS],
)
def test_tei_errors_have_tei_shape_and_status(
    gateway: GatewayProcess, key: str | None, body: Any, status: int, error_type: str
) -> None:
    """TEI's ErrorResponse {error, error_type} with TEI's status for each refusal."""
    headers = {} if key is None else auth(key)
    body = with_long_text(body)
    response = httpx.post(f"{gateway.url}/embed", json=body, headers=headers, timeout=60)
    message = tei_error(response, status, error_type)
    assert SECRET_TEXT not in message


# ---------------------------------------------------------------------------- overload, timeouts


def test_a_full_gateway_answers_429_with_retry_after_at_once(
    fleet: Fleet, tight_gateway: GatewayProcess
) -> None:
    """With its one in-flight slot taken (a request waiting on the paused worker), the
    gateway answers the next request 429 with Retry-After, in OpenAI's shape
    (overloaded, rate_limit_error) and TEI's (Overloaded), without queueing it."""
    url = tight_gateway.url
    before = statuses_seen(url)

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            waiting = asyncio.create_task(
                http.post("/v1/embeddings", json={"model": MODEL, "input": "waits"})
            )
            give_up = time.monotonic() + 10
            while in_flight(url) < 1:
                assert time.monotonic() < give_up, "the first request never went in flight"
                await asyncio.sleep(0.05)
            openai_shaped = await http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
            tei_shaped = await http.post("/embed", json={"inputs": "x"})
            return await waiting, openai_shaped, tei_shaped

    with PausedWorker(fleet.worker):
        waiting, openai_shaped, tei_shaped = asyncio.run(scenario())
    openai_error(openai_shaped, 429, "overloaded", "rate_limit_error")
    assert openai_shaped.headers["retry-after"] == "1"
    tei_error(tei_shaped, 429, "Overloaded")
    assert tei_shaped.headers["retry-after"] == "1"
    openai_error(waiting, 504, "deadline_exceeded", "server_error")
    assert in_flight(url) == 0
    after = statuses_seen(url)
    assert after.get("429", 0) == before.get("429", 0) + 2, (before, after)
    assert after.get("504", 0) == before.get("504", 0) + 1, (before, after)


def test_a_paused_worker_gives_504_and_drops_the_expired_work(
    fleet: Fleet, tight_gateway: GatewayProcess
) -> None:
    """A worker live in the catalog that cannot answer within the gateway's timeout: 504
    deadline_exceeded (OpenAI) and 504 Unhealthy (TEI); resumed, the worker drops the work
    (its deadline passed) and serves again."""
    dropped = worker_outcomes(fleet.worker, "deadline_exceeded")
    with PausedWorker(fleet.worker):
        openai_shaped = httpx.post(
            f"{tight_gateway.url}/v1/embeddings",
            json={"model": MODEL, "input": [SECRET_TEXT, "another"]},
            timeout=30,
        )
        tei_shaped = httpx.post(f"{tight_gateway.url}/embed", json={"inputs": "x"}, timeout=30)
    openai_error(openai_shaped, 504, "deadline_exceeded", "server_error")
    tei_error(tei_shaped, 504, "Unhealthy")
    give_up = time.monotonic() + 60
    while worker_outcomes(fleet.worker, "deadline_exceeded") < dropped + 2:
        assert time.monotonic() < give_up, "the worker never dropped the expired requests"
        time.sleep(0.2)
    after = httpx.post(
        f"{tight_gateway.url}/v1/embeddings", json={"model": MODEL, "input": "back"}, timeout=30
    )
    assert after.status_code == 200, after.text


# ---------------------------------------------------------------------------- metrics, logs


def test_metrics_count_requests_by_status(gateway: GatewayProcess) -> None:
    """kembed_gateway_requests_total{endpoint,model,status} counts each answer by status."""
    before = statuses_seen(gateway.url)
    url = f"{gateway.url}/v1/embeddings"
    assert httpx.post(url, json={"model": MODEL, "input": "x"}, headers=auth()).status_code == 200
    assert httpx.post(url, json={"model": MODEL, "input": "x"}).status_code == 401
    assert httpx.post(url, json={"model": "nope", "input": "x"}, headers=auth()).status_code == 404
    too_large = {"model": MODEL, "input": "x" * MAX_BODY_BYTES}
    assert httpx.post(url, json=too_large, headers=auth()).status_code == 413
    too_many = {"model": MODEL, "input": ["x"] * (MAX_INPUTS + 1)}
    assert httpx.post(url, json=too_many, headers=auth()).status_code == 400
    tei = httpx.post(f"{gateway.url}/embed", json={"inputs": []}, headers=auth())
    after = statuses_seen(gateway.url)
    for status in ("200", "400", "401", "404", "413", str(tei.status_code)):
        assert after.get(status, 0) >= before.get(status, 0) + 1, (status, before, after)
    samples = metric_samples(gateway.url, "kembed_gateway_requests_total")
    assert any(labels["model"] == MODEL and labels["status"] == "200" for labels, _ in samples)
    assert metric_samples(gateway.url, "kembed_gateway_request_seconds_count")


def test_logs_hold_no_request_text_and_no_api_key(
    gateway: GatewayProcess, tight_gateway: GatewayProcess
) -> None:
    """After answers and refusals of requests carrying SECRET_TEXT (above and here), with
    right and wrong keys, neither gateway's log holds the text or any key (though it logs
    these requests: it grows); the gateway without keys warned about it at start, the one
    with keys did not."""
    logged = len(gateway.log_text())
    for body, key in (
        ({"model": MODEL, "input": [SECRET_TEXT]}, KEY_FROM_ENV),
        ({"model": MODEL, "input": [SECRET_TEXT]}, WRONG_KEY),
        ({"model": "no-such-model", "input": [SECRET_TEXT]}, KEY_FROM_FILE),
        ({"model": MODEL, "input": [SECRET_TEXT], "dimensions": 1000}, KEY_FROM_ENV),
    ):
        httpx.post(f"{gateway.url}/v1/embeddings", json=body, headers=auth(key), timeout=60)
    httpx.post(
        f"{gateway.url}/embed",
        json={"inputs": f"{SECRET_TEXT} {long_text()}", "truncate": False},
        headers=auth(),
        timeout=60,
    )
    main, tight = gateway.log_text(), tight_gateway.log_text()
    assert len(main) > logged  # the refusals above were logged: the checks below can fail
    for log in (main, tight):
        assert SECRET_TEXT not in log
        assert "quokka" not in log
        for key in (KEY_FROM_ENV, KEY_FROM_FILE, WRONG_KEY):
            assert key not in log
    assert "gateway.no_api_keys" in tight
    assert "gateway.no_api_keys" not in main


# ---------------------------------------------------------------------------- no worker (last)


def test_with_no_worker_left_ready_fails_and_requests_get_503(
    fleet: Fleet, gateway: GatewayProcess, tight_gateway: GatewayProcess
) -> None:
    """The worker stops (withdrawing its catalog card): /ready turns 503 (/health stays
    200); TEI's /embed, which names no model, times out as 503 Unhealthy (no live worker
    reads its topic), not 504; OpenAI's request for the model is 404 model_not_found.
    Runs last: it stops the module's worker."""
    assert fleet.worker.stop() == 0
    give_up = time.monotonic() + 60
    while httpx.get(f"{tight_gateway.url}/ready").status_code != 503:
        assert time.monotonic() < give_up, "/ready never turned 503"
        time.sleep(0.2)
    assert httpx.get(f"{tight_gateway.url}/health").status_code == 200
    tei = httpx.post(f"{tight_gateway.url}/embed", json={"inputs": "x"}, timeout=30)
    tei_error(tei, 503, "Unhealthy")
    openai_shaped = httpx.post(
        f"{tight_gateway.url}/v1/embeddings", json={"model": MODEL, "input": "x"}, timeout=30
    )
    # docs/gateway.md: a model no live worker announces is 404 model_not_found (503
    # no_worker is for a request sent while the model was live, left unanswered by then).
    openai_error(openai_shaped, 404, "model_not_found", "invalid_request_error")
