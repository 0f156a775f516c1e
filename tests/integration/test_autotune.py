"""dtype/torch_compile auto and compiling in the background, with the real model.

- after a compiled variant is built the way the tuner builds it, serving a spread of batch
  shapes compiles nothing more (dynamo's counters);
- a worker with compilation on is ready before compiling finishes (order of its log
  events, not wall-clock), serves through the switch to the compiled variant, in
  exactly-once mode, and every vector matches sentence-transformers' fp32 one.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from producer_sdk import EmbedClient
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess, load_stsb
from tests.support.cli import run_kembed

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS, RESULTS = f"tune.{TAG}", f"tune.{TAG}.results"


def test_served_shapes_after_the_build_compile_nothing_more() -> None:
    """The compiled graph is dynamic in rows and length: once built (one call, full thread
    count, on another thread), batches of any shape the batcher cuts, and lone texts (run
    eagerly on one thread), reuse it."""
    import torch._dynamo.utils as dynamo_utils

    from worker.encoder.autotune import _compile
    from worker.encoder.models import resolve_model_dir
    from worker.encoder.torch_backend import TorchEncoder

    encoder = TorchEncoder(resolve_model_dir("all-MiniLM-L6-v2"), "m", dtype="float32")
    encoder.pin_threads(True)
    variant = encoder.variant(encoder.current.dtype, compiled=True)
    # Built on another thread, as the tuner builds it while the encoder thread serves.
    builder = threading.Thread(target=_compile, args=(encoder, variant))
    builder.start()
    builder.join()
    encoder.pin_threads(False)
    encoder.install(variant)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    frames = dict(dynamo_utils.counters["frames"])
    assert graphs >= 1
    rng = random.Random(13)
    shapes = [(1, 3), (1, 200), (2, 2), (3, 64), (256, 8), (7, 300), (128, 16), (33, 61)]
    shapes += [(rng.randint(1, 120), rng.randint(2, 256)) for _ in range(12)]
    for rows, longest in shapes:
        batch = [[101] * rng.randint(2, longest) for _ in range(rows - 1)] + [[101] * longest]
        assert encoder.encode(batch).shape == (rows, 384)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs
    assert dict(dynamo_utils.counters["frames"]) == frames
    assert not dynamo_utils.counters["recompiles"]
    assert encoder.info.compiled is True


@pytest.fixture(scope="module")
def compiling_worker(
    kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    kafka.create_topics(
        [TopicSpec(REQUESTS, 2), TopicSpec(f"{REQUESTS}.bulk", 1), TopicSpec(RESULTS, 2)]
    )
    process = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path_factory.mktemp("tune") / "worker.log",
        dtype="float32",
        torch_compile="on",
        delivery="exactly_once",
        requests_topic=REQUESTS,
        bulk_topic=f"{REQUESTS}.bulk",
        results_topic=RESULTS,
        group_id=f"tune-{TAG}",
    )
    try:
        yield process
    finally:
        process.stop()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return json.loads(body) if url.endswith("/info") else body


async def test_ready_before_compiled_then_serves_through_the_switch(
    kafka: LocalKafka, compiling_worker: WorkerProcess, reference_model: Any
) -> None:
    worker = compiling_worker
    worker.wait_ready(timeout=180)
    base = worker.http_url
    started = worker.wait_for("worker.started")
    loaded = worker.wait_for("model.loaded")
    assert loaded["compiled"] is False  # serving eagerly until the compiled one is built
    sentences = sorted({s for p in load_stsb("en") for s in (p.first, p.second)})[:1200]
    texts: list[str] = []
    vectors: list[np.ndarray[Any, Any]] = []
    phases = set()
    async with EmbedClient(kafka.bootstrap_servers, requests_topic=REQUESTS) as client:
        chunk = 0
        while True:
            tuned = [e for e in worker.events() if e.get("event") == "encoder.tuned"]
            info = _get(f"{base}/info")
            phases.add(info["model"]["tuning"]["phase"])
            batch = sentences[(chunk * 16) % len(sentences) :][:16]
            vectors.append(await client.embed(batch, timeout=120))
            texts.extend(batch)
            chunk += 1
            if tuned and chunk >= 8:
                break
            assert chunk < 2000, "the tuner never finished"
        # and after the switch
        for start in range(0, 256, 32):
            batch = sentences[start : start + 32]
            vectors.append(await client.embed(batch, timeout=120))
            texts.extend(batch)
    events = [e["event"] for e in worker.events()]
    assert events.index("worker.started") < events.index("encoder.tuning_started")
    assert events.index("encoder.tuning_started") < events.index("encoder.switched")
    assert started is not None
    assert "tuning" in phases
    tuned_event = tuned[0]
    assert tuned_event["chosen"] == "float32/compiled"
    assert tuned_event["compiled"] is True
    info = _get(f"{base}/info")
    assert info["model"]["compiled"] is True
    assert info["model"]["tuning"]["phase"] == "compiled"
    assert [row["candidate"] for row in info["model"]["tuning"]["table"]] == ["float32/compiled"]
    metrics = _get(f"{base}/metrics")
    assert re.search(r'kembed_encoder_phase\{model="[^"]+",phase="compiled"\} 1\.0', metrics)
    got = np.concatenate(vectors)
    expected = reference_model.encode(texts, normalize_embeddings=True)
    cosine = np.sum(got * expected, axis=1)
    assert float(cosine.min()) > 0.9999, f"min cosine {cosine.min():.6f}"


def test_validate_measures_auto_and_judges_the_variant_it_chose() -> None:
    """`kembed validate` with dtype auto times fp32 and bf16 (compiling off, to keep this
    short), reports the table, and judges the chosen one against fp32."""
    done = run_kembed(
        *["validate", "--limit", "100", "--json"],
        timeout=600,
        env={**os.environ, "KEMBED_DTYPE": "auto", "KEMBED_TORCH_COMPILE": "off"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    table = report["tuning"]["table"]
    assert [row["candidate"] for row in table] == ["float32/eager", "bfloat16/eager"]
    assert all(row["status"] == "ok" and row["texts_per_s"] > 0 for row in table)
    chosen = max(table, key=lambda row: row["texts_per_s"])
    assert report["tuning"]["chosen"] == chosen["candidate"]
    assert report["candidate"]["dtype"] == chosen["dtype"]
    assert table[0]["mean_cosine"] > 0.9999  # fp32 against itself
