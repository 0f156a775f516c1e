"""The pure parts of dtype/torch_compile auto: which candidates, which one wins, the
bundled texts and the batches cut from them."""

from __future__ import annotations

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
