"""A one-line progress bar for ``kembed ingest``, drawn on a terminal (stderr) only.

    [##########..........]  50%  12,345 docs  2,100 docs/s  1.8 MB  0:00:06

Without a known total (a pipe) it shows the counters only. It redraws at most
``1 / min_interval`` times a second, and draws nothing when disabled or when the stream
is not a terminal, so logs and redirected output stay clean.
"""

from __future__ import annotations

import shutil
import time
from typing import TextIO

from producer_sdk.ingest import IngestSummary

__all__ = ["ProgressBar", "format_bytes", "format_duration"]

_BAR_WIDTH = 20


class ProgressBar:
    def __init__(self, stream: TextIO, *, enabled: bool = True, min_interval: float = 0.1) -> None:
        self.stream = stream
        self.enabled = enabled and _is_terminal(stream)
        self.min_interval = min_interval
        self._last_draw = float("-inf")
        self._drawn = False

    def update(
        self, summary: IngestSummary, position: int | None = None, total: int | None = None
    ) -> None:
        """Redraw with ``summary``; ``position`` of ``total`` input bytes read, if known."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        line = render(summary, position, total)
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar, leaving the line for whatever is printed next."""
        if self._drawn:
            width = shutil.get_terminal_size((80, 24)).columns - 1
            self.stream.write("\r" + " " * width + "\r")
            self.stream.flush()
            self._drawn = False


def render(summary: IngestSummary, position: int | None, total: int | None) -> str:
    """The bar's text (without the carriage return)."""
    parts = []
    if position is not None and total:
        fraction = min(position / total, 1.0)
        filled = int(fraction * _BAR_WIDTH)
        parts.append(f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {fraction:4.0%}")
    parts.append(f"{summary.documents:,} docs")
    parts.append(f"{summary.documents_per_second:,.0f} docs/s")
    parts.append(format_bytes(summary.bytes))
    parts.append(format_duration(summary.seconds))
    return "  ".join(parts)


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
