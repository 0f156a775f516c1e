"""The pure parts of ingestion: the JSONL reader, batching, bounded in-flight requests,
splitting of oversized batches, submit's argument checks, the progress bar and the
command's exit status for bad input (no Kafka needed for any of these)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kembed_cli.commands.ingest import IngestCommand, run_ingest_command
from kembed_cli.main import main
from kembed_cli.progress import ProgressBar, render
from producer_sdk import (
    ClientClosedError,
    Document,
    EmbedClient,
    IngestError,
    IngestSummary,
    JsonlError,
    JsonlReader,
    RequestTooLargeError,
    ingest,
)
from producer_sdk.wire import content_key
from schemas import EmbedRequest, Encoding
from tests.conftest import embed_request
from tests.support.sdk import FakeClient, offline

# ---------------------------------------------------------------------------- JSONL reader


def _reader(text: str | bytes, **options: Any) -> JsonlReader:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return JsonlReader(io.BytesIO(data), **options)


def test_reader_yields_documents_with_the_chosen_fields() -> None:
    lines = [
        {"id": "a", "body": "first text", "title": "T1", "lang": "en", "extra": 1},
        {"id": 7, "body": "second text", "title": "T2"},
    ]
    reader = _reader(
        "\n".join(json.dumps(line) for line in lines) + "\n\n",
        text_field="body",
        meta_fields=["title", "lang"],
    )
    assert list(reader) == [
        Document("first text", "a", {"title": "T1", "lang": "en"}),
        Document("second text", 7, {"title": "T2"}),  # a missing meta field is left out
    ]
    assert reader.skipped == 0


def test_reader_without_meta_fields_gives_no_metadata() -> None:
    assert list(_reader('{"id": 1, "text": "t"}\n')) == [Document("t", 1, None)]


def test_reader_is_lazy() -> None:
    """Lines are parsed as they are asked for: the first document comes out before a bad
    line further down is reached."""
    documents = iter(_reader('{"id": 1, "text": "ok"}\nnot json\n'))
    assert next(documents) == Document("ok", 1, None)
    with pytest.raises(JsonlError):
        next(documents)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"id": 1, "text": "x"', "not valid JSON"),
        ('["id", "text"]', "expected a JSON object, got an array"),
        ('{"id": 1}', "no field 'text'"),
        ('{"text": "x"}', "no field 'id'"),
        ('{"id": 1, "text": 5}', "field 'text' must be a string, got a number"),
        ('{"id": 1, "text": null}', "field 'text' must be a string, got null"),
        ('{"id": 1, "text": ""}', "field 'text' is empty"),
        ('{"id": true, "text": "x"}', "field 'id' must be a string or an integer, got a boolean"),
        ('{"id": 1.5, "text": "x"}', "field 'id' must be a string or an integer, got a number"),
        ('{"id": 99999999999999999999999, "text": "x"}', "field 'id' does not fit in 64 bits"),
    ],
)
def test_reader_names_the_line_and_the_reason(line: str, reason: str) -> None:
    good = '{"id": 0, "text": "fine"}'
    reader = _reader(f"{good}\n\n{line}\n{good}\n")
    reader.name = "docs.jsonl"
    with pytest.raises(JsonlError) as caught:
        list(reader)
    assert caught.value.line == 3
    assert reason in caught.value.reason
    assert str(caught.value).startswith("docs.jsonl:3: ")
    assert isinstance(caught.value, ValueError)


def test_reader_reports_invalid_utf8_with_its_line() -> None:
    with pytest.raises(JsonlError) as caught:
        list(_reader(b'{"id": 1, "text": "a"}\n{"id": 2, "text": "\xff"}\n'))
    assert caught.value.line == 2
    assert "UTF-8" in caught.value.reason


def test_reader_skips_bad_lines_and_counts_them_when_asked() -> None:
    lines = ['{"id": 1, "text": "a"}', "{", '{"id": 2}', '{"id": 3, "text": "c"}', "[]"]
    reader = _reader("\n".join(lines), skip_invalid=True)
    assert [doc.id for doc in reader] == [1, 3]
    assert reader.skipped == 3
    assert [error.line for error in reader.errors] == [2, 3, 5]


def test_reader_keeps_only_the_first_errors() -> None:
    reader = _reader("x\n" * 50, skip_invalid=True)
    assert list(reader) == []
    assert reader.skipped == 50
    assert len(reader.errors) == JsonlReader.MAX_KEPT_ERRORS


def test_reader_from_a_path_tracks_its_position(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text('\ufeff{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n', encoding="utf-8")
    reader = JsonlReader(path)
    assert reader.total_bytes == path.stat().st_size
    assert [doc.text for doc in reader] == ["a", "b"]  # the byte order mark is dropped
    assert reader.position == reader.total_bytes
    with path.open("rb") as file:
        assert JsonlReader(file).total_bytes == path.stat().st_size
    assert JsonlReader(io.BytesIO(b"")).total_bytes is None


# ------------------------------------------------------------------------------- ingest()


def _documents(count: int, consumed: list[int] | None = None) -> Iterator[Document]:
    for i in range(count):
        if consumed is not None:
            consumed.append(i)
        yield Document(f"text {i}", i, {"n": i} if i % 2 else None)


async def test_ingest_batches_documents_in_order_with_keys_and_metadata() -> None:
    client = FakeClient(delay=0)
    progress: list[IngestSummary] = []
    summary = await ingest(
        client, _documents(10), batch_size=4, reply_to="out", on_progress=progress.append
    )
    assert [len(texts) for texts, _ in client.calls] == [4, 4, 2]
    assert [key for _, call in client.calls for key in call["keys"]] == list(range(10))
    assert client.calls[0][1]["metadata"] == [None, {"n": 1}, None, {"n": 3}]
    assert {call["reply_to"] for _, call in client.calls} == {"out"}
    assert (summary.documents, summary.requests) == (10, 3)
    assert summary.bytes == sum(len(f"text {i}") for i in range(10))
    assert [p.documents for p in progress] == [4, 8, 10]


async def test_ingest_sends_no_metadata_when_no_document_has_any() -> None:
    client = FakeClient(delay=0)
    await ingest(client, [Document("a", 1), Document("b", 2)])
    assert client.calls[0][1]["metadata"] is None


async def test_ingest_asks_for_content_affinity_only_when_told() -> None:
    client = FakeClient(delay=0)
    await ingest(client, _documents(3), batch_size=2)
    await ingest(client, _documents(3), batch_size=2, affinity=True)
    assert [call["affinity"] for _, call in client.calls] == [False, False, True, True]


def test_the_affinity_key_follows_the_content_not_the_request() -> None:
    """The same texts under the same model and prompt give the same message key, whatever
    the request id, keys or output options; any text, its order, the model, the prompt or
    the truncation side give another."""
    base = EmbedRequest(id="a", inputs=("one", "two"), model="m")
    same = [
        dataclasses.replace(base, id="b", keys=(1, 2), dimensions=8, normalize=False),
        dataclasses.replace(base, encoding=Encoding.INT8, meta={"x": 1}),
    ]
    other = [
        dataclasses.replace(base, inputs=("two", "one")),
        dataclasses.replace(base, inputs=("one", "two", "")),
        dataclasses.replace(base, inputs=("onetwo",)),
        dataclasses.replace(base, model="n"),
        dataclasses.replace(base, model=None),
        dataclasses.replace(base, prompt="query: "),
        dataclasses.replace(base, prompt_name="query"),
        dataclasses.replace(base, truncation_direction="left"),
    ]
    key = content_key(base)
    assert all(content_key(r) == key for r in same)
    assert len({key, *map(content_key, other)}) == len(other) + 1


async def test_ingest_accepts_an_async_iterable() -> None:
    async def documents() -> AsyncIterator[Document]:
        for doc in _documents(5):
            await asyncio.sleep(0)
            yield doc

    client = FakeClient(delay=0)
    summary = await ingest(client, documents(), batch_size=2)
    assert summary.documents == 5
    assert [len(texts) for texts, _ in client.calls] == [2, 2, 1]


async def test_ingest_bounds_requests_in_flight_and_reads_lazily() -> None:
    """Never more than max_in_flight submits at once, and the input is read only about
    max_in_flight + 1 batches ahead of what has been acknowledged."""
    client = FakeClient(delay=0.02)
    consumed: list[int] = []
    ahead: list[int] = []

    def on_progress(summary: IngestSummary) -> None:
        ahead.append(len(consumed) - summary.documents)

    summary = await ingest(
        client,
        _documents(200, consumed),
        batch_size=10,
        max_in_flight=3,
        on_progress=on_progress,
    )
    assert summary.documents == 200
    assert client.peak == 3
    assert max(ahead) <= (3 + 1) * 10


async def test_ingest_splits_a_batch_that_is_too_large() -> None:
    client = FakeClient(delay=0, max_bytes=25)  # about three of the "text N" texts
    summary = await ingest(client, _documents(8), batch_size=8)
    assert summary.documents == 8
    assert summary.requests == len(client.calls) > 1
    assert [key for _, call in client.calls for key in call["keys"]] == list(range(8))


async def test_ingest_fails_on_a_document_too_large_alone() -> None:
    client = FakeClient(delay=0, max_bytes=5)
    with pytest.raises(IngestError) as caught:
        await ingest(client, [Document("far too long a text", "big")])
    assert isinstance(caught.value.cause, RequestTooLargeError)
    assert "'big'" in str(caught.value.cause)


async def test_ingest_failure_reports_what_was_acknowledged() -> None:
    """A failed submit stops reading; requests already in flight finish first, so the
    summary counts exactly the acknowledged documents."""
    client = FakeClient(delay=0.01)
    client.fail_on = 2
    consumed: list[int] = []
    with pytest.raises(IngestError) as caught:
        await ingest(client, _documents(1000, consumed), batch_size=10, max_in_flight=2)
    error = caught.value
    assert isinstance(error.cause, ClientClosedError)
    assert error.__cause__ is error.cause
    assert error.summary.requests == len(client.calls) - 1
    assert error.summary.documents == 10 * error.summary.requests
    assert len(consumed) < 100


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (Document("", 1), "document 3 (id 1): text is empty"),
        (Document(5, 1), "text must be a string"),  # type: ignore[arg-type]
        (Document("t", True), "document 3: id must be a string or an integer"),
        (Document("t", 1, ["x"]), "metadata must be a map"),  # type: ignore[arg-type]
        ("just a string", "document 3 is not a Document"),
    ],
)
async def test_ingest_names_a_bad_document(document: Any, message: str) -> None:
    client = FakeClient(delay=0)
    with pytest.raises(IngestError) as caught:
        await ingest(client, [Document("a", 1), Document("b", 2), document], batch_size=2)
    assert message in str(caught.value.cause)
    assert caught.value.summary.documents == 2  # the first batch went out before


async def test_ingest_reader_errors_come_with_the_line() -> None:
    client = FakeClient(delay=0)
    reader = _reader('{"id": 1, "text": "a"}\n{"id": 2}\n')
    with pytest.raises(IngestError) as caught:
        await ingest(client, reader)
    assert isinstance(caught.value.cause, JsonlError)
    assert caught.value.cause.line == 2
    assert client.calls == []


@pytest.mark.parametrize("options", [{"batch_size": 0}, {"max_in_flight": 0}])
async def test_ingest_refuses_bad_sizes(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="positive"):
        await ingest(FakeClient(), [], **options)


# ------------------------------------------------------------------ submit's arguments


async def test_submit_builds_the_wire_request_with_keys_and_metadata() -> None:
    client, transport = offline(model="m", bulk_topic="bulk.in")
    request_id = await client.submit(
        ["a", "b"],
        keys=["k1", 2],
        metadata=[{"title": "A"}, None],
        meta={"batch": 7},
        reply_to="embed.results.docs",
        encoding="int8",
        request_id="req-1",
    )
    assert request_id == "req-1"
    [sent] = transport.sent
    value, headers, topic = sent.value, sent.headers, sent.topic
    assert topic == "bulk.in"
    request = embed_request(value)
    assert request.inputs == ("a", "b")
    assert request.keys == ("k1", 2)
    assert request.meta == {"batch": 7, "docs": [{"title": "A"}, {}]}
    assert request.reply_to == "embed.results.docs"
    assert request.reply_partition is None
    assert request.deadline_ms is None
    assert request.model == "m"
    assert dict(headers)["kafka_correlationId"] == b"req-1"
    await client.submit(["c"], bulk=False)
    assert transport.sent[1].topic == "embed.requests"
    assert embed_request(transport.sent[1].value).reply_to == "embed.results"
    assert [sent.key for sent in transport.sent] == [None, None], (
        "no message key unless affinity is asked for"
    )


async def test_submit_with_affinity_keys_the_message_by_its_content() -> None:
    client, transport = offline(model="m")
    await client.submit(["a", "b"], affinity=True)
    await client.submit(["a", "b"], affinity=True, keys=[1, 2], dimensions=8)
    await client.submit(["a", "c"], affinity=True)
    first = embed_request(transport.sent[0].value)
    assert transport.sent[0].key == content_key(first)
    assert transport.sent[1].key == transport.sent[0].key
    assert transport.sent[2].key != transport.sent[0].key


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        ({"texts": "abc"}, TypeError, "sequence of strings"),
        ({"texts": []}, ValueError, "must not be empty"),
        ({"texts": ["a", ""]}, ValueError, r"texts\[1\] is empty"),
        ({"texts": ["a"], "keys": [1, 2]}, ValueError, "keys has 2 entries for 1 texts"),
        ({"texts": ["a"], "keys": [1.5]}, TypeError, r"keys\[0\] must be a string or an integer"),
        ({"texts": ["a"], "keys": [2**64]}, ValueError, "64 bits"),
        ({"texts": ["a"], "metadata": [{}, {}]}, ValueError, "metadata has 2 entries"),
        ({"texts": ["a"], "metadata": [{1: "x"}]}, TypeError, "string keys"),
        ({"texts": ["a"], "metadata": {"a": 1}}, TypeError, "sequence of maps"),
        ({"texts": ["a"], "metadata": [{"x": {1, 2}}]}, TypeError, r"metadata\[0\] holds"),
        ({"texts": ["a"], "meta": {"docs": []}, "metadata": [None]}, ValueError, "reserved"),
        ({"texts": ["a"], "reply_to": "bad topic"}, ValueError, "not a valid Kafka topic"),
        ({"texts": ["a"], "encoding": "int4"}, ValueError, "encoding must be one of"),
        ({"texts": ["a"], "dimensions": 0}, ValueError, "dimensions must be a positive"),
        ({"texts": ["a"], "request_id": "x" * 257}, ValueError, "request_id must be"),
    ],
)
async def test_submit_refuses_bad_arguments_before_sending(
    call: dict[str, Any], error: type[Exception], message: str
) -> None:
    client, transport = offline()
    texts = call.pop("texts")
    with pytest.raises(error, match=message):
        await client.submit(texts, **call)
    assert transport.sent == []


async def test_submit_refuses_a_request_above_max_request_bytes() -> None:
    client, transport = offline(max_request_bytes=1000)
    await client.submit(["x" * 900])
    with pytest.raises(RequestTooLargeError) as caught:
        await client.submit(["x" * 600, "y" * 600])
    assert caught.value.limit == 1000
    assert caught.value.size > 1200
    assert isinstance(caught.value, ValueError)
    assert len(transport.sent) == 1
    assert len(msgpack.packb(msgpack.unpackb(transport.sent[0].value))) <= 1000


async def test_submit_needs_a_started_client() -> None:
    client = EmbedClient("127.0.0.1:1")
    with pytest.raises(ClientClosedError):
        await client.submit(["a"])


async def test_embed_on_a_producer_only_client_says_why() -> None:
    client, _ = offline(read_replies=False)
    with pytest.raises(Exception, match="read_replies=False"):
        await client.embed(["a"])


# ------------------------------------------------------------------ progress and command


def test_progress_bar_renders_counters_and_a_bar() -> None:
    summary = IngestSummary(documents=1500, requests=6, bytes=2_500_000, seconds=3.0)
    assert (
        render(summary, 50, 100) == "[##########..........]  50%  1,500 docs  500 docs/s  "
        "2.5 MB  0:00:03"
    )
    assert render(summary, None, None) == "1,500 docs  500 docs/s  2.5 MB  0:00:03"


def test_progress_bar_draws_nothing_off_a_terminal() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, min_interval=0)
    bar.update(IngestSummary(1, 1, 1, 1.0), 1, 2)
    bar.close()
    assert stream.getvalue() == ""


def test_progress_bar_draws_and_erases_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = ProgressBar(stream, min_interval=0)
    bar.update(IngestSummary(10, 1, 100, 1.0), 1, 2)
    assert "10 docs" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r")
    quiet = Terminal()
    ProgressBar(quiet, enabled=False).update(IngestSummary(10, 1, 100, 1.0))
    assert quiet.getvalue() == ""


def test_command_exits_2_for_a_missing_file(tmp_path: Path) -> None:
    err = io.StringIO()
    status = run_ingest_command(
        IngestCommand(str(tmp_path / "missing.jsonl")), "127.0.0.1:1", {}, stderr=err
    )
    assert status == 2
    assert "cannot read" in err.getvalue()
    assert "missing.jsonl" in err.getvalue()


def test_cli_refuses_a_bad_reply_topic_and_batch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n', encoding="utf-8")
    assert main(["ingest", str(path), "--reply-to", "no spaces allowed"]) == 2
    assert "not a valid Kafka topic name" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["ingest", str(path), "--batch-size", "0"])
    assert caught.value.code == 2


def test_command_exits_1_when_kafka_cannot_be_reached(tmp_path: Path) -> None:
    """Nothing listens on the port: status 1 and one line saying so, not a traceback."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n', encoding="utf-8")
    err, out = io.StringIO(), io.StringIO()
    status = run_ingest_command(
        IngestCommand(str(path)), f"127.0.0.1:{port}", {}, stdout=out, stderr=err
    )
    assert status == 1
    assert f"127.0.0.1:{port}" in err.getvalue()
    assert "Traceback" not in err.getvalue()
    assert out.getvalue() == ""
