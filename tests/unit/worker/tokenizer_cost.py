"""How much memory a tokenizer call takes, measured in a fresh process (its peak resident
set, ``VmHWM``, before and after the call; Linux), so that a test can hold a request's
tokenization cost to what the model can use of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

__all__ = ["peak_growth_mib"]

_PROGRAM = """
import json, sys
from worker.encoder.models import resolve_model_dir
from worker.tokenization import TextTokenizer

def peak_kib():
    # VmHWM: this process's own peak (ru_maxrss also counts the parent's, from before exec).
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


args = json.loads(sys.argv[1])
tokenizer = TextTokenizer.from_model_dir(
    resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2"), args["max_length"]
)
text = ("kafka partition offset commit " * (args["chars"] // 30 + 1))[: args["chars"]]
tokenizer.encode(["warm up"])
tokenizer.encode_pairs([("warm", "up")])
before = peak_kib()
if args["call"] == "pairs":
    out = tokenizer.encode_pairs([(text, f"document {i} about kafka") for i in range(args["n"])])
else:
    out = tokenizer.encode([text] * args["n"])
after = peak_kib()
assert all(piece.truncated for piece in out)
print(json.dumps((after - before) / 1024))
"""


def peak_growth_mib(call: str, chars: int, n: int, max_length: int = 256) -> float:
    """MiB the peak resident set grew by while one ``encode_pairs`` ("pairs": a query of
    ``chars`` characters with ``n`` short documents) or ``encode`` ("texts": ``n`` texts
    of ``chars`` characters) call ran."""
    args = json.dumps({"call": call, "chars": chars, "n": n, "max_length": max_length})
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PROGRAM), args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    return float(json.loads(done.stdout))
