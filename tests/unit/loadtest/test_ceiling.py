"""Unit tests for the host-ceiling benchmark's own logic: the encoder stand-in, the CPU
clock and the profile summary (the benchmark itself runs in
tests/integration/test_ceiling.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from loadtest.ceiling import cpu_seconds, find_pyspy, summarize_profile
from loadtest.ceiling_worker import FixedEncoder
from worker.encoder import ModelInfo
from worker.settings import WorkerSettings
from worker.tuning import tuning_options


def _encoder(pad_id: int = 0) -> FixedEncoder:
    info = ModelInfo("m", Path("."), 8, 16, "mean", "stand-in", "none")
    return FixedEncoder(info, pad_id)


def test_the_stand_in_pads_like_the_torch_encoder() -> None:
    prepared = _encoder(pad_id=9).prepare([[1, 2, 3], [4]])
    assert prepared.ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert prepared.mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert prepared.padded_tokens == 6


def test_the_stand_in_returns_one_unit_vector_per_row_whatever_the_batch() -> None:
    encoder = _encoder()
    for rows in (1, 3, 300, 2):
        vectors = encoder.encode([[5] * (i % 7 + 1) for i in range(rows)])
        assert vectors.shape == (rows, 8)
        assert vectors.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
        assert (vectors == vectors[0]).all()


def test_the_stand_in_is_served_as_it_is_even_with_auto_settings() -> None:
    """dtype and torch_compile ``auto`` (the defaults) tune a torch encoder; the stand-in has
    no variants to build, so the worker must not try to tune it."""
    settings = WorkerSettings.model_validate({"dtype": "auto", "torch_compile": "auto"})
    assert tuning_options(settings, _encoder()) == []


def test_cpu_seconds_counts_this_process_work() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.2


LOOP = "main (w.py:1);BaseEventLoop._run_once (asyncio/base_events.py:9)"
TASK = f"{LOOP};Handle._run (asyncio/events.py:80)"
RAW = "\n".join(
    [
        f"thread (1): MainThread;{TASK};Pipeline._answer (worker/pipeline.py:697);"
        "encode_vectors (worker/publish.py:10) 6",
        f"thread (1): MainThread;{TASK};Pipeline._answer (worker/pipeline.py:698);"
        "send (kafka/publisher.py:3) 2",
        f"thread (1): MainThread;{LOOP};EpollSelector.select (selectors.py:468) 4",
        "thread (2): kembed-tokenizer_0;_worker (concurrent/futures/thread.py:83);"
        "TextTokenizer.encode (worker/tokenization.py:58) 8",
        "not a stack line",
    ]
)


def test_the_profile_summary_shares_samples_by_thread_task_and_function() -> None:
    summary = summarize_profile(RAW)
    assert summary["samples"] == 20
    assert summary["threads"] == {"MainThread": 0.6, "kembed-tokenizer": 0.4}
    assert dict(summary["tasks"]) == {
        "Pipeline._answer (worker/pipeline.py)": 0.4,
        "thread kembed-tokenizer": 0.4,
        "event loop (selector, scheduling)": 0.2,
    }
    own = {name: (share, inclusive) for name, share, inclusive in summary["self"]}
    assert own["encode_vectors (worker/publish.py)"] == (0.3, 0.3)
    assert own["TextTokenizer.encode (worker/tokenization.py)"] == (0.4, 0.4)
    inclusive = dict(summary["inclusive"])
    # Lines of one function are one entry: _answer at lines 697 and 698.
    assert inclusive["Pipeline._answer (worker/pipeline.py)"] == 0.4
    assert inclusive["main (w.py)"] == 0.6


def test_an_empty_profile_summarizes_to_nothing() -> None:
    assert summarize_profile("")["samples"] == 0


def test_py_spy_is_found_where_pyspy_says_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool = tmp_path / "py-spy"
    tool.write_text("")
    monkeypatch.setenv("PYSPY", str(tool))
    assert find_pyspy() == str(tool)
    monkeypatch.setenv("PYSPY", str(tmp_path / "absent"))
    assert find_pyspy() is None
