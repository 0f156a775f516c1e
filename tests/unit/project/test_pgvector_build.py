"""The pure parts of the test PostgreSQL's pgvector build: which Debian archive the
machine's apt uses, and the PostgreSQL 18 edits of the source (the build itself, the
emulator and the server on it: tests/integration/test_pgvector_portable.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.pgvector_build import BuildError, _archive, apply_pg18_edits

_DEB822 = """\
Types: deb
URIs: http://security.mirror.test/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src-only.mirror.test/debian
Suites: bookworm
Components: main

Enabled: no
Types: deb
URIs: http://disabled.mirror.test/debian
Suites: bookworm
Components: main

Types: deb
# a comment inside a stanza
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /etc/keys/debian.gpg
"""


def _etc(tmp_path: Path, sources: str = "", one_line: str = "") -> Path:
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    if sources:
        (parts / "debian.sources").write_text(sources, encoding="utf-8")
    if one_line:
        (tmp_path / "sources.list").write_text(one_line, encoding="utf-8")
    return tmp_path


def test_the_archive_is_the_deb822_entry_of_the_release(tmp_path: Path) -> None:
    etc = _etc(tmp_path, _DEB822)
    assert _archive(etc, "bookworm") == "[signed-by=/etc/keys/debian.gpg] http://mirror.test/debian"


def test_the_archive_is_read_from_a_one_line_sources_list(tmp_path: Path) -> None:
    etc = _etc(
        tmp_path,
        one_line="# deb http://old.mirror.test/debian bookworm main\n"
        "deb-src http://src.mirror.test/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/etc/keys/k.gpg] http://one.mirror.test/debian bookworm main\n",
    )
    assert _archive(etc, "bookworm") == "[signed-by=/etc/keys/k.gpg] http://one.mirror.test/debian"


def test_no_archive_for_the_release_is_a_clear_error(tmp_path: Path) -> None:
    etc = _etc(tmp_path, _DEB822)
    with pytest.raises(BuildError, match="no Debian archive for the release trixie"):
        _archive(etc, "trixie")


def _tree(tmp_path: Path, hnsw_calls: int = 3) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "hnswvacuum.c").write_text("\tvacuum_delay_point();\n" * hnsw_calls, encoding="utf-8")
    (src / "ivfvacuum.c").write_text("x;\n\t\tvacuum_delay_point();\n", encoding="utf-8")
    (src / "ivfbuild.c").write_text(
        "f(buildstate->tupdesc->attrs[0].atttypid, -1, 0);\n", encoding="utf-8"
    )
    return tmp_path


def test_the_pg18_edits_adapt_every_call(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    apply_pg18_edits(tree, "0.8.0-1")
    assert (tree / "src/hnswvacuum.c").read_text() == "\tvacuum_delay_point(false);\n" * 3
    assert (tree / "src/ivfvacuum.c").read_text() == "x;\n\t\tvacuum_delay_point(false);\n"
    assert (tree / "src/ivfbuild.c").read_text() == (
        "f(TupleDescAttr(buildstate->tupdesc, 0)->atttypid, -1, 0);\n"
    )


def test_a_source_the_edits_do_not_fit_is_refused_untouched(tmp_path: Path) -> None:
    tree = _tree(tmp_path, hnsw_calls=4)  # another version: one call more
    before = {path: path.read_text() for path in (tree / "src").iterdir()}
    with pytest.raises(BuildError, match=r"pgvector 0\.9\.9-1: src/hnswvacuum\.c does not hold"):
        apply_pg18_edits(tree, "0.9.9-1")
    assert {path: path.read_text() for path in (tree / "src").iterdir()} == before
