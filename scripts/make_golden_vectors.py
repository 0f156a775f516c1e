"""Writes the golden test vectors of wire format v1 (schemas/vectors/v1/*.json).

Run only when the wire format changes on purpose: the vectors are the contract that every
client, in every language, is tested against. Valid messages are produced by hand-built
maps in canonical order (not by the codec under test), so the codec is checked against
them, not the other way round.

    python -m scripts.make_golden_vectors
"""

from __future__ import annotations

import json
from pathlib import Path

from scripts.golden.invalid import invalid_cases, routing_cases
from scripts.golden.valid import valid_cases

OUT = Path(__file__).resolve().parents[1] / "schemas" / "vectors" / "v1"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    files = (("valid", valid_cases()), ("invalid", invalid_cases()), ("routing", routing_cases()))
    for name, cases in files:
        text = json.dumps(cases, indent=2, ensure_ascii=False) + "\n"
        (OUT / f"{name}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
