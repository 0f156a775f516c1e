"""Prints the worker configuration reference (Markdown) from ``WorkerSettings``, and the
sink's from ``SinkSettings``.

The README embeds the worker's table and docs/sinks.md the sink's, between markers, and a
unit test keeps them identical to the code, so the documentation cannot drift from it:

    python -m scripts.settings_table --write   # refresh README.md and docs/sinks.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel

from sink.settings import SinkSettings
from worker.settings import WorkerSettings

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"
SINKS_DOC = Path(__file__).resolve().parents[1] / "docs" / "sinks.md"
SINK_BEGIN = "<!-- sink-settings-table:begin -->"
SINK_END = "<!-- sink-settings-table:end -->"


def table(model: type[BaseModel] = WorkerSettings, prefix: str = "KEMBED_") -> str:
    rows = [
        "| env var / flag | default | meaning |",
        "| --- | --- | --- |",
    ]
    for name, field in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.is_required():
            default = "(required)"
        else:
            default = "(none)" if field.default is None else f"`{field.default}`"
        rows.append(f"| `{prefix}{name.upper()}` `{flag}` | {default} | {field.description} |")
    return "\n".join(rows)


def sink_table() -> str:
    return table(SinkSettings, "KEMBED_SINK_")


def embedded(text: str, begin: str = BEGIN, end: str = END) -> str:
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[start:stop].strip()


def _write(path: Path, begin: str, end: str, content: str) -> None:
    text = path.read_text(encoding="utf-8")
    start, stop = text.index(begin) + len(begin), text.index(end)
    path.write_text(text[:start] + "\n" + content + "\n" + text[stop:], encoding="utf-8")


def main() -> None:
    if "--write" in sys.argv:
        _write(README, BEGIN, END, table())
        _write(SINKS_DOC, SINK_BEGIN, SINK_END, sink_table())
    else:
        print(table())
        print()
        print(sink_table())


if __name__ == "__main__":
    main()
