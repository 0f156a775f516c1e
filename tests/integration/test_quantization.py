"""bitsandbytes quantization with the real model: the quality gate (`kembed validate`) and a
worker that refuses a configuration failing it. Quantized workers serving STS-B through
Kafka are in test_precisions.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from scripts.kafka_local import LocalKafka
from tests.conftest import ROOT, WorkerProcess, load_stsb
from tests.support.cli import run_kembed

pytestmark = pytest.mark.integration

PAIRS = 200  # the first STS-B test pairs: enough to tell int8 from nf4, quick on a CPU


def validate(*flags: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kembed_cli",
            "validate",
            "--limit",
            str(PAIRS),
            "--json",
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_validate_passes_int8_and_reports_its_memory() -> None:
    """LLM.int8 keeps the ranking and the vectors of fp32: the gate passes; its linear
    weights take a quarter of the bytes, so the model is smaller than the reference."""
    code, report = validate("--quantization", "int8", "--dtype", "float32")
    assert code == 0, report
    assert report["passed"] is True
    assert report["candidate"]["quantization"] == "int8"
    assert report["reference_spearman"] - report["candidate_spearman"] <= 0.5
    assert report["mean_cosine"] >= 0.99
    assert report["candidate"]["memory_bytes"] < 0.8 * report["reference"]["memory_bytes"]


def test_validate_fails_nf4_on_cosine_drift() -> None:
    """4-bit NormalFloat keeps this benchmark's ranking but moves the vectors away from fp32
    (mean cosine ~0.97): the gate tells it apart and exits 1."""
    code, report = validate("--quantization", "nf4", "--dtype", "float32")
    assert code == 1
    assert report["passed"] is False
    assert any(f.startswith("mean cosine") for f in report["failures"]), report["failures"]
    assert report["mean_cosine"] < 0.99


def test_worker_refuses_to_start_when_the_gate_fails(kafka: LocalKafka, tmp_path: Path) -> None:
    """KEMBED_QUALITY_GATE=true with nf4: the worker logs quality_gate.failed and exits 3
    without joining its group."""
    pairs = tmp_path / "pairs.csv"
    rows = load_stsb("en")[:PAIRS]
    pairs.write_text("".join(f'"{p.first}","{p.second}",{p.score}\n' for p in rows))
    worker = WorkerProcess(
        kafka.bootstrap_servers,
        tmp_path / "worker.log",
        dtype="float32",
        quantization="nf4",
        quality_gate="true",
        quality_gate_pairs=pairs,
        group_id=f"gate-{uuid.uuid4().hex[:6]}",
    )
    assert worker.process.wait(timeout=600) == 3
    events = [e.get("event") for e in worker.events()]
    assert "quality_gate.failed" in events
    assert "partitions.assigned" not in events


def test_validate_judges_each_model_of_kembed_models() -> None:
    """With KEMBED_MODELS, kembed validate judges every model as its worker would serve it,
    one report per model; one failing model fails the command."""
    models = [
        {"model": "sentence-transformers/all-MiniLM-L6-v2", "name": "bf16", "dtype": "bfloat16"},
        {
            "model": "sentence-transformers/all-MiniLM-L6-v2",
            "name": "nf4",
            "dtype": "float32",
            "quantization": "nf4",
        },
    ]
    done = run_kembed(
        *["validate", "--limit", "100", "--json"],
        timeout=600,
        env={**os.environ, "KEMBED_MODELS": json.dumps(models)},
    )
    assert done.returncode == 1, done.stderr[-3000:]
    reports = {r["model"]: r for r in map(json.loads, done.stdout.strip().splitlines())}
    assert sorted(reports) == ["bf16", "nf4"]
    assert reports["bf16"]["passed"] is True
    assert reports["bf16"]["candidate"]["dtype"] == "bfloat16"
    assert reports["nf4"]["passed"] is False
    assert reports["nf4"]["candidate"]["quantization"] == "nf4"


def test_validate_reads_the_pairs_shipped_with_the_package(tmp_path: Path) -> None:
    """kembed validate from a copy of the packages with no data folder beside it (no
    ../shared, no KEMBED_STSB_DIR, run from an empty folder) reads the STS-B pairs shipped in
    worker/data; KEMBED_STSB_DIR still replaces them."""
    site = tmp_path / "site"
    for package in ("schemas", "kembed_shared", "worker", "producer_sdk", "sink", "kembed_cli"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__py*"))
    assert not (site.parent / "shared").exists()
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("KEMBED_STSB_DIR", "PYTHONPATH")}

    def run(**extra: str) -> dict[str, Any]:
        done = run_kembed(
            *["validate", "--limit", "20", "--json"],
            cwd=run_in,
            timeout=600,
            env={**env, "PYTHONPATH": str(site), "KEMBED_DTYPE": "float32", **extra},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # The report alone on stdout (the tuner's log events go to stderr).
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kembed_cli, worker; print(kembed_cli.__file__, worker.__file__)",
        ],
        cwd=run_in,
        capture_output=True,
        text=True,
        check=True,
        env={**env, "PYTHONPATH": str(site)},
    ).stdout.split()
    assert [Path(path).parent.parent for path in where] == [site, site]  # the copy, not the clone

    report = run()
    assert Path(report["pairs_source"]) == site / "worker" / "data" / "stsb-en-test.csv"
    assert report["pairs"] == 20
    assert report["passed"] is True

    mine = tmp_path / "stsb"
    mine.mkdir()
    (mine / "stsb-en-test.csv").write_text("".join(f"a{i},b{i},{i % 5}\n" for i in range(7)))
    report = run(KEMBED_STSB_DIR=str(mine))
    assert Path(report["pairs_source"]) == mine / "stsb-en-test.csv"
    assert report["pairs"] == 7
