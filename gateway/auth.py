"""API keys: ``Authorization: Bearer <key>``, compared in constant time.

Every key is compared (no early exit on a match), each with :func:`hmac.compare_digest`, so
the time an answer takes says nothing about which key, or how much of one, matched. The
keys never appear in a log line, an error or a repr.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

__all__ = ["PUBLIC_PATHS", "ApiKeys"]

PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics"})
"""Endpoints answered without a key: probes and the Prometheus scrape."""


class ApiKeys:
    """The accepted keys; none means authentication is off."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(key.encode("utf-8") for key in keys)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self._keys)} keys)"

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def allows(self, path: str, authorization: str | None) -> bool:
        """Whether a request for ``path`` with this ``Authorization`` header may go on."""
        if not self._keys or path in PUBLIC_PATHS:
            return True
        if authorization is None:
            return False
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        presented = token.strip().encode("utf-8")
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(key, presented)
        return matched
