"""End to end: SDK -> embed.requests -> worker (real model) -> reply topic -> SDK."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy.stats import spearmanr

from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka
from tests.conftest import ROOT, WorkerProcess, load_stsb

pytestmark = pytest.mark.integration


def _reference(model: Any, texts: list[str]) -> npt.NDArray[np.float32]:
    vectors: npt.NDArray[np.float32] = model.encode(
        texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True
    )
    return vectors


async def _embed_all(client: EmbedClient, texts: list[str], chunk: int) -> npt.NDArray[np.float32]:
    parts = await asyncio.gather(
        *(client.embed(texts[i : i + chunk], timeout=300) for i in range(0, len(texts), chunk))
    )
    return np.concatenate(parts)


async def test_stsb_through_kafka_matches_in_process_quality(
    kafka: LocalKafka, worker: WorkerProcess, reference_model: Any
) -> None:
    """Every STS-B (en) sentence embedded through Kafka scores Spearman 82.03 +/- 0.05 and
    matches the in-process fp32 sentence-transformers vector with cosine >= 0.9999."""
    pairs = load_stsb("en")
    sentences = sorted({s for p in pairs for s in (p.first, p.second)})
    async with EmbedClient(kafka.bootstrap_servers) as client:
        vectors = await _embed_all(client, sentences, chunk=128)
    assert vectors.shape == (len(sentences), 384)
    assert vectors.dtype == np.float32

    reference = _reference(reference_model, sentences)
    cosines = np.sum(vectors * reference, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosines.min() >= 0.9999, f"worst cosine {cosines.min():.6f}"

    row = {s: i for i, s in enumerate(sentences)}
    first = vectors[[row[p.first] for p in pairs]]
    second = vectors[[row[p.second] for p in pairs]]
    predicted = np.sum(first * second, axis=1)
    spearman = 100 * spearmanr(predicted, [p.score for p in pairs]).statistic
    assert abs(spearman - 82.03) <= 0.05, f"Spearman x100 = {spearman:.3f}"


@pytest.mark.parametrize("count", [1, 256])
async def test_request_sizes_round_trip_in_order(
    kafka: LocalKafka, worker: WorkerProcess, reference_model: Any, count: int
) -> None:
    """Requests of 1 and of 256 inputs come back whole, row i being input i."""
    pairs = load_stsb("en")
    texts = [pairs[i % len(pairs)].first + f" ({i})" for i in range(count)]
    async with EmbedClient(kafka.bootstrap_servers) as client:
        vectors = await client.embed(texts, timeout=120)
    assert vectors.shape == (count, 384)
    reference = _reference(reference_model, texts)
    assert np.min(np.sum(vectors * reference, axis=1)) >= 0.9999


def test_two_client_processes_get_only_their_own_results(
    kafka: LocalKafka, worker: WorkerProcess, reference_model: Any, tmp_path: Path
) -> None:
    """Two SDK clients in separate processes, sharing one reply partition on purpose and
    issuing concurrent requests, each receive exactly their own results in input order."""
    script = ROOT / "tests" / "integration" / "client_process.py"
    outputs = {name: tmp_path / f"{name}.npz" for name in ("alpha", "beta")}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), kafka.bootstrap_servers, name, str(out)], cwd=ROOT
        )
        for name, out in outputs.items()
    ]
    for process in processes:
        assert process.wait(timeout=300) == 0
    for name, out in outputs.items():
        data = np.load(out)
        texts = [str(t) for t in data["texts"]]
        vectors = data["vectors"]
        assert all(t.startswith(f"{name} ") for t in texts)
        assert vectors.shape == (len(texts), 384)
        reference = _reference(reference_model, texts)
        assert np.min(np.sum(vectors * reference, axis=1)) >= 0.9999
    # Sharing a partition means each saw the other's results and dropped them.
    assert sum(int(np.load(out)["dropped"]) for out in outputs.values()) > 0
