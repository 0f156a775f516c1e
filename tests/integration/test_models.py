"""Models by path: a plain Hugging Face directory loads and is served under its own name."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest

from producer_sdk import EmbedClient, EmbedError
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from worker.encoder import torch_backend
from worker.encoder.torch_backend import TorchEncoder
from worker.tokenization import TextTokenizer

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "一个女孩正在梳头。", "Kafka keeps an ordered log."]


@pytest.fixture(scope="module")
def plain_hf_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model without its sentence-transformers files: a plain HF model dir."""
    target = tmp_path_factory.mktemp("plain-hf") / "minilm"
    shutil.copytree(model_dir, target)
    for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
        (target / name).unlink()
    shutil.rmtree(target / "1_Pooling")
    return target


def _encode(path: Path, texts: list[str]) -> np.ndarray:
    encoder = TorchEncoder(path, "m")
    tokenizer = TextTokenizer.from_model_dir(path, encoder.info.max_seq_length)
    return encoder.encode([t.ids for t in tokenizer.encode(texts)])


def test_plain_hugging_face_directory_uses_mean_pooling_and_config_limits(
    model_dir: Path, plain_hf_dir: Path
) -> None:
    """Without sentence-transformers files the encoder defaults to mean pooling and the
    model's position limit, giving the same vectors for short texts."""
    encoder = TorchEncoder(plain_hf_dir, "plain")
    assert encoder.info.pooling == "mean"
    assert encoder.info.max_seq_length == 512
    assert np.allclose(_encode(plain_hf_dir, TEXTS), _encode(model_dir, TEXTS), atol=1e-5)


async def test_worker_serves_a_model_directory_under_its_name(
    kafka: LocalKafka, plain_hf_dir: Path, tmp_path: Path
) -> None:
    """KEMBED_MODEL=<directory> with KEMBED_MODEL_NAME serves that name; other names, the
    directory's path among them (a path is never a model name), are unknown_model."""
    topic = f"test.models.{uuid.uuid4().hex[:6]}"
    kafka.create_topics([TopicSpec(topic, 1)])
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "model-worker.log",
        model=plain_hf_dir,
        model_name="my-minilm",
        requests_topic=topic,
        group_id=f"models-{uuid.uuid4().hex[:6]}",
    )
    try:
        worker.wait_ready()
        async with EmbedClient(kafka.bootstrap_servers, requests_topic=topic) as client:
            vectors = await client.embed(TEXTS, model="my-minilm", timeout=60)
            with pytest.raises(EmbedError) as caught:
                await client.embed(TEXTS, model="sentence-transformers/all-MiniLM-L6-v2")
            with pytest.raises(EmbedError) as by_path:
                await client.embed(TEXTS, model=str(plain_hf_dir), timeout=60)
        assert vectors.shape == (3, 384)
        assert caught.value.code == "unknown_model"
        assert by_path.value.code == "unknown_model"
    finally:
        assert worker.stop() == 0


def test_a_failing_compiler_falls_back_to_the_eager_model(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When torch.compile cannot build the model (no C++ compiler, an op inductor cannot
    lower), the encoder serves the same vectors eagerly and reports itself uncompiled."""

    def broken_compile(model: object) -> object:
        def fail(**kwargs: object) -> object:
            raise RuntimeError("inductor: no working C++ compiler")

        return fail

    monkeypatch.setattr(torch_backend, "_compiled", broken_compile)
    encoder = TorchEncoder(model_dir, "m", compile=True)
    before = encoder.info.compiled
    tokenizer = TextTokenizer.from_model_dir(model_dir, encoder.info.max_seq_length)
    texts = TEXTS * 8  # over 64 padded tokens: smaller batches run eagerly anyway
    vectors = encoder.encode([t.ids for t in tokenizer.encode(texts)])
    assert (before, encoder.info.compiled) == (True, False)
    assert np.allclose(vectors, _encode(model_dir, texts), atol=1e-6)
