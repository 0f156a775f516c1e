"""The ceiling benchmark's report: ``ceiling.json`` and ``ceiling.md`` in its folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_report"]


def write_report(report: dict[str, Any], out: Path) -> None:
    (out / "ceiling.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "ceiling.md").write_text(_markdown(report))


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The host pipeline's ceiling",
        "",
        f"Worker(s) with an encoder stand-in (fixed vectors, no computation), MiniLM's "
        f"tokenizer, bulk requests of {report['per_request']} STS-B sentences, "
        f"{report['texts']:,} texts per run (median of {report['repeat']} runs) after a "
        f"warm-up of {report['warmup_texts']:,}; "
        f"broker and load generator on the same {os.cpu_count()}-core machine. Worker "
        f"settings: {report['worker_settings'] or 'defaults'}.",
        "",
        "| workers | texts/s | worker CPU-ms / 1k texts | broker | load generator | "
        "machine busy | errors / dup / missing |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["runs"]:
        cpu = row["cpu_ms_per_1000_texts"]
        workers = " + ".join(f"{v:.0f}" for k, v in cpu.items() if k.startswith("worker"))
        lines.append(
            f"| {row['workers']} | {row['texts_per_s']:,.0f} | {workers} | "
            f"{cpu['broker']:.0f} | {cpu['load generator']:.0f} | "
            f"{100 * row['machine_busy_fraction']:.0f}% | "
            f"{row['errors']} / {row['duplicates']} / {row['missing']} |"
        )
    if report.get("scaling") is not None:
        lines += [
            "",
            f"Scaling, {report['runs'][-1]['workers']} workers / 1: {report['scaling']:.2f}x.",
        ]
    profile = report.get("profile")
    if profile and "self" in profile:
        lines += [
            "",
            f"## Where one worker's time goes (py-spy, {profile['samples']:,} samples of "
            "active threads)",
            "",
            "Threads: "
            + ", ".join(f"{name} {100 * share:.0f}%" for name, share in profile["threads"].items()),
            "",
            "CPU-ms per 1,000 texts by thread: "
            + ", ".join(
                f"{name} {value:.0f}"
                for name, value in profile.get("thread_cpu_ms_per_1000_texts", {}).items()
            ),
            "",
            "| task (event loop) or thread | share |",
            "| --- | --- |",
            *(f"| `{name}` | {100 * share:.1f}% |" for name, share in profile["tasks"]),
            "",
            "| function | self | inclusive |",
            "| --- | --- | --- |",
            *(
                f"| `{name}` | {100 * own:.1f}% | {100 * inclusive:.1f}% |"
                for name, own, inclusive in profile["self"][:20]
            ),
        ]
    elif profile:
        lines += ["", f"Profile failed: {profile.get('error')}"]
    lines.append("")
    return "\n".join(lines)
