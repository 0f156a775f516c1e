"""``kembed status``: the workers' consumer group, its assignment and lag, as tables or JSON."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from kembed_cli.common import (
    add_settings_flags,
    quiet_kafka_logs,
    settings_from,
    text_table,
    write_json,
)
from kembed_shared.fleet import FleetStatus, StatusError, read_backlog_tokens
from kembed_shared.settings import KafkaClientSettings
from worker.settings import WorkerSettings

__all__ = ["DESCRIPTION", "add_arguments", "render_table", "run", "to_json"]


DESCRIPTION = (
    "Ask the brokers about the workers' consumer group: its members, the "
    "partitions each holds, and per request partition the committed offset, the end "
    "offset (high watermark) and the lag. Exit status 0, or 2 when the brokers cannot "
    "be reached or the group is unknown."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, KafkaClientSettings)
    parser.add_argument(
        "--group",
        default=os.environ.get("KEMBED_GROUP_ID", _default("group_id")),
        help="the workers' consumer group [env: KEMBED_GROUP_ID]",
    )
    parser.add_argument(
        "--topics",
        default=",".join(_request_topics()),
        help="request topics to report, comma separated "
        "[env: KEMBED_REQUESTS_TOPIC, KEMBED_BULK_TOPIC, KEMBED_MODELS] (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        metavar="URL",
        help="a worker's /metrics URL (repeat for each worker) to add the backlog in tokens "
        "(kembed_backlog_tokens); without it the backlog is reported in messages only",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for answers (default: 10)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _default(name: str) -> str:
    return str(WorkerSettings.model_fields[name].default)


def _request_topics() -> list[str]:
    """The workers' request topics, as their env vars (KEMBED_MODELS included) name them;
    the defaults when those do not validate (a worker would refuse to start with them)."""
    try:
        interactive, bulk = WorkerSettings.model_validate({}).request_topics()
    except ValidationError:
        return [_default("requests_topic"), _default("bulk_topic")]
    return interactive + bulk


def run(args: argparse.Namespace) -> int:
    from kembed_shared.kafka.group_status import read_fleet_status
    from kembed_shared.kafka.security import client_options

    kafka = settings_from(KafkaClientSettings, args, "status")
    if kafka is None:
        return 2
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]

    async def read() -> FleetStatus:
        async with asyncio.timeout(args.timeout):
            return await read_fleet_status(
                kafka.bootstrap_servers,
                args.group,
                topics,
                request_timeout_ms=max(int(args.timeout * 1000), 1),
                security=client_options(kafka),
            )

    try:
        if not topics:
            raise StatusError("no topics to report (--topics is empty)")
        with quiet_kafka_logs():
            status = asyncio.run(read())
        if args.metrics_url:
            status = dataclasses.replace(
                status,
                backlog_tokens=read_backlog_tokens(args.metrics_url, args.timeout),
                metrics_urls=tuple(args.metrics_url),
            )
    except StatusError as exc:
        print(f"kembed status: {exc}", file=sys.stderr)
        return 2
    except TimeoutError:
        print(
            f"kembed status: no answer from Kafka at {kafka.bootstrap_servers} "
            f"within {args.timeout:g} s",
            file=sys.stderr,
        )
        return 2
    if args.json:
        write_json(to_json(status), indent=2)
    else:
        print(render_table(status))
    return 0


def to_json(status: FleetStatus) -> dict[str, Any]:
    """The status as plain JSON types (``kembed status --json``)."""
    return {
        "group": status.group,
        "state": status.state,
        "protocol": status.protocol,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "partitions": [{"topic": t, "partition": p} for t, p in m.partitions],
            }
            for m in status.members
        ],
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "member_id": p.member_id,
                "committed": p.committed,
                "log_start": p.log_start,
                "end": p.end,
                "lag": p.lag,
            }
            for p in status.partitions
        ],
        "topics": {
            topic: {
                "partitions": t.partitions,
                "assigned": t.assigned,
                "end": t.end,
                "lag": t.lag,
            }
            for topic, t in status.topic_totals().items()
        },
        "missing_topics": list(status.missing_topics),
        "backlog": {
            "messages": status.backlog_messages,
            "tokens": status.backlog_tokens,
            "tokens_from": list(status.metrics_urls),
        },
    }


def render_table(status: FleetStatus) -> str:
    """The status as aligned text tables, for people."""
    lines = [
        f"group {status.group}: {status.state}, {len(status.members)} member(s), "
        f"assignment strategy {status.protocol or '-'}",
        "",
    ]
    if status.members:
        lines += text_table(
            ["MEMBER", "CLIENT ID", "HOST", "PARTITIONS"],
            [
                [m.member_id, m.client_id, m.host, _partition_list(m.partitions)]
                for m in status.members
            ],
        )
    else:
        lines.append("no members: no worker is running in this group")
    lines.append("")
    if status.partitions:
        lines += text_table(
            ["TOPIC", "PARTITION", "MEMBER", "COMMITTED", "END", "LAG"],
            [
                [
                    p.topic,
                    str(p.partition),
                    p.member_id or "-",
                    "-" if p.committed is None else str(p.committed),
                    str(p.end),
                    str(p.lag),
                ]
                for p in status.partitions
            ],
            right={1, 3, 4, 5},
        )
        lines.append("")
        lines += text_table(
            ["TOPIC", "PARTITIONS", "ASSIGNED", "END", "LAG"],
            [
                [topic, str(t.partitions), str(t.assigned), str(t.end), str(t.lag)]
                for topic, t in status.topic_totals().items()
            ],
            right={1, 2, 3, 4},
        )
        lines.append("")
    for topic in status.missing_topics:
        lines.append(f"topic {topic} does not exist")
    lines.append(f"backlog: {status.backlog_messages} messages not yet finished by the group")
    if status.backlog_tokens is None:
        lines.append(
            "backlog tokens: not read (the workers' /metrics were not asked; "
            "pass --metrics-url for each worker)"
        )
    else:
        lines.append(
            f"backlog tokens: {status.backlog_tokens:.0f} "
            f"(kembed_backlog_tokens summed over {len(status.metrics_urls)} worker(s))"
        )
    return "\n".join(lines)


def _partition_list(partitions: Sequence[tuple[str, int]]) -> str:
    """``embed.requests[0,1] embed.requests.bulk[0]``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in by_topic.items()) or "-"
