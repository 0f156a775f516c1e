"""Worker settings: every field is an env var ``KEMBED_<NAME>`` and a ``kembed worker`` flag.

The field descriptions are the help text of both, so they say what the knob trades off,
not just what it is. The fields come in groups, in this order: Kafka's connection
(:class:`~kembed_shared.settings.KafkaClientSettings`), topics and the group
(:mod:`worker.topic_settings`), the model (:mod:`worker.model_settings`), then batching,
the vector cache, the lifecycle and delivery (here).
"""

from __future__ import annotations

import socket
import uuid
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from kembed_shared import service_fields as fields
from kembed_shared.settings import KafkaClientSettings, none_if_blank
from schemas import DEFAULT_MAX_INPUT_CHARS
from worker.model_settings import DEFAULT_MODEL, ModelFields, ModelSpec
from worker.topic_settings import DEFAULT_INGEST_TOPICS, DEFAULT_REPLY_TOPICS, TopicFields

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_INGEST_TOPICS",
    "DEFAULT_REPLY_TOPICS",
    "ModelSpec",
    "WorkerSettings",
]


class WorkerSettings(ModelFields, TopicFields, KafkaClientSettings):
    model_config = SettingsConfigDict(env_prefix="KEMBED_", extra="ignore", frozen=True)

    # ------------------------------------------------------------------ batching
    max_batch_tokens: int = Field(
        2048,
        gt=0,
        description="Budget of a batch as padded tokens (inputs x longest input). Larger "
        "batches raise throughput until the device saturates, and add latency (best "
        "measured on a 2-core AMX CPU: 2048; GPUs want 16384 or more).",
    )
    max_batch_size: int = Field(256, gt=0, description="Most inputs in one batch.")
    busy_bulk_batch_tokens: int = Field(
        1024,
        gt=0,
        description="While interactive requests are arriving (one in the last second), bulk "
        "batches are cut at this many padded tokens instead of max_batch_tokens: a running "
        "batch cannot be interrupted, so this bounds how long an interactive request waits "
        "behind bulk work, for a little bulk throughput.",
    )
    bulk_every: int = Field(
        4,
        gt=0,
        description="When both lanes have work, at least one batch in every bulk_every is "
        "bulk: interactive goes first, bulk keeps >= 1/bulk_every of the encoder.",
    )
    max_batch_wait_ms: float = Field(
        0.0,
        ge=0,
        description="How long an input may wait for company when the encoder is idle. While "
        "the encoder is busy, inputs gather anyway (the prepared batch is refilled until it "
        "runs), so 0 is right unless requests trickle in one by one and throughput matters "
        "more than latency.",
    )
    max_client_batch_size: int = Field(
        512,
        gt=0,
        description="Most inputs in one request; more is a too_many_inputs error.",
    )
    max_input_chars: int = Field(
        DEFAULT_MAX_INPUT_CHARS,
        gt=0,
        description="Most characters (code points) in one text: an input of an embed "
        "request without chunking, a rerank query or document. More is an input_too_long "
        "error naming the input (or document; none for the query). A model uses only its "
        "first max_seq_length tokens of a text, so a longer text only costs tokenizing.",
    )
    max_chunk_tokens_factor: float = Field(
        4.0,
        ge=1,
        description="Most tokens the chunks of one input of a chunked request may hold "
        "together (special and prompt tokens included), as a multiple of the tokens of "
        "the input tokenized whole (with its special and prompt tokens); more is an "
        "invalid_request error naming the input. Bounds what overlap and per-chunk "
        "overhead make of a text (windows of a few tokens, long prompts).",
    )
    max_inflight_inputs: int = Field(
        8192,
        gt=0,
        description="Inputs accepted but not yet answered, per lane. Above it the worker "
        "pauses that lane's partitions, so memory stays bounded and the backlog stays in "
        "Kafka, while the other lane keeps flowing.",
    )
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        gt=0,
        description="Largest request message accepted; larger is a message_too_large error.",
    )
    max_result_bytes: int = Field(
        1_000_000,
        gt=0,
        description="Largest result message produced; keep below the reply topic's "
        "max.message.bytes. A larger result becomes a result_too_large error.",
    )

    # ------------------------------------------------------------------ vector cache
    cache_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="Memory for the vector cache: a repeated text (same model, dtype, "
        "quantization, pooling, prompt, truncation side and limit) is answered with the "
        "vector the encoder returned the first time, without tokenizing or encoding it; "
        "least recently used entries leave first. One entry of a 384-dimension model takes "
        "~1.8 KB. 0: no cache.",
    )
    cache_path: str | None = Field(
        None,
        description="SQLite file (on a local volume) that keeps the vector cache across "
        "restarts, within cache_bytes; a restarted worker reads it back before joining its "
        "group. Entries of models the worker no longer serves are deleted. Unset: the cache "
        "lives in memory only.",
    )
    _blank_cache_path = field_validator("cache_path", mode="before")(none_if_blank)

    # ------------------------------------------------------------------ lifecycle
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description="On SIGTERM or a partition revocation: how long to finish and publish "
        "in-flight requests before leaving them to be redelivered.",
    )
    http_host: str = fields.http_host("/health, /ready, /metrics, /info")
    http_port: int = fields.http_port(8080)
    health_stuck_batch_s: float = fields.health_stuck_batch(
        "encoder batch", "worker", " (a hung device)"
    )
    publish_retry_s: float = Field(
        300.0,
        gt=0,
        description="How long a result that cannot be published for a transient reason "
        "(broker restarting or unreachable, leader moving) is retried, with backoff, before "
        "the worker exits so that its requests are redelivered. Nothing is committed past "
        "an unpublished result meanwhile.",
    )
    commit_interval_ms: int = Field(
        200,
        gt=0,
        description="How often acknowledged offsets are committed (at_least_once; exactly_once "
        "commits offsets inside its transactions instead).",
    )

    # ------------------------------------------------------------------ delivery
    delivery: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once",
        description="at_least_once: each answer is published on its own and offsets are "
        "committed up to the first unanswered request; after a crash some answers are sent "
        "twice (callers drop duplicates by id). exactly_once: answers and offsets are "
        "committed together in Kafka transactions, so a read_committed reader of the result "
        "topics sees each answer once across crashes, restarts and rebalances, but for one "
        "case: a worker expelled from its group that does not know it yet (it stalled "
        "beyond the session timeout) can still commit what it finishes before its next "
        "heartbeat tells it, duplicating answers, never losing one (aiokafka has no KIP-447 "
        "fencing; a successor with the same transactional id does fence it). Results become "
        "visible when their transaction commits (~5-15 ms later).",
    )
    transactional_id: str | None = Field(
        None,
        description="exactly_once: the producer's transactional.id; it must be unique per "
        "running worker. Unset: kembed-<group_id>-<group_instance_id> when a group instance "
        "id is set, so that a restarted worker fences its predecessor (a zombie can commit "
        "no more) and aborts its open transaction at once; else kembed-<group_id>-<host "
        "name>-<random>, unique per start, so a predecessor's open transaction is aborted "
        "only after transaction_timeout_ms.",
    )
    transaction_timeout_ms: int = Field(
        10_000,
        gt=0,
        description="exactly_once: the broker aborts a transaction left open this long (a "
        "crashed worker's); until then read_committed readers of the partitions it wrote "
        "wait. A transaction that takes longer than this makes the worker fail.",
    )
    transaction_interval_ms: float = Field(
        0.0,
        ge=0,
        description="exactly_once: how long the first waiting answer waits for company before "
        "a transaction begins (at once when 1000 wait). 0 gave the lowest latency: a "
        "transaction begins no sooner than 5 ms after the previous commit anyway, and "
        "answers finished meanwhile share it. Higher: fewer, larger transactions (5 used "
        "less CPU per bulk text), results visible later by as much.",
    )
    log_level: fields.LogLevel = fields.log_level()
    log_format: fields.LogFormat = fields.log_format()

    def for_model(self, spec: ModelSpec) -> WorkerSettings:
        """These settings as a single-model worker serving ``spec`` would have them."""
        return self.model_copy(
            update={
                "models": (),
                "model": spec.model,
                "model_name": spec.name,
                "dtype": spec.dtype or self.dtype,
                "quantization": spec.quantization or self.quantization,
                "max_seq_length": spec.max_seq_length or self.max_seq_length,
                "pooling": spec.pooling,
                "truncation_direction": spec.truncation_direction,
                "prompts": spec.prompts,
                "default_prompt_name": spec.default_prompt_name,
                "model_kind": spec.kind or self.model_kind,
            }
        )

    def request_topics(self) -> tuple[list[str], list[str]]:
        """The interactive and the bulk request topics of all the models, in order."""
        interactive: list[str] = []
        bulk: list[str] = []
        for spec in self.model_specs():
            for topics, topic in zip((interactive, bulk), self.topics_of(spec), strict=True):
                if topic and topic not in topics:
                    topics.append(topic)
        return interactive, bulk

    def topics_of(self, spec: ModelSpec) -> tuple[str, str]:
        """The interactive and bulk request topics ``spec`` is served on ("" = none): its
        own, else the worker's; a model with its own requests topic ``T`` and no bulk topic
        given gets ``T.bulk``, as the default topics are named."""
        if spec.requests_topic is None:
            bulk = self.bulk_topic if spec.bulk_topic is None else spec.bulk_topic
            return self.requests_topic, bulk
        bulk = f"{spec.requests_topic}.bulk" if spec.bulk_topic is None else spec.bulk_topic
        return spec.requests_topic, bulk

    def resolved_transactional_id(self) -> str:
        """The transactional id to use: the setting; else one stable per group instance, so
        that a restarted worker fences its predecessor; else one no other worker has."""
        if self.transactional_id:
            return self.transactional_id
        if self.group_instance_id:
            return f"kembed-{self.group_id}-{self.group_instance_id}"
        return f"kembed-{self.group_id}-{socket.gethostname()}-{uuid.uuid4().hex[:12]}"
