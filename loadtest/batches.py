"""Batch shapes of a run: how many batches, how full, how much padding.

The worker's come from its Prometheus metrics (read before and after a scenario, the
difference kept); the in-process path's from replaying kembed's batcher over the same
token lengths. Batches that are smaller or more padded in the worker (inputs arrive
gradually through Kafka) cost CPU per text that the in-process path does not pay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from worker.batcher import Batcher, Item

__all__ = ["BatchShapes", "from_metrics", "replay"]


@dataclass(frozen=True)
class BatchShapes:
    batches: float
    rows: float
    padded_tokens: float
    encoder_s: float | None = None  # encoder time, where measured

    def minus(self, earlier: BatchShapes) -> BatchShapes:
        encoder_s = (
            self.encoder_s - earlier.encoder_s
            if self.encoder_s is not None and earlier.encoder_s is not None
            else None
        )
        return BatchShapes(
            self.batches - earlier.batches,
            self.rows - earlier.rows,
            self.padded_tokens - earlier.padded_tokens,
            encoder_s,
        )

    def summary(self, real_tokens: int) -> dict[str, float | None]:
        """Mean rows per batch, mean padded tokens per batch, and the share of padded
        tokens that are real (``real_tokens``: the texts' token count)."""
        return {
            "batches": self.batches,
            "rows_per_batch": self.rows / self.batches if self.batches else 0.0,
            "padded_tokens_per_batch": self.padded_tokens / self.batches if self.batches else 0.0,
            "token_efficiency": real_tokens / self.padded_tokens if self.padded_tokens else 0.0,
            "encoder_s": self.encoder_s,
        }


def from_metrics(text: str, lane: str) -> BatchShapes:
    """Totals so far of ``lane``'s batches from the worker's ``/metrics`` exposition."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("lane") != lane:
                continue
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return BatchShapes(
        batches=sums.get("kembed_batch_size_count", 0.0),
        rows=sums.get("kembed_batch_size_sum", 0.0),
        padded_tokens=sums.get("kembed_batch_padded_tokens_sum", 0.0),
        encoder_s=sums.get("kembed_inference_seconds_sum", 0.0),
    )


def replay(lengths: Iterable[int], max_batch_tokens: int, max_batch_size: int) -> BatchShapes:
    """The batches kembed's batcher cuts from inputs of ``lengths`` tokens, all queued at
    once (as the in-process path queues them)."""
    batcher: Batcher[None] = Batcher(max_batch_tokens, max_batch_size)
    for index, length in enumerate(lengths):
        batcher.add(Item(None, index, [0] * length, 0.0))
    batches = rows = padded = 0
    while len(batcher):
        batch = batcher.next_batch()
        batches += 1
        rows += len(batch)
        padded += len(batch) * max(len(item.ids) for item in batch)
    return BatchShapes(batches, rows, padded)
