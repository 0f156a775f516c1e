"""Kafka security end to end, the services: ``kembed`` commands and workers logging in to
the secured broker (``tests/integration/conftest.py``) take credentials from the
environment and never print them, and exit with a clear error when a right or the
password is wrong, at start-up or at run time."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import subprocess
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest

from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.conftest import (
    DAVE_GROUP,
    WORKER_USER,
    assert_no_secret,
    worker_login,
)
from tests.integration.kafka_io import producer
from tests.support.cli import run_kembed, without_kembed_env

pytestmark = pytest.mark.integration


def refused_worker(
    kafka: LocalKafka,
    tmp_path: Path,
    user: str,
    password: str,
    timeout: float,
    event: str = "kafka.authorization_failed",
    **settings: Any,
) -> tuple[WorkerProcess, list[dict[str, Any]], dict[str, Any]]:
    """A worker logging in as ``user`` that must exit with status 1 having logged
    ``event`` once: the worker, its events and that event."""
    worker = WorkerProcess(
        kafka.bootstrap_servers, tmp_path / "worker.log", **settings, **worker_login(user, password)
    )
    try:
        status = worker.process.wait(timeout=timeout)
    finally:
        worker.stop()
    events = worker.events()
    failed = [e for e in events if e.get("event") == event]
    assert status == 1
    assert len(failed) == 1, events
    return worker, events, failed[0]


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``kembed`` from this checkout, with only the given KEMBED_* variables."""
    return run_kembed(*args, env=without_kembed_env(env))


def test_cli_takes_credentials_from_env_and_never_prints_them(
    secure_kafka: LocalKafka, secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """`kembed embed` reads the password from KEMBED_SASL_PASSWORD: it embeds as alice, and
    a wrong password, a missing right and an incomplete setting each end with a clear
    message, a non-zero status and no password in the output."""
    flags = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256"]
    env = {"KEMBED_BOOTSTRAP_SERVERS": secure_kafka.bootstrap_servers}
    wrong = f"wrong-{secrets.token_urlsafe(12)}"

    ok = run_cli(
        "embed", "hello", *flags, "--sasl-username", "alice",
        env={**env, "KEMBED_SASL_PASSWORD": passwords["alice"]},
    )  # fmt: skip
    denied = run_cli(
        "embed", "hello", *flags, "--sasl-username", "bob",
        env={**env, "KEMBED_SASL_PASSWORD": passwords["bob"]},
    )  # fmt: skip
    rejected = run_cli(
        "embed", "hello", *flags, "--sasl-username", "alice",
        env={**env, "KEMBED_SASL_PASSWORD": wrong},
    )  # fmt: skip
    incomplete = run_cli(
        "embed", "hello", "--security-protocol", "SASL_SSL",
        env={**env, "KEMBED_SASL_PASSWORD": passwords["alice"]},
    )  # fmt: skip

    assert ok.returncode == 0, ok.stderr
    assert '"dim": 384' in ok.stdout
    assert denied.returncode == 1
    assert "authorization failed" in denied.stderr
    assert "'embed.requests'" in denied.stderr
    assert rejected.returncode == 1
    assert "authentication failed" in rejected.stderr
    assert incomplete.returncode == 2
    assert "needs sasl_mechanism, sasl_username" in incomplete.stderr
    for result in (ok, denied, rejected, incomplete):
        assert_no_secret(result.stdout + result.stderr, passwords, wrong)


def test_kembed_topics_logs_in_over_sasl_ssl_and_a_wrong_password_is_exit_2(
    secure_kafka: LocalKafka, passwords: dict[str, str]
) -> None:
    """``kembed topics`` takes the TLS/SASL flags of every client: the admin checks the
    broker's topics (the plan for the default settings) over SASL_SSL; a wrong password is
    one line, exit status 2, and no password in the output."""
    flags = [
        "topics", "check", "--catalog-topic", "embed.models",
        "--bootstrap-servers", secure_kafka.tls_bootstrap_servers,
        "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-256",
        "--sasl-username", "admin", "--ssl-cafile", str(secure_kafka.ca_file),
    ]  # fmt: skip
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    ok = run_cli(*flags, env={"KEMBED_SASL_PASSWORD": passwords["admin"]})
    rejected = run_cli(*flags, "--timeout", "20", env={"KEMBED_SASL_PASSWORD": wrong})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines() == ["5 topic(s) checked: 5 as required, 0 problem(s)"]
    assert rejected.returncode == 2, rejected.stdout + rejected.stderr
    assert "rejected the login of User:admin" in rejected.stderr
    assert len(rejected.stderr.strip().splitlines()) == 1
    for result in (ok, rejected):
        assert_no_secret(result.stdout + result.stderr, passwords, wrong)


def test_kembed_ingest_needs_only_write_on_the_bulk_topic(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """erin may not read any reply topic: `kembed ingest` (a producer-only client) still
    works once she may write embed.requests.bulk, and before that it exits 1 naming the
    missing right; no password in either output."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"id": {i}, "text": "doc {i}"}}\n' for i in range(3)))
    env = {
        "KEMBED_BOOTSTRAP_SERVERS": secure_kafka.bootstrap_servers,
        "KEMBED_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KEMBED_SASL_MECHANISM": "SCRAM-SHA-256",
        "KEMBED_SASL_USERNAME": "erin",
        "KEMBED_SASL_PASSWORD": passwords["erin"],
    }
    denied = run_cli("ingest", str(docs), env=env)
    secure_kafka.grant("erin", ["write"], topic="embed.requests.bulk")
    ok = run_cli("ingest", str(docs), env=env)

    assert denied.returncode == 1, denied.stderr
    assert "User:erin is not authorized for WRITE on topic 'embed.requests.bulk'" in (denied.stderr)
    assert ok.returncode == 0, ok.stderr
    assert "ingested 3 documents in 1 request " in ok.stdout
    for result in (denied, ok):
        assert_no_secret(result.stdout + result.stderr, passwords)


def test_worker_without_rights_exits_with_a_clear_error(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """A worker logged in as carol, who has no ACLs, logs kafka.authorization_failed naming
    every missing right and exits non-zero before loading the model, instead of waiting
    for partitions that never come."""
    worker, events, failed = refused_worker(secure_kafka, tmp_path, "carol", passwords["carol"], 60)
    reason = failed["reason"]
    assert failed["level"] == "error"
    assert reason.startswith("User:carol is not authorized for ")
    for right in (
        "READ on topic 'embed.requests'",
        "READ on topic 'embed.requests.bulk'",
        "WRITE on topic 'embed.results'",
        "WRITE on topic 'embed.requests.dlq'",
        "READ on consumer group 'kembed-workers'",
    ):
        assert right in reason
    assert not any(e.get("event") == "model.loaded" for e in events)
    assert_no_secret(worker.log_path.read_text(), passwords)


def test_exactly_once_worker_without_a_transactional_id_right_exits_with_a_clear_error(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """An exactly-once worker whose principal has its topics' and group's rights but none
    on its transactional id logs kafka.authorization_failed naming that id and exits
    non-zero before loading the model."""
    transactional_id = f"kembed-denied-{uuid.uuid4().hex[:6]}"
    worker, events, failed = refused_worker(
        secure_kafka,
        tmp_path,
        WORKER_USER,
        passwords[WORKER_USER],
        120,
        delivery="exactly_once",
        transactional_id=transactional_id,
    )
    assert failed["reason"] == (
        f"User:{WORKER_USER} is not authorized for WRITE on transactional id "
        f"'{transactional_id}' (exactly_once delivery): it needs an ACL allowing it"
    )
    assert not any(e.get("event") == "model.loaded" for e in events)
    assert_no_secret(worker.log_path.read_text(), passwords)


def test_worker_refused_by_its_group_at_run_time_exits_with_a_clear_error(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """dave passes the start-up check (topic rights, a visible group) but may not join the
    group: the refused join, like a right revoked while running, ends the worker with
    kafka.authorization_failed and status 1 instead of an idle worker."""
    worker, events, failed = refused_worker(
        secure_kafka, tmp_path, "dave", passwords["dave"], 180, group_id=DAVE_GROUP
    )
    assert any(e.get("event") == "worker.started" for e in events)
    assert failed["reason"].startswith(
        f"User:dave is not authorized for READ on consumer group '{DAVE_GROUP}'"
    )
    assert_no_secret(worker.log_path.read_text(), passwords)


async def test_worker_whose_group_right_is_revoked_while_running_exits_at_the_next_commit(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """The group's READ right is revoked while an at-least-once worker serves a stream of
    requests: its next offset commit is refused (GroupAuthorizationFailedError), which no
    retry cures, so the worker logs one kafka.authorization_failed error and exits 1 at
    once, instead of warning at every commit while its offsets never move. Heartbeats are
    20 s apart here, so the refused commit, not a refused heartbeat, is what finds it."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"revoke.{tag}", f"revoke-{tag}"
    secure_kafka.create_topics([TopicSpec(topic, 1), TopicSpec(f"{topic}.bulk", 1)])
    for name in (topic, f"{topic}.bulk"):
        secure_kafka.grant(WORKER_USER, ["read"], topic=name)
    secure_kafka.grant(WORKER_USER, ["read"], group=group)
    worker = WorkerProcess(
        secure_kafka.bootstrap_servers,
        tmp_path / "worker.log",
        requests_topic=topic,
        bulk_topic=f"{topic}.bulk",
        group_id=group,
        session_timeout_ms=60000,
        heartbeat_interval_ms=20000,
        **worker_login(WORKER_USER, passwords[WORKER_USER]),
    )
    stop = asyncio.Event()

    async def requests() -> None:
        """One request every 50 ms, until told to stop."""
        async with producer(
            secure_kafka.bootstrap_servers, **secure_kafka.client_config()
        ) as client:
            for i in itertools.count():
                body = {"v": 1, "id": f"{tag}-{i}", "inputs": [f"request {i} of a stream"]}
                await client.send_and_wait(topic, msgpack.packb(body))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
                if stop.is_set():
                    return

    stream = asyncio.create_task(requests())
    try:
        await asyncio.to_thread(worker.wait_ready)
        await asyncio.to_thread(worker.wait_for, "partitions.assigned", 60)
        await asyncio.sleep(3)  # commits succeed meanwhile
        assert worker.process.poll() is None
        await asyncio.to_thread(secure_kafka.revoke, WORKER_USER, ["read"], group=group)
        status = await asyncio.to_thread(worker.process.wait, 120)
    finally:
        stop.set()
        await stream
        worker.stop()

    events = worker.events()
    failed = [e for e in events if e.get("event") == "kafka.authorization_failed"]
    assert status == 1
    assert len(failed) == 1, failed
    assert failed[0]["level"] == "error"
    # The refused commit says so; a refused heartbeat (20 s apart) could come first.
    assert failed[0]["reason"].startswith(
        (
            "GroupAuthorizationFailedError: the principal may no longer commit offsets",
            f"User:{WORKER_USER} is not authorized for READ on consumer group '{group}'",
        )
    ), failed[0]
    warned = [e for e in events if e.get("event") == "commit.failed"]
    assert warned == [], "a commit refused for good is not retried"
    assert_no_secret(worker.log_path.read_text(), passwords)


def test_worker_with_wrong_password_exits_with_a_clear_error(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path: Path
) -> None:
    """A worker with a wrong password logs kafka.authentication_failed and exits non-zero;
    its log holds neither the wrong password nor any real one."""
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    worker, _, failed = refused_worker(
        secure_kafka, tmp_path, WORKER_USER, wrong, 60, event="kafka.authentication_failed"
    )
    assert f"User:{WORKER_USER}" in failed["reason"]
    assert "SCRAM-SHA-512" in failed["reason"]
    assert_no_secret(worker.log_path.read_text(), passwords, wrong)


def test_secured_worker_log_holds_no_password(
    secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """After serving the tests above, the authorized worker's log has its start-up settings
    with the password masked, and no password anywhere."""
    starting = next(e for e in secure_worker.events() if e.get("event") == "worker.starting")

    assert starting["settings"]["sasl_username"] == WORKER_USER
    assert starting["settings"]["sasl_password"] == "***"
    assert any(e.get("event") == "partitions.assigned" for e in secure_worker.events())
    assert_no_secret(secure_worker.log_path.read_text(), passwords)
