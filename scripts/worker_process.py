"""A real ``kembed worker`` process with its JSON log captured, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def variables(prefix: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """``settings`` as environment variables: ``prefix`` + the upper-cased name."""
    return {f"{prefix}{name.upper()}": str(value) for name, value in settings.items()}


class WorkerProcess:
    """A real ``kembed worker`` process, with its JSON log lines captured to a file."""

    def __init__(
        self,
        bootstrap_servers: str,
        log_path: Path,
        preexec_fn: Callable[[], None] | None = None,
        module: str = "kembed_cli",
        **settings: Any,
    ) -> None:
        """``settings`` become KEMBED_* variables; ``preexec_fn`` runs in the child before
        the worker starts (to change what the process may do); ``module`` is what
        ``python -m`` runs: ``kembed_cli`` (as ``kembed worker``), or a benchmark's
        instrumented worker (``loadtest.ceiling_worker``)."""
        env = {
            "KEMBED_LOG_FORMAT": "json",
            "HF_HUB_OFFLINE": "1",
            # Several workers may run side by side: each takes a free port for its HTTP
            # endpoint unless told otherwise (see http_url).
            "KEMBED_HTTP_PORT": "0",
            # Tests and benchmarks send the same texts again and again: without the vector
            # cache they measure the encoder; those about the cache turn it on.
            "KEMBED_CACHE_BYTES": "0",
            **variables("KEMBED_", settings),
        }
        args = [module, *(["worker"] if module == "kembed_cli" else [])]
        self._run(args, bootstrap_servers, log_path, env, preexec_fn)

    @classmethod
    def serving(
        cls, bootstrap_servers: str, log_path: Path, topics: tuple[str, str], **settings: Any
    ) -> WorkerProcess:
        """A ready fp32 worker that reads only ``topics[0]`` (no bulk topic) and answers on
        ``topics[1]``, in a consumer group of its own (``<requests topic>.group``) unless
        ``settings`` name one."""
        requests, results = topics
        options: dict[str, Any] = {
            "dtype": "float32",
            "bulk_topic": "",
            "group_id": f"{requests}.group",
            **settings,
        }
        process = cls(
            bootstrap_servers, log_path, requests_topic=requests, results_topic=results, **options
        )
        process.wait_ready()
        return process

    def _run(
        self,
        args: Sequence[str],
        bootstrap_servers: str,
        log_path: Path,
        env: Mapping[str, str],
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        """Start ``python -m <args>`` in the repository root, with this environment and
        ``env`` over it, its output appended to ``log_path``."""
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env={**os.environ, "KEMBED_BOOTSTRAP_SERVERS": bootstrap_servers, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )

    def events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                events.append({"event": "<not json>", "line": line})
        return events

    def wait_for(self, event: str, timeout: float = 120.0, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in self.events():
                if item.get("event") == event and all(item.get(k) == v for k, v in fields.items()):
                    return item
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise AssertionError(f"worker never logged {event!r} (exit {self.process.poll()}):\n{tail}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Ready = model warmed up and at least one partition assigned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assigned = [e for e in self.events() if e.get("event") == "partitions.assigned"]
            if any(e.get("partitions") for e in assigned):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.wait_for("partitions.assigned", timeout=0)

    def wait_tuned(self, timeout: float = 600.0) -> None:
        """Wait until the worker serves the variant its start-up tuning chose (at once when
        it does not tune): benchmarks measure the steady state, not the tuning window."""
        self.wait_for("worker.started", timeout=timeout)
        # start_tuning runs before worker.started is logged: a tuning model is visible now.
        if any(e.get("event") == "encoder.tuning_started" for e in self.events()) or (
            self._tuning_now()
        ):
            self.wait_for("encoder.tuned", timeout=timeout)

    def _tuning_now(self) -> bool:
        import urllib.request

        with urllib.request.urlopen(f"{self.http_url}/info", timeout=10) as response:
            info = json.loads(response.read())
        return any((m.get("tuning") or {}).get("phase") == "tuning" for m in info["models"])

    @property
    def http_url(self) -> str:
        """Base URL of the worker's HTTP endpoint (waits for it to be listening)."""
        started = self.wait_for("http.started", timeout=60)
        return f"http://127.0.0.1:{started['port']}"

    def stop(self, timeout: float = 60.0) -> int:
        stop_process(self.process, timeout)
        self._log.close()
        return self.process.returncode


def stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if ``process`` has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
