"""The ingestion benchmarks at tiny sizes: each runs against its own PostgreSQL (and broker,
worker and sinks) and writes a complete report. Figures are never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_hnsw_study_small_run_reports_rates_and_recall(tmp_path: Path) -> None:
    """`python -m loadtest.hnsw`: the sink's write path and the raw COPY bound on real
    vectors (the model on STS-B texts), each with recall@10 through the index."""
    out = tmp_path / "hnsw"
    _run(
        "loadtest.hnsw",
        "--texts",
        "300",
        "--queries",
        "10",
        "--batch-rows",
        "100",
        "--only",
        "0",
        "1",
        "8",
        "--out",
        str(out),
    )
    report = json.loads((out / "report.json").read_text())
    runs = report["runs"]
    assert [r["path"] for r in runs] == ["kembed", "raw", "kembed"]
    assert all(r["rows"] == 300 and r["rows_per_s"] > 0 for r in runs)
    assert all(0.0 <= r["recall_at_10"] <= 1.0 for r in runs)
    # On 300 rows the index search finds most of the exact top 10.
    assert runs[0]["recall_at_10"] > 0.8
    assert "raw bound" in (out / "report.md").read_text()


def test_pipeline_small_run_loads_every_document_into_both_targets(tmp_path: Path) -> None:
    """`python -m loadtest.pipeline`: the plain script and kembed ingest -> worker -> sink
    load every text into pgvector and Milvus Lite, and the report compares them."""
    out = tmp_path / "pipeline"
    _run(
        "loadtest.pipeline",
        "--docs",
        "300",
        "--dtype",
        "float32",
        "--worker",
        "torch_compile=off",
        "--out",
        str(out),
    )
    report = json.loads((out / "report.json").read_text())
    assert report["docs"] == 300
    assert {"pgvector", "milvus"} <= report["plain"].keys()
    runs = {r["target"]: r for r in report["kembed"]}
    assert runs.keys() == {"pgvector", "milvus"}
    assert runs["pgvector"]["table_rows"] == 300
    assert all(r["docs_per_s"] > 0 and r["dtype"] == "float32" for r in runs.values())
    assert report["workers"]["float32"]["dtype"] == "float32"
    text = (out / "report.md").read_text()
    assert "torch_compile=off" in text
    assert "kembed / plain" in text
