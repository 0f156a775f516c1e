"""Kafka security end to end: a SASL/SCRAM broker with ACLs, a worker and clients that log in
as their own users, clear errors for missing rights and wrong passwords, and logs that hold
neither secrets nor request text.

The secured broker is this module's own (``LocalKafka(scram_users=...)``); the log-privacy
test at the end uses the session's plain broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from producer_sdk import (
    AuthenticationError,
    AuthorizationError,
    EmbedClient,
    EmbedError,
    KembedError,
)
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import producer
from tests.support.cli import run_kembed, without_kembed_env
from worker.settings import DEFAULT_REPLY_TOPICS

pytestmark = pytest.mark.integration

WORKER_USER = "kembed-worker"
USERS = ("admin", WORKER_USER, "alice", "bob", "carol", "dave", "erin")
DAVE_GROUP = "dave-workers"
ALICE_REPLIES = "embed.results.alice"


@pytest.fixture(scope="module")
def passwords() -> dict[str, str]:
    """Fresh, recognisable passwords: a leak anywhere is found by a plain substring search."""
    return {user: f"pw-{user}-{secrets.token_urlsafe(12)}" for user in USERS}


@pytest.fixture(scope="module")
def secure_kafka(
    tmp_path_factory: pytest.TempPathFactory, passwords: dict[str, str]
) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path_factory.mktemp("secure-kafka"), scram_users=passwords, tls=True)
    broker.start()
    try:
        # The worker: exactly what it needs, nothing more. One prefixed ACL covers the
        # results topic and every reply topic the default KEMBED_REPLY_TOPICS allows.
        for topic in ("embed.requests", "embed.requests.bulk"):
            broker.grant(WORKER_USER, ["read"], topic=topic)
        broker.grant(WORKER_USER, ["read"], group="kembed-workers")
        broker.grant(WORKER_USER, ["write"], topic="embed.results", prefixed=True)
        broker.grant(WORKER_USER, ["write"], topic="embed.requests.dlq")
        broker.create_topics([TopicSpec(ALICE_REPLIES, 1)])
        broker.grant("alice", ["read"], topic=ALICE_REPLIES)
        # alice: a client with the rights a client needs.
        broker.grant("alice", ["write"], topic="embed.requests")
        broker.grant("alice", ["read"], topic="embed.results")
        # bob: reads results, but may not write requests.
        broker.grant("bob", ["read"], topic="embed.results")
        # erin: writes requests, but may only describe (not read) the results.
        broker.grant("erin", ["write"], topic="embed.requests")
        broker.grant("erin", ["describe"], topic="embed.results")
        # carol: no rights at all.
        # dave: a worker with its topics' rights, who may see its group but not join it.
        for topic in ("embed.requests", "embed.requests.bulk"):
            broker.grant("dave", ["read"], topic=topic)
        for topic in ("embed.results", "embed.requests.dlq"):
            broker.grant("dave", ["write"], topic=topic)
        broker.grant("dave", ["describe"], group=DAVE_GROUP)
        yield broker
    finally:
        broker.stop()


def sasl(user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> dict[str, Any]:
    """The SDK's security options for a SCRAM login."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_username": user,
        "sasl_password": password,
    }


def worker_login(user: str, password: str) -> dict[str, Any]:
    """The worker's settings (KEMBED_* env vars) for a SCRAM-SHA-512 login."""
    return sasl(user, password, "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def secure_worker(
    secure_kafka: LocalKafka, passwords: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = WorkerProcess(
        secure_kafka.bootstrap_servers,
        tmp_path_factory.mktemp("secure-worker") / "worker.log",
        reply_topics=DEFAULT_REPLY_TOPICS,
        **worker_login(WORKER_USER, passwords[WORKER_USER]),
    )
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def assert_no_secret(text: str, passwords: dict[str, str], *extra: str) -> None:
    for secret in (*passwords.values(), *extra):
        assert secret not in text, "a password leaked"


async def test_authorized_client_gets_vectors(
    secure_kafka: LocalKafka, secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """A client logged in as alice (SCRAM-SHA-256) gets vectors from the worker logged in
    as its own user (SCRAM-SHA-512) with only the ACLs it needs."""
    options = sasl("alice", passwords["alice"])
    async with EmbedClient(secure_kafka.bootstrap_servers, **options) as client:
        vectors = await client.embed(["a secured request", "and another one"], timeout=60)

    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-3)
    assert_no_secret(repr(client.config), passwords)


async def test_a_worker_with_write_on_the_results_prefix_answers_on_any_allowed_topic(
    secure_kafka: LocalKafka, secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """The worker's only WRITE right on answers is the prefixed ACL on embed.results: it
    covers a client's own reply topic embed.results.alice as well as embed.results."""
    options = sasl("alice", passwords["alice"])
    async with EmbedClient(
        secure_kafka.bootstrap_servers, reply_topic=ALICE_REPLIES, **options
    ) as client:
        vectors = await client.embed(["answered on the client's own topic"], timeout=60)
    assert vectors.shape == (1, 384)


async def test_client_without_write_right_gets_authorization_error(
    secure_kafka: LocalKafka, passwords: dict[str, str]
) -> None:
    """bob may read results but not write embed.requests: embed() fails at once with an
    AuthorizationError naming the user, the topic and the operation, and no password."""
    error, elapsed = await _refused(secure_kafka, "bob", passwords)
    assert elapsed < 5, "the error must come at once, not after the timeout"
    assert isinstance(error, KembedError)
    assert error.principal == "User:bob"
    assert (error.operation, error.topic) == ("write", "embed.requests")
    assert "authorization failed" in str(error)
    assert "WRITE on topic 'embed.requests'" in str(error)
    assert_no_secret(str(error), passwords)


async def test_client_that_may_not_read_replies_fails_fast(
    secure_kafka: LocalKafka, passwords: dict[str, str]
) -> None:
    """erin may describe but not read the reply topic: instead of waiting for results that
    can never arrive, embed() fails at once with an AuthorizationError for READ."""
    error, elapsed = await _refused(secure_kafka, "erin", passwords)
    assert elapsed < 10
    assert (error.operation, error.topic) == ("read", "embed.results")
    assert_no_secret(str(error), passwords)


async def _refused(
    kafka: LocalKafka, user: str, passwords: dict[str, str]
) -> tuple[AuthorizationError, float]:
    """The AuthorizationError ``user``'s embed() gets, and how long it took."""
    options = sasl(user, passwords[user])
    async with EmbedClient(kafka.bootstrap_servers, **options) as client:
        started = time.monotonic()
        with pytest.raises(AuthorizationError) as failure:
            await client.embed([f"{user}'s text"], timeout=30)
        return failure.value, time.monotonic() - started


async def test_wrong_password_gets_authentication_error(
    secure_kafka: LocalKafka, passwords: dict[str, str]
) -> None:
    """A wrong password fails start() with an AuthenticationError that names the user and
    mechanism, and holds neither the wrong nor the right password."""
    wrong = f"wrong-{secrets.token_urlsafe(12)}"
    client = EmbedClient(secure_kafka.bootstrap_servers, **sasl("alice", wrong))
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as failure:
        await client.start()
    elapsed = time.monotonic() - started

    message = str(failure.value)
    assert elapsed < 10
    assert "authentication failed" in message
    assert "User:alice" in message
    assert "SCRAM-SHA-256" in message
    assert_no_secret(message, passwords, wrong)


async def test_client_over_sasl_ssl_gets_vectors(
    secure_kafka: LocalKafka, secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """SASL_SSL: alice logs in over TLS, checking the broker's certificate against the
    local CA and the host name, and gets vectors."""
    options = sasl("alice", passwords["alice"], "SCRAM-SHA-512") | {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(secure_kafka.ca_file),
    }
    async with EmbedClient(secure_kafka.tls_bootstrap_servers, **options) as client:
        vectors = await client.embed(["a request over TLS"], timeout=60)

    assert vectors.shape == (1, 384)


async def test_tls_certificate_checks_fail_as_authentication_errors(
    secure_kafka: LocalKafka, secure_worker: WorkerProcess, passwords: dict[str, str]
) -> None:
    """A broker certificate that the client's trust store does not vouch for, or that does
    not name the host connected to, fails start() with an AuthenticationError; turning
    the host name check off (and only that) lets the second case through."""
    port = secure_kafka.tls_bootstrap_servers.rpartition(":")[2]
    login = sasl("alice", passwords["alice"]) | {"security_protocol": "SASL_SSL"}
    with_ca = login | {"ssl_cafile": str(secure_kafka.ca_file)}

    with pytest.raises(AuthenticationError) as untrusted:
        await EmbedClient(secure_kafka.tls_bootstrap_servers, **login).start()
    # The certificate names 127.0.0.1 only.
    with pytest.raises(AuthenticationError) as wrong_name:
        await EmbedClient(f"localhost:{port}", **with_ca).start()
    async with EmbedClient(f"localhost:{port}", **with_ca, ssl_check_hostname=False) as unchecked:
        vectors = await unchecked.embed(["hostname check off"], timeout=60)

    assert "TLS handshake" in str(untrusted.value)
    assert "certificate verify failed" in str(untrusted.value)
    assert "TLS handshake" in str(wrong_name.value)
    assert "localhost" in str(wrong_name.value)
    assert vectors.shape == (1, 384)


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


# -- request text never reaches the log ----------------------------------------------------------

PRIVACY_REQUESTS = "test.privacy.requests"
PRIVACY_BULK = "test.privacy.bulk"


async def test_debug_log_holds_no_request_text(kafka: LocalKafka, tmp_path: Path) -> None:
    """A worker at debug level serves interactive and bulk requests, a prompt, a rejected
    (too long) request, an invalid one and an undecodable one: its log, which has debug
    events for every answered request, contains none of the texts."""
    kafka.create_topics([TopicSpec(PRIVACY_REQUESTS, 2), TopicSpec(PRIVACY_BULK, 2)])
    tag = uuid.uuid4().hex[:10]
    texts = [f"quokka{tag}text{i}" for i in range(12)]
    prompt = f"pangolin{tag}prompt: "
    too_long = f"narwhal{tag}long " * 400
    invalid = f"axolotl{tag}invalid"
    garbage = f"okapi{tag}garbage"
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        requests_topic=PRIVACY_REQUESTS,
        bulk_topic=PRIVACY_BULK,
        group_id=f"privacy-{tag}",
        log_level="debug",
    )
    try:
        worker.wait_ready()
        async with (
            EmbedClient(kafka.bootstrap_servers, requests_topic=PRIVACY_REQUESTS) as client,
            EmbedClient(kafka.bootstrap_servers, requests_topic=PRIVACY_BULK) as bulk,
        ):
            interactive = await client.embed(texts[:4], timeout=60)
            with_prompt = await client.embed(texts[4:6], prompt=prompt, timeout=60)
            bulk_vectors = await bulk.embed(texts[6:], timeout=60)
            with pytest.raises(EmbedError) as rejected:
                await client.embed([too_long], truncate=False, timeout=60)
            async with producer(kafka.bootstrap_servers) as raw:
                body = {"v": 1, "id": f"{tag}-invalid", "inputs": [invalid, 7]}
                await raw.send_and_wait(PRIVACY_REQUESTS, msgpack.packb(body))
                await raw.send_and_wait(PRIVACY_REQUESTS, b"\xc1" + garbage.encode())
            # One more round trip after the bad messages, so they were surely handled.
            await client.embed([texts[0]], timeout=60)
        await asyncio.to_thread(worker.wait_for, "request.dead_lettered", 30)
    finally:
        worker.stop()

    assert interactive.shape == (4, 384)
    assert with_prompt.shape == (2, 384)
    assert bulk_vectors.shape == (6, 384)
    assert rejected.value.code == "input_too_long"
    events = worker.events()
    answered = [e for e in events if e.get("event") == "request.answered"]
    assert all(e.get("level") == "debug" for e in answered)
    assert len(answered) >= 6, "every answered request has a debug event"
    assert {e.get("topic") for e in answered} == {PRIVACY_REQUESTS, PRIVACY_BULK}
    assert any(e.get("event") == "batch.encoded" for e in events)
    assert any(e.get("event") == "request.rejected" for e in events)
    assert any(e.get("event") == "request.dead_lettered" for e in events)
    log = worker.log_path.read_text(encoding="utf-8")
    for text in (*texts, prompt.strip(": "), too_long.split()[0], invalid, garbage):
        assert text not in log, "request text reached the log"
    assert tag in log  # the ids are there (the invalid request's id embeds the tag)
