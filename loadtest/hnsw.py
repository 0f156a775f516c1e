"""Streaming into pgvector with the HNSW index present: the server's bound, and what the
index's parameters trade.

    python -m loadtest.hnsw [--texts 16384] [--queries 200] [--out DIR]

A local PostgreSQL with pgvector starts. ``--texts`` texts (the distinct STS-B test
sentences, then pairs of them joined, until there are enough) are embedded once with
sentence-transformers (all-MiniLM-L6-v2, fp32, normalized, as the worker computes them);
``--random`` uses random unit vectors instead (what ``loadtest.sink`` writes). Then, each on
a fresh table with its HNSW index, in batches of ``--batch-rows`` rows:

- **kembed**: ``PostgresStore.upsert`` (binary COPY into the staging table, then ``INSERT
  ... SELECT ... ON CONFLICT`` with the version rule), with the sink's default ``writers``
  and with others, and with other HNSW parameters (``m``, ``ef_construction``);
- **raw**: the least the server can do for the same rows: psycopg alone, a binary COPY
  straight into the indexed table (no staging table, no conflict check, no version rule),
  with as many connections in parallel; also into a ``halfvec`` column.

Each table is then searched for the ``--queries`` held-out texts' vectors (not in the
table) through the index, with pgvector's default ``hnsw.ef_search`` (40): recall@10
against the exact top 10 (numpy, inner product). Nothing is asserted; ``report.md`` and
``report.json`` go to ``--out`` (default ``loadtest/reports/hnsw-<time>``).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from pydantic import SecretStr

from loadtest.data import stsb_sentences
from loadtest.files import report_folder, save_report
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore, copy_data
from sink.registry import parse_target
from sink.rows import Row
from sink.settings import SinkSettings

__all__ = ["Config", "cached_model_vectors", "main", "texts_for"]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
WRITERS: int = SinkSettings.model_fields["writers"].default
M: int = SinkSettings.model_fields["hnsw_m"].default
EF: int = SinkSettings.model_fields["hnsw_ef_construction"].default


@dataclass(frozen=True)
class Config:
    label: str
    path: str  # "kembed" or "raw"
    writers: int
    m: int = M
    ef_construction: int = EF
    column: str = "vector"  # "vector" or "halfvec" (raw path only)


def configs(writers: int) -> list[Config]:
    return [
        Config("kembed, defaults", "kembed", writers),
        Config("raw COPY into the indexed table", "raw", writers),
        Config("kembed, 2 writers", "kembed", 2),
        Config("kembed, 1 writer", "kembed", 1),
        Config("raw COPY, 1 connection", "raw", 1),
        Config("raw COPY, halfvec column", "raw", writers, column="halfvec"),
        Config("kembed, ef_construction 32", "kembed", writers, ef_construction=32),
        Config("kembed, m 12, ef_construction 48", "kembed", writers, m=12, ef_construction=48),
        Config("kembed, m 8, ef_construction 32", "kembed", writers, m=8, ef_construction=32),
    ]


def texts_for(count: int) -> list[str]:
    """``count`` distinct texts: the STS-B test sentences, then pairs of them joined."""
    sentences = stsb_sentences("en")
    texts = list(sentences[:count])
    n = len(sentences)
    step = 1
    while len(texts) < count:
        for i in range(n):
            if len(texts) >= count:
                break
            texts.append(f"{sentences[i]} {sentences[(i + step * 7919) % n]}")
        step += 1
    return texts


def embed(texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    from worker.encoder.models import resolve_model_dir

    model = SentenceTransformer(str(resolve_model_dir(MODEL)), device="cpu")
    vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)


def cached_model_vectors(count: int) -> np.ndarray:
    """The model's vectors of ``texts_for(count)``, fp32, normalized; cached under
    ``loadtest/reports/.cache`` (embedding 51,200 texts takes minutes on 2 cores)."""
    cache = ROOT / "loadtest" / "reports" / ".cache" / f"stsb-minilm-{count}.npy"
    if cache.exists():
        return np.asarray(np.load(cache), dtype=np.float32)
    print(f"embedding {count:,} texts (sentence-transformers, fp32; cached in {cache}) ...")
    vectors = embed(texts_for(count))
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    return vectors


def random_vectors(count: int, dim: int = 384, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def _connect(pg: LocalPostgres) -> psycopg.Connection[Any]:
    return psycopg.connect(pg.dsn, password=pg.password, autocommit=True)


def _table(pg: LocalPostgres, name: str, config: Config, dim: int) -> None:
    """A fresh table for ``config``: for kembed's path, made by the sink's store as
    ``kembed sink`` makes it (its columns, documents table and HNSW index); for the raw
    bound, the same columns and index by hand, in ``config.column``'s type."""
    with _connect(pg) as conn:
        for table in (name, f"{name}_documents"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    if config.path == "kembed":
        store = _store(pg, name, config)
        store.open()
        try:
            store.create(dim, "inner_product")
        finally:
            store.close()
        return
    with _connect(pg) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {t} (id text PRIMARY KEY, vector {col}({dim}) NOT NULL, "
                "metadata jsonb NOT NULL DEFAULT '{{}}'::jsonb, model text NOT NULL, "
                "requested_ms bigint NOT NULL DEFAULT 0, "
                "updated_at timestamptz NOT NULL DEFAULT now(), "
                "doc_key text NOT NULL, chunk_index integer)"
            ).format(t=sql.Identifier(name), col=sql.SQL(config.column), dim=sql.Literal(dim))
        )
        conn.execute(
            sql.SQL(
                "CREATE INDEX ON {t} USING hnsw (vector {ops}) "
                "WITH (m = {m}, ef_construction = {ef})"
            ).format(
                t=sql.Identifier(name),
                ops=sql.SQL(f"{config.column}_ip_ops"),
                m=sql.Literal(config.m),
                ef=sql.Literal(config.ef_construction),
            )
        )


def _store(pg: LocalPostgres, name: str, config: Config) -> PostgresStore:
    return PostgresStore(
        parse_target(pg.dsn, SecretStr(pg.password)),
        name,
        writers=config.writers,
        hnsw_m=config.m,
        hnsw_ef_construction=config.ef_construction,
    )


def _write_kembed(pg: LocalPostgres, name: str, config: Config, batches: list[list[Row]]) -> None:
    store = _store(pg, name, config)
    store.open()
    try:
        for batch in batches:
            store.upsert(batch)
    finally:
        store.close()


def _write_raw(pg: LocalPostgres, name: str, config: Config, batches: list[list[Row]]) -> None:
    """psycopg alone: each batch split between ``writers`` connections, each a binary COPY
    of its part straight into the table, in parallel (threads: psycopg releases the GIL)."""
    conns = [_connect(pg) for _ in range(config.writers)]
    columns = "(id, vector, metadata, model, requested_ms, doc_key, chunk_index)"
    if config.column == "halfvec":  # the COPY data carries vectors; the server casts
        for conn in conns:
            conn.execute(
                "CREATE TEMPORARY TABLE raw_staging (id text, vector vector, metadata jsonb, "
                "model text, requested_ms bigint, doc_key text, chunk_index integer) "
                "ON COMMIT DELETE ROWS"
            )
        copy = sql.SQL("COPY {t} " + columns + " FROM STDIN WITH (FORMAT BINARY)").format(
            t=sql.Identifier("raw_staging")
        )
        move: sql.Composed | None = sql.SQL(
            "INSERT INTO {t} " + columns + " SELECT id, vector::halfvec, metadata, model, "
            "requested_ms, doc_key, chunk_index FROM raw_staging"
        ).format(t=sql.Identifier(name))
    else:
        copy = sql.SQL("COPY {t} " + columns + " FROM STDIN WITH (FORMAT BINARY)").format(
            t=sql.Identifier(name)
        )
        move = None

    def write(conn: psycopg.Connection[Any], rows: Sequence[Row]) -> None:
        with conn.transaction(), conn.cursor() as cursor:
            with cursor.copy(copy) as pipe:
                pipe.write(copy_data(rows, identity=True))
            if move is not None:
                cursor.execute(move)

    try:
        for batch in batches:
            size = -(-len(batch) // config.writers)
            threads = [
                threading.Thread(target=write, args=(conn, batch[k * size : (k + 1) * size]))
                for k, conn in enumerate(conns)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for conn in conns:
            conn.close()


def recall_at_10(
    pg: LocalPostgres, name: str, config: Config, vectors: np.ndarray, queries: np.ndarray
) -> float:
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    found = 0
    statement = sql.SQL("SELECT id FROM {t} ORDER BY vector <#> %s::{col} LIMIT 10").format(
        t=sql.Identifier(name), col=sql.SQL(config.column)
    )
    with _connect(pg) as conn:
        conn.execute("SET enable_seqscan = off")  # the index, as a served query uses it
        for query, truth in zip(queries, exact, strict=True):
            literal = "[" + ",".join(map(repr, query.tolist())) + "]"
            ids = {int(r[0][1:]) for r in conn.execute(statement, [literal]).fetchall()}
            found += len(ids & set(truth.tolist()))
    return found / (10 * len(queries))


def measure(
    pg: LocalPostgres, config: Config, vectors: np.ndarray, queries: np.ndarray, batch_rows: int
) -> dict[str, Any]:
    rows = [
        Row(id=f"d{i}", vector=v, metadata={"n": i}, model=MODEL, requested_ms=1)
        for i, v in enumerate(vectors)
    ]
    batches = [rows[i : i + batch_rows] for i in range(0, len(rows), batch_rows)]
    name = "hnsw_probe"
    _table(pg, name, config, vectors.shape[1])
    started = time.perf_counter()
    if config.path == "kembed":
        _write_kembed(pg, name, config, batches)
    else:
        _write_raw(pg, name, config, batches)
    seconds = time.perf_counter() - started
    recall = recall_at_10(pg, name, config, vectors, queries)
    figures = {
        **asdict(config),
        "rows": len(rows),
        "seconds": seconds,
        "rows_per_s": len(rows) / seconds,
        "recall_at_10": recall,
    }
    print(
        f"  {config.label}: {figures['rows_per_s']:,.0f} rows/s, recall@10 {recall:.3f}",
        flush=True,
    )
    return figures


def _report(figures: dict[str, Any]) -> str:
    runs = figures["runs"]

    def same(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["writers"], r["m"], r["ef_construction"], r["column"]

    raw = {same(r): r["rows_per_s"] for r in runs if r["path"] == "raw"}
    default = runs[0]
    lines = [
        "# Streaming into pgvector with the HNSW index present",
        "",
        f"`python -m loadtest.hnsw {' '.join(figures['argv'])}`".replace("  ", " "),
        "",
        f"{figures['rows']:,} rows ({figures['vectors']}), {figures['queries']} held-out "
        f"queries, batches of {figures['batch_rows']:,} rows; PostgreSQL + pgvector "
        f"{figures['pgvector']}, {os.cpu_count()} CPUs; recall@10 through the index at "
        "hnsw.ef_search 40 against the exact top 10.",
        "",
        "| write | connections | m | ef_construction | column | rows/s | vs raw, same "
        "connections and index | recall@10 |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in runs:
        bound = raw.get(same(r))
        ratio = f"{r['rows_per_s'] / bound:.2f}" if bound and r["path"] == "kembed" else "-"
        lines.append(
            f"| {r['label']} | {r['writers']} | {r['m']} | {r['ef_construction']} "
            f"| {r['column']} | {r['rows_per_s']:,.0f} | {ratio} | {r['recall_at_10']:.3f} |"
        )
    bound = raw.get(same(default))
    if bound:
        lines += [
            "",
            f"- kembed with its defaults writes at **{default['rows_per_s'] / bound:.2f}x** "
            f"the raw bound (psycopg COPY straight into the indexed table, "
            f"{default['writers']} connections, {bound:,.0f} rows/s).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.hnsw", description=__doc__)
    parser.add_argument("--texts", type=int, default=16384, help="rows written per table")
    parser.add_argument("--queries", type=int, default=200, help="held-out query texts")
    parser.add_argument("--batch-rows", type=int, default=2048, help="rows per write")
    parser.add_argument("--writers", type=int, default=WRITERS, help="the sink's writers")
    parser.add_argument("--random", action="store_true", help="random unit vectors")
    parser.add_argument(
        "--only", type=int, nargs="*", default=None, help="run only these configs (indexes)"
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    out = report_folder(args.out, "hnsw")
    total = args.texts + args.queries
    everything = random_vectors(total) if args.random else cached_model_vectors(total)
    vectors, queries = everything[: args.texts], everything[args.texts :]
    chosen = configs(args.writers)
    if args.only is not None:
        chosen = [chosen[i] for i in args.only]
    figures: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "rows": args.texts,
        "queries": args.queries,
        "batch_rows": args.batch_rows,
        "vectors": "random unit vectors" if args.random else f"{MODEL} on STS-B texts",
        "runs": [],
    }
    with LocalPostgres() as pg:
        with _connect(pg) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname='vector'")
            figures["pgvector"] = (version.fetchone() or ("?",))[0]
        for config in chosen:
            figures["runs"].append(measure(pg, config, vectors, queries, args.batch_rows))
    print(f"report: {save_report(out, figures, _report(figures))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
