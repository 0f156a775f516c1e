"""Reranking through Kafka: a real worker serving two cross-encoders (built in the test:
random weights, the bundled tokenizer; one with sigmoid, one configured with tanh) and the
bundled embedding model, checked against sentence-transformers' CrossEncoder.predict on
the same directories.

The worker is fed raw rerank requests (schemas.encode_request) on its topics; the answers
are read from the results topic. One worker serves the whole module.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from schemas import (
    EmbedRequest,
    EmbedResult,
    ErrorCode,
    ErrorResult,
    RerankRequest,
    RerankResult,
    Result,
    decode_result,
    encode_request,
)
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.cross_encoder import build_cross_encoder
from tests.integration.kafka_io import collect, producer, read_all

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.rr.requests.{TAG}"
RERANK_TOPIC = f"test.rr.rerank.{TAG}"
RESULTS = f"test.rr.results.{TAG}"
MAX_LENGTH = 128
MAX_INPUT_CHARS = 70_000
TANH = "torch.nn.modules.activation.Tanh"
QUERY = "how do kafka consumer groups share the partitions of a topic"
WORDS = [
    "kafka",
    "broker",
    "partition",
    "consumer",
    "group",
    "offset",
    "commit",
    "log",
    "topic",
    "replica",
    "leader",
    "embedding",
    "vector",
    "model",
    "token",
    "batch",
    "query",
    "document",
    "score",
    "rank",
    "search",
    "index",
]


def _documents(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 30))) for _ in range(count)]


# Pairs over 128 tokens whose texts differ at both ends: the two truncation sides differ.
LONG_QUERY = "first query words " + "consumer group " * 30 + "last query words"
LONG_DOCUMENTS = [
    "opening of a document " + " ".join(_documents(1, seed) * 40) + " closing words"
    for seed in range(4)
]


@pytest.fixture(scope="module")
def rerankers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rerankers")
    return {
        "ce": build_cross_encoder(root / "ce", max_length=MAX_LENGTH),
        "ce-tanh": build_cross_encoder(
            root / "tanh", max_length=MAX_LENGTH, activation=TANH, seed=1
        ),
    }


@pytest.fixture(scope="module")
def rerank_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory, rerankers: dict[str, Path]
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(REQUESTS, 1), TopicSpec(RERANK_TOPIC, 1), TopicSpec(RESULTS, 1)])
    models = [
        {"model": "sentence-transformers/all-MiniLM-L6-v2", "name": "minilm"},
        {
            "model": str(rerankers["ce"]),
            "name": "ce",
            "requests_topic": RERANK_TOPIC,
            "bulk_topic": "",
        },
        {"model": str(rerankers["ce-tanh"]), "name": "ce-tanh", "kind": "rerank"},
    ]
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("rr") / "worker.log",
        models=json.dumps(models),
        dtype="float32",
        torch_compile="off",
        requests_topic=REQUESTS,
        bulk_topic="",
        results_topic=RESULTS,
        group_id=f"rr-{TAG}",
        max_input_chars=MAX_INPUT_CHARS,
    )
    process.wait_ready()
    yield process
    assert process.stop() == 0


def _predict(
    model_dir: Path, query: str, documents: Sequence[str], *, side: str = "right", raw: bool = False
) -> npt.NDArray[np.float32]:
    """sentence-transformers' scores for the pairs, fp32 on the CPU."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu")
    model.tokenizer.truncation_side = side
    pairs = [(query, document) for document in documents]
    options: dict[str, Any] = {"activation_fn": torch.nn.Identity()} if raw else {}
    scores: npt.NDArray[np.float32] = np.asarray(
        model.predict(pairs, batch_size=64, **options), dtype=np.float32
    )
    return scores


async def _send(
    kafka: LocalKafka, requests: Sequence[tuple[str, EmbedRequest | RerankRequest]]
) -> dict[str, list[Result]]:
    """Produce ``(topic, request)`` in order; every result under their ids, once all came."""
    ids = {request.id for _, request in requests}
    async with producer(kafka.bootstrap_servers) as client:
        for topic, request in requests:
            await client.send(topic, encode_request(request))
        await client.flush()

    def answered(records: list[Any]) -> bool:
        return ids <= {decode_result(r.value).id for r in records}

    records = await collect(kafka.bootstrap_servers, RESULTS, answered, timeout=90)
    results: dict[str, list[Result]] = {}
    for record in records:
        result = decode_result(record.value)
        if result.id in ids:
            results.setdefault(result.id, []).append(result)
    assert set(results) == ids, f"unanswered: {sorted(ids - set(results))}"
    return results


def _rerank(documents: Sequence[str], query: str = QUERY, **fields: Any) -> RerankRequest:
    return RerankRequest(
        id=f"rr-{uuid.uuid4().hex[:10]}",
        query=query,
        documents=tuple(documents),
        reply_to=RESULTS,
        **fields,
    )


async def _one(kafka: LocalKafka, request: RerankRequest, topic: str = REQUESTS) -> Result:
    (result,) = (await _send(kafka, [(topic, request)]))[request.id]
    return result


def _scores(result: Result) -> npt.NDArray[np.float32]:
    assert isinstance(result, RerankResult), result
    return np.frombuffer(result.scores, dtype="<f4")


def _check_order(
    result: RerankResult, reference: npt.NDArray[np.float32], top_n: int | None = None
) -> None:
    """``order`` is the worker's scores sorted (ties: lower index first), and agrees with
    the reference order except for swaps of documents whose reference scores are within
    1e-4 (random weights spread logits over about +-1)."""
    scores = _scores(result)
    expected = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:top_n]
    assert list(result.order) == expected
    for first, second in zip(result.order, result.order[1:], strict=False):
        assert reference[first] >= reference[second] - 1e-4


@pytest.mark.parametrize("count", [1, 100])
async def test_scores_equal_cross_encoder_predict(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path], count: int
) -> None:
    """1 and 100 documents on the reranker's own topic (no model named): fp32 scores within
    1e-4 of CrossEncoder.predict (sigmoid), the same order, one token count per pair."""
    documents = _documents(count)
    result = await _one(kafka, _rerank(documents), RERANK_TOPIC)
    assert isinstance(result, RerankResult)
    assert result.model == "ce"
    reference = _predict(rerankers["ce"], QUERY, documents)
    assert np.abs(_scores(result) - reference).max() < 1e-4
    _check_order(result, reference)
    assert len(result.order) == len(result.tokens) == count
    assert result.documents is None
    assert result.requested_ms is not None
    assert len(set(np.round(reference, 3))) > count // 2  # the scores do spread


@pytest.mark.parametrize("side", ["right", "left"])
async def test_long_pairs_are_truncated_at_the_requested_side(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path], side: str
) -> None:
    """Pairs over the model's 128 tokens, cut longest-first at either end: the scores of
    CrossEncoder with that truncation side, and every pair exactly 128 tokens."""
    request = _rerank(LONG_DOCUMENTS, LONG_QUERY, model="ce", truncation_direction=side)
    result = await _one(kafka, request)
    assert isinstance(result, RerankResult)
    reference = _predict(rerankers["ce"], LONG_QUERY, LONG_DOCUMENTS, side=side)
    other = _predict(
        rerankers["ce"], LONG_QUERY, LONG_DOCUMENTS, side="left" if side == "right" else "right"
    )
    assert np.abs(_scores(result) - reference).max() < 1e-4
    assert np.abs(reference - other).max() > 1e-3  # the sides really differ
    assert result.tokens == (MAX_LENGTH,) * len(LONG_DOCUMENTS)


async def test_top_n_return_documents_and_meta(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path]
) -> None:
    """top_n cuts the order (scores for all), return_documents gives the texts in that
    order, and meta comes back unchanged."""
    documents = _documents(12, seed=5)
    meta = {"trace": "t-1", "nested": {"a": [1, 2]}}
    request = _rerank(documents, model="ce", top_n=3, return_documents=True, meta=meta)
    result = await _one(kafka, request)
    assert isinstance(result, RerankResult)
    reference = _predict(rerankers["ce"], QUERY, documents)
    assert len(_scores(result)) == 12
    _check_order(result, reference, top_n=3)
    assert len(result.order) == 3
    assert result.documents == tuple(documents[i] for i in result.order)
    assert result.meta == meta


async def test_raw_scores_and_a_configured_activation(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path]
) -> None:
    """raw_scores: the logits (predict with Identity); a model configured with tanh: its
    scores through tanh, as CrossEncoder reads the same config."""
    documents = _documents(20, seed=7)
    raw = await _one(kafka, _rerank(documents, model="ce", raw_scores=True))
    tanh = await _one(kafka, _rerank(documents, model="ce-tanh"))
    raw_reference = _predict(rerankers["ce"], QUERY, documents, raw=True)
    assert np.abs(_scores(raw) - raw_reference).max() < 1e-4
    tanh_reference = _predict(rerankers["ce-tanh"], QUERY, documents)
    assert np.abs(_scores(tanh) - tanh_reference).max() < 1e-4
    assert (
        np.abs(
            tanh_reference - np.tanh(_predict(rerankers["ce-tanh"], QUERY, documents, raw=True))
        ).max()
        < 1e-5
    )
    assert isinstance(tanh, RerankResult)
    assert tanh.model == "ce-tanh"


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


async def test_a_64_kb_query_costs_one_window_not_one_per_document(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path]
) -> None:
    """A query of 64 KB with 512 documents (a request of about 80 KB): answered with the
    scores of CrossEncoder.predict (checked on a sample of the pairs), while the worker's
    peak memory grows by less than 200 MiB (tokenizing the query into every pair took a
    gigabyte, and tens of seconds of the tokenizer thread every model shares)."""
    query = " ".join(_documents(2000, seed=7))[: 64 * 1024]
    documents = _documents(512, seed=8)
    before = _peak_rss_mib(rerank_worker.process.pid)
    result = await _one(kafka, _rerank(documents, query, model="ce"))
    grown = _peak_rss_mib(rerank_worker.process.pid) - before
    assert isinstance(result, RerankResult)
    assert result.tokens == (MAX_LENGTH,) * len(documents)
    sample = list(range(0, 512, 37))
    reference = _predict(rerankers["ce"], query, [documents[i] for i in sample])
    assert np.abs(_scores(result)[sample] - reference).max() < 1e-4
    assert grown < 200, f"the worker's peak RSS grew by {grown:.0f} MiB"


async def test_a_text_over_max_input_chars_is_input_too_long(
    kafka: LocalKafka, rerank_worker: WorkerProcess
) -> None:
    """KEMBED_MAX_INPUT_CHARS (70,000 here): a longer document is input_too_long at its
    index, a longer query without one; a text of exactly the limit is scored."""
    over, at_limit = "w " * (MAX_INPUT_CHARS // 2) + "w", "w " * (MAX_INPUT_CHARS // 2)
    document = _rerank(["short", over], model="ce")
    query = _rerank(["short"], over, model="ce")
    fits = _rerank([at_limit], at_limit, model="ce")
    results = await _send(kafka, [(REQUESTS, document), (REQUESTS, query), (REQUESTS, fits)])
    for request, index, what in ((document, 1, "document"), (query, None, "query")):
        (error,) = results[request.id]
        assert isinstance(error, ErrorResult), error
        assert (error.error.code, error.error.index) == (ErrorCode.INPUT_TOO_LONG, index)
        assert f"the {what} has {MAX_INPUT_CHARS + 1} characters" in error.error.message
    (scored,) = results[fits.id]
    assert isinstance(scored, RerankResult)


async def test_errors_name_the_document_and_the_kind(
    kafka: LocalKafka, rerank_worker: WorkerProcess
) -> None:
    """truncate=false with an over-long pair: input_too_long at that document; a rerank
    request to the embedding model and an embed request to a reranker: invalid_request
    naming the model's kind."""
    too_long = _rerank(["short one", LONG_DOCUMENTS[0], "short two"], model="ce", truncate=False)
    to_embedder = _rerank(["a document"], model="minilm")
    to_reranker = EmbedRequest(
        id=f"e-{uuid.uuid4().hex[:8]}", inputs=("text",), model="ce", reply_to=RESULTS
    )
    results = await _send(
        kafka, [(REQUESTS, too_long), (REQUESTS, to_embedder), (RERANK_TOPIC, to_reranker)]
    )
    errors = {key: value[0] for key, value in results.items()}
    for error in errors.values():
        assert isinstance(error, ErrorResult), error
    long_error = errors[too_long.id]
    assert isinstance(long_error, ErrorResult)
    assert long_error.error.code == ErrorCode.INPUT_TOO_LONG
    assert long_error.error.index == 1
    embed_error = errors[to_embedder.id]
    assert isinstance(embed_error, ErrorResult)
    assert embed_error.error.code == ErrorCode.INVALID_REQUEST
    assert "minilm" in embed_error.error.message
    assert "kind embed" in embed_error.error.message
    rerank_error = errors[to_reranker.id]
    assert isinstance(rerank_error, ErrorResult)
    assert rerank_error.error.code == ErrorCode.INVALID_REQUEST
    assert "kind rerank" in rerank_error.error.message


async def test_mixed_traffic_is_answered_once_with_the_right_kind(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path], model_dir: Path
) -> None:
    """Rerank and embed requests of different sizes, interleaved on one topic: each is
    answered exactly once, with its own kind of result, and the rerank scores are right."""
    rng = random.Random(3)
    sent: list[tuple[str, EmbedRequest | RerankRequest]] = []
    for step in range(24):
        size = rng.randint(1, 40)
        if step % 2:
            sent.append((REQUESTS, _rerank(_documents(size, seed=step), model="ce")))
        else:
            texts = tuple(_documents(size, seed=100 + step))
            sent.append(
                (
                    REQUESTS,
                    EmbedRequest(id=f"e-{uuid.uuid4().hex[:10]}", inputs=texts, reply_to=RESULTS),
                )
            )
    results = await _send(kafka, sent)
    await asyncio.sleep(1)  # a duplicate would have been written by now
    ids = Counter(
        decode_result(r.value).id for r in await read_all(kafka.bootstrap_servers, RESULTS)
    )
    assert [ids[request.id] for _, request in sent] == [1] * len(sent)
    for _, request in sent:
        (result,) = results[request.id]
        if isinstance(request, RerankRequest):
            reference = _predict(rerankers["ce"], QUERY, request.documents)
            assert np.abs(_scores(result) - reference).max() < 1e-4
        else:
            assert isinstance(result, EmbedResult), result
            assert result.model == "minilm"
            assert result.count == len(request.inputs)


def test_info_and_the_log_say_which_kind_each_model_is(rerank_worker: WorkerProcess) -> None:
    """/info (the models' catalog descriptions): the rerankers are kind rerank, dim 1,
    pooling none, at the tokenizer's 128 tokens; the embedding model is kind embed. The
    rerankers are not tuned (the tuner compares vectors by cosine)."""
    with urllib.request.urlopen(f"{rerank_worker.http_url}/info", timeout=10) as response:
        info = json.loads(response.read())
    models = {model["name"]: model for model in info["models"]}
    for name in ("ce", "ce-tanh"):
        assert models[name]["kind"] == "rerank"
        assert (models[name]["dim"], models[name]["pooling"]) == (1, "none")
        assert models[name]["max_seq_length"] == MAX_LENGTH
    assert models["minilm"]["kind"] == "embed"
    assert models["minilm"]["dim"] == 384
    skipped = {
        event["model"] for event in rerank_worker.events() if event.get("event") == "tuning.skipped"
    }
    assert skipped == {"ce", "ce-tanh"}


async def test_the_benchmark_paths_agree_at_tiny_size(
    kafka: LocalKafka, rerank_worker: WorkerProcess, rerankers: dict[str, Path]
) -> None:
    """`python -m loadtest.rerank`'s two measurements, on this module's worker and model at
    tiny size: every request answered, and the same raw scores in-process and via Kafka.
    Figures are never asserted."""
    from loadtest.rerank import in_process, through_kafka, workload

    work = workload(2, 5, 20)
    seconds, tokens, local = in_process(rerankers["ce"], work, "float32")
    assert seconds > 0
    assert tokens > 0
    _, kafka_tokens, remote, errors = await through_kafka(
        kafka.bootstrap_servers, work, topic=RERANK_TOPIC, reply_topic=RESULTS
    )
    assert errors == 0
    assert kafka_tokens == tokens
    assert sorted(remote) == [0, 1]
    for index, scores in remote.items():
        assert np.abs(scores - local[index]).max() < 1e-4
