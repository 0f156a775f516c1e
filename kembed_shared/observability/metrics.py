"""What every kembed process's ``/metrics`` shares: the exposition format it answers in."""

from __future__ import annotations

__all__ = ["CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus text exposition format 0.0.4, the format ``generate_latest`` writes."""
