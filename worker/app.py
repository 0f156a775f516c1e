"""Composition root: builds the stages from settings, runs them, drains on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NamedTuple

import structlog

from kembed_shared.kafka.catalog import start_announcer
from kembed_shared.kafka.publisher import (
    DEFAULT_BATCH_BYTES,
    KafkaPublisher,
    KafkaTransactionalPublisher,
    ProducerOptions,
)
from kembed_shared.kafka.security import client_options
from kembed_shared.kafka.source import KafkaSource
from kembed_shared.observability.fatal import ExitCode, error_fields, loop_exception_handler
from kembed_shared.observability.logging import configure_logging, redacted
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import (
    http_endpoints,
    missing_topics_reporter,
    stop_on_signals,
)
from kembed_shared.ports import KafkaAccessError
from schemas import Kind
from worker.cache import VectorCache
from worker.encoder import Encoder, ModelInfo
from worker.metrics import Metrics
from worker.pipeline import Pipeline
from worker.quality import GateThresholds, QualityReport, gate_pairs_path, load_pairs, validate
from worker.served import ModelLoader, ServedModel, load_served_model
from worker.settings import ModelSpec, WorkerSettings
from worker.tuning import Tuner, start_tuning

__all__ = [
    "ModelLoadError",
    "ModelLoader",
    "QualityGateFailedError",
    "load_served_model",
    "run_worker",
]

log = structlog.get_logger("kembed.worker")

try:
    VERSION = version("kembed")
except PackageNotFoundError:  # run from a source tree that was never installed
    VERSION = "0+unknown"

# Kafka's record overhead on top of the value, for the producer's request-size limit.
_RECORD_OVERHEAD = 64 * 1024


def warm_up(encoder: Encoder, settings: WorkerSettings) -> None:
    """Run the largest batch shape once, so the first real request pays no start-up cost
    (and a compiled model is compiled now). Runs on the encoder thread, which sets torch's
    (process-wide) thread count per batch; a compiled graph is specialized on that count."""
    length = encoder.info.max_seq_length
    rows = max(1, min(settings.max_batch_size, settings.max_batch_tokens // length))
    encoder.encode([[0] * length] * rows)
    encoder.encode([[0] * 8])  # a lone short text takes its own (single-thread) path


async def run_worker(settings: WorkerSettings, *, load: ModelLoader = load_served_model) -> None:
    """Serve until SIGTERM (``load``: see :data:`ModelLoader`). Raises KafkaAccessError
    (after logging it) when Kafka rejects the worker's login or its principal lacks a right
    it needs, ModelLoadError (after logging model.load_failed) when a model cannot be
    loaded, before the consumer joins its group, and QualityGateFailedError when the
    quality gate is on and fails."""
    configure_logging(settings.log_level, settings.log_format)
    asyncio.get_running_loop().set_exception_handler(loop_exception_handler)
    log.info("worker.starting", version=VERSION, settings=redacted(settings.model_dump()))
    metrics = Metrics()
    probes = Probes(stuck_batch_s=settings.health_stuck_batch_s)
    if settings.compile_cache_dir:
        # inductor reads it when it first compiles (after this, in the tuner or warm-up).
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = settings.compile_cache_dir
    info: dict[str, Any] = worker_info(settings, None)
    async with http_endpoints(
        settings.http_host,
        settings.http_port,
        probes=probes,
        metrics=metrics,
        info=lambda: _live_info(info),
        log=log,
    ):
        try:
            await _serve(settings, metrics, probes, info, load)
        except KafkaAccessError as exc:
            log.error(f"kafka.{exc.kind}_failed", reason=exc.reason)
            raise
    log.info("worker.stopped")


def _topic_needs(settings: WorkerSettings) -> dict[str, set[str]]:
    """What the worker's principal must be allowed to do, per topic."""
    needs: dict[str, set[str]] = {}
    for topic in (topic for topics in settings.request_topics() for topic in topics):
        needs.setdefault(topic, set()).add("read")
    for topic in (settings.results_topic, settings.dlq_topic):
        needs.setdefault(topic, set()).add("write")
    return needs


async def _serve(
    settings: WorkerSettings,
    metrics: Metrics,
    probes: Probes,
    info: dict[str, Any],
    load: ModelLoader,
) -> None:
    security = client_options(settings)
    publisher = _publisher(settings, security)
    # Kafka first: a wrong password or a missing ACL fails in a second, not after the model
    # has loaded (and compiled).
    probes.phase = "connecting"
    await publisher.start()
    try:
        await publisher.check_access(_topic_needs(settings), settings.group_id)
        await _load_and_run(settings, publisher, security, metrics, probes, info, load)
    finally:
        await publisher.stop()


def _publisher(
    settings: WorkerSettings, security: dict[str, Any]
) -> KafkaPublisher | KafkaTransactionalPublisher:
    options: ProducerOptions = {
        "client_id": settings.client_id,
        "linger_ms": settings.linger_ms,
        # Results, and dead letters that copy a request of up to max_request_size.
        "max_request_size": (
            max(settings.max_result_bytes, settings.max_request_bytes) + _RECORD_OVERHEAD
        ),
        # Results gather in batches no larger than one result may be, which the topics accept.
        "batch_bytes": min(settings.max_result_bytes, DEFAULT_BATCH_BYTES),
        "security": security,
    }
    if settings.delivery == "exactly_once":
        transactional_id = settings.resolved_transactional_id()
        log.info("transactions.enabled", transactional_id=transactional_id)
        return KafkaTransactionalPublisher(
            settings.bootstrap_servers,
            transactional_id=transactional_id,
            transaction_timeout_ms=settings.transaction_timeout_ms,
            warm_topics=[settings.results_topic, settings.dlq_topic],
            **options,
        )
    return KafkaPublisher(settings.bootstrap_servers, **options)


async def _load_and_run(
    settings: WorkerSettings,
    publisher: KafkaPublisher | KafkaTransactionalPublisher,
    security: dict[str, Any],
    metrics: Metrics,
    probes: Probes,
    info: dict[str, Any],
    load: ModelLoader,
) -> None:
    loop = asyncio.get_running_loop()
    probes.phase = "loading"
    started = time.monotonic()
    encode_thread = ThreadPoolExecutor(1, thread_name_prefix="kembed-encoder")
    models: list[ServedModel] = []
    load_s = warmup_s = 0.0
    for spec in settings.model_specs():
        started = time.monotonic()
        try:
            model = await loop.run_in_executor(encode_thread, load, settings, spec)
            loaded = time.monotonic()
            probes.phase = "warming"
            await loop.run_in_executor(encode_thread, warm_up, model.encoder, settings)
        except Exception as exc:
            encode_thread.shutdown(wait=False)
            raise _load_failed(spec, probes.phase, exc) from exc
        warmed = time.monotonic()
        load_s, warmup_s = load_s + loaded - started, warmup_s + warmed - loaded
        models.append(model)
        _log_loaded(model, loaded - started, warmed - loaded)
        probes.phase = "loading"
    models = _distinct_names(models, settings)
    tunings: dict[str, Any] = {}
    info["_tunings"] = tunings
    if not settings.tune_in_background:
        # Measure (and compile) before joining: ready later, at full speed at once.
        probes.phase = "tuning"
        started = time.monotonic()
        before = start_tuning(models, settings, encode_thread, metrics, tunings)
        if before is not None:
            await loop.run_in_executor(None, before.join)
        warmup_s += time.monotonic() - started
    metrics.model_load_seconds.set(load_s)
    metrics.warmup_seconds.set(warmup_s)
    info.update(worker_info(settings, models))
    info["_served"] = {model.name: model.encoder for model in models}
    metrics.info.info({k: str(v) for k, v in info["model"].items()} | {"version": VERSION})
    if settings.quality_gate:
        probes.phase = "validating"
        for spec, model in zip(settings.model_specs(), models, strict=True):
            if model.kind != Kind.EMBED:  # STS-B cosines say nothing of a reranker's scores
                log.info("quality_gate.skipped", model=model.name, kind=model.kind)
                continue
            # The variant served now; the tuner gates a variant before installing it.
            served = model.encoder.info
            gated = settings.for_model(spec).model_copy(
                update={
                    "dtype": served.dtype,
                    "torch_compile": "on" if served.compiled else "off",
                }
            )
            report = await loop.run_in_executor(None, run_quality_gate, gated)
            fields = report.as_dict() | {"model": spec.served_name()}
            if not report.passed:
                log.error("quality_gate.failed", **fields)
                raise QualityGateFailedError(f"{spec.served_name()}: {report.summary()}")
            log.info("quality_gate.passed", **fields)
    if settings.model_check:
        probes.phase = "validating"
        await loop.run_in_executor(None, check_models, models)
    cache = await loop.run_in_executor(None, open_cache, settings, models, metrics)
    info["cache"] = {"max_bytes": settings.cache_bytes, "persisted": cache.persisted}
    try:
        serving = _Served(models, cache, encode_thread, tunings)
        await _join_and_serve(settings, publisher, security, metrics, probes, serving)
    finally:
        await loop.run_in_executor(None, cache.close)


class _Served(NamedTuple):
    models: list[ServedModel]
    cache: VectorCache
    encode_thread: ThreadPoolExecutor
    tunings: dict[str, Any]


def open_cache(
    settings: WorkerSettings, models: list[ServedModel], metrics: Metrics | None = None
) -> VectorCache:
    """The vector cache of ``settings``: the served models fingerprinted (every file read,
    once per load) and its persisted entries read back (blocking)."""
    cache = VectorCache(settings.cache_bytes, metrics)
    # A reranker's scores are not cached (a score belongs to a pair): nothing to key.
    served = [(m.name, m.encoder.info.path) for m in models if m.kind == Kind.EMBED]
    cache.prepare(directory for _, directory in served)
    if settings.cache_path and cache.enabled:
        cache.open(Path(settings.cache_path), served)
    return cache


async def _join_and_serve(
    settings: WorkerSettings,
    publisher: KafkaPublisher | KafkaTransactionalPublisher,
    security: dict[str, Any],
    metrics: Metrics,
    probes: Probes,
    served: _Served,
) -> None:
    loop = asyncio.get_running_loop()
    models, cache, encode_thread, tunings = served
    probes.phase = "joining"
    interactive_topics, bulk_topics = settings.request_topics()
    source = KafkaSource(
        settings.bootstrap_servers,
        interactive_topics + bulk_topics,
        settings,
        group_instance_id=settings.group_instance_id,
        security=security,
    )
    pipeline = Pipeline(
        source=source,
        publisher=publisher,
        models=models,
        settings=settings,
        encode_thread=encode_thread,
        metrics=metrics,
        cache=cache,
    )
    stop_on_signals(pipeline, probes, log, "worker")
    announcer = await start_announcer(settings, [m.description for m in models], security)
    tuner: Tuner | None = None
    try:
        await source.start(
            pipeline.on_revoked,
            pipeline.on_assigned,
            # The same KEMBED_* environment as this worker's names the same topics.
            on_missing=missing_topics_reporter(probes, log, "kembed topics create"),
            stopped=lambda: probes.phase == "draining",
        )
        probes.phase = "serving"
        if settings.tune_in_background:
            # After joining, so that compiling never delays readiness.
            tuner = start_tuning(models, settings, encode_thread, metrics, tunings)
        log.info(
            "worker.started",
            topics=interactive_topics,
            bulk_topics=bulk_topics,
            models=[model.name for model in models],
            group_id=settings.group_id,
            group_instance_id=settings.group_instance_id,
            delivery=settings.delivery,
        )
        try:
            await pipeline.run()
        finally:
            probes.phase = "stopped"
            if tuner is not None:
                await loop.run_in_executor(None, tuner.stop, settings.shutdown_timeout_s)
            await source.stop()
    finally:
        if announcer is not None:
            await announcer.stop()  # tombstones: the models leave the catalog at once


def _distinct_names(models: list[ServedModel], settings: WorkerSettings) -> list[ServedModel]:
    """Each name answers to one model. Configured names and aliases are distinct (the
    settings check that); a name a model gets implicitly (its path or hub id, the bundled
    model's aliases) goes to the first model that has it, unless it is configured for
    another model."""
    claimed = {n for spec in settings.model_specs() for n in (spec.served_name(), *spec.aliases)}
    given: set[str] = set()
    distinct = []
    for model, spec in zip(models, settings.model_specs(), strict=True):
        implicit = model.aliases - set(spec.aliases) - claimed - given
        given |= implicit
        distinct.append(replace(model, aliases=frozenset(spec.aliases) | implicit))
    return distinct


def _log_loaded(model: ServedModel, load_s: float, warmup_s: float) -> None:
    info = model.encoder.info
    log.info(
        "model.loaded",
        model=info.name,
        kind=model.kind,
        dim=info.dim,
        dtype=info.dtype,
        device=info.device,
        max_seq_length=info.max_seq_length,
        pooling=info.pooling,
        compiled=info.compiled,
        quantization=info.quantization,
        memory_mib=round(info.memory_bytes / 2**20, 1),
        prompts=sorted(model.prompts),
        default_prompt_name=model.default_prompt_name,
        load_s=round(load_s, 3),
        warmup_s=round(warmup_s, 3),
    )


class ModelLoadError(RuntimeError):
    """A model could not be loaded (or warmed up); the worker does not start."""


def _load_failed(spec: ModelSpec, phase: str, error: Exception) -> ModelLoadError:
    """Log why a model cannot be loaded, once, naming its path; the error to raise."""
    from worker.encoder.models import resolve_model_dir

    try:
        path = str(resolve_model_dir(spec.model))
    except Exception:  # noqa: BLE001 (unresolvable: the configured path is the one to name)
        path = spec.model
    cause = f"{type(error).__name__}: {error}"
    log.error(
        "model.load_failed",
        model=spec.served_name(),
        path=path,
        stage="warm_up" if phase == "warming" else "load",
        cause=cause,
        **error_fields(error),
        exit_code=int(ExitCode.STARTUP),
    )
    return ModelLoadError(f"{spec.served_name()} ({path}): {cause}")


class QualityGateFailedError(RuntimeError):
    """The configured precision failed the quality gate; the worker does not start."""


def check_models(models: Sequence[ServedModel]) -> None:
    """``kembed models check`` on each embedding model's folder (``model_check``):
    QualityGateFailedError if a text falls short, ModelLoadError without the reference."""
    from worker.model_check import THRESHOLD, ReferenceMissingError, check_model

    for model in (m for m in models if m.kind == Kind.EMBED):
        try:
            info = model.encoder.info
            side = model.tokenizer.direction
            report = check_model(info.path, model.name, pooling=info.pooling, direction=side)
        except ReferenceMissingError as exc:
            log.error("model_check.failed", model=model.name, cause=str(exc))
            raise ModelLoadError(f"{model.name}: {exc}") from None
        except Exception as exc:  # the reference could not embed the folder
            log.error("model_check.failed", model=model.name, **error_fields(exc))
            raise ModelLoadError(f"{model.name}: model check could not run: {exc}") from exc
        worst = report.worst
        fields = {"model": model.name, "texts": len(report.texts), "worst": worst.label}
        fields |= {"worst_cosine": round(worst.cosine, 7), "threshold": THRESHOLD}
        if not report.passed:
            log.error("model_check.failed", **fields)
            raise QualityGateFailedError(f"{model.name}: model check failed on {worst.label}")
        log.info("model_check.passed", **fields)


def run_quality_gate(settings: WorkerSettings) -> QualityReport:
    thresholds = GateThresholds(
        settings.quality_max_spearman_drop, settings.quality_min_mean_cosine
    )
    pairs = load_pairs(gate_pairs_path(settings.quality_gate_pairs))
    return validate(settings, pairs, thresholds)


def model_info(model: ServedModel) -> dict[str, Any]:
    """A served model as /info describes it: its description (what the model catalog
    says of it) and what only this worker knows."""
    info: ModelInfo = model.encoder.info
    return model.description.as_json() | {
        "compiled": info.compiled,
        "memory_bytes": info.memory_bytes,
        "truncation_direction": model.tokenizer.direction,
    }


def worker_info(settings: WorkerSettings, models: list[ServedModel] | None) -> dict[str, Any]:
    """What /info reports: built field by field from settings, so no secret can slip in.
    ``model`` is the default model (the first), ``models`` all of them."""
    described = [model_info(model) for model in models or []]
    return {
        "version": VERSION,
        "model": described[0] if described else None,
        "models": described,
        "served_names": sorted(
            {name for model in models or [] for name in (model.name, *model.aliases)}
        ),
        "batching": {
            "max_batch_tokens": settings.max_batch_tokens,
            "max_batch_size": settings.max_batch_size,
            "max_batch_wait_ms": settings.max_batch_wait_ms,
            "busy_bulk_batch_tokens": settings.busy_bulk_batch_tokens,
            "bulk_every": settings.bulk_every,
            "max_inflight_inputs": settings.max_inflight_inputs,
            "max_client_batch_size": settings.max_client_batch_size,
        },
        "topics": {
            "requests": settings.requests_topic,
            "bulk": settings.bulk_topic,
            "results": settings.results_topic,
            "dlq": settings.dlq_topic,
        },
        "cache": {"max_bytes": settings.cache_bytes, "persisted": bool(settings.cache_path)},
        "group_id": settings.group_id,
        "client_id": settings.client_id,
        "delivery": settings.delivery,
    }


def _live_info(info: dict[str, Any]) -> dict[str, Any]:
    """/info now: the static description, each model's dtype, compilation and tuning as
    they are at this moment (the tuner may have switched them)."""
    tunings: dict[str, Any] = info.get("_tunings", {})
    live = {key: value for key, value in info.items() if not key.startswith("_")}
    served = info.get("_served", {})
    models = []
    for model in live.get("models", []):
        entry = dict(model)
        encoder = served.get(model["name"])
        if encoder is not None:
            entry["dtype"], entry["compiled"] = encoder.info.dtype, encoder.info.compiled
        tuning = tunings.get(model["name"])
        entry["tuning"] = tuning.as_dict() if tuning is not None else None
        models.append(entry)
    live["models"] = models
    live["model"] = models[0] if models else None
    return live
