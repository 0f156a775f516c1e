"""The benchmark's CPU accounting (/proc/<pid>/stat) and the figures its report judges."""

from __future__ import annotations

import os
import time

import pytest

from loadtest.batches import BatchShapes, from_metrics, replay
from loadtest.cputime import CpuSample, cpu_ms_per_1000, parse_stat_cpu_ticks, sample, usage
from loadtest.report import backlog_reference, worker_cpu_ratio

# A real line's shape (proc(5)): pid, (comm), state, then numbered fields; utime is field
# 14 (here 1234) and stime field 15 (here 567).
STAT = (
    "4242 (python) S 1 4242 4242 0 -1 4194560 9000 0 0 0 1234 567 0 0 20 0 9 0 100 "
    "2000000 3000 18446744073709551615 1 1 0 0 0 0 0 16781312 16386 0 0 0 17 1 0 0 0 0 0"
)


def test_utime_plus_stime_are_read_by_position() -> None:
    assert parse_stat_cpu_ticks(STAT) == 1234 + 567


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() -> None:
    tricky = STAT.replace("(python)", "(a b) (c) d)")
    assert parse_stat_cpu_ticks(tricky) == 1234 + 567


@pytest.mark.parametrize("line", ["", "4242 python S 1", "4242 (python) S 1 2 3"])
def test_lines_that_are_not_stat_lines_are_refused(line: str) -> None:
    with pytest.raises(ValueError, match="stat"):
        parse_stat_cpu_ticks(line)


def test_usage_is_the_difference_for_processes_sampled_both_times() -> None:
    before = CpuSample({"worker": 10.0, "broker": 2.0, "gone": 1.0})
    after = CpuSample({"worker": 14.5, "broker": 2.25})
    assert usage(before, after) == {"worker": 4.5, "broker": 0.25}


def test_cpu_ms_per_1000_texts() -> None:
    assert cpu_ms_per_1000(4.92, 1000) == pytest.approx(4920)
    assert cpu_ms_per_1000(9.84, 2000) == pytest.approx(4920)
    with pytest.raises(ValueError, match="positive"):
        cpu_ms_per_1000(1.0, 0)


def test_sampling_this_process_counts_the_cpu_it_burns() -> None:
    me = {"me": os.getpid()}
    before = sample(me)
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    spent = usage(before, sample(me))["me"]
    # Clock ticks are coarse (10 ms); the busy loop burned at least 200 ms of CPU.
    assert spent >= 0.17


def _backlog(rate: float, p99: float, bulk: float) -> dict[str, float]:
    return {"rate": rate, "p99": p99, "bulk_texts_per_s": bulk}


def test_the_backlog_target_is_the_median_of_the_runs_at_the_reference_rate() -> None:
    rows = [
        _backlog(5, 900, 100),
        _backlog(10, 300, 400),
        _backlog(10, 200, 500),
        _backlog(10, 240, 450),
        _backlog(20, 50, 10),
    ]
    assert backlog_reference(rows) == {"rate": 10, "runs": 3, "p99": 240, "bulk_texts_per_s": 450}


def test_without_the_reference_rate_the_nearest_rate_is_judged() -> None:
    ref = backlog_reference([_backlog(5, 100, 1), _backlog(12, 200, 2)])
    assert (ref["rate"], ref["runs"], ref["p99"]) == (12, 1, 200)


def test_worker_cpu_ratio_divides_worker_by_in_process_cpu_per_text() -> None:
    results = {
        "e2e": {"bulk": {"sentences": {"cpu": {"worker": {"cpu_ms_per_1000": 4920.0}}}}},
        "inprocess": {"cpu": {"cpu_ms_per_1000": 4222.0}},
    }
    assert worker_cpu_ratio(results) == pytest.approx(4920 / 4222)


METRICS = """\
# HELP kembed_batch_size Inputs per encoder batch; the count is the number of batches run.
# TYPE kembed_batch_size histogram
kembed_batch_size_bucket{lane="bulk",le="+Inf"} 4.0
kembed_batch_size_count{lane="bulk"} 4.0
kembed_batch_size_sum{lane="bulk"} 200.0
kembed_batch_size_count{lane="interactive"} 9.0
kembed_batch_size_sum{lane="interactive"} 9.0
# HELP kembed_batch_padded_tokens Padded tokens per batch.
# TYPE kembed_batch_padded_tokens histogram
kembed_batch_padded_tokens_count{lane="bulk"} 4.0
kembed_batch_padded_tokens_sum{lane="bulk"} 5000.0
kembed_batch_padded_tokens_sum{lane="interactive"} 90.0
# HELP kembed_inference_seconds Encoder time per batch.
# TYPE kembed_inference_seconds histogram
kembed_inference_seconds_count{lane="bulk"} 4.0
kembed_inference_seconds_sum{lane="bulk"} 1.5
"""


def test_batch_totals_of_one_lane_are_read_from_the_metrics() -> None:
    shapes = from_metrics(METRICS, "bulk")
    assert shapes == BatchShapes(batches=4, rows=200, padded_tokens=5000, encoder_s=1.5)
    earlier = BatchShapes(batches=1, rows=50, padded_tokens=1000, encoder_s=0.5)
    summary = shapes.minus(earlier).summary(real_tokens=3000)
    assert summary == {
        "batches": 3,
        "rows_per_batch": 50,
        "padded_tokens_per_batch": 4000 / 3,
        "token_efficiency": 0.75,
        "encoder_s": 1.0,
    }


def test_replaying_the_batcher_counts_rows_and_padding() -> None:
    # Budget 40 tokens: the four 10-token inputs fill one batch, the 12- and 8-token inputs
    # go together (padded to 12), the lone 30-token input alone.
    shapes = replay([10, 10, 10, 10, 12, 8, 30], max_batch_tokens=40, max_batch_size=8)
    assert (shapes.batches, shapes.rows) == (3, 7)
    assert shapes.padded_tokens == 40 + 24 + 30
    assert shapes.summary(90)["token_efficiency"] == pytest.approx(90 / 94)
