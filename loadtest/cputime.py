"""CPU time of whole processes (all their threads), read from ``/proc/<pid>/stat``.

The benchmark reads each process's CPU time before and after a scenario: the worker, the
broker's JVM, the load generator, and (for the in-process baseline) the benchmark itself.
CPU time, unlike wall-clock time, barely depends on what else shares the machine, so
"CPU-ms per 1,000 texts" describes kembed itself on a small machine and on a large one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CpuClock",
    "CpuSample",
    "cpu_ms_per_1000",
    "cpu_seconds",
    "machine_busy_seconds",
    "parse_stat_cpu_ticks",
    "sample",
    "thread_cpu_seconds",
    "usage",
]

# Fields after the command name in /proc/<pid>/stat, counted from 3 (state) as in proc(5):
# utime is field 14 and stime field 15, both in clock ticks, summed over all threads.
_UTIME_FIELD, _STIME_FIELD = 14, 15
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat_cpu_ticks(stat: str) -> int:
    """utime + stime (clock ticks) from the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may itself hold spaces and
    parentheses, so the fields are counted from the last ``)``."""
    close = stat.rfind(")")
    if close < 0:
        raise ValueError("not a /proc/<pid>/stat line: no command name")
    rest = stat[close + 1 :].split()
    # rest[0] is field 3 (state).
    try:
        return int(rest[_UTIME_FIELD - 3]) + int(rest[_STIME_FIELD - 3])
    except (IndexError, ValueError) as exc:
        raise ValueError("not a /proc/<pid>/stat line: too few fields") from exc


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds of named processes at one moment."""

    seconds: Mapping[str, float]


def _stat_seconds(stat_path: Path) -> float:
    """utime + stime of a ``/proc`` stat file (a process's or one thread's), in seconds."""
    return parse_stat_cpu_ticks(stat_path.read_text()) / _CLOCK_TICKS


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid``, all its threads (``/proc/<pid>/stat``)."""
    return _stat_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of process ``pid``, by thread id."""
    used = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            used[int(task.name)] = _stat_seconds(task / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return used


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    total = sum(values[:8])
    return (total - idle) / _CLOCK_TICKS, total / _CLOCK_TICKS


def sample(pids: Mapping[str, int]) -> CpuSample:
    """The CPU seconds consumed so far by each process of ``pids`` (name -> pid)."""
    return CpuSample({name: cpu_seconds(pid) for name, pid in pids.items()})


@dataclass
class CpuClock:
    """CPU seconds of named processes between :meth:`start` and :meth:`stop`."""

    pids: dict[str, int]
    started: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self.started = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> None:
        self.used = {name: cpu_seconds(pid) - self.started[name] for name, pid in self.pids.items()}


def usage(before: CpuSample, after: CpuSample) -> dict[str, float]:
    """CPU seconds each process spent between two samples (processes in both)."""
    return {
        name: after.seconds[name] - before.seconds[name]
        for name in before.seconds
        if name in after.seconds
    }


def cpu_ms_per_1000(cpu_seconds: float, texts: int) -> float:
    """CPU milliseconds per 1,000 texts."""
    if texts <= 0:
        raise ValueError("texts must be positive")
    return cpu_seconds * 1000 * 1000 / texts
