"""The sink's ingestion benchmark: how fast results already on Kafka reach pgvector.

    python -m loadtest.sink [--results 200] [--rows 256] [--dim 384] [--out DIR]

A local PostgreSQL with pgvector and a local broker start. ``--results`` results of
``--rows`` float32 unit vectors each (with keys, per-document metadata and requested_ms,
encoded by the schemas' codec as the worker encodes them) are generated, then:

1. **Breakdown, in process** (no Kafka): the time to decode the messages, to build rows
   from them (``sink.rows``) and to encode them for the binary COPY, for all of them. The
   first ``--baseline-results`` results (batches of ``--batch-results`` results) are
   written into a table with its HNSW index three ways: by the former write path
   (executemany of vector text literals), and by ``PostgresStore.upsert`` with one writer
   and with ``--writers``. All the results are then written in bulk mode (no index, the
   ``index=after`` store), followed by the one index build with the build settings.
2. **End to end**: the results are pre-published on a topic, a ``kembed sink`` process
   (what users run) starts against a fresh table, and the database is polled until the
   last row is there: rows/s from the sink's start, and from its first row to its last;
   once with ``index=streaming`` (the default) and once with ``index=after`` (bulk mode,
   ``index_build_idle_s=1``), then until its index exists.

Nothing is asserted: the report gives figures and ratios (``report.md`` and
``report.json`` in ``--out``, default ``loadtest/reports/sink-<time>``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psycopg
from aiokafka import AIOKafkaProducer
from psycopg import sql
from psycopg.types.json import Jsonb
from pydantic import SecretStr

from loadtest.files import report_folder, save_report
from loadtest.hnsw import cached_model_vectors
from schemas import EmbedResult, decode_result, encode_result
from schemas.headers import LANE, LANE_BULK
from scripts.kafka_local import LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from sink.postgres import PostgresStore, copy_data
from sink.registry import parse_target
from sink.rows import Row, RowsOf, newest, rows_of
from sink.settings import SinkSettings

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
BULK_LANE = [(LANE, LANE_BULK.encode())]
TOPIC = "loadtest.sink.results"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
BUILD_MEMORY_MB = SinkSettings.model_fields["index_build_memory_mb"].default
BUILD_WORKERS = SinkSettings.model_fields["index_build_workers"].default
BUILD_SETTINGS = {
    "maintenance_work_mem": f"{BUILD_MEMORY_MB}MB",
    "max_parallel_maintenance_workers": str(BUILD_WORKERS),
}


def make_results(
    results: int, rows: int, dim: int, seed: int = 0, vectors: np.ndarray | None = None
) -> list[bytes]:
    """``results`` encoded results of ``rows`` unit vectors each, keys ``doc-<n>``: random
    unit vectors (the hardest case for an HNSW index: no structure), or rows of
    ``vectors`` (the model's, of real texts) in order."""
    rng = np.random.default_rng(seed)
    now_ms = int(time.time() * 1000)
    out = []
    for r in range(results):
        if vectors is not None:
            part = vectors[r * rows : (r + 1) * rows]
            dim = part.shape[1]
        else:
            part = rng.standard_normal((rows, dim)).astype(np.float32)
            part /= np.linalg.norm(part, axis=1, keepdims=True)
        keys = tuple(f"doc-{r * rows + i}" for i in range(rows))
        docs = [{"source": "loadtest", "n": r * rows + i} for i in range(rows)]
        out.append(
            encode_result(
                EmbedResult(
                    id=f"req-{r}",
                    model=MODEL,
                    dim=dim,
                    vectors=part.astype("<f4").tobytes(),
                    tokens=(12,) * rows,
                    keys=keys,
                    meta={"corpus": "loadtest", "docs": docs},
                    requested_ms=now_ms + r,
                )
            )
        )
    return out


# ------------------------------------------------------------------ in process


def _connect(pg: LocalPostgres) -> psycopg.Connection[Any]:
    return psycopg.connect(pg.dsn, password=pg.password, autocommit=True)


def _store(
    pg: LocalPostgres,
    table: str,
    writers: int = 1,
    index: Literal["streaming", "after"] = "streaming",
) -> PostgresStore:
    store = PostgresStore(
        parse_target(pg.dsn, SecretStr(pg.password)),
        table,
        writers=writers,
        index=index,
        index_build_memory_mb=BUILD_MEMORY_MB,
        index_build_workers=BUILD_WORKERS,
    )
    store.open()
    return store


def former_upsert(conn: psycopg.Connection[Any], table: str, rows: Sequence[Row]) -> None:
    """The write path before binary COPY, kept here as the baseline."""
    statement = sql.SQL(
        "INSERT INTO {table} (id, vector, metadata, model, requested_ms, updated_at, doc_key) "
        "VALUES (%s, %s::vector, %s, %s, %s, now(), %s) "
        "ON CONFLICT (id) DO UPDATE SET vector = EXCLUDED.vector, "
        "metadata = EXCLUDED.metadata, model = EXCLUDED.model, "
        "requested_ms = EXCLUDED.requested_ms, updated_at = EXCLUDED.updated_at "
        "WHERE {table}.requested_ms <= EXCLUDED.requested_ms"
    ).format(table=sql.Identifier(table))
    params = [
        (
            row.id,
            "[" + ",".join(map(repr, row.dense.tolist())) + "]",
            Jsonb(row.metadata),
            row.model,
            row.requested_ms,
            row.document,
        )
        for row in rows
    ]
    with conn.transaction(), conn.cursor() as cursor:
        cursor.executemany(statement, params)


def breakdown(
    pg: LocalPostgres,
    messages: list[bytes],
    dim: int,
    batch_results: int,
    baseline_results: int,
    writers: int,
) -> dict[str, Any]:
    started = time.perf_counter()
    for value in messages:
        decode_result(value)
    decode_s = time.perf_counter() - started
    started = time.perf_counter()
    decoded = [rows_of(value) for value in messages]
    rows_s = time.perf_counter() - started - decode_s  # rows_of decodes too
    results = [r for r in decoded if isinstance(r, RowsOf)]
    batches = [
        newest(row for result in results[i : i + batch_results] for row in result.rows)
        for i in range(0, len(results), batch_results)
    ]
    total_rows = sum(len(batch) for batch in batches)
    started = time.perf_counter()
    for batch in batches:
        copy_data(batch)
    encode_s = time.perf_counter() - started
    out: dict[str, Any] = {
        "rows": total_rows,
        "batch_rows": len(batches[0]),
        "decode_s": decode_s,
        "rows_s": rows_s,
        "copy_encode_s": encode_s,
        "writers": writers,
    }
    # The former path and the COPY path with one writer: the first baseline_results
    # results, the same batches, index present.
    subset = [
        newest(row for result in results[i : i + batch_results] for row in result.rows)
        for i in range(0, min(baseline_results, len(results)), batch_results)
    ]
    subset_rows = sum(len(batch) for batch in subset)
    store = _store(pg, "bench_former")
    try:
        store.create(dim, "inner_product")
    finally:
        store.close()
    with _connect(pg) as conn:
        started = time.perf_counter()
        for batch in subset:
            former_upsert(conn, "bench_former", batch)
        seconds = time.perf_counter() - started
    out["former_with_index"] = {
        "rows": subset_rows,
        "write_s": seconds,
        "rows_per_s": subset_rows / seconds,
    }
    print(f"  former path (executemany, text literals): {subset_rows / seconds:,.0f} rows/s")
    runs: tuple[tuple[str, list[list[Row]], Literal["streaming", "after"], int], ...] = (
        ("with_index_1_writer", subset, "streaming", 1),
        ("with_index", subset, "streaming", writers),
        ("without_index", batches, "after", writers),
    )
    for name, written, index, count in runs:
        store = _store(pg, f"bench_{name}", count, index)
        rows = sum(len(batch) for batch in written)
        try:
            store.create(dim, "inner_product")
            started = time.perf_counter()
            for batch in written:
                store.upsert(batch)
            seconds = time.perf_counter() - started
            if index == "after":
                out["index_build_s"] = store.build_pending_index()
                out["index_build_settings"] = BUILD_SETTINGS
        finally:
            store.close()
        out[name] = {"rows": rows, "write_s": seconds, "rows_per_s": rows / seconds}
        print(
            f"  COPY path, {name.replace('_', ' ')}, {count} writer(s): "
            f"{rows / seconds:,.0f} rows/s"
        )
    print(f"  index build after the load: {out['index_build_s']:.1f} s")
    return out


# ------------------------------------------------------------------ end to end


async def _publish(bootstrap: str, messages: list[bytes]) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_request_size=8 * 1024 * 1024, linger_ms=5
    )
    await producer.start()
    try:
        sent = [
            # stamped as a worker stamps results of bulk requests: the only ones a sink writes
            await producer.send(TOPIC, value, key=f"req-{i}".encode(), headers=BULK_LANE)
            for i, value in enumerate(messages)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def end_to_end(
    kafka: LocalKafka,
    pg: LocalPostgres,
    expected_rows: int,
    out: Path,
    timeout_s: float,
    writers: int,
    index: Literal["streaming", "after"],
) -> dict[str, Any]:
    """Start a ``kembed sink`` on the pre-published results and a fresh table; poll the
    table until the last row is there (and, in bulk mode, until its index exists)."""
    table = f"bench_e2e_{index}"
    env = {
        **os.environ,
        "KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "KEMBED_SINK_TARGET": pg.dsn,
        "KEMBED_SINK_TARGET_PASSWORD": pg.password,
        "KEMBED_SINK_TABLE": table,
        "KEMBED_SINK_INDEX": index,
        "KEMBED_SINK_INDEX_BUILD_IDLE_S": "1",
        "KEMBED_SINK_RESULTS_TOPIC": TOPIC,
        "KEMBED_SINK_GROUP_ID": f"loadtest-sink-{index}",
        "KEMBED_SINK_HTTP_PORT": "0",
        "KEMBED_SINK_LOG_FORMAT": "json",
        "KEMBED_SINK_WRITERS": str(writers),
    }
    log = (out / f"sink-{index}.log").open("ab")
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "kembed_cli", "sink"], cwd=ROOT, env=env, stdout=log, stderr=log
    )
    first: float | None = None
    count = 0
    try:
        with _connect(pg) as conn:
            while count < expected_rows:
                if process.poll() is not None:
                    raise RuntimeError(f"the sink exited ({process.returncode}): see {log.name}")
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"{count} of {expected_rows} rows after {timeout_s} s")
                time.sleep(0.1)
                exists = conn.execute("SELECT to_regclass(%s)", [table]).fetchone()
                if exists == (None,):
                    continue
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
                ).fetchone()
                count = row[0] if row else 0
                if count and first is None:
                    first = time.perf_counter()
            last = indexed = time.perf_counter()
            while index == "after":
                found = conn.execute(
                    "SELECT 1 FROM pg_indexes WHERE tablename = %s AND indexdef LIKE '%%hnsw%%'",
                    [table],
                ).fetchone()
                indexed = time.perf_counter()
                if found:
                    break
                if process.poll() is not None or indexed - started > timeout_s:
                    raise RuntimeError(f"no index on {table}: see {log.name}")
                time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(60)
        log.close()
    assert first is not None
    return {
        "index": index,
        "rows": expected_rows,
        "seconds_to_index": indexed - last,
        "seconds_from_start": last - started,
        "rows_per_s_from_start": expected_rows / (last - started),
        "seconds_first_to_last": last - first,
        "rows_per_s_first_to_last": expected_rows / max(last - first, 1e-9),
    }


# ------------------------------------------------------------------ report


def _report(figures: dict[str, Any]) -> str:
    b = figures["breakdown"]
    rows = b["rows"]
    former = b["former_with_index"]["rows_per_s"]
    streaming = b["with_index"]["rows_per_s"]
    one_writer = b["with_index_1_writer"]["rows_per_s"]
    subset = b["former_with_index"]["rows"]
    w = b["writers"]
    bulk = b["without_index"]["rows_per_s"]
    lines = [
        "# Sink ingestion benchmark",
        "",
        f"`python -m loadtest.sink {' '.join(figures['argv'])}`".replace("  ", " "),
        "",
        f"{figures['results']} results x {figures['rows_per_result']} rows, "
        f"{figures['dim']} dimensions, float32, "
        + (
            "the model's vectors of STS-B texts"
            if figures.get("vectors") == "model"
            else "random unit vectors"
        )
        + f"; PostgreSQL + pgvector {figures['pgvector']} "
        f"(shared_buffers {figures['shared_buffers']}), {os.cpu_count()} CPUs.",
        "",
        f"## End to end (`kembed sink` process, {figures['writers']} writers, results "
        "pre-published)",
        "",
        "| index | rows | s from start | rows/s from start | s first to last row "
        "| rows/s first to last | index build after the last row (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {e['index']} | {e['rows']:,} | {e['seconds_from_start']:.1f} "
            f"| **{e['rows_per_s_from_start']:,.0f}** | {e['seconds_first_to_last']:.1f} "
            f"| {e['rows_per_s_first_to_last']:,.0f} | "
            + (f"{e['seconds_to_index']:.1f} |" if e["index"] == "after" else "- |")
            for e in (figures["end_to_end_streaming"], figures["end_to_end_after"])
        ),
        "",
        f"## Breakdown, in process ({rows:,} rows, batches of {b['batch_rows']:,} rows)",
        "",
        "| stage | seconds | rows/s |",
        "|---|---:|---:|",
        f"| decode (msgpack, schemas) | {b['decode_s']:.2f} | {rows / b['decode_s']:,.0f} |",
        f"| row building (sink.rows) | {b['rows_s']:.2f} | {rows / b['rows_s']:,.0f} |",
        f"| binary COPY encoding | {b['copy_encode_s']:.2f} | {rows / b['copy_encode_s']:,.0f} |",
        f"| write, HNSW index present, 1 writer (first {subset:,} rows) "
        f"| {b['with_index_1_writer']['write_s']:.2f} | {one_writer:,.0f} |",
        f"| write, HNSW index present, {w} writers (first {subset:,} rows) "
        f"| {b['with_index']['write_s']:.2f} | {streaming:,.0f} |",
        f"| write, no index, {w} writers (bulk load) | {b['without_index']['write_s']:.2f} "
        f"| {bulk:,.0f} |",
        f"| index build after the bulk load | {b['index_build_s']:.2f} | "
        f"{rows / b['index_build_s']:,.0f} |",
        f"| former write path, index present (first {subset:,} rows) "
        f"| {b['former_with_index']['write_s']:.2f} | {former:,.0f} |",
        "",
        f"- COPY path vs former path, index present, on the same first {subset:,} rows: "
        f"**{streaming / former:.1f}x** ({w} writers), {one_writer / former:.1f}x "
        "(1 writer)",
        f"- index maintenance: {1 - streaming / bulk:.0%} of the streaming write time "
        f"(rows/s with the index, {w} writers, vs without it)",
        f"- bulk load + one index build: "
        f"{rows / (b['without_index']['write_s'] + b['index_build_s']):,.0f} rows/s overall "
        f"(build settings: {', '.join(f'{k}={v}' for k, v in b['index_build_settings'].items())})",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.sink", description=__doc__)
    parser.add_argument("--results", type=int, default=200, help="result messages")
    parser.add_argument("--rows", type=int, default=256, help="rows per result")
    parser.add_argument("--dim", type=int, default=384, help="vector dimension")
    parser.add_argument(
        "--batch-results", type=int, default=8, help="results per write in the breakdown"
    )
    parser.add_argument(
        "--baseline-results",
        type=int,
        default=32,
        help="results written with the index present by the former path, the new path "
        "with one writer and with --writers (the ratios)",
    )
    parser.add_argument(
        "--writers",
        type=int,
        default=SinkSettings.model_fields["writers"].default,
        help="the sink's writers setting (parallel Postgres connections)",
    )
    parser.add_argument(
        "--vectors",
        choices=["random", "model"],
        default="random",
        help="random unit vectors (the hardest case for HNSW), or the model's vectors of "
        "STS-B texts (what a sink writes; cached after the first run)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="end to end time limit (s)")
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    out = report_folder(args.out, "sink")
    real = cached_model_vectors(args.results * args.rows) if args.vectors == "model" else None
    if real is not None:
        args.dim = real.shape[1]
    messages = make_results(args.results, args.rows, args.dim, vectors=real)
    figures: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "results": args.results,
        "rows_per_result": args.rows,
        "dim": args.dim,
        "writers": args.writers,
        "vectors": args.vectors,
    }
    with tempfile.TemporaryDirectory(prefix="kembed-sinkbench-") as tmp, LocalPostgres() as pg:
        with _connect(pg) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname='vector'")
            figures["pgvector"] = (version.fetchone() or ("?",))[0]
            buffers = conn.execute("SHOW shared_buffers").fetchone()
            figures["shared_buffers"] = (buffers or ("?",))[0]
        print("breakdown (in process):")
        figures["breakdown"] = breakdown(
            pg, messages, args.dim, args.batch_results, args.baseline_results, args.writers
        )
        topics = [
            TopicSpec(TOPIC, 4, {"max.message.bytes": str(8 * 1024 * 1024)}),
            TopicSpec(f"{TOPIC}.dlq", 1),
        ]
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            asyncio.run(_publish(kafka.bootstrap_servers, messages))
            for index in ("streaming", "after"):
                print(f"end to end (kembed sink process, index={index}):")
                e = figures[f"end_to_end_{index}"] = end_to_end(
                    kafka, pg, args.results * args.rows, out, args.timeout, args.writers, index
                )
                print(
                    f"  {e['rows_per_s_from_start']:,.0f} rows/s from start, "
                    f"{e['rows_per_s_first_to_last']:,.0f} rows/s first to last row"
                    + (
                        f", index built {e['seconds_to_index']:.1f} s later"
                        if index == "after"
                        else ""
                    )
                )
    print(f"report: {save_report(out, figures, _report(figures))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
