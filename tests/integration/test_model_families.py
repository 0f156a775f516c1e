"""The model families teams deploy, served through Kafka by a real worker and held to
``SentenceTransformer(dir).encode`` at cos >= 0.9999 (fp32): tiny random-weight models of
each family built offline (tests/support/tiny_models.py says which tokenizer each uses),
all in one worker, with prompts, over-long inputs on both truncation sides and
mixed-length batches from concurrent calls, so that padding and truncation matter.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.families.requests.{TAG}"
RESULTS = f"test.families.results.{TAG}"


# name in the worker -> (folder, truncation side, prompt name)
SERVED: dict[str, tuple[str, str, str | None]] = {
    "bert-dense": ("bert-dense", "right", None),
    "bert-dense-query": ("bert-dense", "right", "query"),
    "bert-dense-left": ("bert-dense", "left", None),
    "bert-st5": ("bert-st5", "right", None),
    "t5": ("t5", "right", None),
    "xlmr": ("xlmr", "right", None),
    "xlmr-left": ("xlmr", "left", None),
    "xlmr-lower": ("xlmr-lower", "right", None),
    "mpnet": ("mpnet", "right", None),
    "modernbert": ("modernbert", "right", None),
    "bert-instructor": ("bert-instructor", "right", None),
    "bert-instructor-query": ("bert-instructor", "right", "query"),
    "qwen3": ("qwen3", "right", None),
    "qwen3-query": ("qwen3", "right", "query"),
    "qwen3-left": ("qwen3", "left", None),
    "qwen2": ("qwen2", "right", None),
    "qwen2-query": ("qwen2", "right", "query"),
    "mistral": ("mistral", "right", None),
    "mistral-query": ("mistral", "right", "query"),
    "llama": ("llama", "right", None),
    "llama-query": ("llama", "right", "query"),
}


@pytest.fixture(scope="module")
def families_worker(
    kafka: LocalKafka, family_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(REQUESTS, 2), TopicSpec(RESULTS, 2)])
    models: list[dict[str, Any]] = []
    for name, (folder, side, _) in SERVED.items():
        if name.endswith("-query"):
            continue  # the same model, asked for its prompt by name
        models.append(
            {"model": str(family_folders[folder]), "name": name, "truncation_direction": side}
        )
    process = WorkerProcess.serving(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("families-worker") / "worker.log",
        (REQUESTS, RESULTS),
        models=json.dumps(models),
        # Each folder proven against sentence-transformers before the worker joins.
        model_check="true",
    )
    yield process
    assert process.stop() == 0


def _reference(
    path: Path, texts: list[str], side: str, prompt_name: str | None
) -> npt.NDArray[np.float32]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    if model.max_seq_length is None or model.max_seq_length > 64:
        model.max_seq_length = 64  # the plain XLM-R folder: 66 positions hold 64 tokens
    model.tokenizer.truncation_side = side
    vectors = model.encode(texts, prompt_name=prompt_name, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


def _min_cos(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


async def test_every_family_equals_sentence_transformers_through_kafka(
    kafka: LocalKafka,
    families_worker: WorkerProcess,
    family_folders: dict[str, Path],
    family_mix: list[str],
) -> None:
    """Each served model, asked concurrently (one text a call and all texts at once, the
    models interleaved, so batches mix lengths and complete out of order), answers
    sentence-transformers' vectors for its folder, prompt and truncation side."""
    async with EmbedClient(
        kafka.bootstrap_servers, requests_topic=REQUESTS, reply_topic=RESULTS
    ) as client:
        calls = []
        for name, (_, _, prompt) in SERVED.items():
            model = name.removesuffix("-query")
            calls.append(client.embed(family_mix, model=model, prompt_name=prompt, timeout=120))
            calls.extend(
                client.embed([text], model=model, prompt_name=prompt, timeout=120)
                for text in family_mix
            )
        answers = await asyncio.gather(*calls)
    per_model = 1 + len(family_mix)
    for i, (name, (folder, side, prompt)) in enumerate(SERVED.items()):
        whole, *singles = answers[i * per_model : (i + 1) * per_model]
        reference = _reference(family_folders[folder], family_mix, side, prompt)
        assert whole.shape == reference.shape, name
        assert _min_cos(whole, reference) >= 0.9999, name
        assert _min_cos(np.vstack(singles), reference) >= 0.9999, name
    dims = {name: answers[i * per_model].shape[1] for i, name in enumerate(SERVED)}
    assert (dims["bert-dense"], dims["bert-st5"], dims["t5"]) == (24, 20, 16)  # Dense sizes
    # The truncation sides really differ for the over-long family_mix, or the checks above
    # could not tell them apart.
    right = _reference(family_folders["xlmr"], family_mix, "right", None)
    left = _reference(family_folders["xlmr"], family_mix, "left", None)
    long = family_mix.index(max(family_mix, key=len))
    assert _min_cos(right[long : long + 1], left[long : long + 1]) < 0.999


def test_the_worker_proved_every_family_before_serving(families_worker: WorkerProcess) -> None:
    """With ``model_check``, the worker ran ``kembed models check`` on each model before it
    joined its group: one model_check.passed per served model, at cos >= 0.9999."""
    events = families_worker.events()
    passed = [e for e in events if e["event"] == "model_check.passed"]
    served = {name for name in SERVED if not name.endswith("-query")}
    assert {e["model"] for e in passed} == served
    assert min(e["worst_cosine"] for e in passed) >= 0.9999
    checked = max(i for i, e in enumerate(events) if e["event"] == "model_check.passed")
    joined = min(i for i, e in enumerate(events) if e["event"] == "partitions.assigned")
    assert checked < joined


def test_a_served_setting_that_drifts_from_the_reference_fails_the_model_check(
    kafka: LocalKafka, family_folders: dict[str, Path], tmp_path: Path
) -> None:
    """A max-pooled folder served with ``pooling: mean``: the start-up check embeds it as
    it would be served, finds the drift, logs model_check.failed and exits 3 without
    joining its group."""
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        model=str(family_folders["bert-st5"]),
        pooling="mean",
        model_check="true",
        requests_topic=f"{REQUESTS}.drift",
        bulk_topic="",
        group_id=f"families-drift-{TAG}",
    )
    try:
        assert worker.process.wait(timeout=240) == 3
    finally:
        worker.stop()
    events = worker.events()
    (failed,) = [e for e in events if e["event"] == "model_check.failed"]
    assert failed["worst_cosine"] < 0.9999
    assert "partitions.assigned" not in {e["event"] for e in events}
