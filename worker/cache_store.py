"""The SQLite file behind a persisted vector cache (worker/cache.py): one table of
entries keyed like the in-memory cache, written by a thread of its own in batched
transactions (WAL), read back most recently used first at start.

The file is a cache: no failure of it stops the worker. Changes wait for the writer in a
queue bounded in bytes (what does not fit is not persisted, and counted); a transaction
commits at least every :data:`_WRITE_INTERVAL_S` however steadily changes arrive; a
failed one is rolled back, counted, and followed by a WAL checkpoint (which returns the
journal's disk space), and once changes were lost the file is trimmed back to the byte
budget."""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import structlog

__all__ = ["Entry", "SqliteStore", "entry_bytes", "pending_limit"]

log = structlog.get_logger("kembed.worker")

# The file's layout; a file with another version is started afresh.
_SCHEMA_VERSION = 1
# Changes gathered per transaction at most, and the longest a change waits for its commit
# once the writer has taken it (changes arriving faster than this still commit this often).
_WRITE_BATCH = 2048
_WRITE_INTERVAL_S = 0.2
# How long a statement waits for another connection's lock before it fails
# ("database is locked"): opening then turns persistence off, a write is dropped.
_BUSY_TIMEOUT_S = 5.0
# Changes waiting for the writer hold at most this share of the cache's byte budget (at
# least _MIN_PENDING_BYTES): beyond it they are dropped, not queued.
_PENDING_SHARE = 8
_MIN_PENDING_BYTES = 2**20
# Python's memory per entry beyond the key and vector bytes: the key's and the vector's
# bytes objects (their headers), the entry tuple, the OrderedDict's slot and link node.
# Checked against tracemalloc by tests/unit/worker/test_cache.py.
_ENTRY_OVERHEAD = 2 * sys.getsizeof(b"") + sys.getsizeof((0, 0, 0, 0)) + 104
# What a queued key (a touch or a delete) holds: its bytes object and its list slot.
_KEY_OVERHEAD = sys.getsizeof(b"") + 8


class Entry(NamedTuple):
    """A cached vector: its float32 bytes (raw, full dimension), token count, whether the
    text was cut, and the served model it belongs to."""

    vector: bytes
    tokens: int
    truncated: bool
    model: str


def entry_bytes(key: bytes, vector: bytes) -> int:
    """What a cache entry costs in memory (the byte budget counts this)."""
    return len(key) + len(vector) + _ENTRY_OVERHEAD


def pending_limit(max_bytes: int) -> int:
    """The bytes of changes that may wait for the writer, for a cache of ``max_bytes``."""
    return max(max_bytes // _PENDING_SHARE, _MIN_PENDING_BYTES)


Dropped = Callable[[str, int], None]
"""Told (reason, changes) of changes that did not reach the file: ``queue_full`` or
``write_failed``."""


class SqliteStore:
    """The file behind a persisted cache: one table of entries, written by one thread."""

    def __init__(
        self,
        path: Path,
        models: dict[str, bytes],
        max_bytes: int,
        *,
        pending_bytes: int | None = None,
        busy_timeout_s: float = _BUSY_TIMEOUT_S,
        dropped: Dropped | None = None,
    ) -> None:
        self.path = path
        self._models = models
        self._max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
        )
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version != _SCHEMA_VERSION:
                self._db.execute("DROP TABLE IF EXISTS entries")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, model BLOB NOT NULL, "
                "name TEXT NOT NULL, used INTEGER NOT NULL, tokens INTEGER NOT NULL, "
                "truncated INTEGER NOT NULL, vector BLOB NOT NULL) WITHOUT ROWID"
            )
            self._db.execute("CREATE INDEX IF NOT EXISTS entries_used ON entries (used)")
            if version != _SCHEMA_VERSION:
                self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except BaseException:
            self._db.close()
            raise
        self._used = 0
        self._queue: queue.SimpleQueue[_Op] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._limit = pending_limit(max_bytes) if pending_bytes is None else pending_bytes
        self._pending = 0
        self._pending_lock = threading.Lock()
        self._dropped = dropped
        self._trim = False  # changes were lost: the file may hold more than the budget

    @classmethod
    def opened(
        cls, path: Path, models: dict[str, bytes], max_bytes: int, **options: Any
    ) -> tuple[SqliteStore, list[tuple[bytes, Entry]]]:
        """The store of ``path`` and its entries of ``models`` (see :meth:`read`)."""
        store = cls(path, models, max_bytes, **options)
        try:
            return store, store.read()
        except BaseException:
            store._db.close()
            raise

    @property
    def pending_bytes(self) -> int:
        """What the changes waiting for the writer hold (at most the queue's limit)."""
        return self._pending

    def read(self) -> list[tuple[bytes, Entry]]:
        """The entries of the served models, least recently used first, at most the byte
        budget of them (the most recent); others are deleted."""
        db = self._db
        marks = ",".join("?" * len(self._models))
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                f"DELETE FROM entries WHERE model NOT IN ({marks})", list(self._models.values())
            )
            names = {fp: name for name, fp in self._models.items()}
            keep: list[tuple[bytes, Entry, int]] = []
            total = 0
            rows = db.execute(
                "SELECT key, model, used, tokens, truncated, vector FROM entries ORDER BY used DESC"
            )
            cutoff: int | None = None
            for key, model, used, tokens, truncated, vector in rows:
                size = entry_bytes(key, vector)
                if total + size > self._max_bytes:
                    cutoff = used
                    break
                total += size
                keep.append((key, Entry(vector, tokens, bool(truncated), names[model]), used))
            if cutoff is not None:
                db.execute("DELETE FROM entries WHERE used <= ?", (cutoff,))
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        self._used = keep[0][2] if keep else 0
        return [(key, entry) for key, entry, _ in reversed(keep)]

    def start(self, evicted: list[bytes]) -> None:
        if evicted:
            self._queue.put(("delete", evicted, 0))
        self._thread = threading.Thread(target=self._run, name="kembed-cache-writer", daemon=True)
        self._thread.start()

    def touch(self, keys: list[bytes]) -> None:
        self._put("touch", keys, _keys_bytes(keys))

    def write(
        self, added: list[tuple[bytes, Entry]], evicted: list[bytes], added_bytes: int
    ) -> None:
        """Queue ``added`` (their :func:`entry_bytes`: ``added_bytes``) and ``evicted``."""
        # In this order: an entry added and evicted by one store() leaves no row.
        if added:
            self._put("insert", added, added_bytes)
        if evicted:
            self._put("delete", evicted, _keys_bytes(evicted))

    def flush(self) -> None:
        done = threading.Event()
        self._queue.put(("flush", done, 0))
        done.wait()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(("stop", None, 0))
            self._thread.join()
        self._db.close()

    def _put(self, kind: str, payload: list[Any], cost: int) -> None:
        """Queue a change unless the queue is full: an insert then is not persisted (the
        entry stays in memory), a touch leaves the row's order, and a lost delete leaves a
        row the trim removes later."""
        with self._pending_lock:
            fits = self._pending + cost <= self._limit
            if fits:
                self._pending += cost
            elif kind == "delete":
                self._trim = True
        if fits:
            self._queue.put((kind, payload, cost))
        elif self._dropped is not None:
            self._dropped("queue_full", len(payload))

    def _run(self) -> None:
        stopping = False
        while not stopping:
            ops = [self._queue.get()]
            # Gather what comes within the interval into one transaction (a flush or stop
            # goes now): however steadily changes arrive, they commit this often.
            deadline = time.monotonic() + _WRITE_INTERVAL_S
            with contextlib.suppress(queue.Empty):
                while len(ops) < _WRITE_BATCH and ops[-1][0] not in ("flush", "stop"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    ops.append(self._queue.get(timeout=left))
            try:
                self._apply(ops)
            except Exception as exc:  # noqa: BLE001 (the file is a cache: serving goes on)
                self._failed(ops, exc)
            else:
                if self._trim and self._queue.empty():
                    self._trim_to_budget()
            with self._pending_lock:
                self._pending -= sum(cost for _, _, cost in ops)
            for kind, payload, _ in ops:
                if kind == "flush":
                    payload.set()
            stopping = ops[-1][0] == "stop"

    def _failed(self, ops: list[_Op], exc: Exception) -> None:
        """A transaction failed (disk full, another process's lock, an I/O error): roll it
        back, count what it lost, and checkpoint the WAL so that the journal (grown by the
        failed transaction's pages) gives its disk space back."""
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")
        lost = sum(len(payload) for kind, payload, _ in ops if kind in _CHANGES)
        log.error("cache.write_failed", error=type(exc).__name__, reason=str(exc), changes=lost)
        if lost and self._dropped is not None:
            self._dropped("write_failed", lost)
        if any(kind == "delete" for kind, _, _ in ops):
            self._trim = True
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as error:
            log.warning("cache.checkpoint_failed", error=type(error).__name__, reason=str(error))

    def _apply(self, ops: list[_Op]) -> None:
        db = self._db
        db.execute("BEGIN")
        for kind, payload, _ in ops:
            if kind == "insert":
                rows = []
                for key, entry in payload:
                    self._used += 1
                    model = self._models.get(entry.model)
                    if model is not None:
                        rows.append(
                            (key, model, entry.model, self._used, entry.tokens,
                             int(entry.truncated), entry.vector)
                        )  # fmt: skip
                db.executemany("INSERT OR REPLACE INTO entries VALUES (?,?,?,?,?,?,?)", rows)
            elif kind == "delete":
                db.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in payload])
            elif kind == "touch":
                updates = []
                for key in payload:
                    self._used += 1
                    updates.append((self._used, key))
                db.executemany("UPDATE entries SET used = ? WHERE key = ?", updates)
        db.execute("COMMIT")

    def _trim_to_budget(self) -> None:
        """Delete the least recently used rows beyond the byte budget (after changes were
        lost, a delete among them); the same cut as :meth:`read`'s."""
        db = self._db
        self._trim = False
        try:
            self._cut(db)
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            log.error("cache.write_failed", error=type(exc).__name__, reason=str(exc), changes=0)
            self._trim = True

    def _cut(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN")
        total = 0
        cutoff: int | None = None
        sizes = db.execute(
            "SELECT length(key), length(vector), used FROM entries ORDER BY used DESC"
        )
        for key_bytes, vector_bytes, used in sizes:
            total += key_bytes + vector_bytes + _ENTRY_OVERHEAD
            if total > self._max_bytes:
                cutoff = used
                break
        if cutoff is not None:
            db.execute("DELETE FROM entries WHERE used <= ?", (cutoff,))
        db.execute("COMMIT")


def _keys_bytes(keys: list[bytes]) -> int:
    # Keys are all of one length (identity + content digests).
    return len(keys) * (len(keys[0]) + _KEY_OVERHEAD) if keys else 0


_CHANGES = ("insert", "delete", "touch")
_Op = tuple[str, Any, int]
