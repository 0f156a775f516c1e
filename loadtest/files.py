"""Where a benchmark's figures go: its report folder, ``report.json`` and ``report.md`` in
it, and the command line that measured them (written into the report)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

__all__ = ["REPORTS", "command_line", "report_folder", "save_report"]

REPORTS = Path(__file__).resolve().parent / "reports"
"""Where a benchmark's report folder goes unless ``--out`` names one."""


def report_folder(out: Path | None, name: str) -> Path:
    """``out``, or ``loadtest/reports/<name>-<date>-<time>`` when it is None; created."""
    folder = out or REPORTS / time.strftime(f"{name}-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_report(out: Path, figures: dict[str, Any], markdown: str) -> Path:
    """Write ``figures`` as ``report.json`` and ``markdown`` as ``report.md`` in ``out``
    (created if missing); the path of ``report.md``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(figures, indent=2) + "\n")
    path = out / "report.md"
    path.write_text(markdown)
    return path


def command_line(module: str, args: argparse.Namespace, *, drop_empty: bool = False) -> str:
    """``python -m module`` with ``args`` as flags (``--out`` left out; with
    ``drop_empty``, flags whose value is empty, zero or false too)."""
    flags = [
        f"--{name.replace('_', '-')} {value}"
        for name, value in vars(args).items()
        if name != "out" and (value or not drop_empty)
    ]
    return " ".join([f"python -m {module}", *flags])
