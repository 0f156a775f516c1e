"""The gateway benchmark's pure parts: turn order, blocks, requests, the senders, the
targets and the report (the run itself needs a broker, a worker and a gateway)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from loadtest.gateway import (
    GatewayError,
    batched,
    concurrent,
    order,
    report_markdown,
    round_ratios,
    sequential,
    split_blocks,
    targets,
)


def test_each_path_goes_first_equally_often() -> None:
    paths = ("gateway", "sdk")
    turns = [order(paths, turn) for turn in range(4)]
    assert turns == [["gateway", "sdk"], ["sdk", "gateway"]] * 2
    firsts = [order(("a", "b", "c"), turn)[0] for turn in range(6)]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]


def test_blocks_cover_every_item_once_in_order_and_differ_by_at_most_one() -> None:
    items = [str(i) for i in range(23)]
    blocks = split_blocks(items, 5)
    assert [len(b) for b in blocks] == [5, 5, 5, 4, 4]
    assert [x for block in blocks for x in block] == items
    assert split_blocks(items[:3], 10) == [["0"], ["1"], ["2"]]  # never an empty block
    assert split_blocks(items, 0) == [items]


def test_requests_of_a_fixed_size_with_a_short_last_one() -> None:
    texts = [str(i) for i in range(70)]
    requests = batched(texts, 32)
    assert [len(r) for r in requests] == [32, 32, 6]
    assert [t for r in requests for t in r] == texts
    with pytest.raises(ValueError, match="positive"):
        batched(texts, 0)


async def test_concurrent_senders_answer_every_request_with_at_most_n_in_flight() -> None:
    in_flight, most, seen = 0, 0, []

    async def call(texts: list[str]) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        seen.append(texts)
        return len(texts)

    requests = batched([str(i) for i in range(100)], 3)
    seconds = await concurrent(call, requests, 4)
    assert seconds > 0
    assert most == 4
    assert sorted(seen) == sorted(requests)


async def test_a_short_answer_fails_the_run() -> None:
    async def short(texts: list[str]) -> int:
        return len(texts) - 1

    with pytest.raises(GatewayError, match="2 texts, 1 vectors"):
        await concurrent(short, [["a", "b"]], 2)
    with pytest.raises(GatewayError, match="1 text, 0 vectors"):
        await sequential(short, ["a"])


async def test_sequential_times_each_request() -> None:
    async def call(texts: list[str]) -> int:
        await asyncio.sleep(0.002)
        return len(texts)

    latencies = await sequential(call, ["a", "b", "c"])
    assert len(latencies) == 3
    assert all(ms >= 2.0 for ms in latencies)


def _figures(gateway_p50: float, sdk_p50: float, ratio: float) -> dict[str, Any]:
    def single(p50: float) -> dict[str, Any]:
        cpu = {"worker": 5.0, "broker": 1.0, "gateway": 0.5, "loadgen": 0.25}
        return {
            "n": 40,
            "p50": p50,
            "p95": p50 + 1,
            "p99": p50 + 2,
            "mean": p50 + 0.5,
            "cpu_ms_per_request": cpu,
        }

    def rate(texts_per_s: float) -> dict[str, Any]:
        cpu = {"worker": 900.0, "broker": 100.0, "gateway": 50.0, "loadgen": 40.0}
        return {
            "texts_per_s": texts_per_s,
            "rounds": [texts_per_s],
            "rows_per_batch": 24.5,
            "cpu_ms_per_1000": cpu,
        }

    return {
        "argv": ["--requests", "40"],
        "model": "m",
        "worker": {"dtype": "bfloat16", "compiled": False},
        "encoding_format": "float",
        "blocks": 4,
        "clients": 64,
        "batch": 32,
        "single": {"gateway": single(gateway_p50), "sdk": single(sdk_p50)},
        "throughput": {
            "texts": 1024,
            "gateway": rate(ratio * 500),
            "sdk": rate(500.0),
            "ratio": ratio,
            "round_ratios": [ratio],
        },
    }


@pytest.mark.parametrize(
    ("gateway_p50", "ratio", "met"),
    [(11.9, 0.95, [True, True]), (12.1, 0.95, [False, True]), (11.0, 0.94, [True, False])],
)
def test_targets_judge_the_p50_difference_and_the_throughput_ratio(
    gateway_p50: float, ratio: float, met: list[bool]
) -> None:
    rows = targets(_figures(gateway_p50, 10.0, ratio))
    assert [row["met"] for row in rows] == met
    assert rows[0]["measured"] == pytest.approx(gateway_p50 - 10.0)
    assert rows[1]["measured"] == ratio


def test_the_report_names_the_command_and_a_missed_target() -> None:
    text = report_markdown(_figures(14.0, 10.0, 0.95))
    assert "`python -m loadtest.gateway --requests 40`" in text
    assert "| single-text p50: gateway minus SDK (ms) | 4.00 | <= 2 | MISSED |" in text
    assert "| >= 0.95 | met |" in text
    assert "| gateway | 475 | 475 | 24.5 | 900 / 100 / 50 / 40 |" in text
    assert "| 14.00 | 15.00 | 16.00 | 14.50 | 5.00 / 1.00 / 0.50 / 0.25 |" in text
    assert "Gateway / SDK: **0.95x** (median of the rounds' ratios: 0.95)." in text


def test_each_rounds_ratio_compares_the_paths_run_back_to_back() -> None:
    # The machine got twice as fast between the rounds: per round the paths are equal.
    assert round_ratios([200.0, 400.0], [200.0, 400.0]) == [1.0, 1.0]
    assert round_ratios([90.0, 450.0], [100.0, 500.0]) == pytest.approx([0.9, 0.9])
    with pytest.raises(ValueError, match="same number"):
        round_ratios([1.0], [1.0, 2.0])
