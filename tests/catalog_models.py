"""Model descriptions for the catalog's tests: the description of the codec tests' card,
without aliases or prompts, any field overridden."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schemas.catalog import ModelDescription
from tests.unit.schemas.test_catalog_codec import CARD

_BASE = replace(ModelDescription(**CARD.description_fields()), aliases=(), prompts={})


def described(name: str, **fields: Any) -> ModelDescription:
    """A model named ``name`` as a worker describes it, with ``fields`` overridden."""
    return replace(_BASE, name=name, **fields)
