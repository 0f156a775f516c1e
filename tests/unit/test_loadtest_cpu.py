"""The benchmark's CPU accounting (/proc/<pid>/stat) and the figures its report judges."""

from __future__ import annotations

import os
import time

import pytest

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
