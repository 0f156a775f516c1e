"""The topics a kembed fleet needs, as plain values: the plan from the settings' values
(:class:`TopicNeeds`), and what an existing cluster lacks (:func:`compare`). Pure: the
admin calls that create and describe topics are in :mod:`kembed_shared.kafka.topics`.

Sizes: a topic takes records of up to its ``max.message.bytes`` (the broker's
``message.max.bytes`` when the topic sets none), the value plus its key, headers and
batch framing. A request topic must take a request of ``max_request_bytes`` and a results
topic a result of ``max_result_bytes`` (plus :data:`RECORD_OVERHEAD`); request topics are
planned at twice ``max_request_bytes`` so that an oversized request still reaches a worker
and is answered ``message_too_large`` instead of being refused by the broker with no answer.

Timestamps: request topics are planned with ``message.timestamp.type=LogAppendTime``. A
worker copies a request record's timestamp into its result as ``requested_ms``, and a
sink takes that as the version of the rows it writes (a row is never replaced by an older
version). With Kafka's default, CreateTime, that timestamp is whatever the producer set,
so a producer with a fast clock (or a forged timestamp) writes rows that later versions
cannot replace; with LogAppendTime the broker sets it when it appends the record.

Retention: a sink's results topic (``--results``) holds the only copy of the vectors until
the sink has written them, so it is planned with an explicit ``retention.ms``
(:data:`DEFAULT_SINK_RETENTION_MS`, 7 days) and ``retention.bytes=-1``: a sink may be down
for that long without losing results, at the cost of the disk the results take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

RECORD_OVERHEAD = 16 * 1024
"""Room for a record's key, headers and batch framing on top of its value: a topic must
take ``limit + RECORD_OVERHEAD`` to hold a value of ``limit`` bytes."""

PLAN_HEADROOM = 64 * 1024
"""What results topics are created with above ``max_result_bytes`` (the worker's producer
allows the same on top of a record's value)."""

DEFAULT_PARTITIONS = 12
"""Partitions of the request, bulk and results topics when ``--partitions`` is not given:
up to 12 workers (and 12 sink replicas) share the work. Dead-letter topics and the catalog
get one."""

BROKER_DEFAULT_MESSAGE_BYTES = 1_048_588  # Kafka's message.max.bytes default

DEFAULT_SINK_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
"""``retention.ms`` of a sink's results topic and its dead-letter topic unless
``--results-retention-ms`` says otherwise: how long a sink may be down (or stuck) before
results it has not written are deleted."""

LOG_APPEND_TIME = "LogAppendTime"
_TIMESTAMP_TYPE = "message.timestamp.type"
_RETENTION_MS = "retention.ms"
_RETENTION_BYTES = "retention.bytes"

# The model catalog keeps the latest card per key (compact) and drops what a day has not
# refreshed (delete): workers re-announce every 30 s, so a day-old card is long dead.
CATALOG_TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(24 * 60 * 60 * 1000),
}

_MAX_MESSAGE_BYTES = "max.message.bytes"
_CLEANUP_POLICY = "cleanup.policy"


@dataclass(frozen=True)
class TopicSpec:
    """A topic as planned: name, partitions and topic-level config. ``role`` says what it
    is for (in check reports), ``needed_message_bytes`` the smallest ``max.message.bytes``
    that works (0: no requirement), ``compacted`` whether it must be compacted."""

    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)
    role: str = ""
    needed_message_bytes: int = 0
    compacted: bool = False
    size_setting: str = ""
    timestamp_type: str = ""
    """The ``message.timestamp.type`` it must have ("" : any)."""
    min_retention_ms: int = 0
    """The shortest ``retention.ms`` it may have, with ``retention.bytes`` unbounded (0:
    no requirement; -1, unlimited, is always enough)."""


@dataclass(frozen=True)
class TopicNeeds:
    """What a fleet's settings say about its topics (the worker's settings, and the results
    topics of its sinks). Empty names are topics the fleet does without."""

    requests_topics: Sequence[str] = ("embed.requests",)
    bulk_topics: Sequence[str] = ("embed.requests.bulk",)
    results_topic: str = "embed.results"
    dlq_topic: str = "embed.requests.dlq"
    catalog_topic: str = "embed.models"
    max_request_bytes: int = 4 * 1024 * 1024
    max_result_bytes: int = 1_000_000
    sink_results: Sequence[str] = ()
    """Each results topic a sink reads; its dead-letter topic is ``<topic>.dlq``."""
    sink_retention_ms: int = DEFAULT_SINK_RETENTION_MS
    """``retention.ms`` of each sink results topic and its dead-letter topic."""


def plan(
    needs: TopicNeeds,
    partitions: int = DEFAULT_PARTITIONS,
    results_partitions: int | None = None,
) -> list[TopicSpec]:
    """The topics ``needs`` asks for, each once, in a stable order."""
    request_need = needs.max_request_bytes + RECORD_OVERHEAD
    request_bytes = max(2 * needs.max_request_bytes, request_need)
    result_need = needs.max_result_bytes + RECORD_OVERHEAD
    result_bytes = needs.max_result_bytes + PLAN_HEADROOM

    def sized(planned: int, needed: int, setting: str) -> Callable[[str, str, int], TopicSpec]:
        def spec(name: str, role: str, count: int) -> TopicSpec:
            config = {_MAX_MESSAGE_BYTES: str(planned)}
            return TopicSpec(name, count, config, role, needed, size_setting=setting)

        return spec

    sized_request = sized(
        request_bytes, request_need, f"max_request_bytes={needs.max_request_bytes}"
    )
    result = sized(result_bytes, result_need, f"max_result_bytes={needs.max_result_bytes}")

    def request(name: str, role: str, count: int) -> TopicSpec:
        """A request topic: the broker stamps its records (the rows' versions)."""
        spec = sized_request(name, role, count)
        config = spec.config | {_TIMESTAMP_TYPE: LOG_APPEND_TIME}
        return replace(spec, config=config, timestamp_type=LOG_APPEND_TIME)

    def sink_input(name: str, role: str, count: int) -> TopicSpec:
        """A sink's results topic (or its dead letters): kept for sink_retention_ms."""
        spec = result(name, role, count)
        retention = needs.sink_retention_ms
        config = spec.config | {_RETENTION_MS: str(retention), _RETENTION_BYTES: "-1"}
        return replace(spec, config=config, min_retention_ms=retention)

    specs: dict[str, TopicSpec] = {}

    def add(spec: TopicSpec) -> None:
        if spec.name and spec.name not in specs:
            specs[spec.name] = spec

    for name in needs.requests_topics:
        add(request(name, "requests", partitions))
    for name in needs.bulk_topics:
        add(request(name, "bulk requests", partitions))
    add(result(needs.results_topic, "results", results_partitions or partitions))
    add(sized_request(needs.dlq_topic, "request dead letters", 1))
    if needs.catalog_topic:
        catalog = dict(CATALOG_TOPIC_CONFIG)
        add(TopicSpec(needs.catalog_topic, 1, catalog, "model catalog", compacted=True))
    for name in needs.sink_results:
        add(sink_input(name, "sink results", results_partitions or partitions))
        add(sink_input(f"{name}.dlq", "sink dead letters", 1))
    return list(specs.values())


def default_replication(brokers: int, wanted: int | None = None) -> int:
    """The replication factor: ``wanted``, else 3, or the broker count when smaller."""
    return wanted if wanted is not None else max(1, min(3, brokers))


def replicated(spec: TopicSpec, replication_factor: int) -> TopicSpec:
    """``spec`` as created with ``replication_factor`` replicas: from 3 on, it also sets
    ``min.insync.replicas=2`` (unless it sets its own), so that a write the producers see
    acknowledged (they use acks=all) is on two brokers, and one broker may be down without
    stopping them. Below 3 the broker's default (1) stays: 2 of 2 would stop every write
    while either broker restarts."""
    if replication_factor < 3 or "min.insync.replicas" in spec.config:
        return spec
    return replace(spec, config=spec.config | {"min.insync.replicas": "2"})


# -- comparing what exists with the plan (pure: unit-tested on made-up descriptions) ----------


@dataclass(frozen=True)
class FoundTopic:
    """An existing topic as the cluster describes it: partition count and the effective
    topic configs (DescribeConfigs gives the topic-level value, else the broker's: its
    ``max.message.bytes`` is the broker's ``message.max.bytes`` when the topic sets none)."""

    partitions: int
    config: Mapping[str, str]


def compare(
    specs: Sequence[TopicSpec],
    found: Mapping[str, FoundTopic | str],
    *,
    check_partitions: bool = True,
    broker_message_bytes: int = BROKER_DEFAULT_MESSAGE_BYTES,
) -> list[str]:
    """One line per problem: a planned topic that is missing, has fewer partitions than
    planned (when ``check_partitions``), takes records too small for its settings, is a
    catalog that is not compacted, a request topic whose records the producers stamp
    (not ``LogAppendTime``), or a sink's results topic kept shorter than planned.
    ``found`` maps a name to its description, or to why it could not be described (a
    string); topics it lacks are missing."""
    return [
        line
        for spec in specs
        for line in problems_of(
            spec,
            found.get(spec.name),
            check_partitions=check_partitions,
            broker_message_bytes=broker_message_bytes,
        )
    ]


def problems_of(
    spec: TopicSpec,
    topic: FoundTopic | str | None,
    *,
    check_partitions: bool = True,
    broker_message_bytes: int = BROKER_DEFAULT_MESSAGE_BYTES,
) -> list[str]:
    """What is wrong with one planned topic (see :func:`compare`)."""
    what = f"{spec.role} topic {spec.name!r}" if spec.role else f"topic {spec.name!r}"
    if topic is None:
        return [f"{what} is missing"]
    if isinstance(topic, str):
        return [f"{what}: cannot be described ({topic})"]
    problems: list[str] = []
    if check_partitions and topic.partitions < spec.partitions:
        problems.append(
            f"{what} has {topic.partitions} partition(s), fewer than the {spec.partitions} planned"
        )
    if spec.needed_message_bytes:
        size = _int(topic.config.get(_MAX_MESSAGE_BYTES), broker_message_bytes)
        if size < spec.needed_message_bytes:
            problems.append(
                f"{what} has max.message.bytes={size}, below the "
                f"{spec.needed_message_bytes} that {spec.size_setting} needs"
            )
    if spec.timestamp_type:
        stamped = topic.config.get(_TIMESTAMP_TYPE, "CreateTime")
        if stamped != spec.timestamp_type:
            problems.append(
                f"{what} has {_TIMESTAMP_TYPE}={stamped}, not {spec.timestamp_type}: its "
                "producers set the timestamps that sinks take as their rows' versions"
            )
    if spec.min_retention_ms:
        problems += _retention_problems(what, spec.min_retention_ms, topic.config)
    if spec.compacted:
        policy = topic.config.get(_CLEANUP_POLICY, "delete")
        if "compact" not in {p.strip() for p in policy.split(",")}:
            problems.append(
                f"{what} has cleanup.policy={policy}, not compacted "
                f"(needs {_CLEANUP_POLICY}={CATALOG_TOPIC_CONFIG[_CLEANUP_POLICY]})"
            )
    return problems


def _retention_problems(what: str, least_ms: int, config: Mapping[str, str]) -> list[str]:
    """A sink's results topic that deletes results sooner than planned: unread results
    (the only copy of their vectors) would be lost while a sink is down."""
    problems: list[str] = []
    kept_ms = _int(config.get(_RETENTION_MS), DEFAULT_SINK_RETENTION_MS)
    if 0 <= kept_ms < least_ms:
        problems.append(
            f"{what} has {_RETENTION_MS}={kept_ms}, below the {least_ms} planned: results a "
            "sink has not written by then are deleted"
        )
    kept_bytes = _int(config.get(_RETENTION_BYTES), -1)
    if kept_bytes >= 0:
        problems.append(
            f"{what} has {_RETENTION_BYTES}={kept_bytes}: results a sink has not written are "
            "deleted once a partition holds that much (plan: -1)"
        )
    return problems


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
