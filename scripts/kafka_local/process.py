"""The broker's JVM as a process: the java command line, its ports, its pid file, stopping
it, and the tails of its logs for error messages."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from scripts.kafka_local.layout import BOOTSTRAP_NAME, CONFIG_NAME, HOST, LOG4J_CONFIG, PID_NAME

DEFAULT_HEAP = "512m"


def java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("java (17 or newer) is needed to run the local Kafka broker")
    return found


def java_command(libs: Path, data_dir: Path, main_class: str, *args: str) -> list[str]:
    heap = os.environ.get("KEMBED_KAFKA_HEAP") or DEFAULT_HEAP
    return [
        java(),
        f"-Xmx{heap}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        f"-Dkafka.logs.dir={data_dir}",
        "-cp",
        f"{libs}{os.sep}*",
        main_class,
        *args,
    ]


def tail_text(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tail_file(path: Path, lines: int = 40) -> str:
    try:
        return tail_text(path.read_text(errors="replace"), lines)
    except FileNotFoundError:
        return "(missing)"


def write_text_atomic(path: Path, text: str) -> None:
    # Readers (the CLI, other shells) must never see a half-written pid or address.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- ports -----------------------------------------------------------------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # The JVM binds with SO_REUSEADDR, so TIME_WAIT leftovers of a stopped broker are fine.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def previous_port(data_dir: Path) -> int | None:
    """The client port a former broker in ``data_dir`` used, if it is free again."""
    try:
        port = int((data_dir / BOOTSTRAP_NAME).read_text().strip().rpartition(":")[2])
    except (FileNotFoundError, ValueError):
        return None
    return port if _port_is_free(port) else None


def port_accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


# -- pids ------------------------------------------------------------------------------------


def _pid_runs_broker(pid: int, config: Path) -> bool:
    """Whether ``pid`` is alive and is the broker of ``config`` (guards against pid reuse)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the pid file
    # A zombie has an empty cmdline, so it counts as stopped.
    return str(config).encode() in args


def running_pid(data_dir: Path) -> int | None:
    """The pid of the broker running from ``data_dir`` according to its pid file, if any."""
    try:
        pid = int((data_dir / PID_NAME).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _pid_runs_broker(pid, data_dir / CONFIG_NAME) else None


def terminate_pid(pid: int, config: Path, timeout: float = 30) -> None:
    """SIGTERM a broker that is not our child, SIGKILL it if it outlives ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_runs_broker(pid, config):
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10  # SIGKILL cannot be ignored; just wait for it
        time.sleep(0.1)


def terminate_child(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
