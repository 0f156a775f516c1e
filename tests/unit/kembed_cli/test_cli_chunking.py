"""Unit tests for the chunking flags of ``kembed embed`` (kembed_cli.common's
add_chunking_flags and chunking_from): parsed into a Chunking, refused before connecting
when they make no window."""

from __future__ import annotations

import pytest

from kembed_cli.common import chunking_from
from kembed_cli.main import build_parser, main
from schemas import Chunking


def test_flags_make_a_chunking() -> None:
    parser = build_parser("embed")
    args = parser.parse_args(["embed", "--chunk-tokens", "64", "--chunk-overlap", "8", "t"])
    assert chunking_from(args) == Chunking(64, 8)
    assert args.chunk_pooling == "none"
    plain = parser.parse_args(["embed", "t"])
    assert chunking_from(plain) is None
    assert chunking_from(parser.parse_args(["embed", "--chunk-tokens", "64", "t"])) == Chunking(64)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--chunk-overlap", "8"], "--chunk-overlap needs --chunk-tokens"),
        (["--chunk-tokens", "8", "--chunk-overlap", "8"], "must be 0..7"),
        (["--chunk-pooling", "mean"], "--chunk-pooling needs --chunk-tokens"),
    ],
)
def test_flags_that_make_no_window_are_refused(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["embed", "--bootstrap-servers", "localhost:9", *flags, "text"]) == 2
    assert words in capsys.readouterr().err


def test_chunk_tokens_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["embed", "--chunk-tokens", "0", "text"])
    assert "must be a positive integer" in capsys.readouterr().err
