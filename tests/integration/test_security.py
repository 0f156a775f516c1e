"""Kafka security end to end, the clients: a SASL/SCRAM broker with ACLs and a worker
that logs in as its own user; clients get vectors with their rights and clear errors for
missing rights, wrong passwords and failed TLS checks; logs hold neither secrets nor
request text.

The secured broker and its users are ``tests/integration/conftest.py``'s; the log-privacy
test at the end uses the session's plain broker.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from pathlib import Path

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
from tests.integration.conftest import (
    ALICE_REPLIES,
    assert_no_secret,
    sasl,
)
from tests.integration.kafka_io import producer

pytestmark = pytest.mark.integration


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
