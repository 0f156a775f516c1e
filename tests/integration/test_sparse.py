"""Sparse (SPLADE-style) encoders served through Kafka by a real worker, held to
sentence-transformers' ``SparseEncoder.encode`` within 1e-4 per weight: tiny random-weight
masked-LM models in the SparseEncoder layout (tests/support/tiny_models.py ``splade``), max
and sum pooling, the model's ``max_active_dims`` and a request's ``top_k``, prompts, both
truncation sides on over-long texts, and mixed-length concurrent calls."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from producer_sdk import EmbedClient, EmbedError, SparseEmbeddings
from scripts.kafka_local import CATALOG_TOPIC_CONFIG, LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from tests.conftest import WorkerProcess
from tests.integration.sink_helpers import create_topics, pg_settings, start_sink, wait_drained
from tests.integration.test_gateway import GatewayProcess
from tests.support.tiny_models import splade

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.sparse.requests.{TAG}"
RESULTS = f"test.sparse.results.{TAG}"
CATALOG = f"test.sparse.catalog.{TAG}"
BULK = f"test.sparse.bulk.{TAG}"
INGEST = f"embed.ingest.sparse-{TAG}"  # an ingestion results topic: the sink's input


@pytest.fixture(scope="module")
def sparse_folders(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    return {
        "splade": splade(root, model_dir),
        "splade-sum": splade(root, model_dir, strategy="sum"),
        "splade-top16": splade(root, model_dir, top=16),
    }


@pytest.fixture(scope="module")
def sparse_worker(
    kafka: LocalKafka, sparse_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics(
        [
            TopicSpec(REQUESTS, 2),
            TopicSpec(RESULTS, 2),
            TopicSpec(CATALOG, 1, CATALOG_TOPIC_CONFIG),
            TopicSpec(f"{RESULTS}.gateway", 2),
            TopicSpec(BULK, 2),
        ]
    )
    models: list[dict[str, Any]] = [
        {"model": str(folder), "name": name} for name, folder in sparse_folders.items()
    ]
    models.append({"model": str(sparse_folders["splade"]), "name": "splade-left",
                   "truncation_direction": "left"})  # fmt: skip
    models.append({"model": "sentence-transformers/all-MiniLM-L6-v2", "name": "minilm"})
    process = WorkerProcess.serving(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("sparse-worker") / "worker.log",
        (REQUESTS, RESULTS),
        models=json.dumps(models),
        catalog_topic=CATALOG,
        bulk_topic=BULK,
    )
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def sparse_gateway(
    kafka: LocalKafka, sparse_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """TEI's /embed_sparse names no model: the gateway's sparse_model says which."""
    process = GatewayProcess.ready(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("sparse-gateway") / "gateway.log",
        requests_topic=REQUESTS,
        reply_topic=f"{RESULTS}.gateway",
        catalog_topic=CATALOG,
        sparse_model="splade",
        timeout_s=60,
    )
    yield process
    process.stop()


def _reference(
    path: Path,
    texts: list[str],
    *,
    side: str = "right",
    prompt_name: str | None = None,
    top_k: int | None = None,
) -> npt.NDArray[np.float32]:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu")
    model.tokenizer.truncation_side = side
    weights = model.encode(
        texts, prompt_name=prompt_name, max_active_dims=top_k, convert_to_tensor=True
    )
    return np.asarray(weights.to_dense().numpy(), dtype=np.float32)


def _check(answer: SparseEmbeddings, reference: npt.NDArray[np.float32]) -> None:
    dense = answer.to_dense()
    assert dense.shape == reference.shape
    assert float(np.abs(dense - reference).max()) <= 1e-4
    # The terms kept are the reference's (a weight under 1e-4 may fall either side of 0).
    for row in range(len(answer)):
        ids, values = answer[row]
        assert np.all(np.diff(ids.astype(np.int64)) > 0)  # ascending, distinct
        assert np.all(values > 0)
        expected = set(np.flatnonzero(reference[row] > 1e-4).tolist())
        assert expected <= set(ids.tolist()) <= set(np.flatnonzero(reference[row] > 0).tolist())


async def test_sparse_weights_equal_sentence_transformers_through_kafka(
    kafka: LocalKafka,
    sparse_worker: WorkerProcess,
    sparse_folders: dict[str, Path],
    family_mix: list[str],
) -> None:
    """Every model and option, asked concurrently (all texts at once and one text a call,
    interleaved, so batches mix lengths and complete out of order)."""
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("splade", {}, {}),
        ("splade-sum", {}, {}),
        ("splade-top16", {}, {"top_k": 16}),
        ("splade", {"top_k": 8}, {"top_k": 8}),
        ("splade", {"prompt_name": "query"}, {"prompt_name": "query"}),
        ("splade-left", {}, {"side": "left"}),
        ("splade", {"truncation_direction": "left"}, {"side": "left"}),
    ]
    async with EmbedClient(
        kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS
    ) as client:
        calls = []
        for model, options, _ in cases:
            calls.append(client.embed_sparse(family_mix, model=model, timeout=120, **options))
            calls.extend(
                client.embed_sparse([text], model=model, timeout=120, **options)
                for text in family_mix
            )
        answers = await asyncio.gather(*calls)
    per_case = 1 + len(family_mix)
    for i, (model, _, reference_options) in enumerate(cases):
        whole, *singles = answers[i * per_case : (i + 1) * per_case]
        folder = sparse_folders[model.removesuffix("-left")]
        reference = _reference(folder, family_mix, **reference_options)
        assert whole.model == model
        assert whole.vocab == 30522
        _check(whole, reference)
        for row, single in enumerate(singles):
            _check(single, reference[row : row + 1])
        if "top_k" in reference_options:
            assert max(np.diff(whole.indptr)) == reference_options["top_k"]
    # The options really change the weights, or the checks above could not tell them apart.
    plain = _reference(sparse_folders["splade"], family_mix)
    long = family_mix.index(max(family_mix, key=len))
    left = _reference(sparse_folders["splade"], family_mix, side="left")
    assert float(np.abs(plain[long] - left[long]).max()) > 1e-2
    summed = _reference(sparse_folders["splade-sum"], family_mix)
    assert float(np.abs(plain - summed).max()) > 1e-2


async def test_a_sparse_model_answers_only_sparse_requests(
    kafka: LocalKafka, sparse_worker: WorkerProcess
) -> None:
    """Vectors asked of a sparse encoder, and weights of an embedding model: each one
    invalid_request naming the model's kind, and the worker goes on serving."""
    async with EmbedClient(
        kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS
    ) as client:
        with pytest.raises(EmbedError, match="sparse") as vectors:
            await client.embed(["a text"], model="splade", timeout=60)
        with pytest.raises(EmbedError, match="embedding model") as weights:
            await client.embed_sparse(["a text"], model="minilm", timeout=60)
        assert vectors.value.code == weights.value.code == "invalid_request"
        answer = await client.embed_sparse(["still served"], model="splade", timeout=60)
    assert len(answer) == 1
    assert len(answer[0].indices) > 0


def test_tei_embed_sparse_answers_in_teis_shape(
    sparse_gateway: GatewayProcess, sparse_folders: dict[str, Path], family_mix: list[str]
) -> None:
    """``POST /embed_sparse`` as TEI answers it: per input a list of ``{index, value}``,
    equal to sentence-transformers within 1e-4; a prompt by name, the left end cut; TEI's
    error shape for an input over the window without ``truncate``."""
    with httpx.Client(base_url=sparse_gateway.url, timeout=90) as http:
        plain = http.post("/embed_sparse", json={"inputs": family_mix, "truncate": True})
        options = {"truncate": True, "truncation_direction": "Left", "prompt_name": "query"}
        one = http.post("/embed_sparse", json={"inputs": family_mix[5], **options})
        refused = http.post("/embed_sparse", json={"inputs": family_mix[5]})
    assert plain.status_code == 200, plain.text
    reference = _reference(sparse_folders["splade"], family_mix)
    answers = plain.json()
    assert len(answers) == len(family_mix)
    for row, entries in enumerate(answers):
        assert set(entries[0]) == {"index", "value"}
        ids = [entry["index"] for entry in entries]
        assert ids == sorted(ids)
        dense = np.zeros(30522, dtype=np.float32)
        dense[ids] = [entry["value"] for entry in entries]
        assert float(np.abs(dense - reference[row]).max()) <= 1e-4
    assert one.status_code == 200, one.text
    left = _reference(sparse_folders["splade"], family_mix[5:6], side="left", prompt_name="query")[
        0
    ]
    dense = np.zeros(30522, dtype=np.float32)
    dense[[e["index"] for e in one.json()[0]]] = [e["value"] for e in one.json()[0]]
    assert float(np.abs(dense - left).max()) <= 1e-4
    assert refused.status_code == 422, refused.text
    assert set(refused.json()) == {"error", "error_type"}


def _sparse_literal(ids: npt.NDArray[Any], values: npt.NDArray[Any], vocab: int) -> str:
    """pgvector's text form of a sparse vector (indices from 1)."""
    terms = ",".join(f"{int(i) + 1}:{float(v)!r}" for i, v in zip(ids, values, strict=True))
    return f"{{{terms}}}/{vocab}"


async def test_sparse_results_reach_postgres_beside_the_dense_ones_and_milvus(
    kafka: LocalKafka,
    postgres: LocalPostgres,
    sparse_worker: WorkerProcess,
    sparse_folders: dict[str, Path],
    family_mix: list[str],
    family_sentences: list[str],
    tmp_path: Path,
) -> None:
    """Documents ingested dense (the bundled model) and sparse (a tiny SPLADE model) on the
    bulk lane, in requests of mixed sizes interleaved on one ingestion topic, then a sparse
    re-ingestion of some documents with edited texts, written by a real ``kembed sink``
    into PostgreSQL: one row per key holds both vectors; each sparse vector is
    sentence-transformers' within 1e-4 (the edited ones the new text's, their dense vector
    the old text's: each kind keeps its own version); a query by a document's sparse vector
    (and by its dense one) finds that document first. Then a Milvus Lite sink on the same
    topic: its sparse companion collection holds the very terms PostgreSQL holds, and its
    search returns the document of the largest inner product."""
    create_topics(kafka, INGEST)
    texts = family_mix + list(dict.fromkeys(family_sentences[400:520]))[:113]  # distinct
    keys = [f"doc-{i}" for i in range(len(texts))]
    edited = {i: f"an edited passage about harbours and tides, number {i}" for i in (0, 5, 11)}
    requests = 0
    async with EmbedClient(
        kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS, bulk_topic=BULK
    ) as client:
        for start, size in ((0, 7), (7, 1), (8, 13), (21, 100)):
            part = slice(start, start + size)
            for model in ("splade", "minilm") if start % 2 else ("minilm", "splade"):
                submit = client.submit_sparse if model == "splade" else client.submit
                await submit(
                    texts[part],
                    keys=keys[part],
                    metadata=[{"n": i} for i in range(len(texts))][part],
                    reply_to=INGEST,
                    model=model,
                    bulk=True,
                )
                requests += 1
        await asyncio.sleep(0.01)  # the edit's version is newer than every other's
        await client.submit_sparse(
            list(edited.values()),
            keys=[keys[i] for i in edited],
            reply_to=INGEST,
            model="splade",
            bulk=True,
        )
        requests += 1
        query = await client.embed_sparse([texts[9]], model="splade", timeout=120)
        dense_query = await client.embed([texts[9]], model="minilm", timeout=120)
    group = f"sink-sparse-{TAG}"
    sink = start_sink(
        kafka,
        tmp_path / "sink.log",
        **pg_settings(postgres, "sparse_docs", INGEST, group),
        metric="cosine",
    )
    try:
        await wait_drained(kafka.bootstrap_servers, INGEST, group, requests, sink)
    finally:
        assert sink.stop() == 0
    with psycopg.connect(postgres.dsn, password=postgres.password) as conn:
        rows = conn.execute(
            "SELECT id, sparsevec_send(sparse), vector IS NOT NULL, model, sparse_model, "
            "metadata FROM sparse_docs"
        ).fetchall()
        ids, values = query[0]
        nearest = conn.execute(
            "SELECT id FROM sparse_docs ORDER BY sparse <=> %s::sparsevec LIMIT 1",
            [_sparse_literal(ids, values, query.vocab)],
        ).fetchone()
        vector = "[" + ",".join(map(repr, dense_query[0].tolist())) + "]"
        nearest_dense = conn.execute(
            "SELECT id FROM sparse_docs WHERE vector IS NOT NULL "
            "ORDER BY vector <=> %s::vector LIMIT 1",
            [vector],
        ).fetchone()
    assert nearest == nearest_dense == (keys[9],)
    stored = {row[0]: row[1:] for row in rows}
    assert set(stored) == set(keys)
    now = [edited.get(i, text) for i, text in enumerate(texts)]
    reference = _reference(sparse_folders["splade"], now)
    for i, key in enumerate(keys):
        raw, has_dense, model, sparse_model, metadata = stored[key]
        assert (has_dense, model, sparse_model) == (True, "minilm", "splade")
        assert metadata == ({} if i in edited else {"n": i})  # the newer write's metadata
        vocab, nnz, _ = np.frombuffer(raw[:12], ">i4")
        assert vocab == 30522
        weights = np.zeros(vocab, np.float32)
        weights[np.frombuffer(raw[12:], ">i4", nnz)] = np.frombuffer(raw[12 + 4 * nnz :], ">f4")
        assert float(np.abs(weights - reference[i]).max()) <= 1e-4, key
    # The same topic into Milvus Lite: the sparse companion collection holds the very terms
    # PostgreSQL holds (each document's newest sparse version), and a search finds doc 9.
    path = tmp_path / "sparse.db"
    milvus_group = f"sink-sparse-milvus-{TAG}"
    milvus_sink = start_sink(
        kafka,
        tmp_path / "milvus-sink.log",
        target=f"milvus://{path}",
        table="sparse_docs",
        results_topic=INGEST,
        group_id=milvus_group,
    )
    try:
        await wait_drained(kafka.bootstrap_servers, INGEST, milvus_group, requests, milvus_sink)
    finally:
        assert milvus_sink.stop() == 0  # the Lite file is free for this process afterwards
    from pymilvus import MilvusClient

    client = MilvusClient(str(path))
    try:
        client.load_collection("sparse_docs_sparse")
        client.load_collection("sparse_docs")
        hits = client.query(
            "sparse_docs_sparse", filter='id != ""', output_fields=["sparse"], limit=1000
        )
        found = client.search(
            "sparse_docs_sparse",
            data=[dict(zip(ids.tolist(), values.tolist(), strict=True))],
            anns_field="sparse",
            limit=1,
            search_params={"metric_type": "IP"},
        )
        dense_count = len(client.query("sparse_docs", filter='id != ""', limit=1000))
    finally:
        client.close()
    assert dense_count == len(keys)
    assert {hit["id"] for hit in hits} == set(keys)
    for hit in hits:
        raw = stored[hit["id"]][0]
        nnz = int(np.frombuffer(raw[4:8], ">i4")[0])
        terms = sorted(hit["sparse"].items())
        assert [i for i, _ in terms] == np.frombuffer(raw[12:], ">i4", nnz).tolist()
        milvus_values = np.array([v for _, v in terms], np.float32)
        assert (
            milvus_values.tobytes()
            == np.frombuffer(raw[12 + 4 * nnz :], ">f4").astype(np.float32).tobytes()
        ), hit["id"]
    # Inner product, the only sparse metric Milvus has: its best match is the document with
    # the largest inner product with the query over the stored terms (computed here).
    query_dense = np.zeros(30522, np.float32)
    query_dense[ids] = values
    products = {}
    for key in keys:
        raw = stored[key][0]
        nnz = int(np.frombuffer(raw[4:8], ">i4")[0])
        doc_ids = np.frombuffer(raw[12:], ">i4", nnz)
        products[key] = float(query_dense[doc_ids] @ np.frombuffer(raw[12 + 4 * nnz :], ">f4"))
    assert found[0][0]["id"] == max(products, key=products.__getitem__)
    assert found[0][0]["distance"] == pytest.approx(max(products.values()), rel=1e-4)


async def test_the_hybrid_benchmark_ingests_both_kinds_and_scores_three_rankings(
    kafka: LocalKafka, postgres: LocalPostgres, sparse_worker: WorkerProcess, tmp_path: Path
) -> None:
    """``loadtest.hybrid.measure`` on a small corpus (the tiny SPLADE model standing in):
    every document's row holds both kinds, each kind's ingest rate is measured, and the
    dense ranking of the bundled model finds most paraphrases (its quality is real; the
    sparse and fused figures are mechanics only)."""
    from loadtest.hybrid import build_corpus, measure

    corpus = build_corpus(120, 40, seed=1)
    figures = await measure(
        kafka,
        postgres,
        corpus,
        tmp_path,
        bulk_topic=BULK,
        requests_topic=REQUESTS,
        reply_topic=RESULTS,
        top_k=64,
        timeout=300,
    )
    assert (figures["rows"], figures["rows_with_both"]) == (120, 120)
    assert figures["ingest"]["dense_docs_per_s"] > 0
    assert figures["ingest"]["sparse_docs_per_s"] > 0
    assert 0 < figures["mean_sparse_terms"] <= 64
    retrieval = figures["retrieval"]
    assert retrieval["dense"]["top1"] >= 0.7
    assert retrieval["dense"]["recall_at_10"] >= retrieval["dense"]["top1"]
    for method in ("sparse", "rrf"):
        assert 0 <= retrieval[method]["top1"] <= retrieval[method]["recall_at_10"] <= 1
