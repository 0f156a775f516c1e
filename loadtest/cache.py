"""``python -m loadtest.cache``: the worker's vector cache, on against off in the same run.

1. Re-ingesting a corpus: the STS-B test sentences are sent twice through the bulk lane
   (requests of ``--per-request`` texts), to a worker with the cache off, then to one
   with the cache on; texts/s of each pass, end to end (first send to last result).
   Target: second pass with the cache >= 5x the second pass without.
2. Popular queries: a stream of ``--queries`` single-text requests drawn from the same
   sentences with Zipf-distributed popularity (exponent ``--zipf``; ranks shuffled with a
   fixed seed), with a prompt so that none is in the cache yet; the hit rate the worker's
   metrics count, against the rate an LRU of the same size must reach on that stream
   (replayed in-process), and the in-process hit rate of smaller caches on it.

One broker and one worker at a time (dtype and torch_compile fixed, no start-up tuning),
2 CPUs shared with the load generator. Writes ``report.md`` and ``report.json`` to
``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import tempfile
import time
import urllib.request
import uuid
from collections import OrderedDict
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from loadtest import e2e
from loadtest.data import stsb_sentences
from loadtest.files import command_line, save_report
from schemas import EmbedRequest, encode_request
from schemas.headers import CORRELATION_ID
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.worker_process import WorkerProcess

TARGET = 5.0
RESULTS = "loadtest.cache.results"
PROMPTS = {"burst": "query: ", "paced": "search: "}
WARM_UP = "passage: "


def zipf_stream(population: int, count: int, exponent: float, seed: int = 7) -> list[int]:
    """``count`` draws from ``range(population)``: rank r (1-based) with probability
    proportional to 1 / r**exponent, ranks assigned to items in a seeded random order."""
    rng = random.Random(seed)
    items = list(range(population))
    rng.shuffle(items)
    weights = [1 / (rank**exponent) for rank in range(1, population + 1)]
    return rng.choices(items, weights=weights, k=count)


def lru_hit_rate(stream: list[int], capacity: int) -> float:
    """Hits of an LRU of ``capacity`` entries on ``stream``, as a share of it."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for item in stream:
        if item in cache:
            hits += 1
            cache.move_to_end(item)
            continue
        cache[item] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return hits / len(stream)


def lookup_cost_us(texts: list[str], dim: int = 384, repeats: int = 5) -> dict[str, float]:
    """Microseconds per text of the worker's cache lookup (hash and dictionary) in-process,
    all hits and all misses (best of ``repeats``), and of storing a vector."""
    import numpy as np

    from worker.cache import CacheNote, VectorCache
    from worker.encoder import ModelInfo

    info = ModelInfo("bench", Path("bench"), dim, 256, "mean", "float32", "cpu")
    rows = np.random.default_rng(0).standard_normal((len(texts), dim)).astype(np.float32)
    figures: dict[str, float] = {}
    for name in ("miss", "store", "hit"):
        best = float("inf")
        for _ in range(repeats):
            cache = VectorCache(2**30)
            if name == "hit":
                keys = cache.lookup("bench", info, "right", texts).keys or []
                cache.store(
                    "bench",
                    info,
                    zip([CacheNote(k, False) for k in keys], rows, [9] * len(texts), strict=True),
                )
            lookup = cache.lookup("bench", info, "right", texts) if name == "store" else None
            started = time.perf_counter()
            if name == "store" and lookup is not None:
                notes = [CacheNote(k, False) for k in lookup.keys or []]
                cache.store("bench", info, zip(notes, rows, [9] * len(texts), strict=True))
            else:
                cache.lookup("bench", info, "right", texts)
            best = min(best, time.perf_counter() - started)
        figures[f"{name}_us_per_text"] = best / len(texts) * 1e6
    return figures


def cache_counts(worker: WorkerProcess) -> dict[str, float]:
    """The worker's cache counters, summed over models."""
    with urllib.request.urlopen(f"{worker.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals = {"hits": 0.0, "misses": 0.0, "evictions": 0.0, "bytes": 0.0, "entries": 0.0}
    for line in text.splitlines():
        match = re.match(r"kembed_cache_(hits|misses|evictions)_total\{.*\} (\S+)", line)
        match = match or re.match(r"kembed_cache_(bytes|entries)\{.*\} (\S+)", line)
        if match:
            totals[match[1]] += float(match[2])
    return totals


async def _ingest_twice(
    bootstrap: str, texts: list[str], per_request: int, topic: str
) -> list[e2e.BulkRun]:
    """An unmeasured warm-up pass over other texts (the first batch shapes), then the same
    texts twice."""
    warm = [WARM_UP + text for text in texts[:1024]]
    await e2e.bulk(bootstrap, warm, per_request, topic=f"{topic}.bulk", reply_topic=RESULTS)
    passes = []
    for _ in range(2):
        run = await e2e.bulk(
            bootstrap, texts, per_request, topic=f"{topic}.bulk", reply_topic=RESULTS
        )
        if run.errors:
            raise RuntimeError(f"{run.errors} requests failed")
        passes.append(run)
    return passes


async def _queries(bootstrap: str, texts: list[str], topic: str) -> e2e.BulkRun:
    """All at once: as fast as the producer sends them."""
    return await e2e.bulk(bootstrap, texts, 1, topic=topic, reply_topic=RESULTS)


async def _paced(bootstrap: str, texts: list[str], rate: float, topic: str) -> float:
    """One single-text request every 1/``rate`` s (open loop); seconds until the last
    answer."""
    requests = [EmbedRequest(id=uuid.uuid4().hex, inputs=(t,), reply_to=RESULTS) for t in texts]
    pending = {request.id for request in requests}
    consumer = AIOKafkaConsumer(RESULTS, bootstrap_servers=bootstrap, group_id=None)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    async with e2e.reading_replies(consumer, producer):
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def send() -> None:
            for n, request in enumerate(requests):
                await asyncio.sleep(max(0.0, started + n / rate - loop.time()))
                await producer.send(topic, encode_request(request))

        sending = asyncio.create_task(send())
        while pending:
            if loop.time() - started > len(texts) / rate + 120:
                raise TimeoutError(f"{len(pending)} queries unanswered")
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    pending.discard(dict(record.headers).get(CORRELATION_ID, b"").decode())
        await sending
        return loop.time() - started


def _zipf(
    worker: WorkerProcess,
    kafka: LocalKafka,
    sentences: list[str],
    stream: list[int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The stream sent twice, each time with its own prompt (so that it starts cold): all
    at once, then paced at ``args.rate``; the worker's hit counts for each."""
    out: dict[str, Any] = {
        "exponent": args.zipf,
        "queries": len(stream),
        "population": len(sentences),
        "distinct": len(set(stream)),
        "expected_hit_rate": lru_hit_rate(stream, len(sentences)),
        "rate": args.rate,
    }
    for mode, prompt in PROMPTS.items():
        queries = [prompt + sentences[i] for i in stream]
        before = cache_counts(worker)
        if mode == "burst":
            seconds = asyncio.run(_queries(kafka.bootstrap_servers, queries, _topic("on"))).seconds
        else:
            seconds = asyncio.run(_paced(kafka.bootstrap_servers, queries, args.rate, _topic("on")))
        after = cache_counts(worker)
        hits = after["hits"] - before["hits"]
        misses = after["misses"] - before["misses"]
        out[mode] = {
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses),
            "queries_per_s": len(queries) / seconds,
            "cache": after,
        }
        print(mode, out[mode], flush=True)
    return out


def _topic(name: str) -> str:
    """Each worker its own request topics: a worker never sees the other's requests."""
    return f"loadtest.cache.{name}"


def _worker(
    kafka: LocalKafka, name: str, log: Path, cache_bytes: int, args: argparse.Namespace
) -> Any:
    return WorkerProcess(
        kafka.bootstrap_servers,
        log,
        reply_topics=re.escape(RESULTS),
        dtype=args.dtype,
        torch_compile=args.torch_compile,
        tune_budget_s=0,
        cache_bytes=cache_bytes,
        group_id=f"loadtest-cache-{name}",
        requests_topic=_topic(name),
        bulk_topic=f"{_topic(name)}.bulk",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    sentences = stsb_sentences()[: args.texts]
    stream = zipf_stream(len(sentences), args.queries, args.zipf)
    report: dict[str, Any] = {
        "texts": len(sentences),
        "per_request": args.per_request,
        "dtype": args.dtype,
        "torch_compile": args.torch_compile,
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    with tempfile.TemporaryDirectory(prefix="kembed-cache-") as tmp:
        topics = [
            *DEFAULT_TOPICS,
            TopicSpec(RESULTS, 4),
            *(TopicSpec(f"{_topic(n)}{s}", 2) for n in ("off", "on") for s in ("", ".bulk")),
        ]
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            for name, cache_bytes in (("off", 0), ("on", args.cache_bytes)):
                log = Path(tmp) / f"worker-{name}.log"
                worker = _worker(kafka, name, log, cache_bytes, args)
                try:
                    worker.wait_ready()
                    passes = asyncio.run(
                        _ingest_twice(
                            kafka.bootstrap_servers, sentences, args.per_request, _topic(name)
                        )
                    )
                    report[f"cache_{name}"] = {
                        "cache_bytes": cache_bytes,
                        "passes": [asdict(p) | {"texts_per_s": p.texts_per_s} for p in passes],
                    }
                    print(name, [round(p.texts_per_s, 1) for p in passes], flush=True)
                    if name == "on":
                        report["zipf"] = _zipf(worker, kafka, sentences, stream, args)
                finally:
                    worker.stop()
    report["inprocess"] = lookup_cost_us(sentences)
    report["lru_table"] = [
        {
            "exponent": exponent,
            "capacity_share": share,
            "hit_rate": lru_hit_rate(
                zipf_stream(len(sentences), args.queries, exponent),
                max(1, int(share * len(sentences))),
            ),
        }
        for exponent in (0.8, 1.0, 1.2)
        for share in (0.05, 0.2, 1.0)
    ]
    off, on = report["cache_off"]["passes"], report["cache_on"]["passes"]
    report["second_pass_on_over_off"] = on[1]["texts_per_s"] / off[1]["texts_per_s"]
    report["first_pass_on_over_off"] = on[0]["texts_per_s"] / off[0]["texts_per_s"]
    report["target_met"] = report["second_pass_on_over_off"] >= TARGET
    return report


def markdown(report: dict[str, Any], command: str) -> str:
    off, on = report["cache_off"]["passes"], report["cache_on"]["passes"]
    zipf = report["zipf"]
    ratio = report["second_pass_on_over_off"]
    lines = [
        "# Vector cache: re-ingestion and popular queries",
        "",
        f"`{command}` (under the benchmark lock)",
        "",
        f"One broker and one worker at a time (dtype {report['dtype']}, torch_compile "
        f"{report['torch_compile']}, no start-up tuning), the load generator; 2 CPUs shared "
        f"by all three. Run {report['when']}.",
        "",
        "## Targets",
        "",
        "| target | measured | threshold | result |",
        "| --- | ---: | --- | --- |",
        f"| re-ingestion texts/s, second pass: cache on / off | {ratio:.1f} | >= {TARGET:g} | "
        f"{'met' if report['target_met'] else 'MISSED'} |",
        "",
        f"## Re-ingesting STS-B ({report['texts']:,} sentences, requests of "
        f"{report['per_request']} texts, bulk lane)",
        "",
        "| worker | first pass texts/s | second pass texts/s |",
        "| --- | ---: | ---: |",
        f"| cache off | {off[0]['texts_per_s']:,.0f} | {off[1]['texts_per_s']:,.0f} |",
        f"| cache on ({report['cache_on']['cache_bytes'] / 2**20:g} MiB) | "
        f"{on[0]['texts_per_s']:,.0f} | {on[1]['texts_per_s']:,.0f} |",
        "",
        f"Second pass, on / off: **{ratio:.1f}x**. First pass (cold cache: every text "
        f"hashed and stored), on / off: {report['first_pass_on_over_off']:.2f}x.",
        "",
        f"## Zipf query stream (exponent {zipf['exponent']}, {zipf['queries']:,} single-text "
        f"requests over {zipf['population']:,} sentences, {zipf['distinct']:,} distinct)",
        "",
        "| arrival | hit rate (worker's counters) | hits | misses | requests/s |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {label} | **{zipf[mode]['hit_rate']:.1%}** | {zipf[mode]['hits']:,.0f} | "
            f"{zipf[mode]['misses']:,.0f} | {zipf[mode]['queries_per_s']:,.0f} |"
            for mode, label in (
                ("burst", "all at once"),
                ("paced", f"paced, {zipf['rate']:g} requests/s"),
            )
        ),
        "",
        f"An LRU holding every sentence must reach {zipf['expected_hit_rate']:.1%} on this "
        "stream (only first sightings miss). Sent all at once, a popular text's repeats "
        "arrive before its first computation is done and miss too: the cache does not "
        "coalesce texts in flight. Cache afterwards: "
        f"{zipf['paced']['cache']['entries']:,.0f} entries, "
        f"{zipf['paced']['cache']['bytes'] / 2**20:.1f} MiB.",
        "",
        "In-process, per text (the worker's lookup before tokenization, and its store after "
        f"encoding): hit {report['inprocess']['hit_us_per_text']:.1f} us, miss "
        f"{report['inprocess']['miss_us_per_text']:.1f} us, store "
        f"{report['inprocess']['store_us_per_text']:.1f} us.",
        "",
        "LRU hit rate on Zipf streams of the same length (in-process replay), by cache size "
        "as a share of the distinct texts:",
        "",
        "| exponent | 5% | 20% | 100% |",
        "| --- | ---: | ---: | ---: |",
    ]
    for exponent in sorted({row["exponent"] for row in report["lru_table"]}):
        rates = [r["hit_rate"] for r in report["lru_table"] if r["exponent"] == exponent]
        lines.append(f"| {exponent} | " + " | ".join(f"{rate:.1%}" for rate in rates) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=10_000, help="STS-B sentences (all: ~2.8k)")
    parser.add_argument("--per-request", type=int, default=64)
    parser.add_argument("--queries", type=int, default=10_000, help="Zipf stream length")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent")
    parser.add_argument("--rate", type=float, default=200.0, help="paced queries per second")
    parser.add_argument("--cache-bytes", type=int, default=256 * 2**20)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--torch-compile", default="off", choices=["auto", "on", "off"])
    parser.add_argument("--out", type=Path, default=None, help="folder for report.md/.json")
    args = parser.parse_args()
    report = run(args)
    text = markdown(report, command_line("loadtest.cache", args, drop_empty=True))
    print(text)
    if args.out:
        save_report(args.out, report, text)


if __name__ == "__main__":
    main()
