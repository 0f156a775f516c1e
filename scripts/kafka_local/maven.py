"""The broker jars: fetched once per Kafka version with Maven (``scripts/kafka/pom.xml``)
into the cache outside the clone, ``${KEMBED_CACHE_DIR:-~/.cache/kembed}/kafka-<version>/libs``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from scripts.file_lock import file_lock
from scripts.kafka_local.layout import POM_FILE, kafka_version, libs_dir
from scripts.kafka_local.process import tail_text


def ensure_jars(version: str | None = None) -> Path:
    """Return the directory holding the broker jars, fetching them with Maven if missing.

    The jars are copied into a temporary directory next to the cache entry and renamed into
    place, so an interrupted download never looks like a complete cache. A file lock keeps
    parallel test processes from fetching the same version twice.
    """
    version = version or kafka_version()
    target = libs_dir(version)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / ".fetch.lock"):
        if target.is_dir():  # another process fetched it while we waited for the lock
            return target
        _remove_stale_fetches(target.parent)
        work = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
        try:
            _maven_copy_dependencies(version, work)
            os.rename(work / "libs", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def _remove_stale_fetches(version_dir: Path) -> None:
    # Only called under the fetch lock, so any leftover temp dir belongs to a dead fetch.
    for leftover in version_dir.glob(".fetch-*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def _maven_copy_dependencies(version: str, work: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            f"Maven (mvn) is needed once to fetch the Kafka {version} jars into "
            f"{libs_dir(version)}; install it or populate that directory with the broker jars."
        )
    # Maven runs on a copy of the pom so that it never writes a target/ dir into the clone.
    pom = work / "pom.xml"
    shutil.copyfile(POM_FILE, pom)
    command = [
        mvn, "-q", "-B", "-f", str(pom),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={work / 'libs'}",
        "-DincludeScope=runtime",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=work, capture_output=True, text=True, timeout=900, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise RuntimeError(f"fetching Kafka {version} jars failed:\n{tail_text(output)}")
