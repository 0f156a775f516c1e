"""``python -m loadtest.startup``: time to /ready and to full speed, cold and warm.

Starts a local broker, then a real worker (default settings unless ``--env`` says
otherwise) with ``KEMBED_COMPILE_CACHE_DIR`` in a fresh directory (cold), polls ``/ready``
from the moment it is spawned, and keeps it busy with single-text-free load (8 concurrent
``embed()`` calls of 32 STS-B sentences) measuring texts/s in 3 s windows, until the
encoder's phase (in ``/info``) leaves ``tuning`` and two more windows have run. Then the
same again with the same cache directory (warm). Nothing is asserted; figures printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadtest.data import stsb_sentences
from producer_sdk import EmbedClient
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

WINDOW_S = 3.0


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, json.loads(response.read() or b"null")
    except Exception:  # noqa: BLE001 (not up yet)
        return 0, None


async def _measure(
    bootstrap: str, topic: str, worker: WorkerProcess, spawned: float
) -> dict[str, Any]:
    base = ""
    while not base:
        try:
            base = worker.http_url
        except AssertionError:
            await asyncio.sleep(0.2)
    ready_s = None
    while ready_s is None:
        status, _ = _get(f"{base}/ready")
        if status == 200:
            ready_s = time.monotonic() - spawned
        else:
            await asyncio.sleep(0.1)
    sentences = stsb_sentences()
    done = 0
    windows: list[dict[str, Any]] = []

    async def load(client: EmbedClient, lane: int) -> None:
        nonlocal done
        offset = lane * 997
        while True:
            chunk = [sentences[(offset + i) % len(sentences)] for i in range(32)]
            offset += 32 * 8
            await client.embed(chunk, timeout=120)
            done += len(chunk)

    async with EmbedClient(bootstrap, requests_topic=topic) as client:
        tasks = [asyncio.create_task(load(client, lane)) for lane in range(8)]
        after_final = 0
        try:
            while after_final < 3 and time.monotonic() - spawned < 600:
                before, begun = done, time.monotonic()
                await asyncio.sleep(WINDOW_S)
                _, info = _get(f"{base}/info")
                tuning = (info or {}).get("model", {}).get("tuning") or {}
                phase = tuning.get("phase", "eager")
                windows.append(
                    {
                        "at_s": round(time.monotonic() - spawned, 1),
                        "texts_per_s": round((done - before) / (time.monotonic() - begun), 1),
                        "phase": phase,
                        "dtype": (info or {}).get("model", {}).get("dtype"),
                        "compiled": (info or {}).get("model", {}).get("compiled"),
                    }
                )
                print(windows[-1], flush=True)
                after_final += phase != "tuning"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    tuned = next((e for e in worker.events() if e.get("event") == "encoder.tuned"), None)
    started = next(e for e in worker.events() if e.get("event") == "worker.started")
    return {
        "ready_s": round(ready_s, 1),
        "full_speed_s": None if tuned is None else _since(tuned, started, ready_s),
        "first_window_texts_per_s": windows[0]["texts_per_s"],
        "final_texts_per_s": max(w["texts_per_s"] for w in windows[-2:]),
        "chosen": None if tuned is None else tuned.get("chosen"),
        "table": None if tuned is None else tuned.get("table"),
        "windows": windows,
    }


def _since(event: dict[str, Any], started: dict[str, Any], ready_s: float) -> float:
    """Seconds from spawn to ``event``: its log time relative to worker.started, which
    came just before /ready answered."""
    from datetime import datetime

    def at(e: dict[str, Any]) -> float:
        return datetime.fromisoformat(str(e["timestamp"]).replace("Z", "+00:00")).timestamp()

    return round(ready_s + at(event) - at(started), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the worker")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.env)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "compile-cache"
        runs = ("cold", "warm")
        topics = [
            *DEFAULT_TOPICS,
            *(TopicSpec(f"startup.{r}{s}", 2) for r in runs for s in ("", ".bulk")),
        ]
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            for run in runs:
                spawned = time.monotonic()
                worker = WorkerProcess(
                    kafka.bootstrap_servers,
                    Path(tmp) / f"worker-{run}.log",
                    compile_cache_dir=str(cache),
                    group_id=f"startup-{run}",
                    requests_topic=f"startup.{run}",
                    bulk_topic=f"startup.{run}.bulk",
                    **{k.lower().removeprefix("kembed_"): v for k, v in settings.items()},
                )
                try:
                    report[run] = asyncio.run(
                        _measure(kafka.bootstrap_servers, f"startup.{run}", worker, spawned)
                    )
                finally:
                    worker.stop()
                print(run, {k: v for k, v in report[run].items() if k != "windows"}, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
