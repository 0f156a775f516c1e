"""Several models in one worker, and a fleet that splits models across workers.

The second model is the bundled one again, served under another name with cls pooling and
left truncation: the same weights give different, exactly predictable vectors, so every
answer can be checked against the encoder run in-process with that model's settings.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from producer_sdk import EmbedClient, EmbedError
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from worker.encoder.torch_backend import TorchEncoder
from worker.tokenization import TextTokenizer

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS = f"test.mm.requests.{TAG}"
CLS_TOPIC = f"test.mm.cls.{TAG}"
RESULTS = f"test.mm.results.{TAG}"
TEXTS = ["A man is playing a guitar.", "一个女孩正在梳头。", "Kafka keeps an ordered log."]
PROMPTS = {"query": "query: ", "passage": "passage: "}
# Over 256 tokens, with different beginnings and ends: the two truncation sides differ.
LONG = "alpha beta gamma " * 60 + "the quick brown fox jumps over the lazy dog " * 20


def _models(extra_cls: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        {"model": "sentence-transformers/all-MiniLM-L6-v2", "name": "minilm", "prompts": PROMPTS},
        {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            "name": "minilm-cls",
            "aliases": ["cls"],
            "pooling": "cls",
            "truncation_direction": "left",
            **(extra_cls or {}),
        },
    ]


def _reference(
    model_dir: Path, texts: list[str], pooling: str = "auto", direction: str = "right"
) -> npt.NDArray[np.float32]:
    """The model run in-process (fp32), normalized as the worker's default answer is."""
    encoder = TorchEncoder(model_dir, "reference", pooling=pooling)
    tokenizer = TextTokenizer.from_model_dir(model_dir, encoder.info.max_seq_length, direction)
    vectors = encoder.encode([t.ids for t in tokenizer.encode(texts)])
    normalized: npt.NDArray[np.float32] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return normalized


@pytest.fixture(scope="module")
def two_model_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics([TopicSpec(REQUESTS, 2), TopicSpec(CLS_TOPIC, 1), TopicSpec(RESULTS, 2)])
    models = _models({"requests_topic": CLS_TOPIC, "bulk_topic": ""})
    process = WorkerProcess.serving(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("mm") / "worker.log",
        (REQUESTS, RESULTS),
        models=json.dumps(models),
        group_id=f"mm-{TAG}",
    )
    yield process
    assert process.stop() == 0


def _client(kafka: LocalKafka, topic: str = REQUESTS) -> EmbedClient:
    return EmbedClient(kafka.bootstrap_servers, requests_topic=topic, reply_topic=RESULTS)


def _cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> list[float]:
    return [float(x @ y) for x, y in zip(a, b, strict=True)]


async def test_each_request_is_computed_by_the_model_it_names(
    kafka: LocalKafka, two_model_worker: WorkerProcess, model_dir: Path
) -> None:
    """No model named: the topic's default (mean pooling); by name or alias: that model
    (cls pooling), with the result naming the model that computed it."""
    mean = _reference(model_dir, TEXTS)
    cls = _reference(model_dir, TEXTS, pooling="cls")
    async with _client(kafka) as client:
        default = await client.embed_result(TEXTS, timeout=60)
        by_name = await client.embed_result(TEXTS, model="minilm-cls", timeout=60)
        by_alias = await client.embed(TEXTS, model="cls", timeout=60)
    async with _client(kafka, CLS_TOPIC) as client:
        on_cls_topic = await client.embed_result(TEXTS, timeout=60)
    assert default.model == "minilm"
    assert by_name.model == on_cls_topic.model == "minilm-cls"
    assert min(_cosines(default.vectors, mean)) > 0.9999
    assert min(_cosines(by_name.vectors, cls)) > 0.9999
    assert np.allclose(by_alias, by_name.vectors, atol=1e-6)
    assert np.allclose(on_cls_topic.vectors, by_name.vectors, atol=1e-6)
    # The pooling really differs: otherwise the checks above could not tell the models apart.
    assert max(_cosines(mean, cls)) < 0.99


async def test_interleaved_requests_for_two_models_are_batched_apart(
    kafka: LocalKafka, two_model_worker: WorkerProcess, model_dir: Path
) -> None:
    """60 concurrent calls alternating between the models: each answer is its model's
    vectors (a batch never mixes models)."""
    mean = _reference(model_dir, TEXTS)
    cls = _reference(model_dir, TEXTS, pooling="cls")
    async with _client(kafka) as client:
        calls = [
            client.embed_result([TEXTS[i % 3]], model=("minilm", "cls")[i % 2], timeout=60)
            for i in range(60)
        ]
        results = await asyncio.gather(*calls)
    for i, result in enumerate(results):
        expected = (mean, cls)[i % 2][i % 3]
        assert result.model == ("minilm", "minilm-cls")[i % 2]
        assert float(result.vectors[0] @ expected) > 0.9999


async def test_named_prompts_and_the_prompt_text_give_the_same_vectors(
    kafka: LocalKafka, two_model_worker: WorkerProcess
) -> None:
    """prompt_name="query" prepends the model's "query: " prompt; an unknown prompt name,
    or one the model does not have, is invalid_request naming the prompts it has."""
    async with _client(kafka) as client:
        named = await client.embed(TEXTS, prompt_name="query", timeout=60)
        as_text = await client.embed(TEXTS, prompt="query: ", timeout=60)
        plain = await client.embed(TEXTS, timeout=60)
        with pytest.raises(EmbedError) as unknown:
            await client.embed(TEXTS, prompt_name="summary", timeout=60)
        with pytest.raises(EmbedError) as lacking:
            await client.embed(TEXTS, model="cls", prompt_name="query", timeout=60)
    assert np.allclose(named, as_text, atol=1e-6)
    assert max(_cosines(named, plain)) < 0.999
    assert unknown.value.code == lacking.value.code == "invalid_request"
    assert "passage, query" in str(unknown.value)


async def test_truncation_direction_per_model_and_per_request(
    kafka: LocalKafka, two_model_worker: WorkerProcess, model_dir: Path
) -> None:
    """minilm cuts over-long inputs on the right by default and minilm-cls on the left; a
    request may choose the side. Each matches the model run in-process with that side."""
    right = _reference(model_dir, [LONG])[0]
    left = _reference(model_dir, [LONG], direction="left")[0]
    cls_left = _reference(model_dir, [LONG], pooling="cls", direction="left")[0]
    async with _client(kafka) as client:
        default = await client.embed_result([LONG], timeout=60)
        asked_left = await client.embed([LONG], truncation_direction="left", timeout=60)
        cls_default = await client.embed([LONG], model="cls", timeout=60)
    assert default.tokens == (256,)
    assert float(default.vectors[0] @ right) > 0.9999
    assert float(asked_left[0] @ left) > 0.9999
    assert float(cls_default[0] @ cls_left) > 0.9999
    assert float(right @ left) < 0.9


async def test_unknown_model_lists_every_served_name(
    kafka: LocalKafka, two_model_worker: WorkerProcess
) -> None:
    async with _client(kafka) as client:
        with pytest.raises(EmbedError) as caught:
            await client.embed(TEXTS, model="e5-large", timeout=60)
    assert caught.value.code == "unknown_model"
    for name in ("minilm", "minilm-cls", "cls"):
        assert name in str(caught.value)


def test_info_lists_both_models(two_model_worker: WorkerProcess) -> None:
    with urllib.request.urlopen(f"{two_model_worker.http_url}/info", timeout=10) as response:
        info = json.loads(response.read())
    models = {model["name"]: model for model in info["models"]}
    assert list(models) == ["minilm", "minilm-cls"]
    assert models["minilm"]["pooling"] == "mean"
    assert models["minilm"]["prompts"] == PROMPTS
    assert models["minilm"]["requests_topic"] == REQUESTS
    assert models["minilm-cls"]["pooling"] == "cls"
    assert models["minilm-cls"]["aliases"] == ["cls"]
    assert "all-MiniLM-L6-v2" in models["minilm"]["aliases"]
    assert models["minilm-cls"]["truncation_direction"] == "left"
    assert models["minilm-cls"]["requests_topic"] == CLS_TOPIC
    assert info["model"]["name"] == "minilm"
    assert set(info["served_names"]) >= {"minilm", "minilm-cls", "cls"}


async def test_a_fleet_splits_models_across_workers(
    kafka: LocalKafka, tmp_path: Path, model_dir: Path
) -> None:
    """Two workers in one consumer group, each serving one model on its own topic: each
    topic's partitions go to the worker that serves its model. Both announce their model
    on the catalog: a client lists them, and a client configured for neither topic reaches
    each model by name or alias. A worker that stops takes its model off the list."""
    tag = uuid.uuid4().hex[:6]
    mean_topic, cls_topic = f"test.split.mean.{tag}", f"test.split.cls.{tag}"
    catalog, results = f"test.split.catalog.{tag}", f"test.split.results.{tag}"
    kafka.create_topics(
        [
            TopicSpec(mean_topic, 2),
            TopicSpec(cls_topic, 2),
            TopicSpec(catalog, 1, {"cleanup.policy": "compact,delete"}),
            TopicSpec(f"test.split.none.{tag}", 1),
            TopicSpec(results, 2),
        ]
    )
    common: dict[str, Any] = {
        "dtype": "float32",
        "bulk_topic": "",
        "results_topic": results,
        "group_id": f"split-{tag}",
        "catalog_topic": catalog,
    }
    mean_worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "mean.log",
        models=json.dumps([_models()[0] | {"requests_topic": mean_topic, "bulk_topic": ""}]),
        requests_topic=mean_topic,
        **common,
    )
    cls_worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "cls.log",
        models=json.dumps([_models()[1] | {"requests_topic": cls_topic, "bulk_topic": ""}]),
        requests_topic=cls_topic,
        **common,
    )
    options: dict[str, Any] = {"reply_topic": results, "catalog_topic": catalog}
    try:
        mean_worker.wait_ready()
        cls_worker.wait_ready()
        # Configured for a topic no worker reads: every call below is routed by the catalog.
        async with EmbedClient(
            kafka.bootstrap_servers, requests_topic=f"test.split.none.{tag}", **options
        ) as client:
            listed = {model.name: model for model in await client.models()}
            mean = await client.embed_result(TEXTS, model="minilm", timeout=60)
            cls = await client.embed_result(TEXTS, model="cls", timeout=60)
        assert sorted(listed) == ["minilm", "minilm-cls"]
        assert (listed["minilm"].workers, listed["minilm-cls"].workers) == (1, 1)
        assert listed["minilm"].requests_topic == mean_topic
        assert listed["minilm-cls"].requests_topic == cls_topic
        assert "cls" in listed["minilm-cls"].aliases
        assert listed["minilm-cls"].pooling == "cls"
        assert listed["minilm"].prompts == PROMPTS
        assert (mean.model, cls.model) == ("minilm", "minilm-cls")
        assert min(_cosines(cls.vectors, _reference(model_dir, TEXTS, pooling="cls"))) > 0.9999
        for worker, topic in ((mean_worker, mean_topic), (cls_worker, cls_topic)):
            assigned = [e for e in worker.events() if e.get("event") == "partitions.assigned"]
            partitions = {p for event in assigned for p in event["partitions"]}
            assert partitions == {f"{topic}-0", f"{topic}-1"}, (worker, partitions)
        assert cls_worker.stop() == 0
        async with EmbedClient(kafka.bootstrap_servers, **options) as client:
            after = [model.name for model in await client.models()]
        assert after == ["minilm"]
    finally:
        assert mean_worker.stop() == 0
        cls_worker.stop()
