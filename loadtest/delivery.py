"""``python -m loadtest.delivery``: what exactly-once delivery costs next to at least once.

One local broker and one worker per mode (at_least_once, then exactly_once at each
``--intervals`` value of ``transaction_interval_ms``), each mode on its own topics and
consumer group, all running at once. The scenarios run in rounds, the modes taking turns
in a rotating order, so that a machine shared with other work slows every mode alike:

- single: single-text ``EmbedClient.embed()`` calls one after another (closed loop);
- rate: single-text calls arriving as a Poisson process at ``--rate`` per second (open loop);
- bulk: texts sent in requests of 32 to the mode's bulk lane, timed to the last result;
  also the CPU time the worker and the broker used meanwhile, per 1,000 texts (far less
  sensitive to other load on the machine than texts/s).

Exactly-once modes read results ``read_committed`` (the SDK client and the bulk reader), as
callers that want the guarantee must. The model runs eagerly (no torch.compile) to keep
worker starts short; the figures compare the modes, they are not the service's best.
Prints a Markdown table (latency percentiles over all rounds, bulk: median of the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import e2e
from loadtest.cputime import cpu_seconds
from loadtest.data import stsb_sentences
from loadtest.run import percentiles
from producer_sdk import EmbedClient
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess


@dataclass
class Mode:
    name: str
    settings: dict[str, Any]
    index: int
    single: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    bulk: list[float] = field(default_factory=list)
    worker_cpu: list[float] = field(default_factory=list)  # ms per 1,000 bulk texts
    broker_cpu: list[float] = field(default_factory=list)
    pid: int = 0

    @property
    def exactly_once(self) -> bool:
        return self.settings.get("delivery") == "exactly_once"

    @property
    def isolation(self) -> str:
        return "read_committed" if self.exactly_once else "read_uncommitted"

    def topic(self, kind: str) -> str:
        return f"delivery{self.index}.{kind}"


async def measure(
    bootstrap: str, modes: list[Mode], args: argparse.Namespace, broker_pid: int
) -> None:
    sentences = stsb_sentences()
    async with AsyncExitStack() as stack:
        clients = {}
        for mode in modes:
            client = EmbedClient(
                bootstrap,
                requests_topic=mode.topic("requests"),
                reply_topic=mode.topic("results"),
                isolation_level=mode.isolation,
            )
            clients[mode.name] = await stack.enter_async_context(client)
            for text in sentences[:5]:
                await client.embed([text], timeout=60)  # warm-up
        for round_ in range(args.rounds):
            for mode in modes[round_ % len(modes) :] + modes[: round_ % len(modes)]:
                client = clients[mode.name]
                for i in range(args.single):
                    started = time.perf_counter()
                    await client.embed([sentences[(round_ * 997 + i) % len(sentences)]])
                    mode.single.append((time.perf_counter() - started) * 1000)
                mode.rate += await e2e.interactive(
                    client, sentences, args.rate, args.duration, seed=round_
                )
                texts = [sentences[(round_ + i) % len(sentences)] for i in range(args.bulk)]
                worker_before, broker_before = cpu_seconds(mode.pid), cpu_seconds(broker_pid)
                run = await e2e.bulk(
                    bootstrap,
                    texts,
                    32,
                    topic=mode.topic("bulk"),
                    reply_topic=mode.topic("bulk-results"),
                    isolation_level=mode.isolation,
                )
                assert run.errors == 0, f"{mode.name}: {run.errors} bulk errors"
                mode.bulk.append(run.texts_per_s)
                per_1000 = 1e6 / args.bulk
                mode.worker_cpu.append((cpu_seconds(mode.pid) - worker_before) * per_1000)
                mode.broker_cpu.append((cpu_seconds(broker_pid) - broker_before) * per_1000)
                print(
                    f"round {round_ + 1}, {mode.name}: bulk {run.texts_per_s:.0f} texts/s",
                    file=sys.stderr,
                    flush=True,
                )


def table(modes: list[Mode], args: argparse.Namespace) -> str:
    lines = [
        f"| mode | single embed() p50 / p95 ms (n={args.single * args.rounds}) "
        f"| {args.rate:g} req/s p50 / p99 ms "
        f"| bulk texts/s, median of {args.rounds} ({args.bulk} texts each) "
        "| bulk CPU ms per 1,000 texts: worker / broker (median) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode in modes:
        single, rate = percentiles(mode.single), percentiles(mode.rate)
        lines.append(
            f"| {mode.name} | {single['p50']:.1f} / {single['p95']:.1f} "
            f"| {rate['p50']:.1f} / {rate['p99']:.1f} "
            f"| {statistics.median(mode.bulk):.0f} "
            f"| {statistics.median(mode.worker_cpu):.0f} / "
            f"{statistics.median(mode.broker_cpu):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.delivery", description=__doc__)
    parser.add_argument("--intervals", default="0,5", help="exactly_once intervals, ms")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every scenario")
    parser.add_argument("--single", type=int, default=60, help="sequential calls per round")
    parser.add_argument("--rate", type=float, default=20.0, help="open-loop calls per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds at --rate")
    parser.add_argument("--bulk", type=int, default=2000, help="bulk texts per round")
    parser.add_argument("--dtype", default="auto", help="worker precision")
    parser.add_argument("--out", type=Path, default=None, help="write the table here too")
    parser.add_argument("--logs", type=Path, default=None, help="keep worker logs here")
    args = parser.parse_args(argv)
    modes = [Mode("at_least_once", {}, 0)]
    for interval in (float(v) for v in args.intervals.split(",") if v):
        modes.append(
            Mode(
                f"exactly_once, interval {interval:g} ms",
                {"delivery": "exactly_once", "transaction_interval_ms": interval},
                len(modes),
            )
        )
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kembed-delivery-") as tmp:
        topics = [*DEFAULT_TOPICS]
        for mode in modes:
            topics += [
                TopicSpec(mode.topic("requests"), 4),
                TopicSpec(mode.topic("bulk"), 4),
                TopicSpec(mode.topic("results"), 4),
                TopicSpec(mode.topic("bulk-results"), 4),
            ]
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            workers = [
                WorkerProcess(
                    kafka.bootstrap_servers,
                    (args.logs or Path(tmp)) / f"worker-{mode.index}.log",
                    dtype=args.dtype,
                    torch_compile="off",
                    requests_topic=mode.topic("requests"),
                    bulk_topic=mode.topic("bulk"),
                    group_id=f"delivery-{mode.index}",
                    reply_topics=re.escape(mode.topic("")) + ".+",  # its reply topics
                    **mode.settings,
                )
                for mode in modes
            ]
            try:
                for mode, worker in zip(modes, workers, strict=True):
                    worker.wait_ready(timeout=300)
                    worker.wait_tuned()  # dtype auto: measure what the start-up tuning chose
                    mode.pid = worker.process.pid
                assert kafka.pid is not None
                asyncio.run(measure(kafka.bootstrap_servers, modes, args, kafka.pid))
            finally:
                for worker in workers:
                    worker.stop()
    report = table(modes, args)
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
