"""Documentation that is derived from code stays in step with it."""

from __future__ import annotations

from scripts.settings_table import (
    README,
    SINK_BEGIN,
    SINK_END,
    SINKS_DOC,
    embedded,
    sink_table,
    table,
)


def test_readme_configuration_table_matches_the_settings() -> None:
    """README's configuration reference lists exactly the worker's settings and help texts
    (refresh with `python -m scripts.settings_table --write`)."""
    assert embedded(README.read_text(encoding="utf-8")) == table()


def test_sinks_doc_configuration_table_matches_the_sink_settings() -> None:
    """docs/sinks.md lists exactly the sink's settings and help texts (same command)."""
    assert embedded(SINKS_DOC.read_text(encoding="utf-8"), SINK_BEGIN, SINK_END) == sink_table()
