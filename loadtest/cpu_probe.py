"""Where a worker's CPU goes, thread by thread, against the in-process path.

    python -m loadtest.cpu_probe [--texts 3000] [--dtype float32] [--torch-compile off]
        [--max-batch-tokens 2048] [--worker-env NAME=VALUE ...]

Measures the in-process CPU per text, then one worker's (after an unmeasured warm-up
bulk) on the same STS-B sentences through a local broker, then the in-process path again;
prints CPU-ms per 1,000 texts for each process and for each thread that used more than
5 ms per 1,000 texts (the worker's event loop is its main thread; the encoder thread and
its OpenMP team are the two largest). ``--worker-env`` sets variables for the worker
process only (e.g. ``OMP_WAIT_POLICY=PASSIVE``), to compare thread settings.
A diagnostic: ``python -m loadtest`` reports the figures the targets judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from loadtest import cputime, e2e
from loadtest.data import stsb_sentences
from loadtest.inprocess import InProcess
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

RESULTS = "loadtest.cpu_probe.results"


def _thread_ticks(pid: int) -> dict[int, int]:
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ticks[int(task.name)] = cputime.parse_stat_cpu_ticks((task / "stat").read_text())
        except OSError:  # the thread ended meanwhile
            continue
    return ticks


def _per_thread(pid: int, before: dict[int, int], texts: int) -> dict[str, float]:
    after = _thread_ticks(pid)
    tick = 1 / os.sysconf("SC_CLK_TCK")
    spent = {tid: (ticks - before.get(tid, 0)) * tick for tid, ticks in after.items()}
    named = {
        ("main" if tid == pid else f"thread {tid}"): cputime.cpu_ms_per_1000(s, texts)
        for tid, s in sorted(spent.items(), key=lambda pair: -pair[1])
    }
    return {name: ms for name, ms in named.items() if ms > 5}


def _inprocess(bench: InProcess, texts: list[str], budget: int) -> dict[str, Any]:
    pid = os.getpid()
    threads = _thread_ticks(pid)
    before = cputime.sample({"p": pid})
    run = bench.throughput(texts, budget)
    spent = cputime.usage(before, cputime.sample({"p": pid}))["p"]
    return {
        "texts_per_s": run.texts_per_s,
        "cpu_ms_per_1000": cputime.cpu_ms_per_1000(spent, len(texts)),
        "threads": _per_thread(pid, threads, len(texts)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.cpu_probe", description=__doc__)
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--torch-compile", default="off", choices=["auto", "on", "off"])
    parser.add_argument("--max-batch-tokens", type=int, default=2048)
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sentences = stsb_sentences()
    texts = [sentences[i % len(sentences)] for i in range(args.texts)]
    budget = args.max_batch_tokens
    bench = InProcess("sentence-transformers/all-MiniLM-L6-v2", args.dtype, args.torch_compile)
    bench.throughput(texts[:1024], budget)
    out: dict[str, Any] = {"args": vars(args), "inprocess_before": _inprocess(bench, texts, budget)}
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    saved = dict(os.environ)
    with (
        tempfile.TemporaryDirectory(prefix="kembed-cpu-probe-") as tmp,
        LocalKafka(Path(tmp) / "kafka", topics=(*DEFAULT_TOPICS, TopicSpec(RESULTS, 8))) as kafka,
    ):
        os.environ.update(worker_env)  # WorkerProcess passes its environment on
        worker = WorkerProcess(
            kafka.bootstrap_servers,
            Path(tmp) / "worker.log",
            reply_topics=re.escape(RESULTS),
            dtype=args.dtype,
            torch_compile=args.torch_compile,
            max_batch_tokens=budget,
        )
        os.environ.clear()
        os.environ.update(saved)
        try:
            worker.wait_ready(timeout=300)

            async def bulk(batch: list[str]) -> e2e.BulkRun:
                return await e2e.bulk(
                    kafka.bootstrap_servers,
                    batch,
                    32,
                    topic="embed.requests.bulk",
                    reply_topic=RESULTS,
                )

            asyncio.run(bulk(texts[:1024]))
            assert kafka.pid is not None
            pids = {"worker": worker.process.pid, "broker": kafka.pid, "client": os.getpid()}
            threads = _thread_ticks(worker.process.pid)
            before = cputime.sample(pids)
            run = asyncio.run(bulk(texts))
            spent = cputime.usage(before, cputime.sample(pids))
            out["worker"] = {
                "texts_per_s": run.texts_per_s,
                "errors": run.errors,
                **{
                    f"{name}_cpu_ms_per_1000": cputime.cpu_ms_per_1000(s, len(texts))
                    for name, s in spent.items()
                },
                "threads": _per_thread(worker.process.pid, threads, len(texts)),
            }
        finally:
            worker.stop()
    out["inprocess_after"] = _inprocess(bench, texts, budget)
    mean = (
        out["inprocess_before"]["cpu_ms_per_1000"] + out["inprocess_after"]["cpu_ms_per_1000"]
    ) / 2
    out["worker_over_inprocess"] = out["worker"]["worker_cpu_ms_per_1000"] / mean
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
