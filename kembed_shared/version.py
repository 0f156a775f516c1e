"""The installed kembed's version, for ``--version``, logs and the OpenAPI page."""

from __future__ import annotations

from importlib import metadata

__all__ = ["kembed_version"]


def kembed_version(missing: str = "0+unknown") -> str:
    """The version of the installed ``kembed`` distribution; ``missing`` when run from a
    source tree that was never installed."""
    try:
        return metadata.version("kembed")
    except metadata.PackageNotFoundError:
        return missing
