"""`python -m loadtest.ceiling` at tiny sizes: its own broker, one then two stand-in
workers, every request answered once, and a complete report. Figures are never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.ceiling import find_pyspy
from tests.support.cli import run_module

pytestmark = pytest.mark.integration


def test_ceiling_small_run_writes_a_complete_report(tmp_path: Path) -> None:
    out = tmp_path / "ceiling"
    done = run_module(
        *("loadtest.ceiling", "--texts", "640", "--warmup", "64", "--repeat", "2"),
        *("--workers", "2", "--profile", "--out", str(out)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "ceiling.json").read_text())
    assert [run["workers"] for run in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert run["texts"] == 640
        assert run["requests"] == 20
        assert run["bad_runs"] == 0
        assert len(run["texts_per_s_of_runs"]) == 2
        assert run["texts_per_s"] > 0
        names = {f"worker {n + 1}" for n in range(run["workers"])}
        assert set(run["cpu_ms_per_1000_texts"]) == names | {"broker", "load generator"}
        assert run["cpu_ms_per_1000_texts"]["worker 1"] > 0
    assert report["scaling"] > 0
    if find_pyspy() is not None:
        assert report["profiled_run"]["bad_runs"] == 0
        assert report["profile"]["samples"] > 0, report["profile"]
        assert report["profile"]["tasks"]
    else:  # py-spy is optional: the run says why there is no profile
        assert "py-spy" in report["profile"]["error"]
    markdown = (out / "ceiling.md").read_text()
    assert "| 2 |" in markdown
