"""Unit tests for the reply-topic allow-list (``KEMBED_REPLY_TOPICS``) and header routing:
which topics a request may have its answer written to, and where the answer goes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import ValidationError

from kembed_shared.ports import Record
from kembed_shared.settings import describe_errors
from producer_sdk import EmbedError
from schemas import ErrorCode
from schemas.headers import CORRELATION_ID, routing_headers
from sink.settings import SinkSettings
from worker.decode import Accepted, DeadLetter, Limits, ModelLimits, Rejected, decode_record
from worker.settings import DEFAULT_INGEST_TOPICS, DEFAULT_REPLY_TOPICS, WorkerSettings


def settings(**fields: Any) -> WorkerSettings:
    """Settings from ``fields`` alone: the default reply_topics whatever the environment."""
    return WorkerSettings.model_validate({"reply_topics": DEFAULT_REPLY_TOPICS, **fields})


def test_the_default_allows_the_results_topic_and_its_dotted_children_only() -> None:
    allowed = settings().reply_topic_allowed
    assert WorkerSettings.model_fields["reply_topics"].default == DEFAULT_REPLY_TOPICS
    assert allowed("embed.results")
    assert allowed("embed.results.docs")
    assert allowed("embed.results.team-a.v2")
    for topic in (
        "embed.resultsX",
        "embed.results.",
        "embed.requests.dlq",
        "orders",
        "xembed.results",
    ):
        assert not allowed(topic), topic


def test_the_pattern_must_match_the_whole_name() -> None:
    allowed = settings(reply_topics=r"replies\.[a-z]+").reply_topic_allowed
    assert allowed("replies.alice")
    assert not allowed("replies.alice.evil")
    assert not allowed("my.replies.alice")


def test_the_results_topic_is_always_allowed() -> None:
    """A results topic outside the pattern is allowed (requests without reply_to are
    answered there anyway), and only it."""
    allowed = settings(results_topic="team.results").reply_topic_allowed
    assert allowed("team.results")
    assert not allowed("team.results.other")
    assert allowed("embed.results.docs")


def test_an_invalid_pattern_is_a_settings_error() -> None:
    with pytest.raises(ValidationError) as caught:
        settings(reply_topics="embed.results(")
    text = describe_errors(caught.value)
    assert "reply_topics" in text
    assert "not a valid regular expression" in text


MODEL = ModelLimits("minilm", 384)
LIMITS = Limits(
    max_request_bytes=4096,
    max_client_batch_size=4,
    models={"minilm": MODEL},
    reply_allowed=settings().reply_topic_allowed,
)


def decode(body: dict[str, Any] | bytes, headers: list[tuple[str, bytes]] | None = None) -> object:
    value = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
    record = Record("embed.requests", 0, 1, value, headers=tuple(headers or ()))
    return decode_record(record, LIMITS, now_ms=0)


def request(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "id": "r-1", "inputs": ["a text"], **fields}


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (request(reply_to="orders"), None),
        (request(reply_to="orders", inputs=[]), None),  # invalid too: still not answered
        (request(reply_to="orders", model="no-such-model"), None),
        (request(), routing_headers("r-1", "orders")),
        (b"\xc1", routing_headers("r-1", "orders")),  # unreadable body, routed by headers
        (request(inputs=[""]), routing_headers("r-1", "orders", 0)),
    ],
)
def test_a_forbidden_reply_topic_is_dead_lettered_not_answered(
    body: dict[str, Any] | bytes, headers: list[tuple[str, bytes]] | None
) -> None:
    """Whatever else is wrong with it, a request whose reply topic (body or headers) is
    not allowed is dead-lettered with reply_forbidden, naming the topic."""
    decoded = decode(body, headers)
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.code == ErrorCode.REPLY_FORBIDDEN
    assert "'orders'" in decoded.message


def test_headers_fill_the_routing_the_body_lacks() -> None:
    """A readable body without reply_to and reply_partition is answered where Spring's
    kafka_replyTopic and kafka_replyPartition headers say."""
    decoded = decode(request(), routing_headers("r-1", "embed.results.spring", 3))
    assert isinstance(decoded, Accepted)
    assert decoded.request.reply_to == "embed.results.spring"
    assert decoded.request.reply_partition == 3


def test_a_header_partition_fills_only_its_own_topic() -> None:
    """The header partition is used when the body names the header's topic or none, not
    when the body names another topic."""
    same = decode(request(reply_to="embed.results.a"), routing_headers("r-1", "embed.results.a", 2))
    other = decode(
        request(reply_to="embed.results.a"), routing_headers("r-1", "embed.results.b", 2)
    )
    assert isinstance(same, Accepted)
    assert isinstance(other, Accepted)
    assert (same.request.reply_to, same.request.reply_partition) == ("embed.results.a", 2)
    assert (other.request.reply_to, other.request.reply_partition) == ("embed.results.a", None)


def test_the_body_wins_where_both_give_a_field() -> None:
    decoded = decode(
        request(id="body-id", reply_to="embed.results.a", reply_partition=0),
        routing_headers("header-id", "embed.results.b", 5),
    )
    assert isinstance(decoded, Accepted)
    assert decoded.request.id == "body-id"
    assert (decoded.request.reply_to, decoded.request.reply_partition) == ("embed.results.a", 0)


def test_a_rejected_request_is_answered_where_the_headers_fill_in() -> None:
    """An error result follows the same routing as vectors would."""
    decoded = decode(request(model="no-such-model"), routing_headers("r-1", "embed.results.c", 1))
    assert isinstance(decoded, Rejected)
    assert (decoded.reply_to, decoded.reply_partition) == ("embed.results.c", 1)


def test_an_over_long_id_is_never_echoed() -> None:
    """An id over 256 bytes in the body is invalid, and the same id in the correlation
    header is not used either: the request is dead-lettered, not answered under it."""
    long_id = "x" * 257
    decoded = decode(request(id=long_id), [(CORRELATION_ID, long_id.encode())])
    assert isinstance(decoded, DeadLetter), decoded
    assert decoded.code == ErrorCode.INVALID_REQUEST
    fits = decode(b"\xc1", [(CORRELATION_ID, ("x" * 256).encode())])
    assert isinstance(fits, Rejected)


def test_an_invalid_header_topic_is_left_out() -> None:
    """A kafka_replyTopic that is no legal topic name is ignored, like an unreadable one."""
    decoded = decode(request(), [(CORRELATION_ID, b"r-1"), ("kafka_replyTopic", b"bad topic!")])
    assert isinstance(decoded, Accepted)
    assert decoded.request.reply_to is None


def test_the_sdk_knows_reply_forbidden_is_not_retriable() -> None:
    assert not ErrorCode.REPLY_FORBIDDEN.retriable
    assert not EmbedError("reply_forbidden", "x").retriable


# ---------------------------------------------------------------- ingestion results topics


def test_ingestion_results_topics_are_a_name_space_of_their_own() -> None:
    """The default reply_topics (interactive replies) does not cover embed.ingest.*, the
    sinks' input; ingest_topics does, and a results topic inside it is a settings error
    (interactive results would reach a sink)."""
    chosen = settings()
    assert WorkerSettings.model_fields["ingest_topics"].default == DEFAULT_INGEST_TOPICS
    assert re.fullmatch(DEFAULT_REPLY_TOPICS, "embed.ingest.docs") is None
    assert chosen.ingest_topic("embed.ingest.docs")
    assert not chosen.ingest_topic("embed.results.docs")
    assert not chosen.ingest_topic("embed.ingest")
    assert chosen.reply_topic_allowed("embed.ingest.docs")  # for the bulk lane
    assert not settings(ingest_topics="").ingest_topic("embed.ingest.docs")
    with pytest.raises(ValidationError, match="matches ingest_topics"):
        settings(results_topic="embed.ingest.replies")


BULK_LIMITS = Limits(
    max_request_bytes=4096,
    max_client_batch_size=4,
    models={"minilm": MODEL},
    reply_allowed=settings(reply_topics=".+").reply_topic_allowed,  # even the widest
    ingest_topic=settings().ingest_topic,
    bulk_topics=frozenset({"embed.requests.bulk"}),
)


def on_lane(
    topic: str, body: dict[str, Any], headers: list[tuple[str, bytes]] | None = None
) -> object:
    value = msgpack.packb(body, use_bin_type=True)
    record = Record(topic, 0, 1, value, headers=tuple(headers or ()))
    return decode_record(record, BULK_LIMITS, now_ms=0)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (request(reply_to="embed.ingest.docs", keys=["chosen-row"]), None),
        (request(), routing_headers("r-1", "embed.ingest.docs")),  # Spring's header alone
    ],
)
def test_an_interactive_request_cannot_reply_to_an_ingestion_topic(
    body: dict[str, Any], headers: list[tuple[str, bytes]] | None
) -> None:
    """Only the bulk lane answers on a sink's input: an interactive request naming one,
    in its body or its headers, is not computed, and its error result (which a sink
    dead-letters) says why and where to send it instead."""
    refused = on_lane("embed.requests", body, headers)
    assert isinstance(refused, Rejected), refused
    assert refused.error.code == ErrorCode.REPLY_FORBIDDEN
    assert refused.reply_to == "embed.ingest.docs"
    assert "bulk lane only" in refused.error.message
    assert "embed.requests.bulk" in refused.error.message
    accepted = on_lane("embed.requests.bulk", body, headers)
    assert isinstance(accepted, Accepted), accepted
    assert accepted.request.reply_to == "embed.ingest.docs"
    interactive = on_lane("embed.requests", request(reply_to="embed.results.docs"))
    assert isinstance(interactive, Accepted)  # interactive replies stay interactive's


def test_the_sink_topics_of_the_chart_compose_and_sink_are_outside_the_interactive_replies() -> (
    None
):
    """The default reply allow-list once covered the sink's input (embed.results.docs):
    now the sink reads an ingestion topic, which the default reply_topics does not match
    and ingest_topics does, in the Helm chart, in Compose and as the sink's default."""
    root = Path(__file__).resolve().parents[3]
    values = yaml.safe_load((root / "deploy/helm/kembed/values.yaml").read_text("utf-8"))
    compose = yaml.safe_load((root / "deploy/compose/compose.yaml").read_text("utf-8"))
    sink_env = compose["services"]["sink"]["environment"]
    topics = {
        values["sink"]["resultsTopic"],
        sink_env["KEMBED_SINK_RESULTS_TOPIC"],
        str(SinkSettings.model_fields["results_topic"].default),
    }
    assert topics == {"embed.ingest.docs"}
    for topic in topics:
        assert re.fullmatch(DEFAULT_REPLY_TOPICS, topic) is None
        assert settings().ingest_topic(topic)
    command = compose["services"]["topics"]["command"]
    assert command[command.index("--results") + 1] == "embed.ingest.docs"
