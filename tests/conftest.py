"""Shared fixtures: the real local Kafka broker, real worker processes, the STS-B data."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from scripts.kafka_local import LocalKafka

ROOT = Path(__file__).resolve().parents[1]


def stsb_dir() -> Path:
    """STS-B lives in the shared data folder beside the clone (or where KEMBED_STSB_DIR says)."""
    return Path(os.environ.get("KEMBED_STSB_DIR", ROOT.parent / "shared" / "data" / "stsb"))


@dataclass(frozen=True)
class StsPair:
    first: str
    second: str
    score: float


def load_stsb(language: str = "en") -> list[StsPair]:
    with (stsb_dir() / f"stsb-{language}-test.csv").open(newline="", encoding="utf-8") as f:
        return [StsPair(a, b, float(score)) for a, b, score in csv.reader(f)]


class WorkerProcess:
    """A real ``python -m worker`` process, with its JSON log lines captured to a file."""

    def __init__(self, bootstrap_servers: str, log_path: Path, **settings: Any) -> None:
        self.log_path = log_path
        env = {
            **os.environ,
            "KEMBED_BOOTSTRAP_SERVERS": bootstrap_servers,
            "KEMBED_LOG_FORMAT": "json",
            "HF_HUB_OFFLINE": "1",
        }
        env.update({f"KEMBED_{name.upper()}": str(value) for name, value in settings.items()})
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "worker"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                events.append({"event": "<not json>", "line": line})
        return events

    def wait_for(self, event: str, timeout: float = 120.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in self.events():
                if item.get("event") == event and all(item.get(k) == v for k, v in fields.items()):
                    return item
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise AssertionError(f"worker never logged {event!r} (exit {self.process.poll()}):\n{tail}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Ready = model warmed up and at least one partition assigned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assigned = [e for e in self.events() if e.get("event") == "partitions.assigned"]
            if any(e.get("partitions") for e in assigned):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.wait_for("partitions.assigned", timeout=0)

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


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
