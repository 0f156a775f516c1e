"""Worker settings of the Kafka side: topics, reply topics, the consumer group, fetching,
producing and the model catalog (part of :class:`worker.settings.WorkerSettings`)."""

from __future__ import annotations

import re
from typing import Self

from pydantic import BaseModel, Field, field_validator, model_validator

from kembed_shared import service_fields as fields
from kembed_shared.settings import none_if_blank

__all__ = ["DEFAULT_INGEST_TOPICS", "DEFAULT_REPLY_TOPICS", "TopicFields"]

DEFAULT_REPLY_TOPICS = r"embed\.results(\..+)?"
DEFAULT_INGEST_TOPICS = r"embed\.ingest\..+"


class TopicFields(BaseModel):
    """Where requests come from and answers go, and how the worker takes part in its group."""

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
