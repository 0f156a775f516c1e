"""The whole ingestion pipeline against the script a user would otherwise write.

    python -m loadtest.pipeline [--docs 4096] [--dtype default float32] [--target pgvector milvus]

Same run, same texts (``--docs`` distinct texts: the STS-B test sentences, then pairs of
them joined, as in ``loadtest.hnsw``), the same kind of table (``id`` text primary key, a
``vector(384)``, an HNSW index with pgvector's defaults m 16, ef_construction 64, inner
product; in Milvus Lite a collection with an HNSW index of the same parameters):

1. **Plain script**, alone on the machine: sentence-transformers ``encode()`` with its
   defaults (all-MiniLM-L6-v2, fp32, batches of 32) on every text, then the rows inserted
   with psycopg (``executemany`` of ``INSERT`` with the vector as text, one transaction,
   one connection), or with pymilvus (``MilvusClient.insert`` of the rows, in chunks of
   1,000). The model's load is not timed, the encode is timed once and counted in each
   target's script (the script runs encode, then insert).
2. **kembed**: a local broker (``scripts/kafka_local``), one worker process
   (``scripts/worker_process.py``) with its default settings (and again with
   ``--dtype float32``, the other settings default), a ``kembed sink`` process with its
   default settings against a fresh table (``scripts/pg_local.py``) or Milvus Lite file;
   once the worker is ready and the sink holds its partitions, ``kembed ingest`` of the
   texts as a JSONL file is started, and the run ends when the sink's
   ``kembed_sink_rows_upserted_total`` reaches the number of texts (the table's row count is
   checked afterwards). The sink's consumer lag is sampled meanwhile: a lag that stays
   near 0 means the sink keeps up and the worker (encoding) is the bound.

docs/s = texts / seconds; the ratio kembed / plain script is reported per target and
dtype. Nothing is asserted; ``report.md`` and ``report.json`` go to ``--out`` (default
``loadtest/reports/pipeline-<time>``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from loadtest.files import report_folder, save_report
from loadtest.hnsw import MODEL, texts_for
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.pg_local import LocalPostgres
from scripts.worker_process import WorkerProcess

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
M, EF = 16, 64
MILVUS_CHUNK = 1000
_UPSERTED = re.compile(r"^kembed_sink_rows_upserted_total\{[^}]*\} (\S+)$", re.M)
_LAG = re.compile(r"^kembed_sink_consumer_lag\{[^}]*\} (\S+)$", re.M)


# ------------------------------------------------------------------ the plain script


def plain_encode(texts: list[str]) -> tuple[np.ndarray, float, float]:
    """sentence-transformers with its defaults: the vectors, load seconds, encode seconds."""
    from sentence_transformers import SentenceTransformer

    from worker.encoder.models import resolve_model_dir

    started = time.perf_counter()
    model = SentenceTransformer(str(resolve_model_dir(MODEL)), device="cpu")
    loaded = time.perf_counter()
    vectors = np.asarray(model.encode(texts), dtype=np.float32)
    encoded = time.perf_counter()
    del model
    gc.collect()
    return vectors, loaded - started, encoded - loaded


def plain_pgvector(pg: LocalPostgres, vectors: np.ndarray) -> float:
    """What a user writes: a table with its HNSW index, then executemany of the rows."""
    with psycopg.connect(pg.dsn, password=pg.password) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE plain_docs (id text PRIMARY KEY, vector vector({}) NOT NULL)"
            ).format(sql.Literal(vectors.shape[1]))
        )
        conn.execute(
            "CREATE INDEX ON plain_docs USING hnsw (vector vector_ip_ops) "
            f"WITH (m = {M}, ef_construction = {EF})"
        )
        conn.commit()
        started = time.perf_counter()
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO plain_docs (id, vector) VALUES (%s, %s::vector)",
                [(str(i), str(v.tolist())) for i, v in enumerate(vectors)],
            )
        conn.commit()
        seconds = time.perf_counter() - started
        count = conn.execute("SELECT count(*) FROM plain_docs").fetchone()
    assert count == (len(vectors),), count
    return seconds


def plain_milvus(path: Path, vectors: np.ndarray) -> float:
    """What a user writes: a collection with its HNSW index, then inserts of the rows."""
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(str(path))
    try:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=vectors.shape[1])
        index = client.prepare_index_params()
        index.add_index(
            field_name="vector",
            index_type="HNSW",
            metric_type="IP",
            params={"M": M, "efConstruction": EF},
        )
        client.create_collection("plain_docs", schema=schema, index_params=index)
        started = time.perf_counter()
        for start in range(0, len(vectors), MILVUS_CHUNK):
            client.insert(
                "plain_docs",
                [
                    {"id": str(i), "vector": vectors[i].tolist()}
                    for i in range(start, min(start + MILVUS_CHUNK, len(vectors)))
                ],
            )
        seconds = time.perf_counter() - started
        count = client.query("plain_docs", output_fields=["count(*)"])[0]["count(*)"]
    finally:
        client.close()
    assert count == len(vectors), count
    return seconds


# ------------------------------------------------------------------ kembed


class SinkProcess:
    """A ``kembed sink`` process with its JSON log in a file and its metrics over HTTP."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kembed_cli", "sink"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._port: int | None = None

    def _events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = self._events()
            http = [e for e in events if e.get("event") == "http.started"]
            if http:
                self._port = int(http[0]["port"])
            if self._port and any(
                e.get("event") == "partitions.assigned" and e.get("partitions") for e in events
            ):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the sink is not ready: see {self.log_path}")

    def metrics(self) -> tuple[float, float]:
        """Rows upserted, and the consumer lag summed over its partitions."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self._port}/metrics", timeout=5) as r:
            text = r.read().decode()
        rows = sum(float(v) for v in _UPSERTED.findall(text))
        lag = sum(float(v) for v in _LAG.findall(text))
        return rows, lag

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kembed_run(
    kafka: LocalKafka,
    worker: WorkerProcess,
    bulk_topic: str,
    target: str,
    target_env: dict[str, str],
    docs: Path,
    count: int,
    tag: str,
    out: Path,
    timeout: float,
) -> dict[str, Any]:
    results = f"embed.results.pipeline-{tag}"  # what the workers may reply to by default
    kafka.create_topics([TopicSpec(results, 4), TopicSpec(f"{results}.dlq", 1)])
    sink = SinkProcess(
        {
            "KEMBED_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "KEMBED_SINK_TABLE": f"docs_{tag}",
            "KEMBED_SINK_RESULTS_TOPIC": results,
            "KEMBED_SINK_GROUP_ID": f"pipeline-sink-{tag}",
            "KEMBED_SINK_HTTP_PORT": "0",
            "KEMBED_SINK_LOG_FORMAT": "json",
            **target_env,
        },
        out / f"sink-{tag}.log",
    )
    try:
        sink.wait_ready(120)
        worker_cpu, sink_cpu = _cpu_s(worker.process.pid), _cpu_s(sink.process.pid)
        ingest_log = (out / f"ingest-{tag}.log").open("ab")
        started = time.perf_counter()
        ingest = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kembed_cli",
                "ingest",
                str(docs),
                "--id-field",
                "id",
                "--text-field",
                "text",
                "--reply-to",
                results,
                "--topic",
                bulk_topic,
                "--bootstrap-servers",
                kafka.bootstrap_servers,
                "--quiet",
            ],
            cwd=ROOT,
            stdout=ingest_log,
            stderr=subprocess.STDOUT,
        )
        rows, lags, submitted = 0.0, [], None
        while rows < count:
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{rows:.0f} of {count} rows after {timeout} s ({tag})")
            if sink.process.poll() is not None:
                raise RuntimeError(f"the sink exited: see {sink.log_path}")
            if worker.process.poll() is not None:
                raise RuntimeError(f"the worker exited: see {worker.log_path}")
            if submitted is None and ingest.poll() is not None:
                if ingest.returncode != 0:
                    raise RuntimeError(f"kembed ingest failed: see {ingest_log.name}")
                submitted = time.perf_counter() - started
            time.sleep(0.1)
            rows, lag = sink.metrics()
            lags.append(lag)
        seconds = time.perf_counter() - started
        worker_cpu = _cpu_s(worker.process.pid) - worker_cpu
        sink_cpu = _cpu_s(sink.process.pid) - sink_cpu
        ingest.wait(60)
        ingest_log.close()
    finally:
        sink.stop()
    return {
        "target": target,
        "docs": count,
        "seconds": seconds,
        "docs_per_s": count / seconds,
        "ingest_submitted_s": submitted,
        "sink_lag_median": float(np.median(lags)),
        "sink_lag_max": float(max(lags)),
        "worker_cpu_s": worker_cpu,
        "sink_cpu_s": sink_cpu,
    }


def _pg_count(pg: LocalPostgres, table: str) -> int:
    with psycopg.connect(pg.dsn, password=pg.password) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return int((row.fetchone() or (0,))[0])


# ------------------------------------------------------------------ report


def _report(figures: dict[str, Any]) -> str:
    plain = figures["plain"]
    lines = [
        "# Ingestion pipeline vs a plain script",
        "",
        f"`python -m loadtest.pipeline {' '.join(figures['argv'])}`".replace("  ", " "),
        "",
        f"{figures['docs']:,} distinct texts (STS-B test sentences, then pairs of them), "
        f"{MODEL}, {os.cpu_count()} CPUs. Plain script: sentence-transformers `encode()` "
        f"(defaults) {plain['encode_s']:.1f} s = {plain['encode_docs_per_s']:,.0f} texts/s "
        f"(model load {plain['load_s']:.1f} s, not counted), then the inserts.",
        "",
        "| target | plain: insert s | plain docs/s | worker dtype | kembed s | kembed docs/s "
        "| kembed / plain | sink lag median / max | worker CPU-s | sink CPU-s |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in figures["kembed"]:
        p = plain[run["target"]]
        lines.append(
            f"| {run['target']} | {p['insert_s']:.1f} | {p['docs_per_s']:,.0f} "
            f"| {run['dtype']} | {run['seconds']:.1f} | {run['docs_per_s']:,.0f} "
            f"| **{run['docs_per_s'] / p['docs_per_s']:.2f}x** "
            f"| {run['sink_lag_median']:,.0f} / {run['sink_lag_max']:,.0f} "
            f"| {run['worker_cpu_s']:.1f} | {run['sink_cpu_s']:.1f} |"
        )
    extra = ", ".join(figures["worker_settings"]) or "none"
    lines += ["", f"Workers measured (settings other than the defaults: {extra}):", ""]
    for dtype, loaded in figures["workers"].items():
        lines.append(
            f"- `{dtype}`: model.loaded dtype={loaded.get('dtype')} "
            f"compiled={loaded.get('compiled')}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.pipeline", description=__doc__)
    parser.add_argument("--docs", type=int, default=4096, help="texts ingested")
    parser.add_argument(
        "--dtype",
        nargs="+",
        default=["default", "float32"],
        help="worker dtypes to measure (default: the worker's own default)",
    )
    parser.add_argument(
        "--target", nargs="+", default=["pgvector", "milvus"], choices=["pgvector", "milvus"]
    )
    parser.add_argument(
        "--worker",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting for every worker measured (e.g. torch_compile=off for a short "
        "run); the report names them",
    )
    parser.add_argument("--timeout", type=float, default=600, help="per run (s)")
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    out = report_folder(args.out, "pipeline")
    texts = texts_for(args.docs)
    figures: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "docs": len(texts),
        "plain": {},
        "kembed": [],
        "workers": {},
        "worker_settings": args.worker,
    }
    with tempfile.TemporaryDirectory(prefix="kembed-pipeline-") as tmp, LocalPostgres() as pg:
        with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        print(f"plain script: encode {len(texts):,} texts ...", flush=True)
        vectors, load_s, encode_s = plain_encode(texts)
        plain = figures["plain"]
        plain.update(load_s=load_s, encode_s=encode_s, encode_docs_per_s=len(texts) / encode_s)
        for target in args.target:
            if target == "pgvector":
                insert_s = plain_pgvector(pg, vectors)
            else:
                insert_s = plain_milvus(Path(tmp) / "plain.db", vectors)
            plain[target] = {
                "insert_s": insert_s,
                "docs_per_s": len(texts) / (encode_s + insert_s),
            }
            print(
                f"  {target}: encode {encode_s:.1f} s + insert {insert_s:.1f} s = "
                f"{plain[target]['docs_per_s']:,.0f} docs/s",
                flush=True,
            )
        del vectors
        docs = Path(tmp) / "docs.jsonl"
        with docs.open("w", encoding="utf-8") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"id": str(i), "text": text}) + "\n")
        with LocalKafka(Path(tmp) / "kafka", topics=DEFAULT_TOPICS) as kafka:
            for dtype in args.dtype:
                # Each worker its own topics: a new group must not find the requests of
                # the one before.
                requests, bulk = f"pipeline.{dtype}.requests", f"pipeline.{dtype}.requests.bulk"
                kafka.create_topics([TopicSpec(requests, 2), TopicSpec(bulk, 4)])
                settings: dict[str, Any] = {
                    "requests_topic": requests,
                    "bulk_topic": bulk,
                    "group_id": f"pipeline-{dtype}",
                }
                settings.update(item.split("=", 1) for item in args.worker)
                if dtype != "default":
                    settings["dtype"] = dtype
                print(f"kembed, worker dtype {dtype}: starting the worker ...", flush=True)
                worker = WorkerProcess(
                    kafka.bootstrap_servers, out / f"worker-{dtype}.log", **settings
                )
                try:
                    worker.wait_ready(600)
                    loaded = worker.wait_for("model.loaded", timeout=10)
                    # dtype/compile auto: measure the variant the start-up tuning settles on
                    worker.wait_tuned()
                    tuned = [e for e in worker.events() if e.get("event") == "encoder.tuned"]
                    served = {**loaded, **tuned[-1]} if tuned else loaded
                    figures["workers"][dtype] = {
                        k: served.get(k) for k in ("dtype", "compiled", "model")
                    }
                    for target in args.target:
                        tag = f"{target}_{dtype}"
                        if target == "pgvector":
                            env = {
                                "KEMBED_SINK_TARGET": pg.dsn,
                                "KEMBED_SINK_TARGET_PASSWORD": pg.password,
                            }
                        else:
                            env = {"KEMBED_SINK_TARGET": f"milvus://{Path(tmp) / tag}.db"}
                        run = kembed_run(
                            kafka,
                            worker,
                            bulk,
                            target,
                            env,
                            docs,
                            len(texts),
                            tag,
                            out,
                            args.timeout,
                        )
                        if target == "pgvector":
                            run["table_rows"] = _pg_count(pg, f"docs_{tag}")
                        run["dtype"] = dtype
                        figures["kembed"].append(run)
                        ratio = run["docs_per_s"] / plain[target]["docs_per_s"]
                        print(
                            f"  {target}: {run['seconds']:.1f} s = {run['docs_per_s']:,.0f} "
                            f"docs/s ({ratio:.2f}x the plain script), sink lag median "
                            f"{run['sink_lag_median']:,.0f}",
                            flush=True,
                        )
                finally:
                    worker.stop()
    print(f"report: {save_report(out, figures, _report(figures))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
