"""The vector cache's file when things go wrong, on real SQLite files: a read-only volume,
another process's write lock (before the file opens and while it is written), changes
arriving faster than the writer's interval, a stalled writer (its queue stays bounded and
drops are counted), a full disk (the WAL is checkpointed after the failed write); and the
cache's identity: the weights' contents and the code versions.

Read-only volumes and the full disk are real mounts (tmpfs): the tests run as root, whom
file modes do not stop; a process that is not root gets a directory without write
permission instead (which does stop it) for the read-only case.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from tests.unit.worker.test_cache import ENTRY, INFO, hits, put
from worker import cache as cache_module
from worker.cache import CacheNote, VectorCache, code_versions, model_fingerprint
from worker.cache_store import entry_bytes, pending_limit
from worker.metrics import Metrics

MODELS = [("m", INFO.path)]
WIDE = dataclasses.replace(INFO, dim=384)  # the bundled model's width: ~1.8 KB an entry
WIDE_ENTRY = VectorCache.entry_bytes(bytes(32), bytes(4 * 384))


def rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        count: int = db.execute("SELECT count(*) FROM entries").fetchone()[0]
    return count


def drops(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("kembed_cache_write_drops_total", {"reason": reason})
    assert value is not None
    return value


def warnings(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


def store_wide(cache: VectorCache, first: int, count: int) -> None:
    """Store ``count`` 384-dimension entries for texts ``first`` ... in one call."""
    texts = [f"text {i}" for i in range(first, first + count)]
    lookup = cache.lookup("m", WIDE, "right", texts)
    vectors = np.random.default_rng(first).standard_normal((count, 384)).astype(np.float32)
    notes = [CacheNote(key, False) for key in lookup.keys or []]
    cache.store("m", WIDE, ((n, v, 3) for n, v in zip(notes, vectors, strict=True)))


# ---------------------------------------------------------------------- mounts


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``path`` (root only) with ``options``, unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path))
    try:
        yield path
    finally:
        _run("umount", "-l", str(path))


@contextmanager
def read_only(path: Path, fill: bool) -> Iterator[Path]:
    """A directory nothing can be written to, holding a cache file of ``MODELS`` (3
    entries) when ``fill``: a read-only tmpfs for root, no write permission otherwise."""
    if os.geteuid() != 0:
        path.mkdir()
        if fill:
            _fill(path / "cache.sqlite")
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    with tmpfs(path, "size=4m"):
        if fill:
            _fill(path / "cache.sqlite")
        _run("mount", "-o", "remount,ro", str(path))
        yield path


def _fill(path: Path) -> None:
    cache = VectorCache(10 * ENTRY)
    cache.open(path, MODELS)
    put(cache, ["a", "b", "c"])
    cache.close()


# ---------------------------------------------------------------------- another process


class Locker:
    """Another process holding SQLite's write lock on a file (BEGIN IMMEDIATE) until
    :meth:`release`."""

    def __init__(self, path: Path) -> None:
        script = (
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n"
            "db.execute('ROLLBACK')\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("\n")
            self.process.stdin.flush()
        assert self.process.wait(timeout=30) == 0


# ---------------------------------------------------------------------- opening


@pytest.mark.parametrize("fill", [False, True], ids=["empty", "holding-a-cache-file"])
def test_a_read_only_volume_turns_persistence_off_with_one_warning(
    tmp_path: Path, fill: bool
) -> None:
    """The worker's start-up opens the file: on a read-only volume that fails (and so
    would deleting the file); the cache then serves from memory, warns once, and leaves
    the file as it was."""
    with read_only(tmp_path / "volume", fill) as volume:
        path = volume / "cache.sqlite"
        before = path.read_bytes() if fill else None
        cache = VectorCache(10 * ENTRY)
        with structlog.testing.capture_logs() as logs:
            assert cache.open(path, MODELS) == 0
        assert not cache.persisted
        off = warnings(logs, "cache.persistence_off")
        assert len(off) == 1, logs
        assert off[0]["log_level"] == "warning"
        put(cache, ["a", "b"])
        assert hits(cache, ["a", "b", "c"]) == [True, True, False], "memory still caches"
        cache.flush()
        cache.close()
        assert (path.read_bytes() if fill else None) == before
        assert path.exists() == fill


def test_another_process_s_lock_at_open_leaves_the_file_alone(tmp_path: Path) -> None:
    """Another process holds the write lock past the busy timeout: this worker goes
    without persistence, and the file (with its WAL and SHM) survives for its holder; once
    the lock is gone, the next open reads its entries back."""
    path = tmp_path / "cache.sqlite"
    _fill(path)
    inode = path.stat().st_ino
    locker = Locker(path)
    try:
        cache = VectorCache(10 * ENTRY)
        with structlog.testing.capture_logs() as logs:
            assert cache.open(path, MODELS, busy_timeout_s=0.3) == 0
        assert path.stat().st_ino == inode, "the file was replaced under its holder"
        assert not warnings(logs, "cache.file_unreadable")
        (off,) = warnings(logs, "cache.persistence_off")
        assert "locked" in str(off["reason"])
        assert not cache.persisted
        cache.close()
    finally:
        locker.release()
    assert rows(path) == 3
    again = VectorCache(10 * ENTRY)
    assert again.open(path, MODELS) == 3
    assert hits(again, ["a", "b", "c"]) == [True, True, True]
    again.close()


def test_a_lock_taken_while_writing_loses_that_write_only(tmp_path: Path) -> None:
    """The other order: the file is open and written when another process takes the
    lock. The write that meets it fails after the busy timeout (counted, logged), the
    file stays, and later writes land."""
    path = tmp_path / "cache.sqlite"
    metrics = Metrics()
    cache = VectorCache(10 * ENTRY, metrics)
    cache.open(path, MODELS, busy_timeout_s=0.3)
    put(cache, ["a"])
    cache.flush()
    locker = Locker(path)
    try:
        with structlog.testing.capture_logs() as logs:
            put(cache, ["b"])
            cache.flush()
        (failed,) = warnings(logs, "cache.write_failed")
        assert "locked" in str(failed["reason"])
        assert drops(metrics, "write_failed") == 1
    finally:
        locker.release()
    put(cache, ["c"])
    cache.flush()
    assert cache.persisted
    cache.close()
    again = VectorCache(10 * ENTRY)
    assert again.open(path, MODELS) == 2
    assert hits(again, ["a", "b", "c"]) == [True, False, True]
    again.close()


def test_only_a_corrupt_file_is_deleted(tmp_path: Path) -> None:
    """A database SQLite finds damaged (here: its header overwritten) is started afresh,
    with a warning of its own; the cache then persists again."""
    path = tmp_path / "cache.sqlite"
    _fill(path)
    with path.open("r+b") as file:
        file.write(b"\xff" * 100)
    cache = VectorCache(10 * ENTRY)
    with structlog.testing.capture_logs() as logs:
        assert cache.open(path, MODELS) == 0
    assert warnings(logs, "cache.file_unreadable")
    assert not warnings(logs, "cache.persistence_off")
    assert cache.persisted
    put(cache, ["a"])
    cache.close()
    assert rows(path) == 1


# ---------------------------------------------------------------------- writing


def test_entries_arriving_faster_than_the_interval_still_reach_the_file(tmp_path: Path) -> None:
    """One new entry every 20 ms, ten times faster than the writer's 0.2 s interval: the
    rows reach the file while entries keep arriving (several commits within the stream),
    instead of waiting for a gap in the stream or a full batch of 2,048 changes."""
    path = tmp_path / "cache.sqlite"
    cache = VectorCache(10_000 * ENTRY)
    cache.open(path, MODELS)
    reader = sqlite3.connect(path)
    seen: list[int] = []
    sent = 0
    while sent < 300 and len(set(seen) - {0}) < 3:  # 300 entries: 6 s at least
        put(cache, [f"entry {sent}"])
        sent += 1
        seen.append(reader.execute("SELECT count(*) FROM entries").fetchone()[0])
        time.sleep(0.02)
    reader.close()
    cache.close()
    assert len(set(seen) - {0}) >= 3, f"rows on disk while {sent} entries arrived: {seen[-5:]}"
    assert rows(path) == sent


def test_a_stalled_writer_keeps_memory_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    """Another process holds the file's lock while 10 times the cache's budget of entries
    is stored: what waits for the writer stays within its limit (so evicted vectors are
    not pinned beyond the budget), the rest is counted as dropped; once the lock is gone
    the file is back within the budget, and the cache served throughout."""
    path = tmp_path / "cache.sqlite"
    budget = 1000 * WIDE_ENTRY
    limit = 200 * WIDE_ENTRY
    metrics = Metrics()
    cache = VectorCache(budget, metrics)
    cache.open(path, MODELS, pending_bytes=limit)
    locker = Locker(path)
    try:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for first in range(0, 10_000, 50):
            store_wide(cache, first, 50)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        # The cache's own entries (within 10% of the count) and what waits for the writer.
        assert held <= 1.1 * budget + limit, (held, budget, limit)
        assert cache.size_bytes <= budget
        assert cache._store is not None
        assert cache._store.pending_bytes <= limit
        assert drops(metrics, "queue_full") > 0
        assert hits(cache, ["text 9999"], WIDE) == [True]
    finally:
        locker.release()
    store_wide(cache, 20_000, 10)
    cache.flush()
    with sqlite3.connect(path) as db:
        stored = db.execute("SELECT key, vector FROM entries").fetchall()
    assert sum(entry_bytes(key, vector) for key, vector in stored) <= budget
    cache.close()


def test_the_default_queue_limit_is_a_share_of_the_budget() -> None:
    assert pending_limit(256 * 2**20) == 32 * 2**20
    assert pending_limit(10 * ENTRY) == 2**20


def test_a_failed_write_checkpoints_the_wal(tmp_path: Path) -> None:
    """A transaction that fills the disk (a 4 MiB tmpfs) fails and is counted; the WAL it
    grew is checkpointed and truncated, so the volume has its space back, and later
    writes land."""
    with tmpfs(tmp_path / "volume", "size=4m") as volume:
        path = volume / "cache.sqlite"
        metrics = Metrics()
        cache = VectorCache(64 * 2**20, metrics)
        cache.open(path, MODELS)
        store_wide(cache, 0, 100)
        cache.close()  # the last connection checkpoints: the rows are in the file itself
        cache = VectorCache(64 * 2**20, metrics)
        assert cache.open(path, MODELS) == 100
        free = shutil.disk_usage(volume).free
        with structlog.testing.capture_logs() as logs:
            store_wide(cache, 1000, 3000)  # ~5.4 MB in one transaction
            cache.flush()
        (failed,) = warnings(logs, "cache.write_failed")
        assert "full" in str(failed["reason"]), failed
        assert drops(metrics, "write_failed") == 3000
        wal = Path(f"{path}-wal")
        assert wal.stat().st_size == 0, "the WAL was checkpointed and truncated"
        assert shutil.disk_usage(volume).free >= free - 64 * 1024
        store_wide(cache, 5000, 10)
        cache.flush()
        cache.close()
        assert rows(path) == 110


# ---------------------------------------------------------------------- identity


def _model(directory: Path, weights: bytes, mtime_ns: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    file = directory / "model.safetensors"
    file.write_bytes(weights)
    os.utime(file, ns=(mtime_ns, mtime_ns))
    return directory


def test_retrained_weights_of_the_same_size_and_time_get_another_key(tmp_path: Path) -> None:
    """Weights replaced in place by others of the same size, with the old modification
    time (``cp -p`` of a reproducible build): the fingerprint, the identity and the
    persisted cache follow the bytes, so the old model's vectors are not served."""
    directory = tmp_path / "model"
    stamp = 1_700_000_000_000_000_000
    _model(directory, b"\x01" * 4096, stamp)
    old = model_fingerprint(directory)
    info = dataclasses.replace(INFO, path=directory)
    path = tmp_path / "cache.sqlite"
    cache = VectorCache(10 * ENTRY)
    cache.open(path, [("m", directory)])
    put(cache, ["a", "b"], info)
    cache.close()

    retrained = tmp_path / "retrained.safetensors"
    retrained.write_bytes(b"\x01" * 2048 + b"\x02" * 2048)
    os.utime(retrained, ns=(stamp, stamp))
    shutil.copy2(retrained, directory / "model.safetensors")  # cp -p
    weights = (directory / "model.safetensors").stat()
    assert (weights.st_size, weights.st_mtime_ns) == (4096, stamp)
    assert model_fingerprint(directory) != old

    again = VectorCache(10 * ENTRY)
    assert again.open(path, [("m", directory)]) == 0
    assert hits(again, ["a", "b"], info) == [False, False]
    again.close()

    # Fresh copies of the same bytes (another inode and change time) keep the key.
    twin = tmp_path / "twin"
    shutil.copytree(directory, twin)
    first = model_fingerprint(twin)
    shutil.rmtree(twin)
    shutil.copytree(directory, twin)
    assert model_fingerprint(twin) == first


def test_the_code_versions_are_part_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another kembed, torch, transformers or tokenizers version computes other vectors:
    each changes the identity, and a persisted file of other versions is not read back."""
    installed = dict(code_versions())
    assert set(installed) == {"kembed", "torch", "transformers", "tokenizers"}
    assert installed["torch"] != "none"
    identities = {VectorCache(ENTRY).identity("m", INFO)}
    for package in installed:
        changed = tuple((p, v + ".1" if p == package else v) for p, v in installed.items())
        monkeypatch.setattr(cache_module, "code_versions", lambda changed=changed: changed)
        identities.add(VectorCache(ENTRY).identity("m", INFO))
    assert len(identities) == 1 + len(installed)

    monkeypatch.undo()
    path = tmp_path / "cache.sqlite"
    _fill(path)
    upgraded = tuple((p, v + ".1" if p == "torch" else v) for p, v in installed.items())
    monkeypatch.setattr(cache_module, "code_versions", lambda: upgraded)
    cache = VectorCache(10 * ENTRY)
    assert cache.open(path, MODELS) == 0
    cache.close()
    assert rows(path) == 0


def test_the_fingerprint_is_computed_once_per_load(tmp_path: Path) -> None:
    """prepare() reads the files once; lookups afterwards use that fingerprint, even if the
    files change under the running worker (its model is the one it loaded)."""
    directory = _model(tmp_path / "model", b"\x01" * 64, 1)
    info = dataclasses.replace(INFO, path=directory)
    cache = VectorCache(10 * ENTRY)
    cache.prepare([directory])
    loaded = cache.identity("m", info)
    (directory / "model.safetensors").write_bytes(b"\x02" * 64)
    assert cache.identity("m", dataclasses.replace(info, dtype="bfloat16")) != loaded
    assert cache.fingerprint(directory) != model_fingerprint(directory)
    assert VectorCache(10 * ENTRY).identity("m", info) != loaded
