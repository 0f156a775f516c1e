"""Hybrid retrieval through the whole pipeline: dense, sparse and their fusion in pgvector.

    python -m loadtest.hybrid [--docs 2000] [--queries 300] [--top-k 256] [--out DIR]

A local broker, a local PostgreSQL with pgvector, one worker (fp32, eager: no tuning runs
during the measurement) serving the bundled all-MiniLM-L6-v2 (``minilm``) and a
SPLADE-style sparse encoder (``splade``), and one
``kembed sink`` process writing one table. The corpus: the first sentences of STS-B test
pairs with gold >= 4 (paraphrases) among other STS-B sentences, ``--docs`` in all; each
pair's second sentence is a query whose right answer is its paraphrase's document.

1. **Ingest throughput, each kind.** ``ingest()`` of the corpus on the bulk lane, dense
   only, then sparse only (``dense=False``, ``top_k``) into the same table (one row per
   document then holds both); each timed from the first request to the sink's last row
   (``kembed_sink_rows_upserted_total``). Reported: documents/s of each, and sparse / dense.
2. **Retrieval quality.** The queries embedded both ways (``embed``, ``embed_sparse``),
   then per query the table's top 10 by the dense HNSW index (``vector <#> q``), by the
   sparse one (``sparse <#> q``), and their reciprocal-rank fusion (``1 / (60 + rank)``
   summed over both lists). Reported: top-1 accuracy, recall@10 and MRR@10 of each.

**The sparse model is not a trained SPLADE model** (no model hub here): it is the bundled
MiniLM's encoder with an untrained masked-LM head (the transform set to the identity, the
decoder tied to MiniLM's word embeddings, every term's bias lowered so that most weigh
zero), in sentence-transformers' SparseEncoder layout. Its cost per token is a real
SPLADE model of MiniLM's size (the encoder plus a 384 x 30,522 projection and the max
pooling), so the throughput figures hold; its term weights are not trained for retrieval,
so **its quality figures (sparse and fused) say nothing about SPLADE's**: they show the
mechanics work end to end. Dense quality is the bundled model's own.

Nothing is asserted; ``report.md`` and ``report.json`` go to ``--out`` (default
``loadtest/reports/hybrid-<time>``). :func:`measure` is the same measurement on a running
broker, database and worker (the test runs a small version of it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg

from loadtest.chunk_retrieval import HIGH_SCORE, Corpus
from loadtest.data import load_stsb, stsb_sentences
from loadtest.files import command_line, report_folder, save_report
from loadtest.pipeline import SinkProcess
from producer_sdk import Document, EmbedClient, SparseEmbeddings, ingest
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from scripts.worker_process import WorkerProcess

__all__ = ["Corpus", "Retrieval", "build_corpus", "main", "measure", "rrf", "scores"]

DEPTH = 10
"""Results per query and method (recall@10, MRR@10, the fused lists' depth)."""
RRF_K = 60
"""Reciprocal-rank fusion's constant (the usual 60)."""


@dataclass(frozen=True)
class Retrieval:
    top1: float
    recall_at_10: float
    mrr_at_10: float


def build_corpus(docs: int, queries: int, seed: int = 0) -> Corpus:
    """``docs`` distinct STS-B sentences, ``queries`` of them the first sentences of
    distinct high-score pairs (the queries their second sentences), the rest sentences of
    no chosen pair, shuffled."""
    rng = random.Random(seed)
    seen: set[str] = set()
    pairs = []
    for pair in load_stsb():
        first, second = pair.first.strip(), pair.second.strip()
        if pair.score >= HIGH_SCORE and first != second and not {first, second} & seen:
            seen.update((first, second))
            pairs.append((first, second))
    if queries > len(pairs) or queries > docs:
        raise ValueError(f"{queries} queries asked: STS-B has {len(pairs)} usable pairs")
    rng.shuffle(pairs)
    chosen = pairs[:queries]
    fillers = [s for s in stsb_sentences() if s.strip() not in seen]
    if docs - queries > len(fillers):
        raise ValueError(f"{docs} documents asked: STS-B has {len(fillers) + queries}")
    rng.shuffle(fillers)
    texts = [first for first, _ in chosen] + fillers[: docs - queries]
    order = list(range(docs))
    rng.shuffle(order)
    position = {original: new for new, original in enumerate(order)}
    return Corpus(
        documents=[texts[i] for i in order],
        queries=[second for _, second in chosen],
        answers=[position[q] for q in range(queries)],
    )


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[int]:
    """Reciprocal-rank fusion: the documents of ``rankings`` (each best first) ordered by
    the sum of ``1 / (k + rank)`` (rank from 1) over the rankings that hold them; ties by
    the best rank, then the document."""
    score: dict[int, float] = {}
    best: dict[int, int] = {}
    for ranking in rankings:
        for rank, doc in enumerate(ranking, start=1):
            score[doc] = score.get(doc, 0.0) + 1.0 / (k + rank)
            best[doc] = min(best.get(doc, rank), rank)
    return sorted(score, key=lambda doc: (-score[doc], best[doc], doc))


def scores(rankings: Sequence[Sequence[int]], answers: Sequence[int]) -> Retrieval:
    """Top-1 accuracy, recall@10 and MRR@10 of ``rankings[q]`` against ``answers[q]``."""
    top1 = recall = mrr = 0.0
    for ranking, answer in zip(rankings, answers, strict=True):
        head = list(ranking[:DEPTH])
        top1 += bool(head) and head[0] == answer
        if answer in head:
            recall += 1
            mrr += 1 / (head.index(answer) + 1)
    n = max(len(answers), 1)
    return Retrieval(top1 / n, recall / n, mrr / n)


def sparse_model(root: Path, bundled: Path, *, bias: float = -1.5) -> Path:
    """A SparseEncoder folder of MiniLM's size: the bundled model's encoder and an
    untrained masked-LM head (identity transform, decoder tied to the word embeddings,
    every term's bias ``bias``), SPLADE max pooling, a 256-token window."""
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

    hf = root / "minilm-mlm"
    config = BertConfig.from_pretrained(bundled)
    mlm = BertForMaskedLM(config)
    body = BertModel.from_pretrained(bundled, add_pooling_layer=False)
    mlm.bert.load_state_dict(body.state_dict())
    with torch.no_grad():
        transform = mlm.cls.predictions.transform
        transform.dense.weight.copy_(torch.eye(config.hidden_size))
        transform.dense.bias.zero_()
        mlm.cls.predictions.bias.fill_(bias)
    mlm.tie_weights()
    mlm.save_pretrained(hf)
    AutoTokenizer.from_pretrained(bundled).save_pretrained(hf)
    encoder = SparseEncoder(
        modules=[
            Transformer(str(hf), transformer_task="fill-mask", max_seq_length=256),
            SpladePooling("max"),
        ]
    )
    target = root / "minilm-splade"
    encoder.save(str(target))
    return target


async def measure(
    kafka: LocalKafka,
    postgres: LocalPostgres,
    corpus: Corpus,
    out: Path,
    *,
    dense_model: str = "minilm",
    sparse_model_name: str = "splade",
    bulk_topic: str = "embed.requests.bulk",
    requests_topic: str = "embed.requests",
    reply_topic: str = "embed.results",
    top_k: int = 256,
    timeout: float = 900,
) -> dict[str, Any]:
    """Ingest ``corpus`` dense then sparse through a ``kembed sink`` into a fresh table,
    embed the queries both ways, and score dense, sparse and fused retrieval."""
    tag = uuid.uuid4().hex[:8]
    results, table = f"embed.ingest.hybrid-{tag}", f"hybrid_{tag}"
    kafka.create_topics([TopicSpec(results, 4), TopicSpec(f"{results}.dlq", 1)])
    bootstrap = kafka.bootstrap_servers
    sink = SinkProcess(
        {
            "KEMBED_BOOTSTRAP_SERVERS": bootstrap,
            "KEMBED_SINK_TARGET": postgres.dsn,
            "KEMBED_SINK_TARGET_PASSWORD": postgres.password,
            "KEMBED_SINK_TABLE": table,
            "KEMBED_SINK_RESULTS_TOPIC": results,
            "KEMBED_SINK_GROUP_ID": f"hybrid-sink-{tag}",
            "KEMBED_SINK_HTTP_PORT": "0",
            "KEMBED_SINK_LOG_FORMAT": "json",
        },
        out / f"sink-{tag}.log",
    )
    documents = [Document(text, i) for i, text in enumerate(corpus.documents)]
    n = len(documents)
    try:
        sink.wait_ready(120)
        async with EmbedClient(
            bootstrap,
            bulk_topic=bulk_topic,
            requests_topic=requests_topic,
            reply_topic=reply_topic,
            timeout=timeout,
        ) as client:
            dense_s, dense_lag = await _timed_ingest(
                client, sink, results, documents, n, timeout, model=dense_model
            )
            sparse_s, sparse_lag = await _timed_ingest(
                client,
                sink,
                results,
                documents,
                2 * n,
                timeout,
                sparse_model=sparse_model_name,
                sparse_top_k=top_k,
                dense=False,
            )
            dense_queries = await client.embed(corpus.queries, model=dense_model)
            sparse_queries = await client.embed_sparse(
                corpus.queries, model=sparse_model_name, top_k=top_k
            )
    finally:
        sink.stop()
    with psycopg.connect(postgres.dsn, password=postgres.password, autocommit=True) as conn:
        both = conn.execute(
            f"SELECT count(*) FILTER (WHERE vector IS NOT NULL AND sparse IS NOT NULL), "
            f"count(*) FROM {table}"
        ).fetchone()
        dense_ranks = _dense_rankings(conn, table, np.asarray(dense_queries, np.float32))
        sparse_ranks = _sparse_rankings(conn, table, sparse_queries)
    fused = [rrf([d, s])[:DEPTH] for d, s in zip(dense_ranks, sparse_ranks, strict=True)]
    return {
        "documents": n,
        "queries": len(corpus.queries),
        "rows_with_both": both[0] if both else 0,
        "rows": both[1] if both else 0,
        "top_k": top_k,
        "ingest": {
            "dense_docs_per_s": n / dense_s,
            "sparse_docs_per_s": n / sparse_s,
            "sparse_vs_dense": dense_s / sparse_s,
            "dense_seconds": dense_s,
            "sparse_seconds": sparse_s,
            "dense_max_sink_lag": dense_lag,
            "sparse_max_sink_lag": sparse_lag,
        },
        "retrieval": {
            "dense": asdict(scores(dense_ranks, corpus.answers)),
            "sparse": asdict(scores(sparse_ranks, corpus.answers)),
            "rrf": asdict(scores(fused, corpus.answers)),
        },
        "mean_sparse_terms": float(np.mean(np.diff(sparse_queries.indptr))),
    }


async def _timed_ingest(
    client: EmbedClient,
    sink: SinkProcess,
    results: str,
    documents: list[Document],
    rows: int,
    timeout: float,
    **options: Any,
) -> tuple[float, float]:
    """Seconds from the first request until the sink (reading ``results``) has upserted
    ``rows`` in all, and the sink's largest consumer lag meanwhile (sampled every 0.1 s:
    near 0, the sink keeps up and the worker is the bound)."""
    started = time.perf_counter()
    await ingest(client, documents, batch_size=64, reply_to=results, **options)
    upserted, lag = sink.metrics()
    most = lag
    while upserted < rows:
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"{upserted:.0f} of {rows} rows after {timeout:.0f} s")
        if sink.process.poll() is not None:
            raise RuntimeError(f"the sink exited: see {sink.log_path}")
        await asyncio.sleep(0.1)
        upserted, lag = sink.metrics()
        most = max(most, lag)
    return time.perf_counter() - started, most


def _dense_rankings(
    conn: psycopg.Connection[Any], table: str, queries: npt.NDArray[np.float32]
) -> list[list[int]]:
    out = []
    for query in queries:
        literal = "[" + ",".join(map(repr, query.tolist())) + "]"
        rows = conn.execute(
            f"SELECT id FROM {table} WHERE vector IS NOT NULL "
            f"ORDER BY vector <#> %s::vector LIMIT {DEPTH}",
            [literal],
        ).fetchall()
        out.append([int(row[0]) for row in rows])
    return out


def _sparse_rankings(
    conn: psycopg.Connection[Any], table: str, queries: SparseEmbeddings
) -> list[list[int]]:
    out = []
    for ids, values in (queries[i] for i in range(len(queries))):
        terms = ",".join(f"{int(i) + 1}:{float(v)!r}" for i, v in zip(ids, values, strict=True))
        rows = conn.execute(
            f"SELECT id FROM {table} WHERE sparse IS NOT NULL "
            f"ORDER BY sparse <#> %s::sparsevec LIMIT {DEPTH}",
            [f"{{{terms}}}/{queries.vocab}"],
        ).fetchall()
        out.append([int(row[0]) for row in rows])
    return out


def _report(figures: dict[str, Any]) -> str:
    ingest_figures = figures["ingest"]
    lines = [
        "# Hybrid retrieval through the pipeline",
        "",
        f"`{figures['command']}` on {figures['cpu']}: {figures['documents']:,} documents, "
        f"{figures['queries']:,} paraphrase queries (STS-B test, gold >= 4), sparse top_k "
        f"{figures['top_k']}; {figures['rows_with_both']:,} of {figures['rows']:,} rows hold "
        "both kinds.",
        "",
        "| ingest (worker -> Kafka -> sink -> pgvector) | docs/s | sink's largest lag |",
        "| --- | --- | --- |",
        f"| dense (minilm) | {ingest_figures['dense_docs_per_s']:,.0f} | "
        f"{ingest_figures['dense_max_sink_lag']:,.0f} |",
        f"| sparse (SPLADE of MiniLM's size, top_k {figures['top_k']}) | "
        f"{ingest_figures['sparse_docs_per_s']:,.0f} | "
        f"{ingest_figures['sparse_max_sink_lag']:,.0f} |",
        f"| sparse / dense | {ingest_figures['sparse_vs_dense']:.2f}x | |",
        "",
        "| retrieval | top-1 | recall@10 | MRR@10 |",
        "| --- | --- | --- | --- |",
    ]
    for method, label in (("dense", "dense"), ("sparse", "sparse*"), ("rrf", "RRF fusion*")):
        r = figures["retrieval"][method]
        lines.append(
            f"| {label} | {r['top1']:.1%} | {r['recall_at_10']:.1%} | {r['mrr_at_10']:.3f} |"
        )
    lines += [
        "",
        "\\* The sparse model's masked-LM head is untrained (no trained SPLADE model can be "
        "had here): these figures show the pipeline works, not what SPLADE or fusion "
        "achieve. The dense figures are the bundled model's own.",
        "",
    ]
    return "\n".join(lines)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return f"{os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.hybrid", description=__doc__)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--top-k", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="the report's folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from worker.encoder.models import resolve_model_dir

    out = report_folder(args.out, "hybrid")
    corpus = build_corpus(args.docs, args.queries, args.seed)
    bundled = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    with tempfile.TemporaryDirectory(prefix="kembed-hybrid-") as tmp:
        root = Path(tmp)
        folder = sparse_model(root, bundled)
        models = json.dumps(
            [{"model": str(bundled), "name": "minilm"}, {"model": str(folder), "name": "splade"}]
        )
        with (
            LocalKafka(root / "kafka", topics=DEFAULT_TOPICS) as kafka,
            LocalPostgres() as postgres,
        ):
            worker = WorkerProcess(  # fp32 eager: no tuning competes with the measurement
                kafka.bootstrap_servers,
                out / "worker.log",
                dtype="float32",
                torch_compile="off",
                models=models,
            )
            try:
                worker.wait_ready(timeout=300)
                figures = asyncio.run(measure(kafka, postgres, corpus, out, top_k=args.top_k))
            finally:
                worker.stop()
    figures.update(command=command_line("loadtest.hybrid", args), cpu=_cpu())
    path = save_report(out, figures, _report(figures))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
