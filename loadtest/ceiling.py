"""``python -m loadtest.ceiling``: the host pipeline's ceiling.

How many texts per second can one worker process move when the encoder costs nothing (a
GPU that is never the bottleneck)? Each worker here is the real worker
(``loadtest.ceiling_worker``: Kafka fetch, decoding, tokenization with MiniLM's tokenizer,
batching, result encoding, publishing, commits) with an encoder stand-in that returns fixed
vectors at once. A local broker runs beside it; this process is the load generator: it
publishes bulk requests of ``--per-request`` STS-B sentences and reads every result.

For one worker, then for ``--workers`` in one consumer group (each scenario on its own
topics, after a warm-up run): texts/s from the first send to the last result, and CPU-ms per
1,000 texts of each worker process, of the broker and of this process (``/proc/<pid>/stat``,
all threads, read around the run). Every request must be answered exactly once, with a
result whose id matches its correlation id. With ``--profile`` and py-spy installed, a
further run of one worker is sampled by py-spy and the report lists where its time goes
(py-spy is optional: without it the profile is skipped).

Writes ``ceiling.json`` and ``ceiling.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loadtest.ceiling_report import write_report
from loadtest.cputime import CpuClock, cpu_seconds, machine_busy_seconds, thread_cpu_seconds
from loadtest.data import stsb_sentences
from loadtest.e2e import reading_replies
from loadtest.pyspy_profile import find_pyspy, summarize_profile, thread_cpu_ms
from schemas import EmbedRequest, EmbedResult, decode_result, encode_request
from schemas.headers import CORRELATION_ID
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

__all__ = ["CpuClock", "cpu_seconds", "find_pyspy", "main", "summarize_profile"]


@dataclass
class Drive:
    """What the load generator saw of one run."""

    requests: int
    texts: int = 0
    seconds: float = 0.0
    publish_seconds: float = 0.0
    errors: int = 0
    duplicates: int = 0
    mismatched: int = 0
    missing: int = 0


async def drive(
    bootstrap: str, texts: list[str], per_request: int, topic: str, results: str
) -> Drive:
    """Publish ``texts`` as bulk requests and read every result; count what is wrong."""
    requests = [
        EmbedRequest(
            id=uuid.uuid4().hex, inputs=tuple(texts[i : i + per_request]), reply_to=results
        )
        for i in range(0, len(texts), per_request)
    ]
    encoded = [encode_request(request) for request in requests]
    expected = {request.id: len(request.inputs) for request in requests}
    seen: Counter[str] = Counter()
    run = Drive(requests=len(requests))
    consumer = AIOKafkaConsumer(
        results,
        bootstrap_servers=bootstrap,
        group_id=None,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20)
    async with reading_replies(consumer, producer):
        started = time.perf_counter()
        sends = [await producer.send(topic, value) for value in encoded]
        await asyncio.gather(*sends)
        run.publish_seconds = time.perf_counter() - started
        answered = 0
        while answered < len(requests):
            if time.perf_counter() - started > 600:
                raise TimeoutError(f"{len(requests) - answered} requests unanswered after 600 s")
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for record in records:
                    correlation = dict(record.headers).get(CORRELATION_ID, b"").decode()
                    if correlation not in expected:
                        continue
                    result = decode_result(record.value)
                    if result.id != correlation:
                        run.mismatched += 1
                    seen[correlation] += 1
                    if seen[correlation] > 1:
                        run.duplicates += 1
                        continue
                    answered += 1
                    if isinstance(result, EmbedResult) and result.count == expected[correlation]:
                        run.texts += result.count
                    else:
                        run.errors += 1
        run.seconds = time.perf_counter() - started
        run.missing = len(expected) - len(seen)
    return run


# ------------------------------------------------------------------ workers


def start_workers(
    kafka: LocalKafka, count: int, tag: str, partitions: int, out: Path, settings: dict[str, Any]
) -> list[WorkerProcess]:
    bulk, requests = f"ceiling.{tag}.bulk", f"ceiling.{tag}.requests"
    kafka.create_topics(
        [
            TopicSpec(bulk, partitions, {"max.message.bytes": "8388608"}),
            TopicSpec(requests, 1),
            TopicSpec(f"ceiling.{tag}.results", partitions, {"max.message.bytes": "8388608"}),
        ]
    )
    workers = [
        WorkerProcess(
            kafka.bootstrap_servers,
            out / f"worker-{tag}-{n}.log",
            module="loadtest.ceiling_worker",
            bulk_topic=bulk,
            requests_topic=requests,
            results_topic=f"ceiling.{tag}.results",
            group_id=f"ceiling-{tag}",
            client_id=f"ceiling-{tag}-{n}",
            **settings,
        )
        for n in range(count)
    ]
    wanted = {f"{bulk}-{p}" for p in range(partitions)}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        joined = [_last_join(worker) for worker in workers]
        if all(joined) and len({j["generation"] for j in joined if j}) == 1:
            held = {p for j in joined if j for p in j["partitions"]}
            each = all(any(p in wanted for p in j["partitions"]) for j in joined if j)
            if wanted <= held and each:
                return workers
        if any(worker.process.poll() is not None for worker in workers):
            break
        time.sleep(0.2)
    for worker in workers:
        worker.stop()
    tails = "\n".join(w.log_path.read_text(errors="replace")[-2000:] for w in workers)
    raise RuntimeError(f"the workers never shared {bulk} between them:\n{tails}")


def _last_join(worker: WorkerProcess) -> dict[str, Any] | None:
    joins = [e for e in worker.events() if e.get("event") == "group.joined"]
    return joins[-1] if joins else None


def _worker_problems(workers: list[WorkerProcess]) -> list[str]:
    bad = {"warning", "error", "critical"}
    return [
        f"{e.get('event')}: {e.get('reason', '')}"
        for worker in workers
        for e in worker.events()
        if e.get("level") in bad and not str(e.get("event", "")).startswith("Marking the")
    ]


# ------------------------------------------------------------------ scenarios


def scenario(
    kafka: LocalKafka,
    count: int,
    texts: list[str],
    warmup: list[str],
    per_request: int,
    partitions: int,
    out: Path,
    settings: dict[str, Any],
    pyspy: str | None = None,
    repeat: int = 1,
) -> dict[str, Any]:
    """Start ``count`` workers on new topics, warm them up, then measure ``repeat`` runs
    (one, sampled by py-spy, with ``pyspy``) and report the median."""
    print(f"{time.strftime('%H:%M:%S')} starting {count} worker(s)", flush=True)
    tag = f"{count}w{'p' if pyspy else ''}-{uuid.uuid4().hex[:6]}"
    workers = start_workers(kafka, count, tag, partitions, out, settings)
    topic, results = f"ceiling.{tag}.bulk", f"ceiling.{tag}.results"
    profile: dict[str, Any] | None = None
    try:
        asyncio.run(drive(kafka.bootstrap_servers, warmup, per_request, topic, results))
        assert kafka.pid is not None
        pids = {f"worker {n + 1}": w.process.pid for n, w in enumerate(workers)}
        clock = CpuClock(pids | {"broker": kafka.pid, "load generator": os.getpid()})
        sampler = None
        if pyspy:
            raw = out / "profile.txt"
            sampler = subprocess.Popen(
                [
                    *(pyspy, "record", "--pid", str(workers[0].process.pid), "--threads"),
                    *("--rate", "250", "--format", "raw", "--output", str(raw)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            time.sleep(1.0)  # py-spy attaches
        measured = []
        threads_before = thread_cpu_seconds(workers[0].process.pid)
        for _ in range(1 if sampler else repeat):
            busy0, total0 = machine_busy_seconds()
            clock.start()
            run = asyncio.run(drive(kafka.bootstrap_servers, texts, per_request, topic, results))
            clock.stop()
            busy1, total1 = machine_busy_seconds()
            machine = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
            measured.append((run, dict(clock.used), machine))
        # The median run by texts/s, with its own CPU figures.
        measured.sort(key=lambda m: m[0].texts / m[0].seconds)
        run, used, machine = measured[len(measured) // 2]
        if sampler is not None:
            threads_after = thread_cpu_seconds(workers[0].process.pid)
            sampler.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
            _, stderr = sampler.communicate(timeout=60)
            raw = out / "profile.txt"
            if sampler.returncode == 0 and raw.exists():
                text = raw.read_text()
                profile = summarize_profile(text)
                profile["thread_cpu_ms_per_1000_texts"] = thread_cpu_ms(
                    text, threads_before, threads_after, workers[0].process.pid, run.texts
                )
            else:
                profile = {"error": stderr.decode(errors="replace")[-500:]}
        problems = _worker_problems(workers)
    finally:
        for worker in workers:
            worker.stop()
    per_1000 = {name: 1000 * 1000 * seconds / run.texts for name, seconds in used.items()}
    result: dict[str, Any] = {
        "workers": count,
        "requests": run.requests,
        "texts": run.texts,
        "seconds": run.seconds,
        "publish_seconds": run.publish_seconds,
        "texts_per_s": run.texts / run.seconds,
        "texts_per_s_of_runs": [m[0].texts / m[0].seconds for m in measured],
        "bad_runs": sum(
            m[0].errors + m[0].duplicates + m[0].missing + m[0].mismatched for m in measured
        ),
        "errors": run.errors,
        "duplicates": run.duplicates,
        "mismatched": run.mismatched,
        "missing": run.missing,
        "cpu_ms_per_1000_texts": per_1000,
        "cpu_ms_per_1000_texts_workers": sum(
            value for name, value in per_1000.items() if name.startswith("worker")
        ),
        "cpu_utilization": {name: seconds / run.seconds for name, seconds in used.items()},
        "machine_busy_fraction": machine,
        "worker_problems": problems[:20],
    }
    if profile is not None:
        result["profile"] = profile
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.ceiling", description=__doc__)
    parser.add_argument("--texts", type=int, default=64_000, help="texts per measured run")
    parser.add_argument("--warmup", type=int, default=4_000, help="texts of the warm-up run")
    parser.add_argument("--per-request", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="measured runs (median kept)")
    parser.add_argument("--partitions", type=int, default=4, help="of the bulk topic")
    parser.add_argument("--workers", type=int, default=2, help="the scaling run (1: none)")
    parser.add_argument(
        "--profile", action="store_true", help="one more one-worker run, sampled by py-spy"
    )
    parser.add_argument(
        "--pyspy", default=find_pyspy(), help="py-spy's executable (default: $PYSPY, PATH)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting for every worker (e.g. max_batch_tokens=16384)",
    )
    parser.add_argument("--out", type=Path, default=Path("loadtest-ceiling"))
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    sentences = stsb_sentences()
    texts = [sentences[i % len(sentences)] for i in range(args.texts)]
    warmup = [sentences[-1 - i % len(sentences)] for i in range(args.warmup)]
    report: dict[str, Any] = {
        "per_request": args.per_request,
        "texts": args.texts,
        "warmup_texts": args.warmup,
        "repeat": args.repeat,
        "partitions": args.partitions,
        "worker_settings": settings,
        "runs": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="kembed-ceiling-") as tmp,
        LocalKafka(Path(tmp) / "kafka", topics=DEFAULT_TOPICS) as kafka,
    ):
        measure = functools.partial(
            scenario,
            kafka,
            texts=texts,
            warmup=warmup,
            per_request=args.per_request,
            partitions=args.partitions,
            out=args.out,
            settings=settings,
        )
        counts = [1] if args.workers <= 1 else [1, args.workers]
        for count in counts:
            row = measure(count, repeat=args.repeat)
            report["runs"].append(row)
            print(
                f"{count} worker(s): {row['texts_per_s']:,.0f} texts/s, CPU-ms/1k texts "
                + ", ".join(f"{k} {v:.0f}" for k, v in row["cpu_ms_per_1000_texts"].items()),
                flush=True,
            )
        if len(report["runs"]) > 1:
            report["scaling"] = report["runs"][-1]["texts_per_s"] / report["runs"][0]["texts_per_s"]
        if args.profile:
            if args.pyspy and Path(args.pyspy).exists():
                profiled = measure(1, pyspy=args.pyspy)
                report["profiled_run"] = {k: v for k, v in profiled.items() if k != "profile"}
                report["profile"] = profiled.get("profile")
            else:
                report["profile"] = {"error": f"py-spy not found ({args.pyspy or 'not on PATH'})"}
    write_report(report, args.out)
    ok = all(row["bad_runs"] == 0 for row in report["runs"])
    print(f"report: {args.out / 'ceiling.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
