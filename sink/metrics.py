"""Every Prometheus metric of the sink, in one place (prefix ``kembed_sink_``).

The worker's conventions: an own registry per :class:`SinkMetrics`, counters exposed with
``_total``, no ``_created`` samples, served on ``/metrics`` with ``/health`` and ``/ready``.
"""

from __future__ import annotations

from kembed_shared.observability.metrics import CONTENT_TYPE, MetricsRegistry

__all__ = ["CONTENT_TYPE", "SINK_METRIC_NAMES", "SinkMetrics"]

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
)  # fmt: skip


class SinkMetrics(MetricsRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.info = self._info("kembed_sink", "Target kind, table, topic and group of this sink.")
        self.rows = self._counter(
            "kembed_sink_rows_upserted",
            "Rows written (inserted or replaced by id), by table.",
            ["table"],
        )
        self.results = self._counter(
            "kembed_sink_results",
            "Result messages consumed, by outcome: written, or the code they were "
            "dead-lettered with.",
            ["outcome"],
        )
        self.batches = self._counter(
            "kembed_sink_batches", "Batches committed (one transaction each)."
        )
        self.batch_rows = self._histogram(
            "kembed_sink_batch_rows",
            "Rows per batch transaction.",
            buckets=_SIZE_BUCKETS,
        )
        self.write_seconds = self._histogram(
            "kembed_sink_write_seconds",
            "Database time per batch: the transaction (Milvus: the upsert), retries included.",
            buckets=_WRITE_BUCKETS,
        )
        self.batch_seconds = self._histogram(
            "kembed_sink_batch_seconds",
            "Whole batch: decoding, the write, dead letters and the offset commit.",
            buckets=_WRITE_BUCKETS,
        )
        self.latency_seconds = self._histogram(
            "kembed_sink_latency_seconds",
            "End to end through the sink: from a result's produce timestamp to the commit of "
            "its rows.",
            buckets=_LATENCY_BUCKETS,
        )
        self.errors = self._counter(
            "kembed_sink_errors",
            "Problems by kind: error results (by wire code), messages the sink refused "
            "(invalid_result, unsupported_dtype, missing_keys, invalid_key, "
            "dimension_mismatch, write_refused), and write_retry (a transient write failure).",
            ["kind"],
        )
        self.dlq_messages = self._counter(
            "kembed_sink_dlq_messages",
            "Messages written to the sink's dead-letter topic, by reason code.",
            ["code"],
        )
        self.consumer_lag = self._gauge(
            "kembed_sink_consumer_lag",
            "Results in an assigned partition not yet fetched (high watermark - position).",
            ["topic", "partition"],
        )
        self.ready = self._gauge(
            "kembed_sink_ready", "1 when the sink is ready (the /ready endpoint)."
        )


#: The metric families a scrape exposes (counters with their ``_total`` samples).
SINK_METRIC_NAMES = (
    "kembed_sink_info",
    "kembed_sink_rows_upserted_total",
    "kembed_sink_results_total",
    "kembed_sink_batches_total",
    "kembed_sink_batch_rows",
    "kembed_sink_write_seconds",
    "kembed_sink_batch_seconds",
    "kembed_sink_latency_seconds",
    "kembed_sink_errors_total",
    "kembed_sink_dlq_messages_total",
    "kembed_sink_consumer_lag",
    "kembed_sink_ready",
)
