"""STS-B through the worker for every precision and quantization, judged by the quality
gate's rules.

One worker serves the bundled model five times (KEMBED_MODELS): fp32, bf16, fp16, and
bitsandbytes int8 and nf4 weights. Each answers the same STS-B test pairs through Kafka;
each is held to the gate's thresholds against the fp32 model's answers: Spearman x100
within 0.5, and mean cosine to the fp32 vectors at least 0.99. nf4 keeps the ranking but
not the vectors, and the gate's cosine rule is what tells it apart.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from worker.quality import spearman

pytestmark = pytest.mark.integration

PAIRS = 200
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CONFIGS: dict[str, dict[str, str]] = {
    "fp32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "fp16": {"dtype": "float16"},
    "int8": {"dtype": "float32", "quantization": "int8"},
    "nf4": {"dtype": "float32", "quantization": "nf4"},
}
TAG = uuid.uuid4().hex[:6]
TOPIC = f"test.precisions.{TAG}"
RESULTS = f"test.precisions.results.{TAG}"


@pytest.fixture(scope="module")
def precisions_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(TOPIC, 2), TopicSpec(RESULTS, 2)])
    models = [{"model": MODEL, "name": name, **config} for name, config in CONFIGS.items()]
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("precisions") / "worker.log",
        models=json.dumps(models),
        requests_topic=TOPIC,
        bulk_topic="",
        results_topic=RESULTS,
        group_id=f"precisions-{TAG}",
    )
    process.wait_ready(timeout=600)
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def answers(
    kafka: LocalKafka, precisions_worker: WorkerProcess
) -> tuple[list[str], dict[str, npt.NDArray[np.float32]]]:
    """Every configuration's vectors for the sentences of the first STS-B test pairs."""
    pairs = load_stsb("en")[:PAIRS]
    sentences = sorted({s for p in pairs for s in (p.first, p.second)})

    async def embed_all() -> dict[str, npt.NDArray[np.float32]]:
        config = {"requests_topic": TOPIC, "reply_topic": RESULTS}
        async with EmbedClient(kafka.bootstrap_servers, **config) as client:
            out = {}
            for name in CONFIGS:
                parts = await asyncio.gather(
                    *(
                        client.embed_result(sentences[i : i + 64], model=name, timeout=300)
                        for i in range(0, len(sentences), 64)
                    )
                )
                assert {part.model for part in parts} == {name}
                out[name] = np.concatenate([part.vectors for part in parts])
            return out

    return sentences, asyncio.run(embed_all())


def _spearman(sentences: list[str], vectors: npt.NDArray[np.float32]) -> float:
    pairs = load_stsb("en")[:PAIRS]
    row = {s: i for i, s in enumerate(sentences)}
    first = vectors[[row[p.first] for p in pairs]]
    second = vectors[[row[p.second] for p in pairs]]
    return 100 * spearman(np.sum(first * second, axis=1), [p.score for p in pairs])


@pytest.mark.parametrize("name", ["bf16", "fp16", "int8", "nf4"])
def test_spearman_stays_within_the_gates_drop(
    name: str, answers: tuple[list[str], dict[str, npt.NDArray[np.float32]]]
) -> None:
    """Every precision ranks the pairs like fp32: Spearman x100 within 0.5."""
    sentences, vectors = answers
    reference = _spearman(sentences, vectors["fp32"])
    served = _spearman(sentences, vectors[name])
    assert reference > 80  # the model's known quality on this split (82.0 on all pairs)
    assert abs(served - reference) <= 0.5, (name, served, reference)


@pytest.mark.parametrize("name", ["bf16", "fp16", "int8"])
def test_mean_cosine_to_fp32_meets_the_gate(
    name: str, answers: tuple[list[str], dict[str, npt.NDArray[np.float32]]]
) -> None:
    """bf16, fp16 and int8 vectors stay at mean cosine >= 0.99 to fp32 (they are close to
    1: the bounds below are what this model measured, with margin)."""
    _, vectors = answers
    cosine = np.sum(vectors[name] * vectors["fp32"], axis=1)
    assert float(cosine.mean()) >= 0.99
    assert float(cosine.min()) > {"bf16": 0.98, "fp16": 0.999, "int8": 0.99}[name]


def test_nf4_moves_the_vectors_below_the_gates_cosine(
    answers: tuple[list[str], dict[str, npt.NDArray[np.float32]]],
) -> None:
    """nf4's vectors drift (mean cosine ~0.97): a worker gated on its configuration refuses
    it (tests/integration/test_quantization.py), although its ranking holds."""
    _, vectors = answers
    cosine = np.sum(vectors["nf4"] * vectors["fp32"], axis=1)
    assert 0.9 < float(cosine.mean()) < 0.99


def test_info_reports_each_configuration_and_its_memory(
    precisions_worker: WorkerProcess,
) -> None:
    """/info shows each model's dtype and quantization; quantized weights take less memory."""
    with urllib.request.urlopen(f"{precisions_worker.http_url}/info", timeout=10) as response:
        info: dict[str, Any] = json.loads(response.read())
    models = {model["name"]: model for model in info["models"]}
    assert [(models[n]["dtype"], models[n]["quantization"]) for n in CONFIGS] == [
        ("float32", "none"),
        ("bfloat16", "none"),
        ("float16", "none"),
        ("float32", "int8"),
        ("float32", "nf4"),
    ]
    memory = {name: models[name]["memory_bytes"] for name in CONFIGS}
    assert memory["bf16"] < 0.6 * memory["fp32"]
    assert memory["int8"] < 0.8 * memory["fp32"]
    assert memory["nf4"] < memory["int8"]
