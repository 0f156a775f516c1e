"""Retrieval over long documents: chunking versus truncation, through a real worker.

Long documents are built by concatenating STS-B sentences: each holds ``queries_per_doc``
first sentences of high-score pairs (gold >= 4, a paraphrase) at random places among
other STS-B sentences. Each pair's other sentence is a query whose right answer is the
document holding its paraphrase. The documents are ingested twice with the SDK's
``ingest()`` (bulk lane, results on a topic, rows built by the sink's ``rows_of``): with
``chunking`` (one row per chunk; a document scores its best chunk, max-sim) and without
(the worker truncates each document to the model's window; one row per document). The
queries are embedded with ``EmbedClient.embed``. Reported: top-1 document accuracy of both,
measured in the same run.

    python -m loadtest.chunk_retrieval [--docs 50] [--sentences-per-doc 40] [--queries-per-doc 6]
        [--chunk-tokens 128] [--chunk-overlap 16] [--out report.json]

:func:`measure` is the same measurement on a running broker and worker (the test runs a
small version of it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer

from loadtest.data import StsPair, load_stsb, stsb_sentences
from producer_sdk import Document, EmbedClient, ingest
from schemas import Chunking
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess
from sink.rows import Row, RowsOf, rows_of

__all__ = ["Corpus", "Outcome", "accuracy", "build_corpus", "long_document", "measure"]

RESULTS = "embed.results.chunk-retrieval"
HIGH_SCORE = 4.0


@dataclass(frozen=True)
class Corpus:
    documents: list[str]
    queries: list[str]
    answers: list[int]
    """``answers[q]``: the index of the document holding query ``q``'s paraphrase."""


@dataclass(frozen=True)
class Outcome:
    documents: int
    queries: int
    mean_words: float
    chunking: dict[str, int]
    chunks: int
    """Chunks the worker cut the documents into."""
    chunked_top1: float
    truncated_top1: float
    seconds: float


def build_corpus(docs: int, sentences_per_doc: int, queries_per_doc: int, seed: int = 0) -> Corpus:
    """``docs`` documents of ``sentences_per_doc`` STS-B sentences each, ``queries_per_doc``
    of them the first sentences of high-score pairs; the queries are the pairs' second
    sentences. No sentence of a chosen pair is used as filler, and no filler twice."""
    rng = random.Random(seed)
    pairs = _high_pairs()
    needed = docs * queries_per_doc
    if needed > len(pairs):
        raise ValueError(f"{needed} queries asked, STS-B has {len(pairs)} usable pairs")
    rng.shuffle(pairs)
    chosen = pairs[:needed]
    taken = {s for pair in pairs for s in (pair.first, pair.second)}
    fillers = [s for s in stsb_sentences() if s not in taken]
    rng.shuffle(fillers)
    per_doc = sentences_per_doc - queries_per_doc
    if per_doc < 0 or docs * per_doc > len(fillers):
        raise ValueError(f"not enough filler sentences for {docs} x {sentences_per_doc}")
    documents, queries, answers = [], [], []
    for d in range(docs):
        mine = chosen[d * queries_per_doc : (d + 1) * queries_per_doc]
        sentences = [p.first for p in mine] + fillers[d * per_doc : (d + 1) * per_doc]
        rng.shuffle(sentences)
        documents.append(" ".join(_ended(s) for s in sentences))
        queries += [p.second for p in mine]
        answers += [d] * len(mine)
    return Corpus(documents, queries, answers)


def long_document(words: int) -> str:
    """STS-B sentences in their stable order, joined until the text has ``words`` words."""
    out: list[str] = []
    count = 0
    for sentence in stsb_sentences():
        out.append(_ended(sentence))
        count += len(sentence.split())
        if count >= words:
            return " ".join(out)
    raise ValueError(f"STS-B has fewer than {words} words")


def _high_pairs() -> list[StsPair]:
    seen: set[str] = set()
    pairs = []
    for pair in load_stsb():
        if pair.score >= HIGH_SCORE and pair.first not in seen and pair.first != pair.second:
            seen.add(pair.first)
            pairs.append(pair)
    return pairs


def _ended(sentence: str) -> str:
    """A sentence with final punctuation, so the worker can cut chunks after it."""
    sentence = sentence.strip()
    return sentence if re.search(r"[.!?]$", sentence) else sentence + "."


def accuracy(
    queries: npt.NDArray[np.float32],
    documents: list[npt.NDArray[np.float32]],
    answers: list[int],
) -> float:
    """Top-1 accuracy: query ``q`` scores each document by its best row (inner product of
    unit vectors: cosine), and is right when the best document is ``answers[q]``."""
    scores = np.stack([(queries @ rows.T).max(axis=1) for rows in documents], axis=1)
    return float(np.mean(scores.argmax(axis=1) == np.asarray(answers)))


async def measure(
    bootstrap: str,
    corpus: Corpus,
    chunking: Chunking,
    *,
    results_topic: str = RESULTS,
    timeout: float = 600,
) -> Outcome:
    """Ingest the corpus with and without ``chunking`` (answers on ``results_topic``, which
    the worker may reply on), embed the queries, and score both."""
    started = time.monotonic()
    async with EmbedClient(bootstrap, timeout=timeout) as client:
        queries = await client.embed(corpus.queries)
        chunked = await _ingested(client, bootstrap, corpus, results_topic, chunking, timeout)
        truncated = await _ingested(client, bootstrap, corpus, results_topic, None, timeout)
    query_vectors = np.asarray(queries, dtype=np.float32)
    by_doc: dict[int, list[Row]] = {}
    for row in chunked:
        assert row.chunk_index is not None, "chunked ingestion must give chunk rows"
        by_doc.setdefault(int(row.document), []).append(row)
    chunk_vectors = [
        np.stack([row.dense for row in by_doc[d]]) for d in range(len(corpus.documents))
    ]
    single = {int(row.id): row.dense for row in truncated}
    doc_vectors = [single[d][None, :] for d in range(len(corpus.documents))]
    return Outcome(
        documents=len(corpus.documents),
        queries=len(corpus.queries),
        mean_words=float(np.mean([len(d.split()) for d in corpus.documents])),
        chunking={"max_tokens": chunking.max_tokens, "overlap_tokens": chunking.overlap_tokens},
        chunks=len(chunked),
        chunked_top1=accuracy(query_vectors, chunk_vectors, corpus.answers),
        truncated_top1=accuracy(query_vectors, doc_vectors, corpus.answers),
        seconds=time.monotonic() - started,
    )


async def _ingested(
    client: EmbedClient,
    bootstrap: str,
    corpus: Corpus,
    topic: str,
    chunking: Chunking | None,
    timeout: float,
) -> list[Row]:
    """Ingest the documents (ids 0..n-1) tagged with a fresh run id, and read back the
    rows of that run's results from ``topic``."""
    run = uuid.uuid4().hex
    documents = [Document(text, i) for i, text in enumerate(corpus.documents)]
    summary = await ingest(client, documents, reply_to=topic, chunking=chunking, meta={"run": run})
    return await _rows(bootstrap, topic, run, summary.requests, timeout)


async def _rows(bootstrap: str, topic: str, run: str, requests: int, timeout: float) -> list[Row]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    rows: list[Row] = []
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < requests:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {requests} results in {timeout:.0f} s")
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    outcome = rows_of(record.value, record.timestamp)
                    if not isinstance(outcome, RowsOf):
                        raise RuntimeError(f"{outcome.code}: {outcome.message}")
                    if outcome.rows and outcome.rows[0].metadata.get("run") == run:
                        rows += outcome.rows
                        seen += 1
    finally:
        await consumer.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.chunk_retrieval", description=__doc__)
    parser.add_argument("--docs", type=int, default=50)
    parser.add_argument("--sentences-per-doc", type=int, default=40)
    parser.add_argument("--queries-per-doc", type=int, default=6)
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--chunk-overlap", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    corpus = build_corpus(args.docs, args.sentences_per_doc, args.queries_per_doc, args.seed)
    chunking = Chunking(args.chunk_tokens, args.chunk_overlap)
    with (
        tempfile.TemporaryDirectory(prefix="kembed-chunk-retrieval-") as tmp,
        LocalKafka(Path(tmp) / "kafka", topics=(*DEFAULT_TOPICS, TopicSpec(RESULTS, 1))) as kafka,
    ):
        worker = WorkerProcess(
            kafka.bootstrap_servers,
            Path(tmp) / "worker.log",
            dtype="float32",
        )
        try:
            worker.wait_ready(timeout=300)
            outcome = asyncio.run(measure(kafka.bootstrap_servers, corpus, chunking))
        finally:
            worker.stop()
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    report.update(asdict(outcome))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(
        f"top-1 document accuracy over {outcome.queries} queries, {outcome.documents} "
        f"documents of ~{outcome.mean_words:.0f} words: chunking "
        f"{outcome.chunked_top1:.1%}, truncation {outcome.truncated_top1:.1%}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
