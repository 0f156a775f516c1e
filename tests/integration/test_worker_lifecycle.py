"""Worker lifecycle: requests wait in Kafka for a worker; SIGTERM leaves cleanly."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from schemas import EmbedRequest, EmbedResult, encode_request
from scripts.kafka_local import LocalKafka, TopicSpec
from tests.conftest import WorkerProcess
from tests.integration.kafka_io import producer, results_for

pytestmark = pytest.mark.integration


async def _publish(bootstrap: str, topic: str, requests: list[EmbedRequest]) -> None:
    async with producer(bootstrap) as client:
        for request in requests:
            await client.send_and_wait(topic, encode_request(request))


async def test_requests_sent_before_any_worker_are_answered_when_one_starts(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Requests published while no worker runs wait in Kafka and are all answered once a
    worker of a new consumer group starts; SIGTERM then stops it with exit code 0."""
    requests_topic, replies = "test.late.requests", "test.late.replies"
    kafka.create_topics([TopicSpec(requests_topic, 2), TopicSpec(replies, 1)])
    requests = [
        EmbedRequest(id=uuid.uuid4().hex, inputs=(f"waiting text {i}",), reply_to=replies)
        for i in range(5)
    ]
    await _publish(kafka.bootstrap_servers, requests_topic, requests)

    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "late-worker.log",
        requests_topic=requests_topic,
        group_id=f"late-{uuid.uuid4().hex[:6]}",
    )
    try:
        wanted = {r.id for r in requests}
        answers = await results_for(kafka.bootstrap_servers, replies, wanted, timeout=120)
        found = {result.id: result for result in answers}
    finally:
        exit_code = worker.stop()
    assert {r.id for r in requests} <= found.keys()
    assert all(isinstance(found[r.id], EmbedResult) for r in requests)
    assert exit_code == 0
    events = [e["event"] for e in worker.events()]
    assert "worker.drained" in events
    assert events[-1] == "worker.stopped"
    # The log never carries request text.
    assert "waiting text" not in worker.log_path.read_text()
