"""bitsandbytes quantization with the real model: the quality gate and a quantized worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import ROOT, WorkerProcess, load_stsb
from worker.quality import spearman

pytestmark = pytest.mark.integration

PAIRS = 200  # the first STS-B test pairs: enough to tell int8 from nf4, quick on a CPU


def validate(*flags: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "validate", "--limit", str(PAIRS), "--json", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_validate_passes_int8_and_reports_its_memory() -> None:
    """LLM.int8 keeps the ranking and the vectors of fp32: the gate passes; its linear
    weights take a quarter of the bytes, so the model is smaller than the reference."""
    code, report = validate("--quantization", "int8", "--dtype", "float32")
    assert code == 0, report
    assert report["passed"] is True
    assert report["candidate"]["quantization"] == "int8"
    assert report["reference_spearman"] - report["candidate_spearman"] <= 0.5
    assert report["mean_cosine"] >= 0.99
    assert report["candidate"]["memory_bytes"] < 0.8 * report["reference"]["memory_bytes"]


def test_validate_fails_nf4_on_cosine_drift() -> None:
    """4-bit NormalFloat keeps this benchmark's ranking but moves the vectors away from fp32
    (mean cosine ~0.97): the gate tells it apart and exits 1."""
    code, report = validate("--quantization", "nf4", "--dtype", "float32")
    assert code == 1
    assert report["passed"] is False
    assert any(f.startswith("mean cosine") for f in report["failures"]), report["failures"]
    assert report["mean_cosine"] < 0.99


def test_worker_refuses_to_start_when_the_gate_fails(kafka: LocalKafka, tmp_path: Path) -> None:
    """KEMBED_QUALITY_GATE=true with nf4: the worker logs quality_gate.failed and exits 3
    without joining its group."""
    pairs = tmp_path / "pairs.csv"
    rows = load_stsb("en")[:PAIRS]
    pairs.write_text("".join(f'"{p.first}","{p.second}",{p.score}\n' for p in rows))
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        quantization="nf4",
        quality_gate="true",
        quality_gate_pairs=pairs,
        group_id=f"gate-{uuid.uuid4().hex[:6]}",
    )
    assert worker.process.wait(timeout=600) == 3
    events = [e.get("event") for e in worker.events()]
    assert "quality_gate.failed" in events
    assert "partitions.assigned" not in events


async def test_int8_worker_keeps_stsb_within_the_gate(kafka: LocalKafka, tmp_path: Path) -> None:
    """An int8 worker serves STS-B pairs through Kafka with Spearman within 0.5 of fp32."""
    topic = f"quant.{uuid.uuid4().hex[:6]}"
    kafka.create_topics([TopicSpec(topic, 1), TopicSpec(f"{topic}.bulk", 1)])
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        quantization="int8",
        requests_topic=topic,
        bulk_topic=f"{topic}.bulk",
        group_id=f"quant-{topic}",
    )
    try:
        worker.wait_ready(timeout=300)
        loaded = worker.wait_for("model.loaded")
        assert loaded["quantization"] == "int8"
        pairs = load_stsb("en")[:PAIRS]
        sentences = sorted({s for p in pairs for s in (p.first, p.second)})
        async with EmbedClient(kafka.bootstrap_servers, requests_topic=topic) as client:
            parts = await asyncio.gather(
                *(
                    client.embed(sentences[i : i + 64], timeout=300)
                    for i in range(0, len(sentences), 64)
                )
            )
        vectors = np.concatenate(parts)
        row = {s: i for i, s in enumerate(sentences)}
        cosine = np.sum(
            vectors[[row[p.first] for p in pairs]] * vectors[[row[p.second] for p in pairs]],
            axis=1,
        )
        served = 100 * spearman(cosine, [p.score for p in pairs])
        _, report = validate("--dtype", "float32")  # the fp32 reference on the same pairs
        assert abs(served - report["reference_spearman"]) <= 0.5, (served, report)
    finally:
        worker.stop()
