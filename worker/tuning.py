"""The worker's tuner: while (or before) a model serves, measure its variants (precision,
compilation; worker/encoder/autotune.py) on a thread of their own and install the fastest
that passes the quality gate. ``start_tuning`` starts it for all the worker's models;
``tuning_options`` says whether a model has anything to measure."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import Any

import structlog

from schemas import Kind
from worker.encoder import Encoder
from worker.metrics import Metrics
from worker.quality import GateThresholds, gate_pairs_path, load_pairs
from worker.served import ServedModel
from worker.settings import WorkerSettings
from worker.tokenization import TextTokenizer

__all__ = ["Tuner", "start_tuning", "tune_model", "tuning_options"]

log = structlog.get_logger("kembed.worker")


def tuning_options(settings: WorkerSettings, encoder: Encoder) -> list[Any]:
    """The candidates tune_model measures for a single-model ``settings`` (none to measure
    when the explicit settings leave only the variant already served)."""
    from worker.encoder.autotune import Candidate, candidates

    if settings.quantization != "none":
        return []
    from worker.encoder.torch_backend import TorchEncoder, bf16_supported

    if not isinstance(encoder, TorchEncoder):
        return []  # an encoder without variants (a benchmark's stand-in) serves as it is

    device = encoder.info.device.split(":")[0]
    bf16 = bf16_supported(device)
    options = candidates(settings.dtype, settings.torch_compile, device, bf16_supported=bf16)
    if options == [Candidate(encoder.info.dtype, encoder.info.compiled)]:
        return []
    if settings.tune_budget_s == 0 and len(options) > 1:
        return []  # no measuring: the safe variant stays
    return options


def tune_model(
    model: ServedModel,
    settings: WorkerSettings,
    on_encoder: Callable[[Callable[[], Any]], Any],
    result: Any,
    metrics: Metrics | None = None,
) -> Any:
    """Measure and install the fastest variant of ``model`` (worker/encoder/autotune.py).
    Blocking; runs on a thread of its own, ``on_encoder`` reaching the encoder thread."""
    from worker.encoder import autotune

    options = tuning_options(settings, model.encoder)
    tokenizer = model.tokenizer
    ids = [piece.ids for piece in tokenizer.encode(autotune.workload_texts())]
    workload = autotune.tuning_workload(ids, settings.max_batch_tokens, settings.max_batch_size)
    reference = [piece.ids for piece in tokenizer.encode(autotune.tuning_texts()[:48])]
    gate = _tuning_gate(settings, tokenizer) if settings.quality_gate else None

    def switched(candidate: Any) -> None:
        if metrics is not None:
            _set_phase(metrics, model.name, "compiled" if candidate.compiled else "tuning")

    outcome = autotune.tune(
        model.encoder,
        options,
        workload=workload,
        reference_ids=reference,
        min_mean_cosine=settings.quality_min_mean_cosine,
        budget_s=settings.tune_budget_s,
        on_encoder=on_encoder,
        result=result,
        on_switch=switched,
        gate=gate,
    )
    if metrics is not None:
        _set_phase(metrics, model.name, outcome.phase)
        for row in outcome.table:
            if row.texts_per_s is not None:
                metrics.tuning_texts_per_second.labels(model.name, row.candidate.name).set(
                    row.texts_per_s
                )
    return outcome


def _tuning_gate(settings: WorkerSettings, tokenizer: TextTokenizer) -> Any:
    """The quality gate (STS-B pairs) on a variant the tuner is about to install."""
    thresholds = GateThresholds(
        settings.quality_max_spearman_drop, settings.quality_min_mean_cosine
    )
    pairs = load_pairs(gate_pairs_path(settings.quality_gate_pairs))

    def gate(candidate: Any, reference: Any) -> str | None:
        from worker.quality import judge_embedders

        def embedder(embed: Any) -> Any:
            return lambda texts: embed([piece.ids for piece in tokenizer.encode(texts)])

        report = judge_embedders(pairs, embedder(reference), embedder(candidate), thresholds)
        return None if report.passed else report.summary()

    return gate


def _set_phase(metrics: Metrics, model: str, phase: str) -> None:
    for known in ("tuning", "eager", "compiled"):
        metrics.encoder_phase.labels(model, known).set(1.0 if known == phase else 0.0)


def start_tuning(
    models: list[ServedModel],
    settings: WorkerSettings,
    encode_thread: ThreadPoolExecutor,
    metrics: Metrics,
    tunings: dict[str, Any],
) -> Tuner | None:
    """Tune ``models`` one after the other on a thread of their own, while they serve."""
    from worker.encoder.autotune import TuningResult

    todo = []
    for model, spec in zip(models, settings.model_specs(), strict=True):
        model_settings = settings.for_model(spec)
        if model.kind != Kind.EMBED:
            # The tuner compares candidates' vectors by cosine to the served variant's; a
            # reranker's one logit per pair has no such check, so it serves as configured.
            log.info("tuning.skipped", model=model.name, kind=model.kind)
            _set_phase(metrics, model.name, "compiled" if model.encoder.info.compiled else "eager")
        elif tuning_options(model_settings, model.encoder):
            tunings[model.name] = TuningResult("tuning")
            _set_phase(metrics, model.name, "tuning")
            todo.append((model, model_settings))
        else:
            _set_phase(metrics, model.name, "compiled" if model.encoder.info.compiled else "eager")
    if not todo:
        return None

    stopping = threading.Event()

    def on_encoder(fn: Callable[[], Any]) -> Any:
        if stopping.is_set():
            raise _TunerStoppedError
        return encode_thread.submit(fn).result()

    def work() -> None:
        for model, model_settings in todo:
            try:
                tune_model(model, model_settings, on_encoder, tunings[model.name], metrics)
            except (_TunerStoppedError, CancelledError):
                return  # the worker is stopping
            except RuntimeError as exc:
                if "shutdown" in str(exc):  # the encoder thread is gone: stopping
                    return
                _tuning_failed(model, exc, tunings, metrics)
            except Exception as exc:  # noqa: BLE001 (the served variant stays; say why)
                _tuning_failed(model, exc, tunings, metrics)

    thread = Tuner(target=work, name="kembed-tuner", daemon=True)
    thread.stopping = stopping
    thread.start()
    return thread


class _TunerStoppedError(Exception):
    """The worker is stopping: the tuner leaves at its next step."""


class Tuner(threading.Thread):
    """The tuner's thread (:func:`start_tuning`)."""

    stopping: threading.Event

    def stop(self, timeout: float) -> None:
        """Ask the tuner to stop and wait for it (a compilation under way finishes)."""
        self.stopping.set()
        self.join(timeout)


def _tuning_failed(
    model: ServedModel, exc: Exception, tunings: dict[str, Any], metrics: Metrics
) -> None:
    phase = "compiled" if model.encoder.info.compiled else "eager"
    tunings[model.name].phase = phase
    _set_phase(metrics, model.name, phase)
    log.error("encoder.tuning_failed", model=model.name, error=type(exc).__name__, serving=phase)
