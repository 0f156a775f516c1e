"""``python -m loadtest.fingerprint`` on a small file: it times the cache's fingerprint
and the hash algorithms it is compared with."""

from __future__ import annotations

import pytest

from loadtest.fingerprint import main


def test_the_benchmark_times_the_fingerprint_and_each_algorithm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--mib", "2", "--rounds", "1", "--algorithms", "sha256,blake2b"])
    out = capsys.readouterr().out
    assert "model_fingerprint, 2 MiB: best" in out
    assert "hashlib sha256:" in out
    assert "hashlib blake2b:" in out
