"""The hot routes' fast path. A body that orjson parses into an object whose fields all
have their plain JSON types is handed to the route's function as its model, built without
validation (``model_construct``), past FastAPI's body parsing, dependency solving and
routing: for a one-text request these cost more than the rest of the gateway's work. Any
other body (not JSON, a field pydantic would coerce or refuse, a missing one) goes the
FastAPI way, so every error is worded as before.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson
from fastapi import Request, Response
from pydantic import BaseModel

from gateway.service import Gateway

__all__ = ["FastRoute", "optional_of", "plain_texts"]

M = TypeVar("M", bound=BaseModel)

_JSON = re.compile(r"application/(?:[\w.+-]+\+)?json")


@dataclass(frozen=True, slots=True)
class FastRoute(Generic[M]):
    check: Callable[[dict[str, Any]], M | None]
    """The body as the route's model when every field is of its plain type (nothing for
    pydantic to coerce, or to word an error about), else None."""
    handle: Callable[[M, Request, Gateway], Awaitable[Response]]
    """The route's function, called as FastAPI calls it."""

    def parse(self, body: bytes, content_type: str | None) -> M | None:
        """The body as the route's model, or None: FastAPI's way then."""
        if content_type is None or not _JSON.fullmatch(content_type.split(";")[0].strip()):
            return None
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return self.check(data) if isinstance(data, dict) else None


def plain_texts(value: object) -> bool:
    """A text or a list of texts (what the routes' ``refuse_token_ids`` lets through)."""
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(item, str) for item in value)
    )


def optional_of(data: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """``data[key]`` when it is absent (``default``) or exactly of ``kind``; ``...`` (no
    fast path) otherwise. bool is not an int here, as it is not to the routes."""
    value = data.get(key, default)
    if value is default or type(value) is kind:
        return value
    return ...
