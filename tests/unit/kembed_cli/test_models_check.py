"""``kembed models check DIR``: a model folder held to sentence-transformers, in its own
process as an operator runs it, and the report's verdict (pure logic)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kembed_cli.commands.models import run_check
from tests.support.cli import run_kembed
from tests.support.tiny_models import bert_dense_st6, write_modules, xlmr_plain
from worker import model_check
from worker.model_check import THRESHOLD, CheckReport, TextCheck, check_model, check_texts


def test_a_folder_kembed_serves_as_sentence_transformers_does_passes(
    tmp_path: Path, model_dir: Path
) -> None:
    """Exit 0 and a JSON report: every shipped text, once with no prompt and once per
    prompt the folder names (``query``, and the empty ``document`` sentence-transformers
    saves), one of them over the window, each at cos >= 0.9999."""
    path = bert_dense_st6(tmp_path, model_dir)
    done = run_kembed("models", "check", str(path), "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["model"], report["dim"], report["max_seq_length"]) == (path.name, 24, 64)
    assert report["passed"] is True
    labels = [label for label, _ in check_texts()] + ["over the window"]
    assert [t["label"] for t in report["texts"]] == labels * 3
    assert [t["prompt"] for t in report["texts"][:: len(labels)]] == [None, "document", "query"]
    assert all(t["cosine"] >= THRESHOLD for t in report["texts"])
    over = [t for t in report["texts"] if t["label"] == "over the window"]
    assert all(t["tokens"] == 64 for t in over)


def test_the_table_names_each_text_and_the_verdict(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table (run in this process: the JSON test above runs the command's own)."""
    path = bert_dense_st6(tmp_path, model_dir)
    assert run_check(str(path), as_json=False) == 0
    first, *rows = capsys.readouterr().out.strip().splitlines()
    assert first.startswith(f"{path.name}: dim 24, window 64 tokens, pooling cls")
    assert rows[-1].startswith("passed: the lowest cosine is")
    assert sum(" ok" in row for row in rows) == 3 * (len(check_texts()) + 1)


def test_a_tokenizer_transformers_rebuilds_differently_fails_the_check(
    tmp_path: Path, family_sentences: list[str]
) -> None:
    """A drift the check exists to catch: an XLM-R folder whose tokenizer.json (NFKC,
    Metaspace) is not the pipeline transformers 5 builds for its tokenizer class (no
    normalizer, whitespace split): kembed tokenizes by the file, sentence-transformers by
    transformers, and the text with runs of whitespace (the code) falls under the line."""
    path = xlmr_plain(tmp_path, family_sentences, positions=66, as_rebuilt=False)
    report = check_model(path)
    assert not report.passed
    failing = {t.label for t in report.texts if not t.passed}
    assert "code" in failing
    rebuilt = check_model(xlmr_plain(tmp_path / "rebuilt", family_sentences, positions=66))
    assert rebuilt.passed, rebuilt.worst


def test_a_folder_kembed_refuses_exits_2_with_one_line(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "colbert"
    shutil.copytree(model_dir, path)
    write_modules(
        path,
        [("sentence_transformers.models.Transformer", ""), ("pylate.models.Dense.Dense", "1")],
    )
    done = run_kembed("models", "check", str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("kembed models check: colbert: the module 'pylate.models.Dense.Dense'")


def test_a_missing_folder_exits_2() -> None:
    done = run_kembed("models", "check", "/nonexistent/model")
    assert done.returncode == 2
    assert "does not exist" in done.stderr


def test_one_text_below_the_threshold_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """A reference that disagrees on one text (here: its vector reversed) fails the report
    on that text alone."""
    real = model_check._reference

    def skewed(path: Path, window: int, direction: str) -> object:
        reference = real(path, window, direction)

        def encode(texts: list[str], prompt_name: str | None) -> np.ndarray:
            vectors = reference(texts, prompt_name).copy()
            vectors[3] = vectors[3][::-1]
            return vectors

        return encode

    monkeypatch.setattr(model_check, "_reference", skewed)
    report = check_model(model_dir, "minilm")
    failed = [t for t in report.texts if not t.passed]
    assert [t.label for t in failed] == [check_texts()[3][0]]
    assert not report.passed
    assert report.worst == failed[0]


def test_a_report_passes_only_when_every_text_does() -> None:
    texts = (TextCheck("a", None, 3, 1.0), TextCheck("b", None, 5, THRESHOLD))
    assert CheckReport("m", 8, 16, "mean", texts).passed
    worse = (*texts, TextCheck("c", "query", 7, THRESHOLD - 1e-6))
    report = CheckReport("m", 8, 16, "mean", worse)
    assert not report.passed
    assert report.as_json()["passed"] is False
    assert report.worst.label == "c"
