"""Vector cache: repeated texts answered without the tokenizer or the encoder.

The pipeline looks every input up before tokenization (:meth:`VectorCache.lookup`); hits
carry the vector the encoder returned for that text the first time (float32, unnormalized,
full dimension) and its token count, misses go the normal way and are stored once encoded
(:meth:`VectorCache.store`). ``dimensions``, ``normalize`` and the output ``encoding`` are
applied after the lookup, by the same code for hits and misses (worker/publish.py), so one
entry serves every such option and a hit's result equals the miss's bit for bit.

Key: ``identity || content`` (16 + 16 bytes of BLAKE2b). ``identity`` covers what the
worker knows of the model and how it runs: served name, model directory, its revision (a
Hugging Face snapshot's commit), a fingerprint of its files (config, tokenizer, weights'
names, sizes and modification times), pooling, dtype, quantization, compilation and the
token limit (max_seq_length). It is read on the encoder thread after each batch, so a
variant the tuner installs never files vectors under the previous variant's identity.
``content`` covers the truncation side and the text as tokenized (the prompt included).

Bounded in bytes (keys, vectors and the per-entry bookkeeping as Python allocates it),
least recently used first out. Used from the event loop; a lock makes it safe to read from
the metrics thread and to fill from a loader thread at start-up.

Persistence (optional, worker/cache_store.py): a SQLite file (WAL) mirroring the in-memory
entries, written by a thread of its own in batched transactions, bounded by the same byte
budget; at start the most recently used entries are read back. A different model (or
variant) never reads another's entries: they are keyed by its identity, and rows of models
the worker no longer serves are deleted when it opens the file.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import structlog

from worker.cache_store import Entry, SqliteStore, entry_bytes
from worker.encoder.base import ModelInfo
from worker.metrics import Metrics
from worker.tokenization import Tokenized

__all__ = [
    "CacheNote",
    "Hit",
    "Lookup",
    "VectorCache",
    "content_key",
    "model_fingerprint",
    "token_count",
    "variant_identity",
]

log = structlog.get_logger("kembed.worker")

_DIGEST = 16


class CacheNote(NamedTuple):
    """What the cache needs to store an input's vector once it is encoded."""

    key: bytes
    """Its content key (:func:`content_key`)."""
    truncated: bool


@dataclass(frozen=True, slots=True)
class Hit:
    """A cached input: the vector the encoder returned for it, its tokens and whether the
    text was cut to the model's maximum (a ``truncate: false`` request then fails)."""

    vector: npt.NDArray[np.float32]
    tokens: int
    truncated: bool


def token_count(piece: Tokenized | Hit) -> int:
    return piece.tokens if isinstance(piece, Hit) else len(piece.ids)


# ---------------------------------------------------------------------- keys


def content_key(text: str, side: str) -> bytes:
    """The text as the tokenizer sees it (the prompt included) and which end is cut."""
    digest = hashlib.blake2b(side.encode(), digest_size=_DIGEST, person=b"kembed-text")
    digest.update(b"\0")
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()


_fingerprints: dict[Path, bytes] = {}


def model_fingerprint(path: Path) -> bytes:
    """The model's files: its revision (a Hugging Face snapshot's directory is named after
    the commit), config and tokenizer contents, the weights' names, sizes and modification
    times. Cheap (weights are not read), and changes when a model directory is replaced."""
    if path in _fingerprints:
        return _fingerprints[path]
    digest = hashlib.blake2b(str(path).encode(), digest_size=_DIGEST, person=b"kembed-model")
    if path.parent.name == "snapshots":
        digest.update(b"\0revision\0" + path.name.encode())
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            relative = str(file.relative_to(path)).encode()
            stat = file.stat()
            digest.update(b"\0" + relative + f"\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
            if file.suffix == ".json" and stat.st_size <= 64 * 2**20:
                digest.update(file.read_bytes())
    _fingerprints[path] = fingerprint = digest.digest()
    return fingerprint


def variant_identity(name: str, info: ModelInfo) -> bytes:
    """Everything about the served model that determines its vectors."""
    digest = hashlib.blake2b(model_fingerprint(info.path), digest_size=_DIGEST)
    fields = (
        name,
        info.pooling,
        info.dtype,
        info.quantization or "none",
        "compiled" if info.compiled else "eager",
        str(info.max_seq_length),
        str(info.dim),
    )
    digest.update("\0".join(fields).encode())
    return digest.digest()


# ---------------------------------------------------------------------- lookups


class Lookup:
    """One group of texts looked up: which to tokenize, and how to put the answers back."""

    __slots__ = ("hits", "keys", "misses")

    def __init__(
        self, texts: list[str], keys: list[bytes] | None, hits: list[Hit | None] | None
    ) -> None:
        self.keys = keys
        self.hits = hits
        self.misses = (
            texts if hits is None else [t for t, h in zip(texts, hits, strict=True) if h is None]
        )
        """The texts to tokenize and encode, in order."""

    def complete(
        self, tokenized: Sequence[Tokenized]
    ) -> tuple[list[Tokenized | Hit], list[CacheNote]]:
        """Every input's piece, in order (``tokenized``: the misses'), and the notes by
        which the misses are stored once encoded (none when the cache is off)."""
        if self.hits is None or self.keys is None:
            return list(tokenized), []
        pieces: list[Tokenized | Hit] = []
        notes: list[CacheNote] = []
        misses = iter(tokenized)
        for key, hit in zip(self.keys, self.hits, strict=True):
            piece = next(misses) if hit is None else hit
            pieces.append(piece)
            notes.append(CacheNote(key, piece.truncated))
        return pieces, notes


class VectorCache:
    """In-memory LRU of encoder outputs, bounded in bytes; optionally persisted
    (:meth:`open`). ``max_bytes`` 0: off (every lookup is a miss, nothing is hashed)."""

    def __init__(self, max_bytes: int, metrics: Metrics | None = None) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()
        self._bytes: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._identities: dict[tuple[str, ModelInfo], bytes] = {}
        self._lock = threading.Lock()
        self._metrics = metrics
        self._store: SqliteStore | None = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def size_bytes(self) -> int:
        return sum(self._bytes.values())

    def __len__(self) -> int:
        return len(self._entries)

    def model_bytes(self, model: str) -> int:
        return self._bytes.get(model, 0)

    def model_entries(self, model: str) -> int:
        return self._counts.get(model, 0)

    def watch(self, model: str) -> None:
        """Expose ``model``'s gauges (bytes, entries) and its counters at 0."""
        if self._metrics is None:
            return
        m = self._metrics
        for counter in (m.cache_hits, m.cache_misses, m.cache_evictions):
            counter.labels(model)
        m.cache_bytes.labels(model).set_function(lambda: self.model_bytes(model))
        m.cache_entries.labels(model).set_function(lambda: self.model_entries(model))

    def identity(self, name: str, info: ModelInfo) -> bytes:
        known = self._identities.get((name, info))
        if known is None:
            known = self._identities[name, info] = variant_identity(name, info)
        return known

    @staticmethod
    def entry_bytes(key: bytes, vector: bytes) -> int:
        """What an entry costs in memory."""
        return entry_bytes(key, vector)

    def lookup(self, name: str, info: ModelInfo, side: str, texts: list[str]) -> Lookup:
        """Look ``texts`` (as tokenized: prompt included) up for model ``name`` running as
        ``info``, cut at ``side``."""
        if not self.enabled:
            return Lookup(texts, None, None)
        identity = self.identity(name, info)
        keys = [content_key(text, side) for text in texts]
        hits: list[Hit | None] = []
        touched: list[bytes] = []
        with self._lock:
            entries = self._entries
            for key in keys:
                entry = entries.get(identity + key)
                if entry is None:
                    hits.append(None)
                    continue
                entries.move_to_end(identity + key)
                touched.append(identity + key)
                vector = np.frombuffer(entry.vector, dtype=np.float32)
                hits.append(Hit(vector, entry.tokens, entry.truncated))
        if self._store is not None and touched:
            self._store.touch(touched)
        if self._metrics is not None:
            found = len(touched)
            if found:
                self._metrics.cache_hits.labels(name).inc(found)
            if len(keys) > found:
                self._metrics.cache_misses.labels(name).inc(len(keys) - found)
        return Lookup(texts, keys, hits)

    def store(
        self,
        name: str,
        info: ModelInfo,
        entries: Iterable[tuple[CacheNote, npt.NDArray[np.float32], int]],
    ) -> None:
        """File encoder outputs: (note, its row, its tokens), computed by model ``name``
        running as ``info`` (read on the encoder thread right after the batch ran)."""
        if not self.enabled:
            return
        identity = self.identity(name, info)
        added: list[tuple[bytes, Entry]] = []
        evicted: list[bytes] = []
        with self._lock:
            for note, row, tokens in entries:
                key = identity + note.key
                if key in self._entries:
                    continue
                vector = np.ascontiguousarray(row, dtype=np.float32).tobytes()
                entry = Entry(vector, tokens, note.truncated, name)
                if self._add(key, entry, evicted):
                    added.append((key, entry))
        if self._store is not None and (added or evicted):
            self._store.write(added, evicted)

    def _add(self, key: bytes, entry: Entry, evicted: list[bytes]) -> bool:
        """Insert (lock held), evicting the least recently used to make room."""
        size = self.entry_bytes(key, entry.vector)
        if size > self.max_bytes:
            return False
        while self.size_bytes + size > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._account(old.model, -self.entry_bytes(old_key, old.vector), -1)
            evicted.append(old_key)
            if self._metrics is not None:
                self._metrics.cache_evictions.labels(old.model).inc()
        self._entries[key] = entry
        self._account(entry.model, size, 1)
        return True

    def _account(self, model: str, size: int, count: int) -> None:
        self._bytes[model] = self._bytes.get(model, 0) + size
        self._counts[model] = self._counts.get(model, 0) + count

    # ------------------------------------------------------------------ persistence

    def open(self, path: Path, models: Sequence[tuple[str, Path]]) -> int:
        """Persist to the SQLite file ``path`` and read back its entries of ``models``
        (served name, model directory), most recently used last; rows of other models are
        deleted. Blocking (run it before serving). Returns the entries read."""
        if not self.enabled:
            return 0
        fingerprints = {name: _model_column(name, directory) for name, directory in models}
        try:
            store, rows = SqliteStore.opened(path, fingerprints, self.max_bytes)
        except sqlite3.DatabaseError as exc:  # not a cache file, or a damaged one: start afresh
            log.warning("cache.file_unreadable", error=type(exc).__name__, reason=str(exc))
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            store, rows = SqliteStore.opened(path, fingerprints, self.max_bytes)
        loaded = 0
        evicted: list[bytes] = []
        with self._lock:
            for key, entry in rows:
                self._add(key, entry, evicted)
                loaded += 1
        store.start(evicted)
        self._store = store
        log.info("cache.opened", entries=loaded, bytes=self.size_bytes)
        return loaded

    def close(self) -> None:
        """Write what is pending and close the file (no-op when not persisted)."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def flush(self) -> None:
        """Wait until every change so far is in the file."""
        if self._store is not None:
            self._store.flush()


def _model_column(name: str, path: Path) -> bytes:
    return hashlib.blake2b(model_fingerprint(path) + name.encode(), digest_size=_DIGEST).digest()
