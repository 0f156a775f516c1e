"""Prints the worker configuration reference (Markdown) from ``WorkerSettings``.

The README embeds this table between markers, and a unit test keeps the two identical, so
the documentation cannot drift from the code:

    python -m scripts.settings_table --write   # refresh README.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from worker.settings import WorkerSettings

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"


def table() -> str:
    rows = [
        "| env var / flag | default | meaning |",
        "| --- | --- | --- |",
    ]
    for name, field in WorkerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = "(none)" if field.default is None else f"`{field.default}`"
        rows.append(f"| `KEMBED_{name.upper()}` `{flag}` | {default} | {field.description} |")
    return "\n".join(rows)


def embedded(text: str) -> str:
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip()


def main() -> None:
    if "--write" in sys.argv:
        text = README.read_text(encoding="utf-8")
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        README.write_text(text[:start] + "\n" + table() + "\n" + text[end:], encoding="utf-8")
    else:
        print(table())


if __name__ == "__main__":
    main()
