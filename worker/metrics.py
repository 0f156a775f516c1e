"""Every Prometheus metric of the worker, in one place (prefix ``kembed_``).

Buckets are chosen per metric from what the worker does: batch shapes in powers of two up
to the largest budgets, times from a millisecond (a lone short text on a GPU) to a minute
(a backlog's queue time). Each :class:`Metrics` has its own registry, so tests and
several workers in one process never share counters.

Outcome labels are ``ok`` or a wire error code (``invalid_request``, ``deadline_exceeded``
...); lanes are ``interactive`` and ``bulk``.
"""

from __future__ import annotations

from prometheus_client import disable_created_metrics

from kembed_shared.observability.metrics import CONTENT_TYPE, MetricsRegistry

__all__ = ["CONTENT_TYPE", "METRIC_NAMES", "Metrics"]

# The *_created samples double a scrape's size and no dashboard uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]


_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
_RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_INFERENCE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_WAIT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
)  # fmt: skip


class Metrics(MetricsRegistry):
    """The worker's metrics, registered in their own registry."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self._info("kembed_worker", "Version, model and precision of this worker.")
        self.requests = self._counter(
            "kembed_requests",
            "Requests answered, by model and outcome (ok or an error code).",
            ["model", "outcome"],
        )
        self.inputs = self._counter(
            "kembed_inputs",
            "Inputs (texts) of answered requests, by model and outcome.",
            ["model", "outcome"],
        )
        self.tokens = self._counter(
            "kembed_tokens",
            "Tokens (after truncation) of answered requests, by model and outcome.",
            ["model", "outcome"],
        )
        self.batch_size = self._histogram(
            "kembed_batch_size",
            "Inputs per encoder batch; the count is the number of batches run.",
            ["lane"],
            buckets=_SIZE_BUCKETS,
        )
        self.batch_padded_tokens = self._histogram(
            "kembed_batch_padded_tokens",
            "Padded tokens per batch (inputs x longest input): the cost the encoder pays.",
            ["lane"],
            buckets=_TOKEN_BUCKETS,
        )
        self.batch_padding_ratio = self._histogram(
            "kembed_batch_padding_ratio",
            "Share of a batch's padded tokens that are padding (0: none wasted).",
            ["lane"],
            buckets=_RATIO_BUCKETS,
        )
        self.queue_seconds = self._histogram(
            "kembed_queue_seconds",
            "Time an input waited between tokenization and the start of its batch.",
            ["lane"],
            buckets=_WAIT_BUCKETS,
        )
        self.inference_seconds = self._histogram(
            "kembed_inference_seconds",
            "Encoder time per batch.",
            ["lane"],
            buckets=_INFERENCE_BUCKETS,
        )
        self.batch_splits = self._counter(
            "kembed_batch_splits",
            "Batches that failed and were split in two halves to retry, by lane and reason "
            "(out_of_memory or error).",
            ["lane", "reason"],
        )
        self.effective_batch_tokens = self._gauge(
            "kembed_effective_batch_tokens",
            "Token budget batches are cut at now: max_batch_tokens, or less for a while "
            "after a batch ran out of memory.",
            ["model", "lane"],
        )
        self.latency_seconds = self._histogram(
            "kembed_request_latency_seconds",
            "End to end: from the request's record timestamp (the broker's append time on "
            "LogAppendTime topics, as planned) to the broker's acknowledgement of its answer.",
            ["lane"],
            buckets=_WAIT_BUCKETS,
        )
        self.inflight_inputs = self._gauge(
            "kembed_inflight_inputs",
            "Inputs accepted and not yet answered.",
            ["lane"],
        )
        self.inflight_tokens = self._gauge(
            "kembed_inflight_tokens",
            "Tokens of inputs accepted and not yet answered.",
            ["lane"],
        )
        self.consumer_lag = self._gauge(
            "kembed_consumer_lag",
            "Messages in an assigned partition not yet fetched (high watermark - position).",
            ["topic", "partition"],
        )
        self.backlog_tokens = self._gauge(
            "kembed_backlog_tokens",
            "Estimated tokens of work waiting for this worker: lag x the average tokens "
            "per request seen, plus the tokens in flight. Sum over workers to autoscale.",
            ["lane"],
        )
        self.dlq_messages = self._counter(
            "kembed_dlq_messages",
            "Messages written to the dead-letter topic, by reason code.",
            ["code"],
        )
        self.publish_retries = self._counter(
            "kembed_publish_retries",
            "Publish attempts that failed transiently and were retried.",
        )
        self.model_load_seconds = self._gauge(
            "kembed_model_load_seconds", "Time taken to load the model."
        )
        self.warmup_seconds = self._gauge(
            "kembed_warmup_seconds",
            "Time taken to warm the model up (and compile it, when compiled).",
        )
        self.encoder_phase = self._gauge(
            "kembed_encoder_phase",
            "1 for each model's current encoder phase: tuning (serving a safe variant while "
            "measuring and compiling the others), eager or compiled (what it serves).",
            ["model", "phase"],
        )
        self.tuning_texts_per_second = self._gauge(
            "kembed_tuning_texts_per_second",
            "Texts/s each candidate variant (dtype/eager|compiled) reached when measured at "
            "start-up.",
            ["model", "candidate"],
        )
        self.paused_partitions = self._gauge(
            "kembed_paused_partitions",
            "Partitions paused by backpressure.",
            ["lane"],
        )
        self.cache_hits = self._counter(
            "kembed_cache_hits",
            "Inputs answered from the vector cache (no tokenizer, no encoder), by model.",
            ["model"],
        )
        self.cache_misses = self._counter(
            "kembed_cache_misses",
            "Inputs looked up in the vector cache and not found (encoded), by model.",
            ["model"],
        )
        self.cache_evictions = self._counter(
            "kembed_cache_evictions",
            "Vector cache entries dropped to stay within cache_bytes (least recently used "
            "first), by model.",
            ["model"],
        )
        self.cache_bytes = self._gauge(
            "kembed_cache_bytes",
            "Memory held by the vector cache's entries (keys, vectors, bookkeeping), by model.",
            ["model"],
        )
        self.cache_entries = self._gauge(
            "kembed_cache_entries", "Vectors in the vector cache, by model.", ["model"]
        )
        self.cache_write_drops = self._counter(
            "kembed_cache_write_drops",
            "Vector cache changes (entries added, used or evicted) that never reached the "
            "persisted file, by reason: queue_full (the writer was behind by more than its "
            "queue holds) or write_failed (the transaction failed: disk full, a lock).",
            ["reason"],
        )
        for reason in ("queue_full", "write_failed"):
            self.cache_write_drops.labels(reason)
        self.ready = self._gauge(
            "kembed_ready", "1 when the worker is ready (the /ready endpoint)."
        )


#: The metric families a scrape exposes (counters with their ``_total`` samples).
METRIC_NAMES = (
    "kembed_worker_info",
    "kembed_requests_total",
    "kembed_inputs_total",
    "kembed_tokens_total",
    "kembed_batch_size",
    "kembed_batch_padded_tokens",
    "kembed_batch_padding_ratio",
    "kembed_queue_seconds",
    "kembed_inference_seconds",
    "kembed_batch_splits_total",
    "kembed_effective_batch_tokens",
    "kembed_request_latency_seconds",
    "kembed_inflight_inputs",
    "kembed_inflight_tokens",
    "kembed_consumer_lag",
    "kembed_backlog_tokens",
    "kembed_dlq_messages_total",
    "kembed_publish_retries_total",
    "kembed_model_load_seconds",
    "kembed_warmup_seconds",
    "kembed_encoder_phase",
    "kembed_tuning_texts_per_second",
    "kembed_paused_partitions",
    "kembed_cache_hits_total",
    "kembed_cache_misses_total",
    "kembed_cache_evictions_total",
    "kembed_cache_bytes",
    "kembed_cache_entries",
    "kembed_cache_write_drops_total",
    "kembed_ready",
)
