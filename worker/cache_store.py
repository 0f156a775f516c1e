"""The SQLite file behind a persisted vector cache (worker/cache.py): one table of
entries keyed like the in-memory cache, written by a thread of its own in batched
transactions (WAL), read back most recently used first at start."""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

import structlog

__all__ = ["Entry", "SqliteStore", "entry_bytes"]

log = structlog.get_logger("kembed.worker")

# The file's layout; a file with another version is started afresh.
_SCHEMA_VERSION = 1
# Writes gathered per transaction, and how long the writer waits for more.
_WRITE_BATCH = 2048
_WRITE_WAIT_S = 0.2
# Python's memory per entry beyond the key and vector bytes: the key's and the vector's
# bytes objects (their headers), the entry tuple, the OrderedDict's slot and link node.
# Checked against tracemalloc by tests/unit/test_cache.py.
_ENTRY_OVERHEAD = 2 * sys.getsizeof(b"") + sys.getsizeof((0, 0, 0, 0)) + 104


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


class SqliteStore:
    """The file behind a persisted cache: one table of entries, written by one thread."""

    def __init__(self, path: Path, models: dict[str, bytes]) -> None:
        self.path = path
        self._models = models
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
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
        self._db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        self._used = 0
        self._queue: queue.SimpleQueue[_Op] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @classmethod
    def opened(
        cls, path: Path, models: dict[str, bytes], max_bytes: int
    ) -> tuple[SqliteStore, list[tuple[bytes, Entry]]]:
        """The store of ``path`` and its entries of ``models`` (see :meth:`read`)."""
        store = cls(path, models)
        try:
            return store, store.read(max_bytes)
        except BaseException:
            store._db.close()
            raise

    def read(self, max_bytes: int) -> list[tuple[bytes, Entry]]:
        """The entries of the served models, least recently used first, at most
        ``max_bytes`` of them (the most recent); others are deleted."""
        db = self._db
        marks = ",".join("?" * len(self._models))
        db.execute("BEGIN")
        db.execute(f"DELETE FROM entries WHERE model NOT IN ({marks})", list(self._models.values()))
        names = {fp: name for name, fp in self._models.items()}
        keep: list[tuple[bytes, Entry, int]] = []
        total = 0
        rows = db.execute(
            "SELECT key, model, used, tokens, truncated, vector FROM entries ORDER BY used DESC"
        )
        cutoff: int | None = None
        for key, model, used, tokens, truncated, vector in rows:
            size = entry_bytes(key, vector)
            if total + size > max_bytes:
                cutoff = used
                break
            total += size
            keep.append((key, Entry(vector, tokens, bool(truncated), names[model]), used))
        if cutoff is not None:
            db.execute("DELETE FROM entries WHERE used <= ?", (cutoff,))
        db.execute("COMMIT")
        self._used = keep[0][2] if keep else 0
        return [(key, entry) for key, entry, _ in reversed(keep)]

    def start(self, evicted: list[bytes]) -> None:
        if evicted:
            self._queue.put(("delete", evicted))
        self._thread = threading.Thread(target=self._run, name="kembed-cache-writer", daemon=True)
        self._thread.start()

    def touch(self, keys: list[bytes]) -> None:
        self._queue.put(("touch", keys))

    def write(self, added: list[tuple[bytes, Entry]], evicted: list[bytes]) -> None:
        # In this order: an entry added and evicted by one store() leaves no row.
        if added:
            self._queue.put(("insert", added))
        if evicted:
            self._queue.put(("delete", evicted))

    def flush(self) -> None:
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(("stop", None))
            self._thread.join()
        self._db.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            ops = [self._queue.get()]
            # Gather what comes meanwhile into one transaction; a flush or stop goes now.
            with contextlib.suppress(queue.Empty):
                while len(ops) < _WRITE_BATCH and ops[-1][0] not in ("flush", "stop"):
                    ops.append(self._queue.get(timeout=_WRITE_WAIT_S))
            try:
                self._apply(ops)
            except Exception as exc:  # noqa: BLE001 (the file is a cache: serving goes on)
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
                log.error("cache.write_failed", error=type(exc).__name__, reason=str(exc))
            for kind, payload in ops:
                if kind == "flush":
                    payload.set()
            stopping = ops[-1][0] == "stop"

    def _apply(self, ops: list[_Op]) -> None:
        db = self._db
        db.execute("BEGIN")
        for kind, payload in ops:
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


_Op = tuple[str, Any]
