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

from loadtest.data import stsb_sentences
from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.support.tiny_models import (
    bert_dense_st6,
    bert_st5,
    family_texts,
    modernbert,
    mpnet,
    qwen3_decoder,
    t5_encoder,
    xlmr_lower_case,
    xlmr_plain,
)

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.families.requests.{TAG}"
RESULTS = f"test.families.results.{TAG}"


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return stsb_sentences("en")[:2000]


@pytest.fixture(scope="module")
def texts(sentences: list[str]) -> list[str]:
    return family_texts(sentences)


@pytest.fixture(scope="module")
def folders(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, sentences: list[str]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {
        "bert-dense": bert_dense_st6(root, model_dir),
        "bert-st5": bert_st5(root, model_dir),
        "t5": t5_encoder(root, model_dir),
        "xlmr": xlmr_plain(root, sentences, positions=66),
        "xlmr-lower": xlmr_lower_case(root, sentences),
        "mpnet": mpnet(root, sentences),
        "modernbert": modernbert(root, model_dir),
        "qwen3": qwen3_decoder(root, sentences),
    }


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
    "qwen3": ("qwen3", "right", None),
    "qwen3-query": ("qwen3", "right", "query"),
    "qwen3-left": ("qwen3", "left", None),
}


@pytest.fixture(scope="module")
def families_worker(
    kafka: LocalKafka, folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(REQUESTS, 2), TopicSpec(RESULTS, 2)])
    models: list[dict[str, Any]] = []
    for name, (folder, side, _) in SERVED.items():
        if name.endswith("-query"):
            continue  # the same model, asked for its prompt by name
        models.append({"model": str(folders[folder]), "name": name, "truncation_direction": side})
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("families-worker") / "worker.log",
        models=json.dumps(models),
        dtype="float32",
        requests_topic=REQUESTS,
        bulk_topic="",
        results_topic=RESULTS,
        group_id=f"families-{TAG}",
    )
    process.wait_ready()
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
    folders: dict[str, Path],
    texts: list[str],
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
            calls.append(client.embed(texts, model=model, prompt_name=prompt, timeout=120))
            calls.extend(
                client.embed([text], model=model, prompt_name=prompt, timeout=120) for text in texts
            )
        answers = await asyncio.gather(*calls)
    per_model = 1 + len(texts)
    for i, (name, (folder, side, prompt)) in enumerate(SERVED.items()):
        whole, *singles = answers[i * per_model : (i + 1) * per_model]
        reference = _reference(folders[folder], texts, side, prompt)
        assert whole.shape == reference.shape, name
        assert _min_cos(whole, reference) >= 0.9999, name
        assert _min_cos(np.vstack(singles), reference) >= 0.9999, name
    dims = {name: answers[i * per_model].shape[1] for i, name in enumerate(SERVED)}
    assert (dims["bert-dense"], dims["bert-st5"], dims["t5"]) == (24, 20, 16)  # Dense sizes
    # The truncation sides really differ for the over-long texts, or the checks above
    # could not tell them apart.
    right = _reference(folders["xlmr"], texts, "right", None)
    left = _reference(folders["xlmr"], texts, "left", None)
    long = texts.index(" ".join(stsb_sentences("en")[:40]))
    assert _min_cos(right[long : long + 1], left[long : long + 1]) < 0.999
