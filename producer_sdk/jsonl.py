"""Documents from JSONL (one JSON object per line), for :func:`producer_sdk.ingest`."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from producer_sdk.errors import KembedError
from producer_sdk.ingest import Document

__all__ = ["JsonlError", "JsonlReader"]

_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class JsonlError(KembedError, ValueError):
    """A line of a JSONL input is not a document; ``line`` is its 1-based number."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{source}:{line}: {reason}")
        self.source = source
        self.line = line
        self.reason = reason


class JsonlReader:
    """Documents from a JSONL file (one JSON object per line), read lazily.

    ``source`` is a path, ``"-"`` for standard input, or an open binary file (which the
    reader does not close). Each line's
    ``text_field`` is the text (a non-empty string) and ``id_field`` the id (a string or an
    integer); ``meta_fields`` picks the fields copied into the document's metadata (fields
    a line lacks are left out; None or empty: no metadata). Blank lines are skipped.

    A bad line (invalid JSON or UTF-8, not an object, a missing or mistyped field) raises
    :class:`JsonlError` naming its line, unless ``skip_invalid``: then it is skipped and
    counted in ``skipped``, and the first few reasons are kept in ``errors``.

    ``position`` is the number of bytes read so far and ``total_bytes`` the size of a
    regular file (None for a pipe), for progress reports.
    """

    MAX_KEPT_ERRORS = 10

    def __init__(
        self,
        source: str | Path | IO[bytes],
        *,
        text_field: str = "text",
        id_field: str = "id",
        meta_fields: Sequence[str] | None = None,
        skip_invalid: bool = False,
    ) -> None:
        self.source = source
        self.text_field = text_field
        self.id_field = id_field
        self.meta_fields = tuple(meta_fields or ())
        self.skip_invalid = skip_invalid
        self.skipped = 0
        self.errors: list[JsonlError] = []
        self.position = 0
        self.total_bytes: int | None = None
        if isinstance(source, str | Path) and str(source) != "-":
            self.name = str(source)
            path = Path(source)
            if path.is_file():
                self.total_bytes = path.stat().st_size
        elif isinstance(source, str | Path):
            self.name = "<stdin>"
            stdin = getattr(sys.stdin, "buffer", None)
            self.total_bytes = None if stdin is None else _regular_file_size(stdin)
        else:
            name = getattr(source, "name", None)
            self.name = name if isinstance(name, str) else "<input>"
            self.total_bytes = _regular_file_size(source)

    def __iter__(self) -> Iterator[Document]:
        if isinstance(self.source, str | Path):
            if str(self.source) == "-":
                yield from self._read(sys.stdin.buffer)
            else:
                with Path(self.source).open("rb") as file:
                    yield from self._read(file)
        else:
            yield from self._read(self.source)

    def _read(self, file: IO[bytes]) -> Iterator[Document]:
        for number, raw in enumerate(file, start=1):
            self.position += len(raw)
            try:
                doc = self.parse(raw, number)
            except JsonlError as exc:
                if not self.skip_invalid:
                    raise
                self.skipped += 1
                if len(self.errors) < self.MAX_KEPT_ERRORS:
                    self.errors.append(exc)
                continue
            if doc is not None:
                yield doc

    def parse(self, raw: bytes, number: int) -> Document | None:
        """The document on line ``number`` (None for a blank line), or JsonlError."""
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._error(number, f"not valid UTF-8 (byte {exc.start})") from None
        if number == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            return None
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise self._error(number, f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(value, dict):
            raise self._error(number, f"expected a JSON object, got {_json_type(value)}")
        text = self._field(value, self.text_field, number)
        if not isinstance(text, str):
            raise self._error(
                number, f"field {self.text_field!r} must be a string, got {_json_type(text)}"
            )
        if not text:
            raise self._error(number, f"field {self.text_field!r} is empty")
        doc_id = self._field(value, self.id_field, number)
        if isinstance(doc_id, bool) or not isinstance(doc_id, str | int):
            raise self._error(
                number,
                f"field {self.id_field!r} must be a string or an integer, got {_json_type(doc_id)}",
            )
        if isinstance(doc_id, int) and not _INT64_MIN <= doc_id <= _UINT64_MAX:
            raise self._error(number, f"field {self.id_field!r} does not fit in 64 bits")
        metadata = None
        if self.meta_fields:
            metadata = {name: value[name] for name in self.meta_fields if name in value}
        return Document(text, doc_id, metadata)

    def _field(self, value: dict[str, Any], name: str, number: int) -> Any:
        if name not in value:
            raise self._error(number, f"no field {name!r}")
        return value[name]

    def _error(self, number: int, reason: str) -> JsonlError:
        return JsonlError(self.name, number, reason)


def _regular_file_size(file: IO[bytes]) -> int | None:
    """The size of an open regular file (stdin redirected from one too); None otherwise."""
    try:
        status = os.fstat(file.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
