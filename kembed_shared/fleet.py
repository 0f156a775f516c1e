"""The fleet as the consumer group sees it, for ``kembed status``: members, assignment, lag.

This module holds the data; :mod:`kembed_shared.kafka.group_status` fills it from the
brokers, and ``kembed status`` (:mod:`kembed_cli.commands.status`) renders it. Optionally,
the token backlog is read from the workers' ``/metrics`` (``kembed_backlog_tokens``);
without it the backlog is known only in messages.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "FleetStatus",
    "Member",
    "PartitionLag",
    "StatusError",
    "TopicTotal",
    "read_backlog_tokens",
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
