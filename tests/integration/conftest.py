"""Fixtures of the integration tests that share a secured broker: a SASL/SCRAM broker
with TLS and ACLs (``LocalKafka(scram_users=...)``), its users' passwords and a worker
logged in with exactly the rights it needs. Session-scoped: one broker serves the client
tests (``test_security.py``) and the service tests (``test_security_services.py``)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from worker.settings import DEFAULT_REPLY_TOPICS

WORKER_USER = "kembed-worker"
USERS = ("admin", WORKER_USER, "alice", "bob", "carol", "dave", "erin")
DAVE_GROUP = "dave-workers"
ALICE_REPLIES = "embed.results.alice"


@pytest.fixture(scope="session")
def passwords() -> dict[str, str]:
    """Fresh, recognisable passwords: a leak anywhere is found by a plain substring search."""
    return {user: f"pw-{user}-{secrets.token_urlsafe(12)}" for user in USERS}


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
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
