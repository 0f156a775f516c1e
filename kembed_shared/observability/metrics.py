"""What every kembed process's ``/metrics`` shares: the exposition format it answers in, and
the registry its metrics are declared in."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import generate_latest

__all__ = ["CONTENT_TYPE", "MetricsRegistry"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus text exposition format 0.0.4, the format ``generate_latest`` writes."""


class MetricsRegistry:
    """A process's metrics in their own registry (tests and several services in one process
    never share counters), each declared in one call, and their scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

    def _counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def _gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def _histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float],
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

    def _info(self, name: str, documentation: str) -> Info:
        return Info(name, documentation, registry=self.registry)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
