"""Soak: steady mixed load on one worker for a long time; memory must stay flat and every
request must be answered without error.

    python -m loadtest.soak [--minutes 10] [--out DIR]

A local broker and a worker with the default settings (the same as `scripts/run.sh`) run
for a warm-up and then for ``--minutes`` of steady load: single-text ``embed()`` calls at
``--interactive-rate`` per second and bulk requests of ``--per-request`` texts at
``--bulk-rate`` texts per second. The worker's resident memory (VmRSS) is sampled every
few seconds. Targets: RSS at the end within 10% of RSS right after the warm-up, no error
result, no timeout, every request answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from tqdm import tqdm

from loadtest.data import stsb_sentences
from producer_sdk import EmbedClient, EmbedError, EmbedTimeoutError
from schemas import EmbedRequest, ErrorResult, decode_result, encode_request
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

__all__ = ["main"]

SOAK_RESULTS = "embed.results.soak"
MAX_RSS_GROWTH = 0.10


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def interactive(
    client: EmbedClient, texts: list[str], rate: float, until: float, tally: Tally
) -> None:
    rng = random.Random(11)
    calls: set[asyncio.Task[None]] = set()

    async def one(text: str) -> None:
        started = time.perf_counter()
        try:
            await client.embed([text], timeout=30)
        except EmbedTimeoutError:
            tally.timeouts += 1
        except EmbedError as exc:
            tally.error(exc.code)
        else:
            tally.ok += 1
            tally.latencies_ms.append((time.perf_counter() - started) * 1000)

    while time.monotonic() < until:
        tally.sent += 1
        task = asyncio.create_task(one(rng.choice(texts)))
        calls.add(task)
        task.add_done_callback(calls.discard)
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*calls)


async def bulk(
    bootstrap: str,
    texts: list[str],
    texts_per_s: float,
    per_request: int,
    until: float,
    tally: Tally,
) -> None:
    """Requests of ``per_request`` texts to the bulk lane at a steady rate; waits (up to a
    minute after ``until``) for every answer."""
    pending: set[str] = set()
    drained = asyncio.Event()
    consumer = AIOKafkaConsumer(SOAK_RESULTS, bootstrap_servers=bootstrap, group_id=None)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await consumer.start()
    await producer.start()

    async def read() -> None:
        while True:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    result = decode_result(record.value)
                    if result.id not in pending:
                        continue
                    pending.discard(result.id)
                    if isinstance(result, ErrorResult):
                        tally.error(str(result.error.code))
                    else:
                        tally.ok += 1
                    if not pending:
                        drained.set()

    reader = asyncio.create_task(read())
    try:
        await consumer.seek_to_end()
        for tp in consumer.assignment():
            await consumer.position(tp)
        interval = per_request / texts_per_s
        offset = 0
        next_at = time.monotonic()
        while time.monotonic() < until:
            chunk = tuple(texts[(offset + i) % len(texts)] for i in range(per_request))
            offset += per_request
            request = EmbedRequest(id=uuid.uuid4().hex, inputs=chunk, reply_to=SOAK_RESULTS)
            pending.add(request.id)
            tally.sent += 1
            await producer.send("embed.requests.bulk", encode_request(request))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await producer.flush()
        if pending:
            drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(drained.wait(), 60)
        tally.timeouts += len(pending)
    finally:
        reader.cancel()
        await producer.stop()
        await consumer.stop()


async def sample_rss(
    pid: int, every: float, until: float, samples: list[tuple[float, int]]
) -> None:
    started = time.monotonic()
    while time.monotonic() < until:
        samples.append((time.monotonic() - started, rss_bytes(pid)))
        await asyncio.sleep(every)


async def soak(args: argparse.Namespace, bootstrap: str, worker: WorkerProcess) -> dict[str, Any]:
    texts = stsb_sentences()
    pid = worker.process.pid
    samples: list[tuple[float, int]] = []
    interactive_tally, bulk_tally = Tally(), Tally()
    async with EmbedClient(bootstrap) as client:
        await client.embed(["warm-up"], timeout=120)
        started = time.monotonic()
        warm_end = started + args.warmup_s
        end = warm_end + args.minutes * 60
        sampler = asyncio.create_task(sample_rss(pid, args.sample_s, end, samples))
        load = asyncio.gather(
            interactive(client, texts, args.interactive_rate, end, interactive_tally),
            bulk(bootstrap, texts, args.bulk_rate, args.per_request, end, bulk_tally),
        )
        with tqdm(total=int(end - started), desc="soak", unit="s") as bar:
            while not load.done():
                await asyncio.sleep(1)
                bar.n = min(int(time.monotonic() - started), bar.total)
                bar.refresh()
        await load
        await sampler
    after_warmup = [rss for t, rss in samples if t >= args.warmup_s]
    window = max(1, int(60 / args.sample_s))  # one minute of samples
    baseline = statistics.fmean(after_warmup[:window])
    final = statistics.fmean(after_warmup[-window:])
    return {
        "settings": vars(args) | {"out": str(args.out)},
        "rss": {
            "samples": samples,
            "baseline_bytes": baseline,
            "final_bytes": final,
            "max_bytes": max(after_warmup),
            "growth": final / baseline - 1,
        },
        "interactive": asdict(interactive_tally) | _percentiles(interactive_tally.latencies_ms),
        "bulk": asdict(bulk_tally),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [0.0]
    return {f"p{q}": ordered[min(len(ordered) - 1, len(ordered) * q // 100)] for q in (50, 99)}


def verdicts(r: dict[str, Any]) -> list[tuple[str, str, bool]]:
    inter, bulk_ = r["interactive"], r["bulk"]
    growth = r["rss"]["growth"]
    return [
        ("RSS growth after warm-up < 10%", f"{growth * 100:+.1f}%", growth < MAX_RSS_GROWTH),
        (
            "no error results",
            f"{sum(inter['errors'].values()) + sum(bulk_['errors'].values())}",
            not inter["errors"] and not bulk_["errors"],
        ),
        (
            "every request answered (no timeout)",
            f"{inter['ok']}/{inter['sent']} interactive, {bulk_['ok']}/{bulk_['sent']} bulk",
            inter["ok"] == inter["sent"] and bulk_["ok"] == bulk_["sent"],
        ),
    ]


def write_report(r: dict[str, Any], out: Path) -> bool:
    (out / "soak.json").write_text(json.dumps(r, indent=2))
    rows = verdicts(r)
    mib = 1024 * 1024
    lines = [
        "# kembed soak",
        "",
        f"Settings: {r['settings']}",
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
        *(f"| {name} | {value} | {'pass' if ok else 'FAIL'} |" for name, value, ok in rows),
        "",
        f"Worker RSS: {r['rss']['baseline_bytes'] / mib:.0f} MiB in the first minute after "
        f"warm-up, {r['rss']['final_bytes'] / mib:.0f} MiB in the last, peak "
        f"{r['rss']['max_bytes'] / mib:.0f} MiB.",
        f"Interactive embed(): {r['interactive']['sent']} calls, p50 "
        f"{r['interactive']['p50']:.1f} ms, p99 {r['interactive']['p99']:.1f} ms. Bulk: "
        f"{r['bulk']['sent']} requests of {r['settings']['per_request']} texts.",
        "",
        "![rss](rss.png)",
        "",
    ]
    (out / "soak.md").write_text("\n".join(lines))
    _plot(r, out / "rss.png")
    return all(ok for _, _, ok in rows)


def _plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = [t for t, _ in r["rss"]["samples"]]
    rss = [b / 1024 / 1024 for _, b in r["rss"]["samples"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(seconds, rss)
    ax.axvline(r["settings"]["warmup_s"], color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("seconds")
    ax.set_ylabel("worker RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="steady load after warm-up")
    parser.add_argument(
        "--warmup-s", type=float, default=120.0, help="load before the baseline (seconds)"
    )
    parser.add_argument("--interactive-rate", type=float, default=10.0, help="embed() calls/s")
    parser.add_argument(
        "--bulk-rate",
        type=float,
        default=200.0,
        help="bulk texts/s; keep the total well under the worker's capacity (a soak checks "
        "steady state: above capacity, the backlog and the memory holding it grow by design)",
    )
    parser.add_argument("--per-request", type=int, default=32, help="texts per bulk request")
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    args.out = args.out or Path("loadtest/reports") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="kembed-soak-") as tmp:
        topics = (*DEFAULT_TOPICS, TopicSpec(SOAK_RESULTS, 4))
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            worker = WorkerProcess(kafka.bootstrap_servers, args.out / "worker.log")
            try:
                worker.wait_ready(timeout=300)
                results = asyncio.run(soak(args, kafka.bootstrap_servers, worker))
            finally:
                worker.stop()
    passed = write_report(results, args.out)
    print(f"report: {args.out / 'soak.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
