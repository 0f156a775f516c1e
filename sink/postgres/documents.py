"""A batch's documents: their versions for the documents table, and shares by document."""

from __future__ import annotations

from collections.abc import Sequence

from sink.rows import Row

__all__ = ["Documents", "by_document", "documents"]


class Documents(dict[str, tuple[int, str, int | None]]):
    """The documents of a batch: doc_key -> (its version: requested_ms and request id,
    its chunk count; None for a row per input)."""

    def columns(self) -> tuple[list[str], list[int], list[str], list[int | None]]:
        keys = sorted(self)
        return (
            keys,
            [self[k][0] for k in keys],
            [self[k][1] for k in keys],
            [self[k][2] for k in keys],
        )


def documents(rows: Sequence[Row]) -> Documents:
    """Each document of ``rows`` (of one version each, after ``newest``)."""
    docs = Documents()
    for row in rows:
        chunks = row.chunks if row.chunk_index is not None else None
        docs[row.document] = (row.requested_ms, row.request_id, chunks)
    return docs


def by_document(rows: Sequence[Row], parts: int) -> list[list[Row]]:
    """``rows`` in ``parts`` shares of about equal size, each document's rows in one."""
    by_doc: dict[str, list[Row]] = {}
    for row in rows:
        by_doc.setdefault(row.document, []).append(row)
    size = -(-len(rows) // parts)
    shares: list[list[Row]] = [[] for _ in range(parts)]
    share = 0
    for doc_rows in by_doc.values():
        if len(shares[share]) >= size and share < parts - 1:
            share += 1
        shares[share].extend(doc_rows)
    return shares
