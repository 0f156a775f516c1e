"""Sink settings: every field is an env var ``KEMBED_SINK_<NAME>`` and a ``kembed sink`` flag.

Where Kafka is and how to log in are not repeated here: ``kembed sink`` reads the shared
:class:`~kembed_shared.settings.KafkaClientSettings` (``KEMBED_BOOTSTRAP_SERVERS``,
``KEMBED_SECURITY_PROTOCOL``, ``KEMBED_SASL_*``, ``KEMBED_SSL_*``), so one set of Kafka
variables serves the worker, ``kembed embed`` and the sink alike. The consumer, HTTP and log
fields the worker has too are declared with :mod:`kembed_shared.service_fields`.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kembed_shared import service_fields as fields
from sink.registry import STORES, able, parse_target
from sink.targets import TargetSpec

__all__ = ["SinkSettings"]

_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class SinkSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KEMBED_SINK_", extra="ignore", frozen=True)

    # ------------------------------------------------------------------ the database
    target: str = Field(
        description="Where rows go: postgresql://user@host:5432/db (PostgreSQL with "
        "pgvector), milvus:///path/to/file.db (Milvus Lite, a local file), or "
        "http(s)://host:19530 (a Milvus server or cluster). Put the password in "
        "target_password, not here; one in the URI is accepted and never logged.",
    )
    target_password: SecretStr | None = Field(
        None,
        description="Password of the Postgres user, or the Milvus token (user:password or "
        "an API key). Prefer the env var to the flag; it is never logged.",
    )
    table: str = Field(
        "kembed_docs",
        description="Postgres table or Milvus collection, created if absent (Postgres: "
        "schema.table allowed). Letters, digits and underscores.",
    )
    dim: int | None = Field(
        None,
        gt=0,
        description="Vector dimension the table must have. Unset: an existing table's, or the "
        "first result's when the sink creates the table. A table of another dimension is a "
        "start-up error (exit 2).",
    )
    metric: Literal["auto", "cosine", "inner_product", "l2"] = Field(
        "auto",
        description="Distance of the HNSW index of a table the sink creates. auto: "
        "inner_product when the first batch's vectors are unit length (normalized, the "
        "default of requests; equal to cosine there, and cheaper), else cosine.",
    )
    hnsw_m: int = Field(16, ge=2, le=100, description="HNSW index: links per node (M).")
    hnsw_ef_construction: int = Field(
        64, ge=4, le=1000, description="HNSW index: candidate list size while building."
    )
    index: Literal["streaming", "after"] = Field(
        "streaming",
        description="Postgres: when a table the sink creates gets its HNSW index. "
        "streaming: at creation, every row is indexed as it is written. after (bulk mode, "
        "for initial loads): the table is created without it and the sink builds it once, "
        "when it has been caught up (lag 0, no new result) for index_build_idle_s; rows "
        "load many times faster, and searches scan the table until the index is built.",
    )
    index_build_idle_s: float = Field(
        30.0,
        ge=0,
        description="How long the sink must have been caught up before it builds an index "
        "a bulk load (index=after) left pending: the load is taken as done.",
    )
    index_build_memory_mb: int = Field(
        1024,
        ge=64,
        description="index=after: maintenance_work_mem of the index build (pgvector builds "
        "far faster when the graph fits).",
    )
    index_build_workers: int = Field(
        4,
        ge=0,
        le=64,
        description="index=after: max_parallel_maintenance_workers of the index build "
        "(the server's max_parallel_workers caps it).",
    )
    writers: int = Field(
        4,
        ge=1,
        le=32,
        description="Postgres: connections that write a batch's rows in parallel, each its "
        "share of the ids in its own transaction (an HNSW index makes each row's insert "
        "CPU-bound: parallel writers use the database's cores). The offsets are committed "
        "once every share is written; a replay after a failure in between is harmless. 1: "
        "one transaction per batch.",
    )

    # ------------------------------------------------------------------ Kafka topics, group
    results_topic: str = Field(
        "embed.ingest.docs",
        description="Results topic to consume (the reply_to of the ingesting producers): an "
        "ingestion results topic (the workers' ingest_topics, embed.ingest.* by default), "
        "which only the bulk lane answers on. Only results stamped kembed.lane: bulk are "
        "written; others are dead-lettered with not_bulk_lane.",
    )
    group_id: str = Field(
        "kembed-sink",
        description="Consumer group. Sinks of one group share the results partitions; give "
        "each target its own group (each group reads every result).",
    )
    dlq_topic: str | None = Field(
        None,
        description="Dead-letter topic for results that cannot be written (error results, "
        "undecodable messages, binary vectors, missing keys, another dimension). Default: "
        "the results topic + '.dlq'.",
    )
    client_id: str = fields.client_id("kembed-sink")
    max_batch_results: int = Field(
        200,
        gt=0,
        description="Most result messages per batch. A batch is one database transaction "
        "(one Milvus upsert), followed by one offset commit.",
    )
    fetch_max_wait_ms: int = fields.fetch_max_wait(
        500,
        "How long a poll waits for results when none are waiting; also bounds how long "
        "SIGTERM waits for an idle sink.",
    )
    session_timeout_ms: int = fields.session_timeout("sink")
    heartbeat_interval_ms: int = fields.heartbeat_interval()
    max_poll_interval_ms: int = fields.max_poll_interval(
        "; keep it above the slowest batch write. Offset commits that keep failing for longer "
        "than this plus session_timeout_ms end the sink (status 1)."
    )

    # ------------------------------------------------------------------ failures
    write_retry_s: float = Field(
        60.0,
        ge=0,
        description="How long a batch whose write fails for a transient reason (database "
        "restarting, connection lost) is retried, reconnecting with backoff, before the sink "
        "exits (status 1) so that a restart resumes from the committed offsets.",
    )
    connect_timeout_s: float = Field(
        10.0, gt=0, description="Timeout of one connection attempt to the database."
    )

    # ------------------------------------------------------------------ lifecycle
    http_host: str = fields.http_host("/health, /ready, /metrics")
    http_port: int = fields.http_port(8081)
    health_stuck_batch_s: float = fields.health_stuck_batch(
        "batch (write, dead letters, commit)", "sink"
    )
    log_level: fields.LogLevel = fields.log_level()
    log_format: fields.LogFormat = fields.log_format()

    @model_validator(mode="after")
    def _check(self) -> Self:
        self.target_spec()  # raises ValueError, without the URI's password, when unusable
        parts = self.table.split(".")
        if len(parts) > 2 or not all(_TABLE.fullmatch(part) for part in parts):
            raise ValueError(
                f"table {self.table!r}: use letters, digits and underscores (Postgres: "
                "optionally schema.table)"
            )
        store = STORES[self.target_spec().kind]
        if len(parts) == 2 and not store.schema_tables:
            raise ValueError(
                "table: a schema-qualified name is for "
                f"{able(lambda entry: entry.schema_tables)} targets only"
            )
        if self.index == "after" and not store.index_after:
            raise ValueError(
                f"index: after (bulk mode) is for {able(lambda entry: entry.index_after)} "
                "targets only"
            )
        return self

    def target_spec(self) -> TargetSpec:
        """The parsed target (kind, redacted URI, credentials)."""
        return parse_target(self.target, self.target_password)

    def store_options(self) -> dict[str, Any]:
        """The options every store takes (connection timeout, HNSW build parameters)."""
        return {
            "connect_timeout_s": self.connect_timeout_s,
            "hnsw_m": self.hnsw_m,
            "hnsw_ef_construction": self.hnsw_ef_construction,
        }

    def resolved_dlq_topic(self) -> str:
        return self.dlq_topic or f"{self.results_topic}.dlq"
