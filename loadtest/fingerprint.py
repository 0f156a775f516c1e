"""``python -m loadtest.fingerprint``: what fingerprinting a model directory costs.

The vector cache keys its entries by a fingerprint of the model directory's contents
(``worker.cache.model_fingerprint``: SHA-256 of every file), computed once per model load.
This writes a directory holding one file of ``--mib`` random bytes (the weights), reads it
once (so it is in the page cache, as a model the worker has just loaded is), then times
the fingerprint (``--rounds`` times, the best and the worst) and, for comparison, each of
hashlib's algorithms named in ``--algorithms`` over the same file. One thread, as the
worker computes it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import tempfile
import time
from pathlib import Path

from worker import cache

_CHUNK = 2**24


def write_weights(directory: Path, mib: int) -> Path:
    path = directory / "model.safetensors"
    with path.open("wb") as file:
        left = mib * 2**20
        while left:
            block = os.urandom(min(left, _CHUNK))
            file.write(block)
            left -= len(block)
    return path


def time_fingerprint(directory: Path, rounds: int) -> list[float]:
    cache.model_fingerprint(directory)  # the page cache holds the file from now on
    times = []
    for _ in range(rounds):
        cache._fingerprints.clear()
        started = time.perf_counter()
        cache.model_fingerprint(directory)
        times.append(time.perf_counter() - started)
    return times


def time_algorithm(path: Path, name: str, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        with path.open("rb") as file:
            started = time.perf_counter()
            hashlib.file_digest(file, name)
            best = min(best, time.perf_counter() - started)
    return best


def cpu_model() -> str:
    """The CPU's model name (what ``lscpu`` shows), or the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the weights file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithms", default="sha256,sha1,blake2b,sha512,md5")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kembed-fingerprint-") as folder:
        directory = Path(folder)
        weights = write_weights(directory, args.mib)
        size = weights.stat().st_size
        times = time_fingerprint(directory, args.rounds)
        print(f"cpu: {cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        print(
            f"model_fingerprint, {size / 2**20:.0f} MiB: best {min(times):.3f} s, "
            f"worst {max(times):.3f} s, {size / min(times) / 1e6:.0f} MB/s"
        )
        for name in filter(None, args.algorithms.split(",")):
            best = time_algorithm(weights, name, args.rounds)
            print(f"hashlib {name}: {size / best / 1e6:.0f} MB/s ({best:.3f} s)")


if __name__ == "__main__":
    main()
