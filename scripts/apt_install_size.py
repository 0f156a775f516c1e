"""Estimate what ``apt-get install --no-install-recommends PACKAGE...`` adds to a slim Debian
image, from the package lists of the Debian machine it runs on (``apt-cache dumpavail``),
without installing anything or needing a container engine.

The estimate: the packages in the dependency closure (Depends and Pre-Depends, first
alternative, no Recommends) of the requested ones, minus those of the base: every
Essential or Priority: required package and its closure (what a minimal Debian holds), plus
the closure of the ``--base`` packages (what the base image adds, e.g. python:slim's
ca-certificates and libssl). Their ``Installed-Size`` fields are summed: unpacked size on
disk, before any layer compression. Use it on the Debian release of the image's base.

    python scripts/apt_install_size.py g++
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterable

# What python:3.11-slim installs on top of a minimal Debian (its runtime libraries).
SLIM_PYTHON_BASE = (
    "ca-certificates",
    "netbase",
    "tzdata",
    "libssl3",
    "libsqlite3-0",
    "libncursesw6",
    "libreadline8",
)

_FIELD = re.compile(r"([A-Za-z-]+): (.*)")


def packages() -> dict[str, dict[str, str]]:
    """Every available package's fields (the first stanza of each name)."""
    dump = subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, dict[str, str]] = {}
    for stanza in dump.split("\n\n"):
        fields = {m[1]: m[2] for m in map(_FIELD.match, stanza.splitlines()) if m}
        if "Package" in fields:
            found.setdefault(fields["Package"], fields)
    return found


def closure(available: dict[str, dict[str, str]], start: Iterable[str]) -> set[str]:
    """The packages and everything they depend on (first alternative of each)."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in seen or name not in available:
            continue
        seen.add(name)
        fields = available[name]
        for dependency in f"{fields.get('Pre-Depends', '')},{fields.get('Depends', '')}".split(","):
            first = dependency.split("|")[0].strip()
            if first:
                todo.append(first.split()[0].split(":")[0])
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="+", help="what would be installed")
    parser.add_argument(
        "--base",
        nargs="*",
        default=list(SLIM_PYTHON_BASE),
        help="packages the base image adds to a minimal Debian (default: python:slim's)",
    )
    args = parser.parse_args()
    available = packages()
    minimal = [
        name
        for name, fields in available.items()
        if fields.get("Essential") == "yes" or fields.get("Priority") == "required"
    ]
    base = closure(available, minimal) | closure(available, args.base)
    added = sorted(closure(available, args.package) - base)
    sizes = {name: int(available[name].get("Installed-Size", "0")) for name in added}
    for name in sorted(added, key=sizes.__getitem__, reverse=True):
        print(f"{sizes[name] / 1024:8.1f} MiB  {name}")
    print(f"{sum(sizes.values()) / 1024:8.1f} MiB  in {len(added)} packages (Installed-Size)")


if __name__ == "__main__":
    main()
