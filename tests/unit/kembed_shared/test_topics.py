"""The topic plan from settings, the comparison of a cluster's topics with it (on made-up
descriptions), ``kembed topics``' command line, and the start-up wait for missing topics
(readiness and the one error event)."""

from __future__ import annotations

import asyncio
import json

import pytest
import structlog

from kembed_cli.commands.topics import TOPIC_SETTINGS, needs_of
from kembed_cli.common import settings_from
from kembed_cli.main import build_parser
from kembed_shared.kafka.topics import (
    CATALOG_TOPIC_CONFIG,
    RECORD_OVERHEAD,
    FoundTopic,
    TopicNeeds,
    TopicSpec,
    compare,
    default_replication,
    plan,
    replicated,
    wait_for_topics,
)
from kembed_shared.observability.probes import Probes
from kembed_shared.observability.service import missing_topics_reporter
from worker.settings import WorkerSettings

MiB = 1024 * 1024


def by_name(specs: list[TopicSpec]) -> dict[str, TopicSpec]:
    return {spec.name: spec for spec in specs}


def test_the_default_settings_plan_the_five_fleet_topics_with_their_configs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KEMBED_CATALOG_TOPIC", raising=False)  # the tests' workers have none
    specs = by_name(plan(needs_of(WorkerSettings.model_validate({}), []), partitions=6))
    assert list(specs) == [
        "embed.requests",
        "embed.requests.bulk",
        "embed.results",
        "embed.requests.dlq",
        "embed.models",
    ]
    for name in ("embed.requests", "embed.requests.bulk", "embed.requests.dlq"):
        # twice max_request_bytes: an oversized request still reaches a worker
        assert specs[name].config["max.message.bytes"] == str(8 * MiB)
        assert specs[name].needed_message_bytes == 4 * MiB + RECORD_OVERHEAD
    for name in ("embed.requests", "embed.requests.bulk"):
        # the broker stamps requests: their timestamps become the sink rows' versions
        assert specs[name].config["message.timestamp.type"] == "LogAppendTime"
    assert "message.timestamp.type" not in specs["embed.requests.dlq"].config
    assert int(specs["embed.results"].config["max.message.bytes"]) > 1_000_000 + RECORD_OVERHEAD
    assert specs["embed.results"].needed_message_bytes == 1_000_000 + RECORD_OVERHEAD
    assert specs["embed.models"].config == CATALOG_TOPIC_CONFIG
    assert specs["embed.models"].compacted
    counts = {name: spec.partitions for name, spec in specs.items()}
    assert counts == {
        "embed.requests": 6,
        "embed.requests.bulk": 6,
        "embed.results": 6,
        "embed.requests.dlq": 1,
        "embed.models": 1,
    }


def test_per_model_topics_results_topics_and_sizes_come_from_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    models = [
        {"model": "a"},
        {"model": "b", "requests_topic": "embed.requests.b"},
        {"model": "c", "requests_topic": "embed.requests.c", "bulk_topic": ""},
    ]
    monkeypatch.setenv("KEMBED_MODELS", json.dumps(models))
    monkeypatch.setenv("KEMBED_MAX_REQUEST_BYTES", str(MiB))
    monkeypatch.setenv("KEMBED_MAX_RESULT_BYTES", str(2 * MiB))
    monkeypatch.setenv("KEMBED_CATALOG_TOPIC", "")
    needs = needs_of(WorkerSettings.model_validate({}), ["embed.results.docs"])
    specs = by_name(plan(needs, partitions=3))
    assert list(specs) == [
        "embed.requests",
        "embed.requests.b",
        "embed.requests.c",
        "embed.requests.bulk",
        "embed.requests.b.bulk",
        "embed.results",
        "embed.requests.dlq",
        "embed.results.docs",
        "embed.results.docs.dlq",
    ]
    assert specs["embed.requests.b.bulk"].config["max.message.bytes"] == str(2 * MiB)
    for name in ("embed.results", "embed.results.docs", "embed.results.docs.dlq"):
        assert specs[name].needed_message_bytes == 2 * MiB + RECORD_OVERHEAD
        assert int(specs[name].config["max.message.bytes"]) >= specs[name].needed_message_bytes
    assert specs["embed.results.docs"].partitions == 3
    assert specs["embed.results.docs.dlq"].partitions == 1


def test_replication_defaults_to_three_or_fewer_brokers_and_adds_min_insync_from_three() -> None:
    assert [default_replication(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert default_replication(5, 2) == 2
    spec = TopicSpec("t", 3, {"max.message.bytes": "10"})
    assert replicated(spec, 1) == spec
    assert replicated(spec, 2) == spec
    assert replicated(spec, 3).config == {"max.message.bytes": "10", "min.insync.replicas": "2"}


def good(spec: TopicSpec) -> FoundTopic:
    return FoundTopic(spec.partitions, dict(spec.config))


def test_check_reports_one_line_per_problem_and_nothing_for_topics_as_planned() -> None:
    specs = plan(TopicNeeds(sink_results=["embed.results.docs"]), partitions=4)
    found: dict[str, FoundTopic | str] = {spec.name: good(spec) for spec in specs}
    assert compare(specs, found) == []
    del found["embed.results.docs.dlq"]
    found["embed.requests"] = good(specs[0]).__class__(2, dict(specs[0].config))
    found["embed.requests.bulk"] = FoundTopic(4, {**specs[1].config, "max.message.bytes": str(MiB)})
    found["embed.models"] = FoundTopic(1, {"cleanup.policy": "delete"})
    found["embed.results"] = "TopicAuthorizationFailedError"
    problems = compare(specs, found)
    assert problems == [
        "requests topic 'embed.requests' has 2 partition(s), fewer than the 4 planned",
        f"bulk requests topic 'embed.requests.bulk' has max.message.bytes={MiB}, below the "
        f"{4 * MiB + RECORD_OVERHEAD} that max_request_bytes={4 * MiB} needs",
        "results topic 'embed.results': cannot be described (TopicAuthorizationFailedError)",
        "model catalog topic 'embed.models' has cleanup.policy=delete, not compacted "
        "(needs cleanup.policy=compact,delete)",
        "sink dead letters topic 'embed.results.docs.dlq' is missing",
    ]
    # partitions are compared only when asked for (check without --partitions)
    assert len(compare(specs, found, check_partitions=False)) == len(problems) - 1


def test_request_topics_must_be_stamped_by_the_broker_and_check_says_why() -> None:
    """A request's record timestamp is the version of the rows a sink writes from its
    result: with CreateTime (Kafka's default) the producer chooses it, so check flags every
    request topic that is not LogAppendTime, the broker's default included."""
    specs = [s for s in plan(TopicNeeds()) if s.role in ("requests", "bulk requests")]
    assert [s.name for s in specs] == ["embed.requests", "embed.requests.bulk"]
    stamped: dict[str, FoundTopic | str] = {
        spec.name: FoundTopic(12, dict(spec.config)) for spec in specs
    }
    assert compare(specs, stamped) == []
    producers = "message.timestamp.type=CreateTime, not LogAppendTime"
    first = specs[0]
    created = FoundTopic(12, {**first.config, "message.timestamp.type": "CreateTime"})
    [line] = compare(specs, {**stamped, first.name: created})
    assert line.startswith(f"requests topic 'embed.requests' has {producers}: its producers")
    bare: dict[str, FoundTopic | str] = {
        spec.name: FoundTopic(12, {"max.message.bytes": str(8 * MiB)}) for spec in specs
    }
    problems = compare(specs, bare)  # the broker's default is CreateTime
    assert len(problems) == 2
    assert all(producers in line for line in problems)


def test_a_sinks_results_topic_is_planned_kept_seven_days_and_check_flags_shorter() -> None:
    """The sink's results topic holds the only copy of the vectors until they are written:
    planned with an explicit retention.ms (7 days, or --results-retention-ms) and unbounded
    retention.bytes; a shorter or bounded one is a problem; the replies topic is not."""
    specs = by_name(plan(TopicNeeds(sink_results=["embed.ingest.docs"])))
    for name in ("embed.ingest.docs", "embed.ingest.docs.dlq"):
        assert specs[name].config["retention.ms"] == str(7 * 24 * 3600 * 1000)
        assert specs[name].config["retention.bytes"] == "-1"
    assert "retention.ms" not in specs["embed.results"].config
    docs = specs["embed.ingest.docs"]
    assert compare([docs], {docs.name: good(docs)}) == []
    for kept in ("-1", str(30 * 24 * 3600 * 1000)):  # unlimited, or longer: enough
        assert (
            compare([docs], {docs.name: FoundTopic(12, {**docs.config, "retention.ms": kept})})
            == []
        )
    short = {**docs.config, "retention.ms": "3600000", "retention.bytes": "1073741824"}
    assert compare([docs], {docs.name: FoundTopic(12, short)}) == [
        "sink results topic 'embed.ingest.docs' has retention.ms=3600000, below the "
        "604800000 planned: results a sink has not written by then are deleted",
        "sink results topic 'embed.ingest.docs' has retention.bytes=1073741824: results a "
        "sink has not written are deleted once a partition holds that much (plan: -1)",
    ]
    longer = plan(TopicNeeds(sink_results=["t"], sink_retention_ms=30 * 24 * 3600 * 1000))
    assert by_name(longer)["t"].config["retention.ms"] == str(30 * 24 * 3600 * 1000)
    args = build_parser("topics").parse_args(
        ["topics", "check", "--results", "t", "--results-retention-ms", "86400000"]
    )
    settings = settings_from(WorkerSettings, args, "topics check")
    assert settings is not None
    assert needs_of(settings, args.results, args.results_retention_ms).sink_retention_ms == 86400000


def test_a_topic_without_its_own_max_message_bytes_takes_the_brokers_default() -> None:
    (results,) = [s for s in plan(TopicNeeds()) if s.name == "embed.results"]
    bare = {"embed.results": FoundTopic(12, {})}
    assert compare([results], bare) == []  # Kafka's default 1048588 holds 1000000 + overhead
    assert compare([results], bare, broker_message_bytes=1_000_000) != []
    assert compare([results], {"embed.results": FoundTopic(12, {"max.message.bytes": "x"})}) == []


def test_the_command_line_takes_results_partitions_replication_and_the_workers_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEMBED_REQUESTS_TOPIC", "team.requests")
    monkeypatch.setenv("KEMBED_MAX_REQUEST_BYTES", "1000")
    argv = ["topics", "create", "--results", "a", "--results", "b", "--partitions", "3"]
    args = build_parser("topics").parse_args([*argv, "--replication-factor", "2"])
    assert (args.action, args.results, args.partitions) == ("create", ["a", "b"], 3)
    assert args.replication_factor == 2
    args = build_parser("topics").parse_args([*argv, "--dlq-topic", "team.dlq"])
    settings = settings_from(WorkerSettings, args, "topics create")
    assert settings is not None
    needs = needs_of(settings, args.results)
    assert needs.requests_topics == ["team.requests"]
    assert (needs.dlq_topic, needs.max_request_bytes) == ("team.dlq", 1000)
    assert needs.sink_results == ["a", "b"]
    with pytest.raises(SystemExit):
        build_parser("topics").parse_args(["topics", "create", "--partitions", "0"])
    assert set(TOPIC_SETTINGS) <= set(WorkerSettings.model_fields)


def test_waiting_for_topics_reports_the_missing_ones_and_returns_when_all_exist() -> None:
    answers = iter([{"a"}, {"a"}, {"a", "b"}, {"a", "b", "c"}])
    seen: list[list[str]] = []

    async def existing() -> set[str]:
        return next(answers)

    asyncio.run(wait_for_topics(existing, ["a", "b", "c"], seen.append, every_s=0))
    assert seen == [["b", "c"], ["c"], []]

    quiet: list[list[str]] = []

    async def everything() -> set[str]:
        return {"a"}

    asyncio.run(wait_for_topics(everything, ["a"], quiet.append, every_s=0))
    assert quiet == []  # nothing was ever missing: nothing to say
    asyncio.run(wait_for_topics(everything, ["x"], quiet.append, stopped=lambda: True))
    assert quiet == [["x"]]


def test_readiness_names_the_missing_topics_and_one_error_event_says_how_to_create_them() -> None:
    probes = Probes(stuck_batch_s=60, phase="joining")
    log = structlog.get_logger("test")
    with structlog.testing.capture_logs() as events:
        report = missing_topics_reporter(probes, log, "kembed topics create --results r")
        report(["r", "s"])
        ok, body = probes.ready()
        assert not ok
        assert body["status"] == "missing topics"
        assert body["missing_topics"] == ["r", "s"]
        report(["s"])
        report([])
    assert [e["event"] for e in events] == ["kafka.topics_missing", "kafka.topics_found"]
    assert events[0]["log_level"] == "error"
    assert events[0]["topics"] == ["r", "s"]
    assert events[0]["create"] == "kembed topics create --results r"
    assert "missing_topics" not in probes.ready()[1]
