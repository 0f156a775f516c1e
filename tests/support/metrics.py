"""Reading a kembed process's Prometheus endpoint in tests: every sample of one scrape,
and sums over label subsets."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Scrape", "samples", "total"]

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(base: str) -> Scrape:
    """Every sample of ``base``/metrics, keyed by (sample name, labels)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        assert response.status == 200
        body = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def total(scrape: Scrape, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in scrape.items() if n == name and wanted <= ls)
