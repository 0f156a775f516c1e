"""The benchmarks' report files and the command line written into each report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from loadtest.files import command_line, save_report


def test_save_report_writes_both_files_in_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    path = save_report(out, {"ratio": 0.5, "rows": [1, 2]}, "# report\n")
    assert path == out / "report.md"
    assert path.read_text() == "# report\n"
    assert json.loads((out / "report.json").read_text()) == {"ratio": 0.5, "rows": [1, 2]}


def test_command_line_repeats_the_flags_but_the_report_folder() -> None:
    args = argparse.Namespace(requests=20, dtype="float32", cache_bytes=0, out=Path("x"))
    assert command_line("loadtest.rerank", args) == (
        "python -m loadtest.rerank --requests 20 --dtype float32 --cache-bytes 0"
    )
    assert command_line("loadtest.cache", args, drop_empty=True) == (
        "python -m loadtest.cache --requests 20 --dtype float32"
    )
