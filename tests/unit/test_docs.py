"""Documentation that is derived from code stays in step with it."""

from __future__ import annotations

from scripts.settings_table import README, embedded, table


def test_readme_configuration_table_matches_the_settings() -> None:
    """README's configuration reference lists exactly the worker's settings and help texts
    (refresh with `python -m scripts.settings_table --write`)."""
    assert embedded(README.read_text(encoding="utf-8")) == table()
