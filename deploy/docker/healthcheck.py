#!/usr/local/bin/python3
"""Container health check of a kembed service: GET a path on its own HTTP port.

    kembed-healthcheck PATH PORT_VARIABLE DEFAULT_PORT

asks 127.0.0.1 on the port named by the environment variable PORT_VARIABLE (the role's
setting, e.g. KEMBED_HTTP_PORT), or DEFAULT_PORT when that is unset, and exits 0 when the
answer is 200, else 1 with one line on stderr (Docker reserves exit status 2, so
misuse exits 1 too). The standard library only: the images have
no curl or wget, and the check must not depend on the role's virtual environment.
"""

from __future__ import annotations

import http.client
import os
import sys

TIMEOUT_S = 4.0


def check(path: str, port: int, host: str = "127.0.0.1") -> str | None:
    """None when ``GET path`` answers 200, else why not."""
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", path)
        status = connection.getresponse().status
    except OSError as exc:
        return f"GET {path} on port {port}: {exc}"
    finally:
        connection.close()
    return None if status == 200 else f"GET {path} on port {port}: status {status}"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[0].startswith("/"):
        print("usage: kembed-healthcheck PATH PORT_VARIABLE DEFAULT_PORT", file=sys.stderr)
        return 1
    path, variable, default = argv
    raw = os.environ.get(variable, "").strip() or default
    try:
        port = int(raw)
    except ValueError:
        print(f"{variable}={raw!r} is not a port", file=sys.stderr)
        return 1
    problem = check(path, port)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
