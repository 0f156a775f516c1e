"""Vector cache: repeated texts answered without the tokenizer or the encoder.

The pipeline looks every input up before tokenization (:meth:`VectorCache.lookup`); hits
carry the vector the encoder returned for that text the first time (float32, unnormalized,
full dimension) and its token count, misses go the normal way and are stored once encoded
(:meth:`VectorCache.store`). ``dimensions``, ``normalize`` and the output ``encoding`` are
applied after the lookup, by the same code for hits and misses (worker/publish.py), so one
entry serves every such option and a hit's result equals the miss's bit for bit.

Key: ``identity || content`` (16 + 16 bytes of BLAKE2b). ``identity`` covers what the
worker knows of the model and how it runs: served name, model directory, its revision (a
Hugging Face snapshot's commit), a fingerprint of its files' contents (every file, the
weights included: SHA-256, computed once per model load, before serving), the versions of
the code that computes vectors (kembed, torch, transformers, tokenizers), pooling, dtype,
quantization, compilation and the token limit (max_seq_length). It is read on the encoder
thread after each batch, so a variant the tuner installs never files vectors under the
previous variant's identity. ``content`` covers the truncation side and the text as
tokenized (the prompt included).

Bounded in bytes (keys, vectors and the per-entry bookkeeping as Python allocates it),
least recently used first out. Used from the event loop; a lock makes it safe to read from
the metrics thread and to fill from a loader thread at start-up.

Persistence (optional, worker/cache_store.py): a SQLite file (WAL) mirroring the in-memory
entries, written by a thread of its own in batched transactions, bounded by the same byte
budget; at start the most recently used entries are read back. A different model (or
variant) never reads another's entries: they are keyed by its identity, and rows of models
the worker no longer serves are deleted when it opens the file. A file that cannot be
opened (a read-only volume, another process's lock) turns persistence off with one
warning and the cache serves from memory; only a file SQLite finds corrupt (or no
database at all) is deleted and started afresh.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

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
    "code_versions",
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


#: The packages whose code computes the vectors (tokens, forward pass, pooling): a cached
#: vector belongs to their versions.
VECTOR_PACKAGES = ("kembed", "torch", "transformers", "tokenizers")


@functools.cache
def code_versions() -> tuple[tuple[str, str], ...]:
    """(package, version) of :data:`VECTOR_PACKAGES` installed here (``none`` if absent)."""
    found = []
    for package in VECTOR_PACKAGES:
        try:
            found.append((package, metadata.version(package)))
        except metadata.PackageNotFoundError:
            found.append((package, "none"))
    return tuple(found)


def _code_identity() -> bytes:
    return "\0".join(f"{package}={version}" for package, version in code_versions()).encode()


# Fingerprints computed in this process, by directory, valid while every file's stat
# signature (name, size, inode, modification and change times) is the one it was computed
# for: a file rewritten in place, even to the same size and modification time, changes
# its change time, so its contents are hashed again.
_fingerprints: dict[Path, tuple[tuple[Any, ...], bytes]] = {}


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def model_fingerprint(path: Path) -> bytes:
    """The model's files: its directory, its revision (a Hugging Face snapshot's directory is
    named after the commit) and every file's name and contents (SHA-256 of each; the weights
    of a 1 GB model take about 0.7 s on one core at 1.5 GB/s, docs/performance.md). Two
    models differ in their bytes, not in their sizes or modification times: weights
    retrained to the same size and copied with ``cp -p`` (or rebuilt reproducibly) get
    another fingerprint. Computed once per load: the cache fingerprints every served
    model before serving (:meth:`VectorCache.prepare`), on no hot path."""
    files = _files(path)
    stats = tuple(_signature(path, file) for file in files)
    known = _fingerprints.get(path)
    if known is not None and known[0] == stats:
        return known[1]
    digest = hashlib.blake2b(str(path).encode(), digest_size=_DIGEST, person=b"kembed-model")
    if path.parent.name == "snapshots":
        digest.update(b"\0revision\0" + path.name.encode())
    for file in files:
        digest.update(b"\0" + str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as stream:
            digest.update(hashlib.file_digest(stream, "sha256").digest())
    _fingerprints[path] = (stats, digest.digest())
    return _fingerprints[path][1]


def _signature(root: Path, file: Path) -> tuple[Any, ...]:
    stat = file.stat()
    return (
        str(file.relative_to(root)),
        stat.st_size,
        stat.st_ino,
        stat.st_dev,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
    )


def variant_identity(name: str, info: ModelInfo, fingerprint: bytes | None = None) -> bytes:
    """Everything about the served model that determines its vectors (``fingerprint``: the
    model directory's, when already computed)."""
    if fingerprint is None:
        fingerprint = model_fingerprint(info.path)
    digest = hashlib.blake2b(fingerprint, digest_size=_DIGEST)
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
    digest.update(b"\0code\0" + _code_identity())
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
        self._fingerprints: dict[Path, bytes] = {}

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

    def prepare(self, directories: Iterable[Path]) -> None:
        """Fingerprint the served models' directories (reading every file: blocking, run it
        once the models are loaded and before serving); the cache keys their vectors by
        these fingerprints from then on, whatever happens to the files later."""
        if not self.enabled:
            return
        code_versions()  # reads the packages' metadata (~15 ms): here, not on a lookup
        for directory in directories:
            if directory not in self._fingerprints:
                self._fingerprints[directory] = model_fingerprint(directory)

    def fingerprint(self, directory: Path) -> bytes:
        known = self._fingerprints.get(directory)
        if known is None:  # not prepared (in-process use): fingerprinted on first use
            known = self._fingerprints[directory] = model_fingerprint(directory)
        return known

    def identity(self, name: str, info: ModelInfo) -> bytes:
        known = self._identities.get((name, info))
        if known is None:
            known = variant_identity(name, info, self.fingerprint(info.path))
            self._identities[name, info] = known
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
        added_bytes = 0
        evicted: list[bytes] = []
        with self._lock:
            for note, row, tokens in entries:
                key = identity + note.key
                if key in self._entries:
                    continue
                vector = np.ascontiguousarray(row, dtype=np.float32).tobytes()
                entry = Entry(vector, tokens, note.truncated, name)
                size = self._add(key, entry, evicted)
                if size:
                    added.append((key, entry))
                    added_bytes += size
        if self._store is not None and (added or evicted):
            self._store.write(added, evicted, added_bytes)

    def _add(self, key: bytes, entry: Entry, evicted: list[bytes]) -> int:
        """Insert (lock held), evicting the least recently used to make room; the entry's
        bytes, 0 if it is larger than the whole budget (not kept)."""
        size = self.entry_bytes(key, entry.vector)
        if size > self.max_bytes:
            return 0
        while self.size_bytes + size > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self._account(old.model, -self.entry_bytes(old_key, old.vector), -1)
            evicted.append(old_key)
            if self._metrics is not None:
                self._metrics.cache_evictions.labels(old.model).inc()
        self._entries[key] = entry
        self._account(entry.model, size, 1)
        return size

    def _account(self, model: str, size: int, count: int) -> None:
        self._bytes[model] = self._bytes.get(model, 0) + size
        self._counts[model] = self._counts.get(model, 0) + count

    # ------------------------------------------------------------------ persistence

    def open(
        self,
        path: Path,
        models: Sequence[tuple[str, Path]],
        *,
        pending_bytes: int | None = None,
        busy_timeout_s: float | None = None,
    ) -> int:
        """Persist to the SQLite file ``path`` and read back its entries of ``models``
        (served name, model directory), most recently used last; rows of other models are
        deleted. Blocking (run it before serving). Returns the entries read.

        A file that cannot be opened (a read-only or missing volume, another process's
        lock held past ``busy_timeout_s``, an I/O error) turns persistence off: one
        warning, the cache serves from memory, the file is left as it is. Only a file
        SQLite finds corrupt, or no database at all, is deleted and started afresh.
        ``pending_bytes``: the most that changes waiting for the writer may hold (default
        :func:`~worker.cache_store.pending_limit`)."""
        if not self.enabled:
            return 0
        self.prepare(directory for _, directory in models)
        fingerprints = {name: self._model_column(name, directory) for name, directory in models}
        options: dict[str, Any] = {"pending_bytes": pending_bytes, "dropped": self._dropped}
        if busy_timeout_s is not None:
            options["busy_timeout_s"] = busy_timeout_s
        try:
            try:
                store, rows = SqliteStore.opened(path, fingerprints, self.max_bytes, **options)
            except sqlite3.DatabaseError as exc:
                if not _corrupt(exc):
                    raise
                # Not a cache file, or a damaged one: start afresh.
                log.warning("cache.file_unreadable", error=type(exc).__name__, reason=str(exc))
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
                store, rows = SqliteStore.opened(path, fingerprints, self.max_bytes, **options)
        except (sqlite3.Error, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            log.warning(
                "cache.persistence_off",
                error=type(exc).__name__,
                reason=reason,
                detail="the vector cache serves from memory only; the file is left as it is",
            )
            return 0
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

    @property
    def persisted(self) -> bool:
        """Whether a file backs the cache (:meth:`open` succeeded)."""
        return self._store is not None

    def _dropped(self, reason: str, changes: int) -> None:
        if self._metrics is not None:
            self._metrics.cache_write_drops.labels(reason).inc(changes)

    def _model_column(self, name: str, path: Path) -> bytes:
        """What the file's rows of model ``name`` are marked with: its fingerprint and the
        code versions (rows of another model, or of other versions, are deleted at open)."""
        digest = hashlib.blake2b(self.fingerprint(path), digest_size=_DIGEST)
        digest.update(name.encode() + b"\0code\0" + _code_identity())
        return digest.digest()

    def close(self) -> None:
        """Write what is pending and close the file (no-op when not persisted)."""
        store, self._store = self._store, None
        if store is not None:
            store.close()

    def flush(self) -> None:
        """Wait until every change so far is in the file."""
        if self._store is not None:
            self._store.flush()


# SQLite's primary result codes for a file that is damaged or is no database.
_CORRUPTION = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def _corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _CORRUPTION
