"""The command line: ``python -m scripts.kafka_local start|stop|status|fetch``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from scripts.kafka_local.broker import LocalKafka
from scripts.kafka_local.layout import BOOTSTRAP_NAME, CONFIG_NAME, PID_NAME, default_data_dir
from scripts.kafka_local.maven import ensure_jars
from scripts.kafka_local.process import running_pid, terminate_pid


def _read_bootstrap(data_dir: Path) -> str:
    try:
        return (data_dir / BOOTSTRAP_NAME).read_text().strip()
    except FileNotFoundError:
        return "(unknown address)"


def _cmd_start(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    if running_pid(data_dir) is not None:
        print(_read_bootstrap(data_dir))
        return 0
    broker = LocalKafka(data_dir, port=args.port, detach=True)
    broker.start(timeout=args.timeout)
    print(broker.bootstrap_servers)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    pid = running_pid(data_dir)
    if pid is not None:
        terminate_pid(pid, data_dir / CONFIG_NAME, timeout=args.timeout)
    with contextlib.suppress(FileNotFoundError):
        (data_dir / PID_NAME).unlink()
    print("stopped")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    data_dir: Path = args.data_dir.resolve()
    if running_pid(data_dir) is None:
        print("stopped")
        return 1
    print(f"running {_read_bootstrap(data_dir)}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(ensure_jars())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.kafka_local",
        description="Run a local single-node Kafka (KRaft) broker for tests and local runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, help_text: str, handler: Callable[[argparse.Namespace], int]
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.set_defaults(handler=handler)
        return sub

    start = add("start", "start a detached broker and print its bootstrap address", _cmd_start)
    start.add_argument("--port", type=int, default=None, help="client port (default: free)")
    start.add_argument("--timeout", type=float, default=90, help="seconds to wait for readiness")
    stop = add("stop", "stop the broker running from the data dir", _cmd_stop)
    stop.add_argument("--timeout", type=float, default=30, help="seconds before SIGKILL")
    status = add("status", "print running/stopped (exit status 0/1)", _cmd_status)
    add("fetch", "only fetch the broker jars into the cache (CI cache warming)", _cmd_fetch)
    for sub in (start, stop, status):
        sub.add_argument(
            "--data-dir",
            type=Path,
            default=default_data_dir(),
            help="broker state, logs, pid file (default: %(default)s)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
