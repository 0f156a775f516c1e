"""``python -m loadtest``: the throughput and latency benchmark, baselines in the same run.

Order matters on a small machine: the in-process baselines run first, alone; then a local
broker and one worker start, and the end-to-end scenarios run against them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loadtest import batches, cputime, e2e
from loadtest.data import mixed_texts, stsb_sentences
from loadtest.inprocess import InProcess, sentence_transformers_default
from loadtest.report import REFERENCE_RATE, write_report
from producer_sdk import EmbedClient
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

BULK_RESULTS = "loadtest.bulk.results"


@dataclass(frozen=True)
class Plan:
    texts: int
    mixed: int
    per_request: int
    budgets: tuple[int, ...]
    rates: tuple[float, ...]
    loaded_rates: tuple[float, ...]
    duration: float
    backlog: int
    single: int
    backlog_repeats: int  # runs of the backlog scenario at the reference rate (median kept)


FULL = Plan(
    10_208,
    2_000,
    32,
    (512, 1024, 2048, 4096, 8192),
    (2, 5, 10, 20, 40),
    (5, 10, 20),
    10.0,
    10_208,  # halved when the reference-rate run became three
    200,
    3,
)
QUICK = Plan(400, 100, 16, (1024, 2048), (5, 20), (10,), 2.0, 1_000, 20, 3)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(values),
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "mean": statistics.fmean(values),
    }


def run_inprocess(
    plan: Plan, bench: InProcess, sentences: list[str], mixed: list[str]
) -> dict[str, Any]:
    sweep = []
    for budget in tqdm(plan.budgets, desc="in-process sweep", leave=False):
        row: dict[str, Any] = {"max_batch_tokens": budget}
        for name, texts in (("sentences", sentences), ("mixed", mixed)):
            best = max(
                (bench.throughput(texts, budget) for _ in range(2)), key=lambda t: t.texts_per_s
            )
            row[name] = {"texts_per_s": best.texts_per_s, "tokens_per_s": best.tokens_per_s}
        sweep.append(row)
    best_row = max(sweep, key=lambda r: r["sentences"]["texts_per_s"])
    # The worker gets the knee, not the peak: the smallest budget within 5% of the best.
    # A bulk batch holds up interactive requests for as long as it runs, so a smaller batch
    # buys much lower interactive latency for a few percent of throughput.
    knee = min(
        (
            r
            for r in sweep
            if r["sentences"]["texts_per_s"] >= 0.95 * best_row["sentences"]["texts_per_s"]
        ),
        key=lambda r: r["max_batch_tokens"],
    )
    tokens = sum(len(t.ids) for t in bench.tokenizer.encode(sentences))
    st = sentence_transformers_default(bench.model_dir, sentences, tokens)
    single = bench.single_latencies_ms(sentences, plan.single)
    return {
        "dtype": bench.encoder.info.dtype,
        "compiled": bench.encoder.info.compiled,
        "sweep": sweep,
        "best_max_batch_tokens": best_row["max_batch_tokens"],
        "worker_max_batch_tokens": knee["max_batch_tokens"],
        "limit": {
            "sentences": best_row["sentences"],
            "mixed": max((r["mixed"] for r in sweep), key=lambda m: m["texts_per_s"]),
        },
        "st_default": {"texts_per_s": st.texts_per_s, "tokens_per_s": st.tokens_per_s},
        "single_ms": percentiles(single),
    }


def inprocess_cpu(bench: InProcess, texts: list[str], max_batch_tokens: int) -> dict[str, Any]:
    """This process's CPU time (all threads) for tokenizing, batching and encoding
    ``texts`` in-process at the worker's batch budget: the baseline of the worker's CPU per
    text, same texts, precision, compile setting and budget."""
    me = {"inprocess": os.getpid()}
    before = cputime.sample(me)
    run = bench.throughput(texts, max_batch_tokens)
    seconds = cputime.usage(before, cputime.sample(me))["inprocess"]
    return {
        "cpu_s": seconds,
        "wall_s": run.seconds,
        "cpu_ms_per_1000": cputime.cpu_ms_per_1000(seconds, len(texts)),
    }


def bracketed_inprocess_cpu(
    runs: list[dict[str, Any]], texts: list[str], max_batch_tokens: int, lengths: list[int]
) -> dict[str, Any]:
    """The in-process baseline from the runs just before and just after the worker's bulk
    run (their mean: a neighbour's load that drifts during the run shifts both sides)."""
    return {
        "texts": len(texts),
        "max_batch_tokens": max_batch_tokens,
        "runs": runs,
        "cpu_ms_per_1000": statistics.fmean(run["cpu_ms_per_1000"] for run in runs),
        "wall_s": statistics.fmean(run["wall_s"] for run in runs),
        "batches": batches.replay(lengths, max_batch_tokens, 256).summary(sum(lengths)),
    }


def worker_batches(metrics_url: str, lane: str = "bulk") -> batches.BatchShapes:
    """The worker's batch totals of ``lane`` so far, from its /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        return batches.from_metrics(response.read().decode(), lane)


async def run_e2e(
    plan: Plan,
    bootstrap: str,
    sentences: list[str],
    mixed: list[str],
    pids: dict[str, int],
    metrics_url: str,
    baseline: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """``pids``: the processes whose CPU time the bulk runs account for (name -> pid);
    ``metrics_url``: the worker's /metrics, for the shapes of the batches it ran;
    ``baseline``: measures the in-process CPU per text, run just before and just after
    the bulk sentences (while the worker and the broker idle)."""
    out: dict[str, Any] = {"bulk": {}, "interactive": {"alone": [], "with_backlog": []}}
    # The in-process path ran the same texts many times already (the sweep); the worker
    # meets its first bulk batch shapes here, unmeasured, so that both are measured warm.
    await e2e.bulk(
        bootstrap,
        sentences[:1024],
        plan.per_request,
        topic="embed.requests.bulk",
        reply_topic=BULK_RESULTS,
    )
    out["inprocess_cpu_runs"] = [baseline()]
    for name, texts in (("sentences", sentences), ("mixed", mixed)):
        if name == "mixed":
            out["inprocess_cpu_runs"].append(baseline())
        with tqdm(total=len(texts), desc=f"bulk {name}", unit="text", leave=False) as bar:
            shapes = worker_batches(metrics_url)
            before = cputime.sample(pids)
            run = await e2e.bulk(
                bootstrap,
                texts,
                plan.per_request,
                topic="embed.requests.bulk",
                reply_topic=BULK_RESULTS,
                progress=bar.update,
            )
            spent = cputime.usage(before, cputime.sample(pids))
            shapes = worker_batches(metrics_url).minus(shapes)
        out["bulk"][name] = {
            "texts": run.texts,
            "seconds": run.seconds,
            "errors": run.errors,
            "texts_per_s": run.texts_per_s,
            "tokens_per_s": run.tokens_per_s,
            "cpu": {
                process: {
                    "cpu_s": seconds,
                    "cpu_ms_per_1000": cputime.cpu_ms_per_1000(seconds, run.texts),
                }
                for process, seconds in spent.items()
            },
            "batches": shapes.summary(run.tokens),
        }
    async with EmbedClient(bootstrap) as client:
        await client.embed(["warm-up"], timeout=60)
        for rate in tqdm(plan.rates, desc="interactive alone", leave=False):
            latencies = await e2e.interactive(client, sentences, rate, plan.duration)
            out["interactive"]["alone"].append({"rate": rate, **percentiles(latencies)})
        # The backlog's tail latency varies from run to run: at the reference rate the
        # scenario runs plan.backlog_repeats times and the report judges the median.
        loaded = [
            rate
            for rate in plan.loaded_rates
            for _ in range(plan.backlog_repeats if rate == REFERENCE_RATE else 1)
        ]
        for rate in tqdm(loaded, desc="interactive + backlog", leave=False):
            bulk = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "loadtest.bulk_client",
                bootstrap,
                str(plan.backlog),
                str(plan.per_request),
                "embed.requests.bulk",
                BULK_RESULTS,
                stdout=asyncio.subprocess.PIPE,
            )
            assert bulk.stdout is not None
            await bulk.stdout.readline()  # "started"
            await asyncio.sleep(0.5)  # let the backlog land in Kafka first
            finished = asyncio.ensure_future(bulk.wait())
            latencies = await e2e.interactive(client, sentences, rate, 600, until=finished)
            figures = json.loads((await bulk.stdout.read()).decode().strip().splitlines()[-1])
            await finished
            out["interactive"]["with_backlog"].append(
                {
                    "rate": rate,
                    **percentiles(latencies),
                    "backlog_texts": figures["texts"],
                    "bulk_texts_per_s": figures["texts_per_s"],
                    "bulk_errors": figures["errors"],
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--dtype", default="auto", help="worker and in-process precision")
    parser.add_argument(
        "--torch-compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="worker and in-process torch.compile setting",
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    out = args.out or Path("loadtest/reports") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    sentences_all = stsb_sentences()
    sentences = [sentences_all[i % len(sentences_all)] for i in range(plan.texts)]
    mixed = mixed_texts(sentences_all, plan.mixed)
    steps = tqdm(total=3, desc="loadtest", unit="step")
    results: dict[str, Any] = {"plan": plan.__dict__, "argv": sys.argv[1:]}
    bench = InProcess("sentence-transformers/all-MiniLM-L6-v2", args.dtype, args.torch_compile)
    results["inprocess"] = run_inprocess(plan, bench, sentences, mixed)
    steps.update()
    budget = results["inprocess"]["worker_max_batch_tokens"]
    baseline = partial(inprocess_cpu, bench, sentences, budget)
    with tempfile.TemporaryDirectory(prefix="kembed-loadtest-") as tmp:
        topics = (*DEFAULT_TOPICS, TopicSpec(BULK_RESULTS, 8))
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            settings = {
                "dtype": args.dtype,
                "torch_compile": args.torch_compile,
                "max_batch_tokens": budget,
            }
            worker = WorkerProcess(
                kafka.bootstrap_servers,
                out / "worker.log",
                reply_topics=re.escape(BULK_RESULTS),  # besides embed.results, the default
                **settings,
            )
            try:
                worker.wait_ready()
                worker.wait_tuned()  # dtype/compile auto: measure what it settles on
                steps.update()
                results["worker_settings"] = settings
                assert kafka.pid is not None
                pids = {"worker": worker.process.pid, "broker": kafka.pid, "client": os.getpid()}
                results["e2e"] = asyncio.run(
                    run_e2e(
                        plan,
                        kafka.bootstrap_servers,
                        sentences,
                        mixed,
                        pids,
                        f"{worker.http_url}/metrics",
                        baseline,
                    )
                )
                lengths = [len(t.ids) for t in bench.tokenizer.encode(sentences)]
                results["inprocess"]["cpu"] = bracketed_inprocess_cpu(
                    results["e2e"].pop("inprocess_cpu_runs"), sentences, budget, lengths
                )
            finally:
                worker.stop()
    steps.update()
    steps.close()
    passed = write_report(results, out)
    print(f"report: {out / 'report.md'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
