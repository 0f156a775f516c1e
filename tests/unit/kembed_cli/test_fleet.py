"""Unit tests for `kembed status` without a broker: lag arithmetic, the two renderings,
the token backlog read from a real HTTP /metrics endpoint, and the exit status when no
broker answers."""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from kembed_cli.commands.status import render_table, to_json
from kembed_cli.main import main
from kembed_shared.fleet import (
    FleetStatus,
    Member,
    PartitionLag,
    StatusError,
    read_backlog_tokens,
)
from worker.metrics import CONTENT_TYPE, Metrics

MEMBER = "kembed-worker-0d1c"


def partition(
    partition: int, *, start: int = 0, end: int = 10, committed: int | None = None
) -> PartitionLag:
    return PartitionLag("embed.requests", partition, start, end, committed, MEMBER)


@pytest.mark.parametrize(
    ("lag", "expected"),
    [
        pytest.param(partition(0, end=10, committed=4), 6, id="committed"),
        pytest.param(partition(0, end=10, committed=10), 0, id="caught up"),
        pytest.param(partition(0, start=3, end=10), 7, id="never committed: from log start"),
        pytest.param(partition(0, start=8, end=10, committed=2), 2, id="committed below start"),
        pytest.param(partition(0, start=0, end=0), 0, id="empty partition"),
    ],
)
def test_lag_counts_from_where_a_worker_would_resume(lag: PartitionLag, expected: int) -> None:
    """Lag is end - committed; a partition without a committed offset (or one deleted by
    retention) is read from the log start, as the workers' auto.offset.reset=earliest does."""
    assert lag.lag == expected


def sample_status(**changes: object) -> FleetStatus:
    status = FleetStatus(
        group="kembed-workers",
        state="Stable",
        protocol="roundrobin",
        members=(
            Member(
                MEMBER,
                "kembed-worker",
                "10.0.0.7",
                (("embed.requests", 0), ("embed.requests", 1), ("embed.requests.bulk", 0)),
            ),
        ),
        partitions=(
            partition(0, end=120, committed=100),
            partition(1, end=50, committed=50),
            PartitionLag("embed.requests", 2, 0, 7, None, None),
            PartitionLag("embed.requests.bulk", 0, 0, 900, 400, MEMBER),
        ),
    )
    return dataclasses.replace(status, **changes)  # type: ignore[arg-type]


def test_json_has_members_partitions_totals_and_backlog() -> None:
    """--json: every partition with its owner and offsets, totals per topic, and the
    backlog in messages (tokens null when no /metrics was read)."""
    out = to_json(sample_status())
    json.dumps(out)  # plain JSON types only
    assert out["members"] == [
        {
            "member_id": MEMBER,
            "client_id": "kembed-worker",
            "host": "10.0.0.7",
            "partitions": [
                {"topic": "embed.requests", "partition": 0},
                {"topic": "embed.requests", "partition": 1},
                {"topic": "embed.requests.bulk", "partition": 0},
            ],
        }
    ]
    assert [p["lag"] for p in out["partitions"]] == [20, 0, 7, 500]
    assert out["partitions"][2]["member_id"] is None
    assert out["partitions"][2]["committed"] is None
    assert out["topics"] == {
        "embed.requests": {"partitions": 3, "assigned": 2, "end": 177, "lag": 27},
        "embed.requests.bulk": {"partitions": 1, "assigned": 1, "end": 900, "lag": 500},
    }
    assert out["backlog"] == {"messages": 527, "tokens": None, "tokens_from": []}


def test_table_lists_members_partitions_and_says_where_tokens_come_from() -> None:
    """The table names each member with its partitions, each partition's offsets and lag,
    the totals, and says that the token backlog was not read."""
    text = render_table(sample_status())
    lines = text.splitlines()
    assert lines[0] == "group kembed-workers: Stable, 1 member(s), assignment strategy roundrobin"
    member_line = next(line for line in lines if line.startswith(MEMBER))
    assert member_line.split()[-2:] == ["embed.requests[0,1]", "embed.requests.bulk[0]"]
    unassigned = next(
        line for line in lines if line.startswith("embed.requests ") and " 7 " in line
    )
    assert unassigned.split() == ["embed.requests", "2", "-", "-", "7", "7"]
    assert "backlog: 527 messages not yet finished by the group" in lines
    assert any(line.startswith("backlog tokens: not read") for line in lines)

    read = render_table(
        sample_status(backlog_tokens=1500.0, metrics_urls=("http://a/metrics", "http://b/metrics"))
    )
    assert "backlog tokens: 1500 (kembed_backlog_tokens summed over 2 worker(s))" in read


def test_table_of_an_empty_group_says_no_worker_runs() -> None:
    status = sample_status(state="Empty", members=(), missing_topics=("embed.requests.bulk",))
    text = render_table(status)
    assert "no members: no worker is running in this group" in text
    assert "topic embed.requests.bulk does not exist" in text


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, Metrics]]:
    """A real HTTP server serving a real worker Metrics registry's exposition."""
    metrics = Metrics()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = metrics.exposition()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", metrics
    finally:
        server.shutdown()
        server.server_close()


def test_backlog_tokens_are_summed_over_lanes_and_workers(
    metrics_server: tuple[str, Metrics],
) -> None:
    """kembed_backlog_tokens is read from each /metrics given and summed (both lanes)."""
    url, metrics = metrics_server
    metrics.backlog_tokens.labels(lane="interactive").set(1200)
    metrics.backlog_tokens.labels(lane="bulk").set(300)
    assert read_backlog_tokens([url], timeout=5) == 1500
    assert read_backlog_tokens([url, url], timeout=5) == 3000


def test_backlog_tokens_from_a_page_without_the_metric_is_an_error(
    metrics_server: tuple[str, Metrics],
) -> None:
    """A /metrics without kembed_backlog_tokens (not a kembed worker, or before any
    series is set) is reported, not read as zero."""
    url, _ = metrics_server
    with pytest.raises(StatusError, match="exposes no kembed_backlog_tokens"):
        read_backlog_tokens([url], timeout=5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_unreadable_metrics_url_is_an_error() -> None:
    with pytest.raises(StatusError, match="cannot read worker metrics"):
        read_backlog_tokens([f"http://127.0.0.1:{free_port()}/metrics"], timeout=5)


def test_status_without_a_broker_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No broker listening: exit status 2 and one clear line on stderr, no traceback."""
    address = f"127.0.0.1:{free_port()}"
    assert main(["status", "--bootstrap-servers", address, "--timeout", "5"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [
        f"kembed status: cannot reach Kafka at {address} (KafkaConnectionError)"
    ]


def test_status_topics_default_to_the_workers_env_vars(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--topics defaults to KEMBED_REQUESTS_TOPIC and KEMBED_BULK_TOPIC (an empty bulk
    topic, no bulk lane, is left out), --group to KEMBED_GROUP_ID."""
    monkeypatch.setenv("KEMBED_REQUESTS_TOPIC", "fast.lane")
    monkeypatch.setenv("KEMBED_BULK_TOPIC", "")
    monkeypatch.setenv("KEMBED_GROUP_ID", "fleet-a")
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: fast.lane)" in help_text
    from kembed_cli.main import build_parser

    args = build_parser("status").parse_args(["status"])
    assert (args.topics, args.group) == ("fast.lane", "fleet-a")
