"""``kembed topics create|check``: the topics a fleet needs, created or checked.

The plan comes from the worker's topic settings (the same ``KEMBED_*`` variables the
workers read, so a deployment's topics job can take the workers' environment) and each
``--results`` topic a sink reads (with its dead-letter topic ``<topic>.dlq``); see
:mod:`kembed_shared.kafka.topics` for the configs and sizes.

Exit status: 0 when every planned topic exists as required, 1 with one line per problem
(a topic missing, too few partitions, a ``max.message.bytes`` too small for the size
settings, a catalog that is not compacted, a request topic not ``LogAppendTime``, a sink
results topic kept shorter than ``--results-retention-ms``), 2 when the settings are
invalid or Kafka cannot be reached or refuses the request.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kembed_cli.common import (
    add_settings_flags,
    positive_int,
    quiet_kafka_logs,
    settings_from,
    write_json,
)
from kembed_shared.settings import KafkaClientSettings
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from kembed_shared.kafka.topics import EnsureReport, TopicNeeds, TopicSpec

__all__ = ["TOPIC_SETTINGS", "DESCRIPTION", "add_arguments", "needs_of", "run"]

TOPIC_SETTINGS = (
    "requests_topic",
    "bulk_topic",
    "results_topic",
    "dlq_topic",
    "catalog_topic",
    "models",
    "max_request_bytes",
    "max_result_bytes",
)
"""The worker settings that name or size topics: flags here, ``KEMBED_*`` env vars as the
worker reads them."""


DESCRIPTION = (
    "Create (create) or compare with the cluster (check) the topics a kembed "
    "fleet needs: the request and bulk topics of every model, the results topic, the "
    "request dead-letter topic and the compacted model catalog, from the worker's "
    "settings (same KEMBED_* env vars), plus each --results topic and its sink "
    "dead-letter topic <topic>.dlq. Existing topics are never changed. Exit status 0 "
    "when all exist as required, 1 with one line per problem, 2 when Kafka cannot be "
    "reached or the settings are invalid."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["create", "check"],
        help="create: create the missing topics, then check them all; check: only compare",
    )
    parser.add_argument(
        "--results",
        action="append",
        default=[],
        metavar="TOPIC",
        help="a results topic a sink reads (repeatable): it and its dead-letter topic "
        "TOPIC.dlq are planned like the results topic",
    )
    parser.add_argument(
        "--results-retention-ms",
        type=positive_int,
        default=None,
        metavar="MS",
        help="retention.ms of each --results topic and its TOPIC.dlq (default: 604800000, "
        "7 days): they hold the only copy of the vectors until a sink has written them, so "
        "a sink down longer than this loses results; check flags a shorter one",
    )
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        help="partitions of each request, bulk and results topic (dead-letter topics and "
        "the catalog get 1). create: default 12; check compares partition counts only when "
        "given",
    )
    parser.add_argument(
        "--replication-factor",
        type=positive_int,
        default=None,
        help="replicas of each created topic (default: 3, or the cluster's broker count when "
        "smaller); from 3 on, topics also get min.insync.replicas=2",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for Kafka, brokers that are still starting included (default: 60)",
    )
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    add_settings_flags(parser, WorkerSettings, only=TOPIC_SETTINGS)
    add_settings_flags(parser, KafkaClientSettings)


def needs_of(
    settings: WorkerSettings, results: Sequence[str], retention_ms: int | None = None
) -> TopicNeeds:
    """The worker's topic settings and the sinks' results topics (kept ``retention_ms``;
    None: 7 days), as the plan takes them."""
    from kembed_shared.kafka.topics import DEFAULT_SINK_RETENTION_MS, TopicNeeds

    interactive, bulk = settings.request_topics()
    return TopicNeeds(
        requests_topics=interactive,
        bulk_topics=bulk,
        results_topic=settings.results_topic,
        dlq_topic=settings.dlq_topic,
        catalog_topic=settings.catalog_topic,
        max_request_bytes=settings.max_request_bytes,
        max_result_bytes=settings.max_result_bytes,
        sink_results=[topic for topic in results if topic.strip()],
        sink_retention_ms=retention_ms or DEFAULT_SINK_RETENTION_MS,
    )


def run(args: argparse.Namespace) -> int:
    from kembed_shared.kafka.security import client_options
    from kembed_shared.kafka.topics import DEFAULT_PARTITIONS, plan
    from kembed_shared.ports import KafkaAccessError

    command = f"topics {args.action}"
    settings = settings_from(WorkerSettings, args, command)
    kafka = settings_from(KafkaClientSettings, args, command)
    if settings is None or kafka is None:
        return 2
    needs = needs_of(settings, args.results, args.results_retention_ms)
    specs = plan(needs, args.partitions or DEFAULT_PARTITIONS)
    try:
        security = client_options(kafka)
    except KafkaAccessError as exc:
        print(f"kembed {command}: {exc.reason}", file=sys.stderr)
        return 2
    try:
        with quiet_kafka_logs():
            report = asyncio.run(_ensure(args, kafka, specs, security))
    except _RefusedError as exc:
        print(f"kembed {command}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        write_json(
            {
                "created": report.created,
                "ok": report.kept,
                "problems": report.problems,
                "replication_factor": report.replication_factor,
                "topics": [
                    {
                        "name": s.name,
                        "role": s.role,
                        "partitions": s.partitions,
                        "config": s.config,
                    }
                    for s in specs
                ],
            },
            indent=2,
        )
    else:
        _print_report(report, specs, listed=args.action == "create")
    return 1 if report.problems else 0


class _RefusedError(Exception):
    """Kafka could not be reached, rejected the login, or refused to create a topic."""


async def _ensure(
    args: argparse.Namespace,
    kafka: KafkaClientSettings,
    specs: Sequence[TopicSpec],
    security: dict[str, Any],
) -> EnsureReport:
    from kembed_shared.kafka.security import diagnose_login
    from kembed_shared.kafka.topics import (
        InvalidReplicationFactorError,
        KafkaConnectionError,
        KafkaError,
        TopicCreationError,
        ensure_topics,
    )

    # Brokers not up yet, or not registered with their controller yet (ensure_topics has
    # refused more replicas than brokers before that could be the reason).
    transient = (KafkaConnectionError, InvalidReplicationFactorError)
    from kembed_shared.ports import KafkaAccessError

    last: str = "no answer"
    try:
        async with asyncio.timeout(args.timeout):
            while True:  # brokers still starting (a topics job started beside them) are waited for
                try:
                    return await ensure_topics(
                        kafka.bootstrap_servers,
                        specs,
                        client_config=security,
                        replication_factor=args.replication_factor,
                        create=args.action == "create",
                        check_partitions=args.partitions is not None,
                    )
                except TopicCreationError as exc:
                    raise _RefusedError(str(exc)) from None
                except KafkaError as exc:
                    try:
                        await diagnose_login(kafka.bootstrap_servers, security)
                    except KafkaAccessError as denied:
                        raise _RefusedError(denied.reason) from None
                    last = f"{type(exc).__name__} {exc}".strip()
                    if not isinstance(exc, transient) and not exc.retriable:
                        raise _RefusedError(
                            f"Kafka at {kafka.bootstrap_servers} refused the request: {last}"
                        ) from None
                await asyncio.sleep(1.0)
    except TimeoutError:
        raise _RefusedError(
            f"no answer from Kafka at {kafka.bootstrap_servers} within {args.timeout:g} s "
            f"(last: {last})"
        ) from None


def _print_report(report: EnsureReport, specs: Sequence[TopicSpec], listed: bool) -> None:
    """``listed``: a line per topic (create); else only the problems and the summary."""
    for spec in specs:
        if spec.name in report.created:
            size = spec.config.get("max.message.bytes")
            print(
                f"created {spec.name} ({spec.role}): {spec.partitions} partition(s), "
                f"replication factor {report.replication_factor}"
                + (f", max.message.bytes={size}" if size else "")
                + (", compacted" if spec.compacted else "")
                + (f", {spec.timestamp_type}" if spec.timestamp_type else "")
                + (f", retention.ms={spec.min_retention_ms}" if spec.min_retention_ms else "")
            )
        elif spec.name in report.kept and listed:
            print(f"ok      {spec.name} ({spec.role})")
    for problem in report.problems:
        print(f"problem: {problem}")
    if listed:
        print(
            f"{len(specs)} topic(s): {len(report.created)} created, {len(report.kept)} already "
            f"as required, {len(report.problems)} problem(s)"
        )
    else:
        print(
            f"{len(specs)} topic(s) checked: {len(report.kept)} as required, "
            f"{len(report.problems)} problem(s)"
        )
