"""How a process ends: exit statuses, and fatal errors as one structured log event.

Whatever ends a worker (or a sink) with an error ends it with one log event in the log's
own format (JSON in production), never with a raw traceback on stderr: the traceback is a
field of that event. :func:`log_fatal` writes the event; :func:`install_hooks` routes what
would otherwise bypass the log (an exception escaping the main thread or another thread,
an unraisable exception in a finalizer) to it; :func:`loop_exception_handler` does the same
for the asyncio loop ("Task exception was never retrieved").

The error's text and traceback hold exception messages. The process's own secrets (the
Kafka passwords of its settings) are masked in both; request text never reaches an
exception message the worker raises (it reports ids, counts and lengths only).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from collections.abc import Iterable
from enum import IntEnum
from types import TracebackType
from typing import Any

import structlog
from pydantic import BaseModel, SecretBytes, SecretStr

__all__ = [
    "ExitCode",
    "error_fields",
    "install_hooks",
    "log_fatal",
    "loop_exception_handler",
    "secrets_of",
]

log = structlog.get_logger("kembed.fatal")


class ExitCode(IntEnum):
    """The worker's exit statuses (docs/operations.md, "Exit statuses")."""

    OK = 0
    """Stopped by SIGTERM or SIGINT after draining."""
    FAILED = 1
    """A fatal error at run time: Kafka refused the login or a right, a transaction failed,
    results stayed unpublishable, or any unexpected error (``worker.fatal``)."""
    STARTUP = 2
    """Unusable configuration: invalid settings, a model that cannot be loaded."""
    QUALITY_GATE = 3
    """The quality gate failed."""
    INTERRUPTED = 130
    """SIGINT (Ctrl-C) before the worker was serving."""


_secrets: tuple[str, ...] = ()


def secrets_of(*settings: BaseModel) -> tuple[str, ...]:
    """The secret values held by settings objects (their SecretStr and SecretBytes fields)."""
    found = []
    for model in settings:
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, SecretStr):
                found.append(value.get_secret_value())
            elif isinstance(value, SecretBytes):
                found.append(value.get_secret_value().decode("utf-8", "replace"))
    return tuple(secret for secret in found if secret)


def _scrub(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, "***")
    return text


def _type_name(error: BaseException) -> str:
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def error_fields(error: BaseException) -> dict[str, str]:
    """``error_type``, ``error`` (the message) and ``traceback`` (the formatted traceback,
    chained causes included), with the process's secrets masked."""
    return {
        "error_type": _type_name(error),
        "error": _scrub(str(error)),
        "traceback": _scrub("".join(traceback.format_exception(error)).rstrip("\n")),
    }


def log_fatal(error: BaseException, event: str = "worker.fatal", **fields: Any) -> None:
    """Log the one event that ends the process with ``error``."""
    log.critical(event, **error_fields(error), **fields)


def install_hooks(secrets: Iterable[str] = ()) -> None:
    """Route exceptions that would print a raw traceback to the log instead, and mask
    ``secrets`` in every error this module logs. Call after logging is configured."""
    global _secrets
    _secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    sys.unraisablehook = _unraisablehook


def _excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    log_fatal(error.with_traceback(tb), "process.fatal", exit_code=int(ExitCode.FAILED))


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        return
    thread = args.thread.name if args.thread is not None else None
    log.error("thread.failed", thread=thread, **error_fields(args.exc_value))


def _unraisablehook(args: Any) -> None:
    error: BaseException | None = args.exc_value
    if error is None:
        return
    log.error(
        "unraisable_error",
        message=args.err_msg or "exception ignored",
        **error_fields(error),
    )


def loop_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """For ``loop.set_exception_handler``: what asyncio would print, as one log event."""
    error = context.get("exception")
    message = str(context.get("message") or "unhandled exception in the event loop")
    if isinstance(error, BaseException):
        log.error("asyncio.error", message=message, **error_fields(error))
    else:
        log.error("asyncio.error", message=message)
