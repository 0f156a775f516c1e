"""Where a worker's time goes, from py-spy: finding py-spy, and summing its raw
(collapsed) stacks into shares per thread, per event-loop task and per function, and the
worker's CPU time per thread under the names py-spy saw."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["find_pyspy", "summarize_profile", "thread_cpu_ms"]


def find_pyspy() -> str | None:
    """py-spy's executable: the PYSPY variable, else ``py-spy`` on the PATH (None: absent)."""
    named = os.environ.get("PYSPY")
    if named:
        return named if Path(named).is_file() else None
    return shutil.which("py-spy")


def summarize_profile(raw: str, top: int = 25) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks of active threads -> shares of the samples: per
    thread, per task (the coroutine or callback the event loop was running, or the thread
    for other threads), per function on its own (self) and with what it calls
    (inclusive)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        thread, *frames = stack.split(";")
        if not frames:
            continue
        total += count
        threads[_thread_name(thread)] += count
        names = [_function(frame) for frame in frames]
        tasks[_task(names, _thread_name(thread))] += count
        own[names[-1]] += count
        for name in set(names):
            inclusive[name] += count
    if not total:
        return {"samples": 0, "threads": {}, "tasks": [], "self": [], "inclusive": []}

    def shares(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(name, samples / total) for name, samples in counter.most_common(n)]

    return {
        "samples": total,
        "threads": dict(shares(threads, 10)),
        "tasks": shares(tasks, 15),
        "self": [(name, share, inclusive[name] / total) for name, share in shares(own, top)],
        "inclusive": shares(inclusive, top),
    }


def thread_cpu_ms(
    raw: str, before: dict[int, float], after: dict[int, float], pid: int, texts: int
) -> dict[str, float]:
    """CPU-ms per 1,000 texts of each thread of the worker, named as py-spy saw them
    (threads that never ran Python code, such as the tokenizer library's own pool, are
    "native")."""
    names = {}
    for line in raw.splitlines():
        head = line.split(";", 1)[0]
        if head.startswith("thread (") and "): " in head:
            number, _, name = head[len("thread (") :].partition("): ")
            if number.isdigit():
                names[int(number)] = _thread_name(name)
    names.setdefault(pid, "MainThread")
    used: dict[str, float] = {}
    for tid, seconds in after.items():
        name = names.get(tid, "native")
        used[name] = used.get(name, 0.0) + seconds - before.get(tid, 0.0)
    ranked = sorted(used.items(), key=lambda pair: -pair[1])
    return {name: 1e6 * seconds / texts for name, seconds in ranked}


def _task(names: list[str], thread: str) -> str:
    """What an event loop's sample was running: the frame below the loop's callback
    runner; other threads: the thread."""
    for position, name in enumerate(names[:-1]):
        if name.startswith("Handle._run "):
            return names[position + 1]
    if any(name.startswith("BaseEventLoop._run_once ") for name in names):
        return "event loop (selector, scheduling)"
    return f"thread {thread}"


def _function(frame: str) -> str:
    """ "name (path/to/file.py:123)" -> "name (to/file.py)": lines differ within one
    function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


def _thread_name(frame: str) -> str:
    """ "thread (123): MainThread" -> "MainThread"; "thread (123): kembed-tokenizer_0" ->
    "kembed-tokenizer"."""
    name = frame.split(": ", 1)[-1]
    return name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit() else name
