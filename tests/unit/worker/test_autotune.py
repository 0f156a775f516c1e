"""The pure parts of dtype/torch_compile auto: which candidates, which one wins, the
bundled texts and the batches cut from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from worker.encoder.autotune import (
    Candidate,
    Measurement,
    candidates,
    choose,
    initial_candidate,
    tuning_texts,
    tuning_workload,
    workload_texts,
)


def test_cpu_auto_measures_fp32_and_bf16_eager_before_compiled() -> None:
    assert candidates("auto", "auto", "cpu") == [
        Candidate("float32", False),
        Candidate("bfloat16", False),
        Candidate("float32", True),
        Candidate("bfloat16", True),
    ]


def test_cuda_auto_measures_fp16_bf16_fp32_and_drops_bf16_where_unsupported() -> None:
    dtypes = [c.dtype for c in candidates("auto", "off", "cuda")]
    assert dtypes == ["float16", "bfloat16", "float32"]
    assert [c.dtype for c in candidates("auto", "off", "cuda", bf16_supported=False)] == [
        "float16",
        "float32",
    ]


def test_explicit_settings_fix_their_axis() -> None:
    assert candidates("float32", "on", "cpu") == [Candidate("float32", True)]
    assert candidates("bfloat16", "auto", "cpu") == [
        Candidate("bfloat16", False),
        Candidate("bfloat16", True),
    ]
    assert candidates("auto", "off", "cpu") == [
        Candidate("float32", False),
        Candidate("bfloat16", False),
    ]


def test_the_safe_start_is_the_explicit_dtype_else_fp32_eager() -> None:
    assert initial_candidate("auto", "cpu") == Candidate("float32", False)
    assert initial_candidate("auto", "cuda") == Candidate("float32", False)
    assert initial_candidate("bfloat16", "cpu") == Candidate("bfloat16", False)


def test_choose_takes_the_fastest_that_kept_quality() -> None:
    table = [
        Measurement(Candidate("float32", False), "ok", texts_per_s=390.0, mean_cosine=1.0),
        Measurement(Candidate("bfloat16", False), "quality", texts_per_s=900.0, mean_cosine=0.9),
        Measurement(Candidate("float32", True), "ok", texts_per_s=480.0, mean_cosine=0.99999),
        Measurement(Candidate("bfloat16", True), "failed", error="CompilerError"),
        Measurement(Candidate("float16", True), "skipped"),
    ]
    assert choose(table) == Candidate("float32", True)
    assert choose(table[3:]) is None


def test_table_rows_are_plain_json_values() -> None:
    row = Measurement(Candidate("bfloat16", True), "ok", 812.345, 0.9987654, 14.26, None, True)
    assert row.as_dict() == {
        "candidate": "bfloat16/compiled",
        "dtype": "bfloat16",
        "compiled": True,
        "status": "ok",
        "texts_per_s": 812.3,
        "mean_cosine": 0.99877,
        "build_s": 14.3,
        "error": None,
        "chosen": True,
    }


def test_bundled_texts_ship_with_the_package_and_make_sentences_and_passages() -> None:
    sentences = tuning_texts()
    assert len(sentences) >= 100
    assert not any(s.startswith("#") for s in sentences)
    texts = workload_texts(50)
    assert len(texts) == 50
    assert len(texts[0].split()) > 5 * len(texts[1].split())  # every fifth: a passage


def test_workload_is_cut_length_sorted_within_the_token_budget_and_row_cap() -> None:
    ids = [[1] * n for n in (3, 40, 7, 7, 100, 12, 64, 5)]
    batches = tuning_workload(ids, 128, 4)
    assert sorted(len(seq) for batch in batches for seq in batch) == sorted(map(len, ids))
    for batch in batches:
        assert len(batch) <= 4
        assert len(batch) * max(map(len, batch)) <= 128 or len(batch) == 1


# -- the tuner's steps, on a stand-in encoder and a fake clock ------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _FakeEncoder:
    """Stands in for TorchEncoder: a variant's batch costs ``cost[name]`` fake seconds, a
    bf16 variant's vectors are its fp32 ones turned by ``drift``; compiling ``broken``
    raises."""

    def __init__(self, clock: _Clock, cost: dict[str, float], drift: float = 0.0) -> None:
        import torch

        from worker.encoder.base import ModelInfo
        from worker.encoder.torch_backend import Variant

        self.clock, self.cost, self.drift = clock, cost, drift
        self.broken: set[str] = set()
        self.info = ModelInfo("m", Path("."), 4, 128, "mean", "float32", "cpu")
        weights: Any = "fp32-weights"
        self.current = Variant(torch.float32, weights, weights, False)
        self.installed: list[str] = []
        self.pinned: list[bool] = []

    def prepare(self, batch: Any) -> Any:
        return len(batch)

    def module(self, dtype: Any) -> str:
        return f"{dtype}-weights"

    def variant(self, dtype: Any, *, compiled: bool) -> Any:
        from worker.encoder.torch_backend import Variant

        weights: Any = self.module(dtype)
        return Variant(dtype, weights, "graph" if compiled else "eager", compiled)

    def compile_variant(self, variant: Any, prepared: Any) -> None:
        if variant.name in self.broken:
            raise RuntimeError("no C++ compiler")

    def run_variant(self, variant: Any, rows: int) -> Any:
        self.clock.now += self.cost.get(variant.name, 1.0)
        vectors = np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32), (rows, 1))
        if "bfloat16" in variant.name:
            vectors[:, 1] = self.drift
        return vectors

    def install(self, variant: Any) -> None:
        self.current = variant
        self.installed.append(variant.name)

    def pin_threads(self, pinned: bool) -> None:
        self.pinned.append(pinned)

    def drop_modules_except(self, keep: Any) -> None:
        pass


def _tune(encoder: _FakeEncoder, options: list[Candidate], **kwargs: Any) -> Any:
    from worker.encoder.autotune import tune

    return tune(
        encoder,
        options,
        workload=[[[1, 2, 3]] * 4] * 3,
        reference_ids=[[1, 2]] * 5,
        min_mean_cosine=kwargs.pop("min_mean_cosine", 0.99),
        budget_s=kwargs.pop("budget_s", 300.0),
        on_encoder=lambda fn: fn(),
        **kwargs,
    )


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    import time

    fake = _Clock()
    monkeypatch.setattr(time, "perf_counter", fake)
    monkeypatch.setattr(time, "monotonic", fake)
    return fake


def test_tuner_installs_the_best_eager_first_then_the_fastest_of_all(clock: _Clock) -> None:
    cost = {"float32/eager": 3.0, "bfloat16/eager": 2.0, "float32/compiled": 1.0}
    cost["bfloat16/compiled"] = 1.5
    encoder = _FakeEncoder(clock, cost)
    switched: list[str] = []
    result = _tune(
        encoder, candidates("auto", "auto", "cpu"), on_switch=lambda c: switched.append(c.name)
    )
    assert encoder.installed == ["bfloat16/eager", "float32/compiled"]
    assert switched == encoder.installed
    assert result.chosen == Candidate("float32", True)
    assert result.phase == "compiled"
    speeds = {row.candidate.name: row.texts_per_s for row in result.table}
    assert speeds == {name: 12 / (3 * c) for name, c in cost.items()}
    assert [row.chosen for row in result.table] == [False, False, True, False]
    assert encoder.pinned == [True, False]  # pinned while tuning, released after


def test_tuner_leaves_out_what_drifts_fails_to_compile_or_the_gate_rejects(clock: _Clock) -> None:
    cost = {"float32/eager": 3.0, "bfloat16/eager": 1.0, "float32/compiled": 2.0}
    cost["bfloat16/compiled"] = 0.5
    encoder = _FakeEncoder(clock, cost, drift=0.5)  # bf16 vectors: cosine 0.89 to fp32
    encoder.broken.add("float32/compiled")
    result = _tune(encoder, candidates("auto", "auto", "cpu"))
    status = {row.candidate.name: row.status for row in result.table}
    assert status == {
        "float32/eager": "ok",
        "bfloat16/eager": "quality",
        "float32/compiled": "failed",
        "bfloat16/compiled": "quality",
    }
    assert encoder.installed == []  # the safe variant stays
    assert result.chosen == Candidate("float32", False)
    assert result.phase == "eager"

    encoder = _FakeEncoder(clock, cost)
    gated: list[int] = []

    def gate(candidate: Any, reference: Any) -> str | None:
        gated.append(len(candidate([[1, 2], [3]])))
        return "Spearman dropped 0.9 > 0.5"

    result = _tune(encoder, candidates("auto", "off", "cpu"), gate=gate)
    assert gated == [2]
    assert encoder.installed == []
    assert [row.status for row in result.table] == ["ok", "quality"]


def test_tuner_skips_what_the_budget_does_not_reach_and_builds_a_lone_explicit_one(
    clock: _Clock,
) -> None:
    encoder = _FakeEncoder(clock, {"float32/eager": 10.0})
    result = _tune(encoder, candidates("auto", "auto", "cpu"), budget_s=5.0)
    assert [row.status for row in result.table][2:] == ["skipped", "skipped"]

    encoder = _FakeEncoder(clock, {})
    result = _tune(encoder, candidates("float32", "on", "cpu"), budget_s=0.0)
    assert encoder.installed == ["float32/compiled"]
    assert result.table[0].texts_per_s is None  # nothing to compare it with: not timed


def test_info_shows_each_models_tuning_and_live_variant_as_json() -> None:
    """/info is built per request: the variant served now and the tuning table, and none
    of the objects it is built from."""
    import json

    from worker.app import _live_info
    from worker.encoder.autotune import TuningResult
    from worker.encoder.base import ModelInfo

    class Served:
        info = ModelInfo("m", Path("."), 4, 128, "mean", "bfloat16", "cpu", compiled=True)

    tuning = TuningResult("compiled", [Measurement(Candidate("bfloat16", True), "ok", 800.0)])
    info = {
        "version": "1",
        "models": [{"name": "m", "dtype": "float32", "compiled": False}],
        "model": None,
        "_tunings": {"m": tuning},
        "_served": {"m": Served()},
    }
    live = json.loads(json.dumps(_live_info(info)))
    assert set(live) == {"version", "models", "model"}
    assert live["model"]["dtype"] == "bfloat16"
    assert live["model"]["compiled"] is True
    assert live["model"]["tuning"]["phase"] == "compiled"
    assert live["model"]["tuning"]["table"][0]["texts_per_s"] == 800.0
