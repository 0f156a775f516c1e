"""The fast paths: bf16 quality, priority lanes, backpressure, and the benchmark itself.

A bf16 worker (compiled) for the quality gate, and an fp32 worker with a small in-flight
bound so that backpressure engages (fp32: the lanes do not depend on the precision, and
bf16 without hardware support, on AVX2-only CPUs, is several times slower). Each has its
own topics. Speed itself is measured by `python -m loadtest`, never asserted here.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from loadtest import e2e
from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from tests.support.cli import run_module

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
INTERACTIVE, BULK, BULK_RESULTS = f"lanes.{TAG}", f"lanes.{TAG}.bulk", f"lanes.{TAG}.results"
BF16 = f"bf16.{TAG}"


@pytest.fixture(scope="module")
def bf16_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(BF16, 2), TopicSpec(f"{BF16}.bulk", 1)])
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("bf16") / "worker.log",
        dtype="bfloat16",
        torch_compile="on",
        requests_topic=BF16,
        bulk_topic=f"{BF16}.bulk",
        group_id=f"bf16-{TAG}",
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def lanes_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(INTERACTIVE, 2), TopicSpec(BULK, 2), TopicSpec(BULK_RESULTS, 2)])
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("lanes") / "worker.log",
        dtype="float32",
        torch_compile="off",
        requests_topic=INTERACTIVE,
        bulk_topic=BULK,
        group_id=f"lanes-{TAG}",
        max_inflight_inputs=256,
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


async def test_bf16_keeps_stsb_within_a_tenth_of_fp32(
    kafka: LocalKafka, bf16_worker: WorkerProcess
) -> None:
    """A bfloat16 worker (compiled, as `auto` runs on CPUs) scores STS-B (en) within 0.1 of
    the fp32 figure, 82.03."""
    loaded = bf16_worker.wait_for("model.loaded")
    assert loaded["dtype"] == "bfloat16"
    tuned = bf16_worker.wait_for("encoder.tuned", timeout=300)  # compiled in the background
    assert tuned["chosen"] == "bfloat16/compiled"
    assert tuned["compiled"] is True
    pairs = load_stsb("en")
    sentences = sorted({s for p in pairs for s in (p.first, p.second)})
    async with EmbedClient(kafka.bootstrap_servers, requests_topic=BF16) as client:
        parts = await asyncio.gather(
            *(
                client.embed(sentences[i : i + 128], timeout=300)
                for i in range(0, len(sentences), 128)
            )
        )
    vectors = np.concatenate(parts)
    row = {s: i for i, s in enumerate(sentences)}
    cosine = np.sum(
        vectors[[row[p.first] for p in pairs]] * vectors[[row[p.second] for p in pairs]], axis=1
    )
    spearman = 100 * spearmanr(cosine, [p.score for p in pairs]).statistic
    assert abs(spearman - 82.03) <= 0.1, f"bf16 Spearman x100 = {spearman:.3f}"


async def test_interactive_request_overtakes_a_bulk_backlog(
    kafka: LocalKafka, lanes_worker: WorkerProcess
) -> None:
    """With thousands of bulk texts queued, a single interactive request is answered while
    most of the backlog is still waiting; the bulk lane pauses its partitions at the
    in-flight bound and resumes them, and every bulk request is answered."""
    texts = [s.first for s in load_stsb("en")] * 5  # ~6,900 texts, seconds of encoding
    seen = len(lanes_worker.events())
    bulk = asyncio.create_task(
        e2e.bulk(kafka.bootstrap_servers, texts, 32, topic=BULK, reply_topic=BULK_RESULTS)
    )
    await asyncio.sleep(0.5)  # the backlog is in Kafka and being worked on
    async with EmbedClient(kafka.bootstrap_servers, requests_topic=INTERACTIVE) as client:
        started = time.monotonic()
        vector = await client.embed(["an urgent query"], timeout=60)
        interactive_s = time.monotonic() - started
    assert vector.shape == (1, 384)
    assert not bulk.done(), "the interactive answer should not wait for the backlog"
    run = await bulk
    assert run.errors == 0
    assert interactive_s < run.seconds / 2
    events = lanes_worker.events()[seen:]
    paused = [e for e in events if e.get("event") == "partitions.paused"]
    resumed = [e for e in events if e.get("event") == "partitions.resumed"]
    assert paused
    assert all(e["lane"] == "bulk" for e in paused)
    assert resumed


def test_loadtest_quick_run_writes_a_complete_report(tmp_path: Path) -> None:
    """`python -m loadtest --quick` runs every scenario against its own broker and worker
    and writes the JSON and Markdown report and both plots (targets are judged only on
    full runs; a quick run is a smoke test of the benchmark itself). fp32 and eager, so that
    the worker does not tune first (dtype auto measures bf16, slow on an AVX2-only CPU)."""
    out = tmp_path / "report"
    done = run_module(
        *("loadtest", "--quick", "--torch-compile", "off", "--dtype", "float32"),
        *("--out", str(out)),
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert {t["name"].split(" ")[0] for t in report["targets"]} >= {
        "worker",
        "bulk",
        "single-text",
    }
    assert report["e2e"]["bulk"]["sentences"]["errors"] == 0
    assert report["e2e"]["bulk"]["sentences"]["texts_per_s"] > 0
    # CPU time of every process around the bulk run, and of the in-process baseline.
    cpu = report["e2e"]["bulk"]["sentences"]["cpu"]
    assert set(cpu) == {"worker", "broker", "client"}
    assert cpu["worker"]["cpu_ms_per_1000"] > 0
    assert report["inprocess"]["cpu"]["cpu_ms_per_1000"] > 0
    backlog = report["e2e"]["interactive"]["with_backlog"]
    assert len([row for row in backlog if row["rate"] == 10]) == 3
    assert report["inprocess"]["st_default"]["texts_per_s"] > 0
    assert all(row["n"] > 0 for row in report["e2e"]["interactive"]["alone"])
    for name in ("report.md", "latency_vs_load.png", "throughput_vs_max_batch_tokens.png"):
        assert (out / name).stat().st_size > 0


def test_sink_benchmark_small_run_writes_a_complete_report(tmp_path: Path) -> None:
    """`python -m loadtest.sink` at small sizes (its own PostgreSQL and broker) loads every
    row in both modes end to end and writes its report; figures are never asserted."""
    out = tmp_path / "sink"
    done = run_module(
        *("loadtest.sink", "--results", "4", "--rows", "128", "--baseline-results", "2"),
        *("--batch-results", "2", "--out", str(out)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    for index in ("streaming", "after"):
        assert report[f"end_to_end_{index}"]["rows"] == 512
    assert report["breakdown"]["rows"] == 512
    assert report["breakdown"]["index_build_s"] is not None
    assert (out / "report.md").stat().st_size > 0


def test_soak_short_run_answers_everything_and_reports_memory(tmp_path: Path) -> None:
    """`python -m loadtest.soak` (here 15 s instead of 10 min) answers every interactive and
    bulk request without error and writes its report and RSS plot."""
    out = tmp_path / "soak"
    done = run_module(
        *("loadtest.soak", "--minutes", "0.25", "--warmup-s", "10"),
        *("--sample-s", "1", "--out", str(out)),
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads((out / "soak.json").read_text())
    for lane in ("interactive", "bulk"):
        assert report[lane]["sent"] > 0
        assert report[lane]["ok"] == report[lane]["sent"], report[lane]
        assert report[lane]["errors"] == {}
    assert report["rss"]["baseline_bytes"] > 100 * 1024 * 1024
    for name in ("soak.md", "rss.png"):
        assert (out / name).stat().st_size > 0
