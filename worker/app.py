"""Composition root: builds the stages from settings, runs them, drains on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from worker.encoder import Encoder
from worker.kafka.publisher import KafkaPublisher, KafkaTransactionalPublisher
from worker.kafka.source import KafkaSource
from worker.observability.logging import configure_logging, redacted
from worker.pipeline import Pipeline
from worker.settings import WorkerSettings
from worker.tokenization import TextTokenizer

__all__ = ["load_model", "run_worker"]

log = structlog.get_logger("kembed.worker")

# Kafka's record overhead on top of the value, for the producer's request-size limit.
_RECORD_OVERHEAD = 64 * 1024


def load_model(settings: WorkerSettings) -> tuple[Encoder, TextTokenizer, frozenset[str]]:
    """Load the encoder and tokenizer, and the names requests may use for the model."""
    from worker.encoder.models import aliases_for, resolve_model_dir
    from worker.encoder.torch_backend import TorchEncoder, resolve_compile, resolve_device

    model_dir = resolve_model_dir(settings.model)
    probe = TextTokenizer.from_model_dir(model_dir, 512)
    encoder = TorchEncoder(
        model_dir,
        settings.served_name(),
        device=settings.device,
        dtype=settings.dtype,
        max_seq_length=settings.max_seq_length,
        pad_id=probe.pad_id,
        threads=settings.torch_threads,
        compile=resolve_compile(settings.torch_compile, resolve_device(settings.device)),
    )
    tokenizer = TextTokenizer.from_model_dir(model_dir, encoder.info.max_seq_length)
    names = frozenset({settings.served_name(), settings.model, *aliases_for(settings.model)})
    return encoder, tokenizer, names


def warm_up(encoder: Encoder, settings: WorkerSettings) -> None:
    """Run the largest batch shape once, so the first real request pays no start-up cost
    (and a compiled model is compiled now). Must run on the thread that will encode: torch's
    thread count is per thread, and a compiled graph is specialized on it."""
    length = encoder.info.max_seq_length
    rows = max(1, min(settings.max_batch_size, settings.max_batch_tokens // length))
    encoder.encode([[0] * length] * rows)
    encoder.encode([[0] * 8])  # a lone short text takes its own (single-thread) path


async def run_worker(settings: WorkerSettings) -> None:
    configure_logging(settings.log_level, settings.log_format)
    log.info("worker.starting", settings=redacted(settings.model_dump()))
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    encode_thread = ThreadPoolExecutor(1, thread_name_prefix="kembed-encoder")
    encoder, tokenizer, names = await loop.run_in_executor(encode_thread, load_model, settings)
    loaded = time.monotonic()
    await loop.run_in_executor(encode_thread, warm_up, encoder, settings)
    log.info(
        "model.loaded",
        model=encoder.info.name,
        dim=encoder.info.dim,
        dtype=encoder.info.dtype,
        device=encoder.info.device,
        max_seq_length=encoder.info.max_seq_length,
        pooling=encoder.info.pooling,
        compiled=encoder.info.compiled,
        load_s=round(loaded - started, 3),
        warmup_s=round(time.monotonic() - loaded, 3),
    )
    publisher = _publisher(settings)
    source = KafkaSource(
        settings.bootstrap_servers,
        [topic for topic in (settings.requests_topic, settings.bulk_topic) if topic],
        group_id=settings.group_id,
        client_id=settings.client_id,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        session_timeout_ms=settings.session_timeout_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    pipeline = Pipeline(
        source=source,
        publisher=publisher,
        tokenizer=tokenizer,
        encoder=encoder,
        settings=settings,
        model_names=names,
        encode_thread=encode_thread,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, pipeline, sig)
    await publisher.start()
    try:
        await source.start(pipeline.on_revoked, pipeline.on_assigned)
        log.info(
            "worker.started",
            topic=settings.requests_topic,
            bulk_topic=settings.bulk_topic,
            group_id=settings.group_id,
            delivery=settings.delivery,
        )
        try:
            await pipeline.run()
        finally:
            await source.stop()
    finally:
        await publisher.stop()
    log.info("worker.stopped")


def _publisher(settings: WorkerSettings) -> KafkaPublisher | KafkaTransactionalPublisher:
    max_request_size = settings.max_result_bytes + _RECORD_OVERHEAD
    if settings.delivery == "exactly_once":
        transactional_id = settings.resolved_transactional_id()
        log.info("transactions.enabled", transactional_id=transactional_id)
        return KafkaTransactionalPublisher(
            settings.bootstrap_servers,
            client_id=settings.client_id,
            linger_ms=settings.linger_ms,
            max_request_size=max_request_size,
            transactional_id=transactional_id,
            transaction_timeout_ms=settings.transaction_timeout_ms,
            warm_topics=[settings.results_topic, settings.dlq_topic],
        )
    return KafkaPublisher(
        settings.bootstrap_servers,
        client_id=settings.client_id,
        linger_ms=settings.linger_ms,
        max_request_size=max_request_size,
    )


def _stop(pipeline: Pipeline, sig: signal.Signals) -> None:
    log.info("worker.stopping", signal=sig.name)
    pipeline.stop()
