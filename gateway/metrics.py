"""Every Prometheus metric of the gateway, in one place (prefix ``kembed_gateway_``).

The worker's conventions: an own registry per :class:`GatewayMetrics`, counters exposed
with ``_total``, no ``_created`` samples. ``model`` is the catalog's name of the model a
request was for (never the name a client sent when the catalog does not know it, which
would let clients create series), empty when the request named none or was refused first.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import generate_latest

from kembed_shared.observability.metrics import CONTENT_TYPE

__all__ = ["CONTENT_TYPE", "GATEWAY_METRIC_NAMES", "GatewayMetrics"]

disable_created_metrics()  # type: ignore[no-untyped-call]

_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "kembed_gateway_requests",
            "HTTP requests answered, by endpoint, model and HTTP status.",
            ["endpoint", "model", "status"],
            registry=r,
        )
        self.seconds = Histogram(
            "kembed_gateway_request_seconds",
            "Time from a request's arrival to its answer, by endpoint.",
            ["endpoint"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "kembed_gateway_in_flight",
            "Embedding requests waiting for a result now (bounded by max_in_flight).",
            registry=r,
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


GATEWAY_METRIC_NAMES = (
    "kembed_gateway_requests_total",
    "kembed_gateway_request_seconds",
    "kembed_gateway_in_flight",
)
"""The exposed metric families."""
