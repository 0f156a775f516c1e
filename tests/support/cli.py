"""Running the ``kembed`` command from this checkout in its own process, as an operator
runs it (``python -m kembed_cli``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from scripts.worker_process import ROOT

__all__ = ["run_kembed", "run_module", "without_kembed_env"]


def without_kembed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its KEMBED_* variables, plus ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KEMBED_")}
    return {**clean, **(extra or {})}


def run_kembed(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``kembed ARGS`` with ``env`` (this process's environment when None); its exit
    status, stdout and stderr as text, whatever the status."""
    return run_module("kembed_cli", *args, env=env, cwd=cwd, timeout=timeout)


def run_module(
    module: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` (a benchmark, the CLI) with this interpreter; its exit
    status, stdout and stderr as text, whatever the status."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
