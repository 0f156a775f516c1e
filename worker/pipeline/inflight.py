"""In-flight accounting and backpressure: how many inputs (and tokens) each lane holds
accepted but unanswered, pausing a lane's partitions above ``max_inflight_inputs`` and
resuming them at half; and the backlog each lane has waiting (lag and in flight)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Set
from functools import partial

import structlog

from kembed_shared.ports import Source, TopicPartition
from worker.batcher import BULK, INTERACTIVE
from worker.metrics import Metrics

__all__ = ["InFlight"]

log = structlog.get_logger("kembed.worker")


class InFlight:
    def __init__(
        self, source: Source, bulk_topics: Set[str], max_inputs: int, metrics: Metrics
    ) -> None:
        self._source = source
        self._bulk_topics = bulk_topics
        self._max_inputs = max_inputs
        self._metrics = metrics
        self.inputs = {INTERACTIVE: 0, BULK: 0}  # inputs accepted and not answered
        self.tokens = {INTERACTIVE: 0, BULK: 0}  # their tokens, once tokenized
        self._tokens_per_request = {INTERACTIVE: 0.0, BULK: 0.0}  # moving average
        self._paused: set[str] = set()
        self._lags: dict[TopicPartition, int] = {}
        self.progress = asyncio.Event()
        """Set whenever a record is answered."""
        for lane in (INTERACTIVE, BULK):
            m = metrics
            m.inflight_inputs.labels(lane).set_function(partial(self.inputs.__getitem__, lane))
            m.inflight_tokens.labels(lane).set_function(partial(self.tokens.__getitem__, lane))
            m.paused_partitions.labels(lane).set_function(partial(self._paused_count, lane))
            m.backlog_tokens.labels(lane).set_function(partial(self._backlog_tokens, lane))

    def lane(self, topic: str) -> str:
        return BULK if topic in self._bulk_topics else INTERACTIVE

    def is_paused(self, lane: str) -> bool:
        return lane in self._paused

    def admit(self, lane: str, inputs: int) -> None:
        """``inputs`` more of ``lane`` in flight (negative: fewer, e.g. a request that
        becomes fewer chunks); pauses the lane's partitions above the limit."""
        self.inputs[lane] += inputs
        self.apply_backpressure(lane)

    def apply_backpressure(self, lane: str) -> None:
        if self.inputs[lane] > self._max_inputs and lane not in self._paused:
            self._paused.add(lane)
            self._source.pause(self._lane_partitions(lane))
            log.info("partitions.paused", lane=lane, in_flight_inputs=self.inputs[lane])

    def settled(self, lane: str, tokens: int) -> None:
        """A request of ``lane`` with ``tokens`` is done computing (its answer is on its way)."""
        self.tokens[lane] -= tokens
        average = self._tokens_per_request[lane]
        self._tokens_per_request[lane] = tokens if not average else 0.9 * average + 0.1 * tokens

    def answered(self, lane: str, inputs: int) -> None:
        """A record of ``lane`` with ``inputs`` was answered: resumes a paused lane at half
        the limit."""
        self.inputs[lane] -= inputs
        self.progress.set()
        if lane in self._paused and self.inputs[lane] <= self._max_inputs // 2:
            self._paused.discard(lane)
            self._source.resume(self._lane_partitions(lane))
            log.info("partitions.resumed", lane=lane, in_flight_inputs=self.inputs[lane])

    def _paused_count(self, lane: str) -> int:
        return len(self._lane_partitions(lane)) if lane in self._paused else 0

    def _lane_partitions(self, lane: str) -> set[TopicPartition]:
        return {tp for tp in self._source.assignment() if self.lane(tp[0]) == lane}

    async def lag_loop(self, every: float = 1.0) -> None:
        """Refresh the lag and backlog gauges from the consumer's fetch positions."""
        shown: set[TopicPartition] = set()
        while True:
            lags = self._source.lag()
            for tp in shown - lags.keys():
                with contextlib.suppress(KeyError):
                    self._metrics.consumer_lag.remove(tp[0], str(tp[1]))
            for (topic, partition), lag in lags.items():
                self._metrics.consumer_lag.labels(topic, str(partition)).set(lag)
            shown = set(lags)
            self._lags = lags
            await asyncio.sleep(every)

    def _backlog_tokens(self, lane: str) -> float:
        """Tokens waiting for this worker in ``lane``: unfetched requests (lag, as of the last
        refresh) at the average tokens per request seen, plus the tokens in flight now."""
        waiting = sum(lag for tp, lag in self._lags.items() if self.lane(tp[0]) == lane)
        return waiting * self._tokens_per_request[lane] + self.tokens[lane]
