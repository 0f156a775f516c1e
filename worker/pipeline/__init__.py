"""The worker's data path: fetch -> decode -> tokenize -> batch -> encode -> publish -> commit.

One room per step a record takes (docs/design.md, "The worker's data path"):
:mod:`~worker.pipeline.admit`, :mod:`~worker.pipeline.inflight`,
:mod:`~worker.pipeline.batches`, :mod:`~worker.pipeline.settle`, wired by
:mod:`~worker.pipeline.lifecycle`. What a model's kind changes lives in :mod:`worker.kinds`.

Three loops share one event loop:

- fetch: polls records, decodes them, tokenizes accepted requests in a thread (interactive
  lane first), and queues their inputs in the lane scheduler; pauses a lane's partitions
  while that lane has too many inputs in flight;
- batch: keeps the encoder thread busy with exactly one batch prepared ahead of it; a
  prepared bulk batch yields to interactive work that becomes ready meanwhile. torch
  releases the GIL, so fetches, heartbeats and publishes go on during inference. A
  finished request is published by its own task. A batch whose encoder call fails is split
  in halves, retried ahead of new batches, until the failing input runs alone: only its
  request is answered ``internal``. Out of memory also lowers that lane's token budget for
  a while (the lane scheduler's :class:`worker.batcher.TokenBudget`);
- commit: the delivery strategy's loop (``worker.delivery``): at least once, it commits,
  per partition, up to the first record not yet answered (acknowledged by the broker), so a
  crash redelivers rather than loses; exactly once, it writes answers and offsets together
  in Kafka transactions.
"""

from __future__ import annotations

from worker.pipeline.lifecycle import Pipeline
from worker.served import ServedModel

__all__ = ["Pipeline", "ServedModel"]
