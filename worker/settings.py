"""Worker settings: every field is an env var ``KEMBED_<NAME>`` and a ``kembed worker`` flag.

The field descriptions are the help text of both, so they say what the knob trades off,
not just what it is.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict

from kembed_shared import service_fields as fields
from kembed_shared.settings import KafkaClientSettings, none_if_blank
from schemas import DEFAULT_MAX_INPUT_CHARS

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_INGEST_TOPICS",
    "DEFAULT_REPLY_TOPICS",
    "ModelSpec",
    "WorkerSettings",
]

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_REPLY_TOPICS = r"embed\.results(\..+)?"
DEFAULT_INGEST_TOPICS = r"embed\.ingest\..+"


DType = Literal["auto", "float32", "bfloat16", "float16"]
Quantization = Literal["none", "int8", "nf4"]
Pooling = Literal["auto", "mean", "cls", "max", "lasttoken", "mean_sqrt_len"]
TruncationDirection = Literal["right", "left"]
ModelKind = Literal["auto", "embed", "rerank"]


class ModelSpec(BaseModel):
    """One model a worker serves (an entry of ``KEMBED_MODELS``).

    Unset fields take the worker-wide setting of the same name (``dtype``,
    ``quantization``, ``max_seq_length``) or the model's own configuration (``pooling``,
    ``prompts``, ``default_prompt_name``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    name: str | None = None
    aliases: tuple[str, ...] = ()
    dtype: DType | None = None
    quantization: Quantization | None = None
    max_seq_length: int | None = Field(None, gt=0)
    pooling: Pooling = "auto"
    truncation_direction: TruncationDirection = "right"
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None
    requests_topic: str | None = None
    bulk_topic: str | None = None
    kind: ModelKind | None = None

    def served_name(self) -> str:
        return self.name or self.model


def _json_if_text(value: Any) -> Any:
    """Structured settings arrive as JSON text from flags (env vars are decoded already)."""
    return json.loads(value) if isinstance(value, str) else value


class WorkerSettings(KafkaClientSettings):
    model_config = SettingsConfigDict(env_prefix="KEMBED_", extra="ignore", frozen=True)

    # ------------------------------------------------------------------ Kafka topics, group
    requests_topic: str = Field(
        "embed.requests",
        description="Interactive lane: requests here are batched ahead of bulk work.",
    )
    bulk_topic: str = Field(
        "embed.requests.bulk",
        description="Bulk lane (ingestion backlogs): served when interactive work leaves room, "
        "and never starved (see bulk_every). Empty: no bulk lane.",
    )
    results_topic: str = Field(
        "embed.results", description="Topic for results of requests that name no reply_to."
    )
    dlq_topic: str = Field(
        "embed.requests.dlq",
        description="Dead-letter topic for messages that cannot be answered (no id, a reply "
        "topic reply_topics does not allow, or one that cannot be written). Headers name "
        "origin and reason.",
    )
    # reply topics a request may name (reply_to, or the kafka_replyTopic header)
    reply_topics: str = Field(
        DEFAULT_REPLY_TOPICS,
        description="Regular expression of the interactive reply topics, that a request's "
        "reply_to must match in full (or ingest_topics, for a bulk request); the results "
        "topic is always allowed. A request naming another topic is not computed: it is "
        "dead-lettered with code reply_forbidden. The default allows embed.results and "
        "embed.results.*, so with the default ingest_topics the worker needs WRITE only on "
        "the prefixes embed.results and embed.ingest.",
    )

    # ingestion results topics (the sinks' input): the bulk lane's alone
    ingest_topics: str = Field(
        DEFAULT_INGEST_TOPICS,
        description="Regular expression of the ingestion results topics, the sinks' input: "
        "only requests of the bulk lane (a bulk topic) may name one as reply topic, whatever "
        "reply_topics says, and their results carry the header kembed.lane: bulk that a "
        "sink requires. An interactive request naming one is not computed: it is answered "
        "there with an error result reply_forbidden (which a sink dead-letters). The "
        "default, embed.ingest.*, keeps them apart from the interactive replies of "
        "reply_topics. Empty: none.",
    )

    @field_validator("reply_topics", "ingest_topics")
    @classmethod
    def _compile_reply_topics(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _results_topic_is_not_an_ingest_topic(self) -> Self:
        if self.ingest_topic(self.results_topic):
            raise ValueError(
                f"results_topic {self.results_topic!r} matches ingest_topics: the results of "
                "interactive requests would reach a sink's input"
            )
        return self

    def ingest_topic(self, topic: str) -> bool:
        """Whether ``topic`` is an ingestion results topic (the bulk lane's alone)."""
        return bool(self.ingest_topics) and re.fullmatch(self.ingest_topics, topic) is not None

    def reply_topic_allowed(self, topic: str) -> bool:
        """Whether a request may name ``topic`` as its reply topic (an ingestion results
        topic: only a request of the bulk lane, see :meth:`ingest_topic`)."""
        return (
            topic == self.results_topic
            or re.fullmatch(self.reply_topics, topic) is not None
            or self.ingest_topic(topic)
        )

    group_id: str = Field(
        "kembed-workers",
        description="Consumer group. Workers of one group share the request partitions; "
        "scale out by adding workers (up to the partition count).",
    )
    client_id: str = fields.client_id("kembed-worker")
    max_poll_interval_ms: int = fields.max_poll_interval(
        ". Fetching continues during inference, so this only bounds a stalled worker; keep it "
        "above the slowest batch."
    )
    session_timeout_ms: int = fields.session_timeout(
        "worker", " (a static member's also wait this long for its restart: see group_instance_id)"
    )
    heartbeat_interval_ms: int = fields.heartbeat_interval()

    # ------------------------------------------------------------------ static membership
    group_instance_id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,249}$",
        description="Kafka group.instance.id (static membership): a name for this replica "
        "that survives its restarts (a StatefulSet pod name). A worker restarted with the "
        "same name within session_timeout_ms takes its partitions back without a "
        "rebalance of the others; in exchange a stopped worker never leaves the group, so "
        "its partitions wait up to session_timeout_ms for it (keep that above a restart, "
        "model load included). Two running workers must never share one. Unset: dynamic "
        "membership (a stopped worker leaves at once, every restart rebalances the group).",
    )
    _blank_instance_id = field_validator("group_instance_id", mode="before")(none_if_blank)
    fetch_max_wait_ms: int = fields.fetch_max_wait(
        20,
        "Kafka fetch.max.wait.ms: how long the broker holds an empty fetch. Lower answers a "
        "lone request a little sooner; each idle worker then sends more fetches.",
    )
    fetch_max_records: int = Field(
        500, gt=0, description="Most records taken from the consumer per poll."
    )
    linger_ms: int = Field(
        0,
        ge=0,
        description="Producer linger.ms for results. 0 answers interactive callers soonest; "
        "a few ms packs more results per produce request under heavy load.",
    )
    catalog_topic: str = Field(
        "embed.models",
        description="Compacted topic where the worker announces each model it serves (name, "
        "aliases, dimension, request topics, ...), so that clients can list the models and "
        "route requests by model. Empty: no announcements.",
    )
    catalog_interval_s: float = Field(
        30.0,
        gt=0,
        description="How often the worker re-announces its models. Readers drop a model card "
        "not refreshed within 3 intervals (a worker that died without withdrawing it).",
    )

    # ------------------------------------------------------------------ model
    model: str = Field(
        DEFAULT_MODEL,
        description="Model to serve: a local sentence-transformers or Hugging Face model "
        "directory, a model id present in the local Hugging Face cache, or the bundled "
        f"default {DEFAULT_MODEL}.",
    )
    model_name: str | None = Field(
        None,
        description="Name the model is served under (requests' `model`, results' `model`). "
        "Default: the `model` setting.",
    )
    device: str = Field("auto", description="torch device: auto (cuda if present), cpu, cuda:N.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights and activations precision. auto: measured at start-up (see "
        "tune_budget_s): the fastest of float32 and bfloat16 (CUDA: float16, bfloat16, "
        "float32) whose vectors keep the quality gate's mean cosine to float32 on reference "
        "texts. float32 reproduces sentence-transformers exactly; bf16 keeps STS-B within 0.1.",
    )
    max_seq_length: int | None = Field(
        None,
        gt=0,
        description="Cap on tokens per input; unset means the model's own maximum. Longer "
        "inputs are truncated, or rejected when the request says truncate=false.",
    )
    pooling: Pooling = Field(
        "auto",
        description="How token vectors become one vector: auto reads the model's "
        "sentence-transformers Pooling config (mean for plain Hugging Face models); mean, cls, "
        "max, lasttoken (decoder embedders) or mean_sqrt_len override it.",
    )
    truncation_direction: TruncationDirection = Field(
        "right",
        description="Which end of an over-long input is cut: right keeps the beginning, left "
        "keeps the end. Requests may override it (truncation_direction).",
    )
    prompts: dict[str, str] | None = Field(
        None,
        description='Named prompts, as JSON (e.g. {"query": "query: ", "passage": "passage: "}); '
        "requests pick one with prompt_name. Unset: the model's own (sentence-transformers' "
        "config_sentence_transformers.json), if any.",
    )
    default_prompt_name: str | None = Field(
        None,
        description="Prompt applied to requests that name none (neither prompt nor "
        "prompt_name). Unset: the model's own default, usually none.",
    )
    model_kind: ModelKind = Field(
        "auto",
        description="What the model computes: embed (vectors: an embedding model), rerank "
        "(a relevance score per (query, document) pair: a one-label cross-encoder in "
        "sentence-transformers' CrossEncoder layout) or auto (rerank when the model's "
        "config.json names a ...ForSequenceClassification architecture, else embed). A "
        "model answers requests of its own kind only.",
    )
    models: tuple[ModelSpec, ...] = Field(
        (),
        description="Several models in one worker, as a JSON list of objects with the keys "
        "model (required), name, aliases, dtype, quantization, max_seq_length, pooling, "
        "truncation_direction, prompts, default_prompt_name, requests_topic, bulk_topic, "
        "kind (auto, embed or rerank: see model_kind) (a "
        "model with its own requests_topic T has bulk topic T.bulk unless given); each "
        "gets its own batcher, and requests pick one by name or alias. Unset keys take the "
        "worker-wide setting. When set, the single-model settings above (model, model_name, "
        "pooling, prompts, ...) are ignored. The first model serving a topic answers that "
        "topic's requests that name no model.",
    )
    quantization: Literal["none", "int8", "nf4"] = Field(
        "none",
        description="Weight quantization with bitsandbytes: int8 (LLM.int8) or nf4 (4-bit "
        "NormalFloat) for every linear layer, computing in `dtype`. Saves memory (the "
        "embeddings stay unquantized); check quality with `kembed validate` first (on the "
        "bundled model int8 kept STS-B within 0.1 of fp32, nf4 drifted to mean cosine "
        "0.97). Slower than bf16 on CPUs.",
    )
    quality_gate: bool = Field(
        False,
        description="Before joining the group, run the quality gate (`kembed validate`) on "
        "this model, dtype and quantization, and refuse to start (exit 3) if it fails.",
    )
    quality_gate_pairs: str | None = Field(
        None,
        description="CSV of reference pairs (text1,text2,gold score) for the gate; default "
        "the STS-B test split (English) shipped with the package (stsb-en-test.csv in "
        "KEMBED_STSB_DIR when that is set).",
    )
    quality_max_spearman_drop: float = Field(
        0.5, ge=0, description="Gate: largest allowed drop of Spearman x100 against fp32."
    )
    quality_min_mean_cosine: float = Field(
        0.99, ge=-1, le=1, description="Gate: smallest allowed mean cosine to fp32 vectors."
    )
    torch_compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Run the model under torch.compile (inductor, dynamic shapes, frozen "
        "weights). auto: measured at start-up against eager, with dtype (tune_budget_s). "
        "Compiling takes ~15-25 s on a 2-core CPU; with tune_in_background (the default) it "
        "happens while the worker already serves eagerly. If it fails (no C++ compiler), the "
        "worker serves eagerly.",
    )
    tune_in_background: bool = Field(
        True,
        description="Serve at once with a safe variant (the explicit dtype, else float32; "
        "eager) and measure the candidates of dtype/torch_compile auto, and compile, in the "
        "background, switching between two batches when done. false: do it all before "
        "joining the group (ready later, at full speed from the first request).",
    )
    tune_budget_s: float = Field(
        300.0,
        ge=0,
        description="Time the start-up measurement of dtype/torch_compile auto may take "
        "(compiling included); candidates not reached by then are skipped. 0: serve the safe "
        "variant (or the one explicit settings name) without measuring.",
    )
    compile_cache_dir: str | None = Field(
        None,
        description="Directory for torch.compile's caches (TORCHINDUCTOR_CACHE_DIR). On a "
        "volume that survives restarts, a restarted worker compiles faster.",
    )
    torch_threads: int | None = Field(
        None, gt=0, description="torch intra-op threads; unset lets torch choose."
    )

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

    _parse_models = field_validator("models", "prompts", mode="before")(_json_if_text)

    @model_validator(mode="after")
    def _check_models(self) -> Self:
        names: dict[str, str] = {}
        for spec in self.model_specs():
            served = spec.served_name()
            for name in {served, *spec.aliases}:
                if names.setdefault(name, served) != served:
                    raise ValueError(f"model name {name!r} is used by two models")
            prompts = spec.prompts or {}
            if (
                spec.default_prompt_name
                and spec.prompts is not None
                and (spec.default_prompt_name not in prompts)
            ):
                raise ValueError(
                    f"default_prompt_name {spec.default_prompt_name!r} of model {served!r} "
                    "is not one of its prompts"
                )
        return self

    def served_name(self) -> str:
        return self.model_name or self.model

    def model_specs(self) -> tuple[ModelSpec, ...]:
        """The models to serve: ``models``, or the one the single-model settings describe."""
        if self.models:
            return self.models
        return (
            ModelSpec(
                model=self.model,
                name=self.model_name,
                dtype=self.dtype,
                quantization=self.quantization,
                max_seq_length=self.max_seq_length,
                pooling=self.pooling,
                truncation_direction=self.truncation_direction,
                prompts=self.prompts,
                default_prompt_name=self.default_prompt_name,
                kind=self.model_kind,
            ),
        )

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
