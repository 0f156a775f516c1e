"""A worker that cannot start, or that fails while serving, ends with one structured log
event and a documented exit status (docs/operations.md, "Exit statuses").

Real worker processes against the real broker, with the real bundled model (or a damaged
copy of it): each worker here would join its group and serve if its model loaded.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import GroupCoordinatorNotAvailableError

from schemas import EmbedRequest, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec, free_port
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import producer

pytestmark = pytest.mark.integration

TAG = uuid.uuid4().hex[:6]
REQUESTS, BULK = f"fatal.{TAG}.requests", f"fatal.{TAG}.bulk"
RAW_TRACEBACK = "Traceback (most recent call last)"

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _without_root_file_access() -> None:
    """In the worker's process, before it starts: drop the two capabilities that let root
    read any file whatever its mode (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH) from the
    bounding set, so that after exec file modes bind root as they bind anyone. A process
    that is not root has neither capability, and needs nothing dropped."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _copy(model_dir: Path, target: Path) -> Path:
    shutil.copytree(model_dir, target)
    return target


def _missing(model_dir: Path, tmp: Path) -> Path:
    return tmp / "no-such-model"


def _a_file(model_dir: Path, tmp: Path) -> Path:
    path = tmp / "model.bin"
    shutil.copyfile(model_dir / "model.safetensors", path)
    return path


def _unreadable(model_dir: Path, tmp: Path) -> Path:
    path = _copy(model_dir, tmp / "unreadable")
    path.chmod(0)  # no read, no search: not even config.json can be looked at
    return path


def _truncated(model_dir: Path, tmp: Path) -> Path:
    path = _copy(model_dir, tmp / "truncated")
    weights = path / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as handle:
        handle.truncate(size // 2)
    return path


def _unknown_architecture(model_dir: Path, tmp: Path) -> Path:
    path = _copy(model_dir, tmp / "unknown-architecture")
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["FrobnicatorModel"], model_type="frobnicator")
    (path / "config.json").write_text(json.dumps(config))
    return path


def _multi_vector(model_dir: Path, tmp: Path) -> Path:
    """A ColBERT-style folder (PyLate's Dense after the transformer, no Pooling)."""
    path = _copy(model_dir, tmp / "colbert")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (path / "modules.json").write_text(json.dumps(modules))
    return path


CASES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    # case: (how to make the model path, what the logged cause must say)
    "missing directory": (_missing, "does not exist"),
    "a file, not a directory": (_a_file, "is not a directory"),
    "unreadable directory": (_unreadable, "PermissionError: [Errno 13] Permission denied"),
    "truncated model.safetensors": (_truncated, "SafetensorError"),
    "unknown architecture": (_unknown_architecture, "frobnicator"),
    "a module kembed does not run": (_multi_vector, "'pylate.models.Dense.Dense'"),
}


@pytest.fixture(scope="module")
def topics(kafka: LocalKafka) -> tuple[str, str]:
    kafka.create_topics([TopicSpec(REQUESTS, 2), TopicSpec(BULK, 2)])
    return REQUESTS, BULK


def _ready_statuses(worker: WorkerProcess, port: int, timeout: float) -> list[tuple[int, str]]:
    """Poll /ready from the worker's start until it exits: every (status, phase) answered."""
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while worker.process.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as answer:
                seen.append((int(answer.status), json.loads(answer.read())["status"]))
        except urllib.error.HTTPError as error:
            seen.append((int(error.code), json.loads(error.read())["status"]))
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or gone
        time.sleep(0.02)
    return seen


async def _describe_group(bootstrap_servers: str, group: str) -> tuple[str, list[Any]]:
    """The group's state and members. A group no member ever joined is "Dead"; one whose
    members joined and left is "Empty"."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        for _ in range(60):
            try:
                (response,) = await admin.describe_consumer_groups([group])
                break
            except GroupCoordinatorNotAvailableError:  # a broker that has just started
                await asyncio.sleep(0.5)
        else:
            raise AssertionError("no group coordinator")
    finally:
        await admin.close()
    # (error_code, group_id, state, protocol_type, protocol, members, ...)
    _, _, state, _, _, members, *_ = response.groups[0]
    return str(state), list(members)


def _assert_json_lines_without_raw_traceback(worker: WorkerProcess) -> list[dict[str, Any]]:
    text = worker.log_path.read_text()
    events = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    inside = sum(json.dumps(event).count(RAW_TRACEBACK) for event in events)
    assert text.count(RAW_TRACEBACK) == inside, "a traceback outside a JSON event"
    return events


@pytest.mark.parametrize("case", list(CASES))
def test_a_model_that_cannot_be_loaded_stops_the_worker_before_it_joins(
    case: str,
    kafka: LocalKafka,
    topics: tuple[str, str],
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """A worker whose model is missing, not a directory, unreadable (mode 000, read by a
    process without root's file-access override), has truncated weights, names an
    architecture transformers does not know, or lists a module kembed does not run: it logs
    exactly one error, model.load_failed naming the path and the cause, exits with status 2,
    never answers /ready with 200, and no member ever joins its consumer group."""
    make_path, cause = CASES[case]
    path = make_path(model_dir, tmp_path)
    group = f"fatal-{TAG}-{uuid.uuid4().hex[:6]}"
    port = free_port()
    requests_topic, bulk_topic = topics
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        preexec_fn=_without_root_file_access if case == "unreadable directory" else None,
        model=str(path),
        requests_topic=requests_topic,
        bulk_topic=bulk_topic,
        group_id=group,
        http_port=port,
        http_host="127.0.0.1",
    )
    try:
        ready = _ready_statuses(worker, port, timeout=240)
        status = worker.process.wait(timeout=60)
    finally:
        worker.stop()

    events = _assert_json_lines_without_raw_traceback(worker)
    problems = [e for e in events if e["level"] not in ("debug", "info")]
    assert [e["event"] for e in problems] == ["model.load_failed"], problems
    (failed,) = problems
    expected_path = (
        path.resolve() if case in ("truncated model.safetensors", "unknown architecture") else path
    )
    assert failed["path"] == str(expected_path)
    assert cause in failed["cause"], failed["cause"]
    assert failed["stage"] == "load"
    assert failed["exit_code"] == 2
    assert status == 2
    assert ready, "/ready never answered while the worker started"
    assert all(code == 503 for code, _ in ready), ready
    assert {phase for _, phase in ready} <= {"connecting", "loading"}, ready
    names = {e["event"] for e in events}
    assert not names & {"model.loaded", "worker.started", "partitions.assigned"}, names
    state, members = asyncio.run(_describe_group(kafka.bootstrap_servers, group))
    assert members == []
    assert state == "Dead", f"group {group} exists ({state}): a member joined it"


async def test_a_fenced_exactly_once_worker_exits_with_one_fatal_event(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A real fatal error while serving: another producer takes the exactly-once worker's
    transactional id, so its next transaction fails and the pipeline raises. The worker
    logs exactly one event with a traceback, worker.fatal with the exception's type, writes
    nothing but JSON lines, and exits with status 1."""
    requests_topic, results_topic = f"fatal.{TAG}.fence", f"fatal.{TAG}.fence.results"
    transactional_id = f"kembed-fatal-{TAG}"
    kafka.create_topics([TopicSpec(requests_topic, 1), TopicSpec(results_topic, 1)])
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        delivery="exactly_once",
        transactional_id=transactional_id,
        transaction_timeout_ms=3000,
        requests_topic=requests_topic,
        bulk_topic="",
        group_id=f"fatal-fence-{TAG}",
    )
    try:
        worker.wait_ready(timeout=300)
        fence = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap_servers, transactional_id=transactional_id
        )
        await fence.start()  # a new epoch for the id: the worker's producer is fenced
        try:
            async with producer(kafka.bootstrap_servers) as send:
                for i in range(5):
                    request = EmbedRequest(
                        id=f"fence-{i}", inputs=("a short text", "another"), reply_to=results_topic
                    )
                    await send.send_and_wait(requests_topic, encode_request(request))
            status = await asyncio.to_thread(worker.process.wait, 180)
        finally:
            await fence.stop()
    finally:
        worker.stop()

    events = _assert_json_lines_without_raw_traceback(worker)
    with_traceback = [e for e in events if "traceback" in e]
    fatal_events = [e for e in with_traceback if e["event"] == "worker.fatal"]
    assert len(fatal_events) == 1, with_traceback
    assert [e for e in events if e["level"] == "critical"] == fatal_events
    # aiokafka leaves futures of the fenced producer's requests unretrieved; asyncio
    # reports them as the loop closes, as log events too (never as raw text).
    assert {e["event"] for e in with_traceback} <= {"worker.fatal", "asyncio.error"}
    (fatal,) = fatal_events
    assert fatal["level"] == "critical"
    assert fatal["error_type"]
    assert fatal["exit_code"] == 1
    assert fatal["traceback"].startswith(RAW_TRACEBACK)
    short_type = fatal["error_type"].rsplit(".", 1)[-1]
    assert f"{short_type}: {fatal['error']}" in fatal["traceback"]
    assert status == 1
