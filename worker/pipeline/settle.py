"""Settling: a finished job becomes its kind's result (or an error) and goes to delivery,
once; rejected and dead-lettered records are answered the same way. Each answer counts in
the metrics and releases its inputs from the in-flight accounting."""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog

from kembed_shared.observability.logging import record_fields
from kembed_shared.ports import Record
from schemas import ErrorInfo, TokenizerRequest
from worker.decode import Limits, Rejected
from worker.delivery import Delivery
from worker.kinds import kind_of
from worker.kinds.requests import request_keys
from worker.metrics import Metrics
from worker.pipeline.inflight import InFlight
from worker.pipeline.jobs import Job
from worker.pipeline.tasks import Tasks
from worker.publish import encode_error
from worker.replies import ReplyTo

__all__ = ["Settlement"]

log = structlog.get_logger("kembed.worker")


@dataclass(slots=True, eq=False)
class Settlement:
    delivery: Delivery
    inflight: InFlight
    limits: Limits
    metrics: Metrics
    tasks: Tasks
    max_result_bytes: int

    def settle(self, job: Job, error: ErrorInfo | None = None) -> None:
        """Publish a job's result (or ``error``) once, whatever happens to its other inputs."""
        if job.settled:
            return
        job.settled = True
        request = job.request
        if error is not None:
            value = encode_error(request.id, error, request_keys(request), request.meta)
        else:
            value = kind_of(job.model).result(job, self.max_result_bytes)
        reply = ReplyTo(request.id, request.reply_to, request.reply_partition, job.lane)
        outcome = "ok" if error is None else str(error.code)
        tokens = sum(job.tokens)
        self.inflight.settled(job.lane, tokens)
        self.tasks.spawn(
            self._answer(
                job.record, reply, value, job.lane, job.model.name, len(job.tokens), outcome, tokens
            )
        )

    def answer(
        self, record: Record, request: TokenizerRequest, value: bytes, model: str, outcome: str
    ) -> None:
        """Publish ``value``, the result a request answered without the encoder (a tokenize
        or decode request), which was never counted in flight."""
        lane = self.inflight.lane(record.topic)
        reply = ReplyTo(request.id, request.reply_to, request.reply_partition, lane)
        self.tasks.spawn(self._answer(record, reply, value, lane, model, 0, outcome, 0))

    def reject(
        self, record: Record, rejected: Rejected, reserved: int = 0, model: str | None = None
    ) -> None:
        """Answer with an error; ``reserved`` inputs of the request were counted in flight.
        ``model``: the request's model, when known (metrics count the error under it)."""
        log.info(
            "request.rejected",
            request_id=rejected.request_id,
            code=str(rejected.error.code),
            index=rejected.error.index,
            **record_fields(record),
        )
        value = encode_error(rejected.request_id, rejected.error, rejected.keys, rejected.meta)
        lane = self.inflight.lane(record.topic)
        reply = ReplyTo(rejected.request_id, rejected.reply_to, rejected.reply_partition, lane)
        outcome = str(rejected.error.code)
        if model is None:
            default = self.limits.model_for(None, record.topic)
            model = default.name if default is not None else ""
        self.tasks.spawn(self._answer(record, reply, value, lane, model, reserved, outcome, 0))

    def dead_letter(self, record: Record, code: str, message: str) -> None:
        log.warning(
            "request.dead_lettered",
            code=code,
            reason=message,
            **record_fields(record),
        )
        self.tasks.spawn(self._dead_letter(record, code, message))

    async def _dead_letter(self, record: Record, code: str, message: str) -> None:
        if await self.delivery.dead_letter(record, code, message):
            self.inflight.answered(self.inflight.lane(record.topic), 0)

    async def _answer(
        self,
        record: Record,
        reply: ReplyTo,
        value: bytes,
        lane: str,
        model: str,
        inputs: int,
        outcome: str,
        tokens: int,
    ) -> None:
        if await self.delivery.answer(record, reply, value):
            log.debug(
                "request.answered",
                request_id=reply.id,
                inputs=inputs,
                **record_fields(record),
            )
            self.inflight.answered(lane, inputs)
            m = self.metrics
            m.requests.labels(model, outcome).inc()
            m.inputs.labels(model, outcome).inc(inputs)
            m.tokens.labels(model, outcome).inc(tokens)
            if record.timestamp_ms is not None and record.timestamp_ms > 0:
                m.latency_seconds.labels(lane).observe(
                    max(0.0, time.time() - record.timestamp_ms / 1000)
                )
