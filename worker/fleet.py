"""The fleet as the consumer group sees it, for ``kembed status``: members, assignment, lag.

This module holds the data and its two renderings (a table for people, JSON for machines);
:mod:`worker.kafka.group_status` fills it from the brokers. Optionally, the token backlog
is read from the workers' ``/metrics`` (``kembed_backlog_tokens``); without it the backlog
is known only in messages.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "FleetStatus",
    "Member",
    "PartitionLag",
    "StatusError",
    "read_backlog_tokens",
    "render_table",
    "to_json",
]

BACKLOG_METRIC = "kembed_backlog_tokens"


class StatusError(Exception):
    """The status cannot be read (broker unreachable, group unknown ...); the message says
    why, for people, and never carries a traceback's worth of detail."""


@dataclass(frozen=True)
class Member:
    """A member of the consumer group and the partitions the group leader gave it."""

    member_id: str
    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class PartitionLag:
    """One request partition: the group's committed offset against the log's bounds."""

    topic: str
    partition: int
    log_start: int
    end: int  # the high watermark: offset of the next message written
    committed: int | None  # None: the group never committed here
    member_id: str | None  # the member it is assigned to, None when unassigned

    @property
    def lag(self) -> int:
        """Messages the group has yet to finish. Without a committed offset (or one below
        the log start, after retention) a worker starts at the log start, as the workers'
        ``auto.offset.reset=earliest`` does."""
        position = self.log_start if self.committed is None else self.committed
        return max(self.end - max(position, self.log_start), 0)


@dataclass(frozen=True)
class TopicTotal:
    partitions: int
    assigned: int
    end: int
    lag: int


@dataclass(frozen=True)
class FleetStatus:
    group: str
    state: str  # Stable, PreparingRebalance, CompletingRebalance, Empty
    protocol: str  # the assignment strategy (range, roundrobin ...)
    members: tuple[Member, ...]
    partitions: tuple[PartitionLag, ...]
    missing_topics: tuple[str, ...] = ()
    backlog_tokens: float | None = None  # summed kembed_backlog_tokens, when read
    metrics_urls: tuple[str, ...] = ()

    @property
    def backlog_messages(self) -> int:
        return sum(p.lag for p in self.partitions)

    def topic_totals(self) -> dict[str, TopicTotal]:
        totals: dict[str, TopicTotal] = {}
        for topic in dict.fromkeys(p.topic for p in self.partitions):
            mine = [p for p in self.partitions if p.topic == topic]
            totals[topic] = TopicTotal(
                partitions=len(mine),
                assigned=sum(p.member_id is not None for p in mine),
                end=sum(p.end for p in mine),
                lag=sum(p.lag for p in mine),
            )
        return totals


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
        lines += _table(
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
        lines += _table(
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
        lines += _table(
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


def read_backlog_tokens(urls: Sequence[str], timeout: float) -> float:
    """``kembed_backlog_tokens`` summed over every lane of every worker's ``/metrics``."""
    total = 0.0
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read().decode("utf-8")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise StatusError(f"cannot read worker metrics at {url}: {exc}") from None
        samples = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == BACKLOG_METRIC
        ]
        if not samples:
            raise StatusError(f"{url} exposes no {BACKLOG_METRIC} (is it a kembed worker?)")
        total += sum(samples)
    return total


def _partition_list(partitions: Sequence[tuple[str, int]]) -> str:
    """``embed.requests[0,1] embed.requests.bulk[0]``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return " ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in by_topic.items()) or "-"


def _table(header: list[str], rows: list[list[str]], right: set[int] | None = None) -> list[str]:
    right = right or set()
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]
