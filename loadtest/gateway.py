"""``python -m loadtest.gateway``: what the HTTP gateway costs next to the SDK it wraps.

    python -m loadtest.gateway [--requests 400] [--blocks 10] [--clients 64] [--batch 32]
                               [--texts 2048] [--rounds 4] [--encoding-format float]

One local broker (``scripts/kafka_local``), one worker (``scripts/worker_process.py``, its
default settings), one ``kembed gateway`` process (its default settings, but listening on
loopback at a free port and reading its results from a reply topic of its own), and this
process as the load generator. The worker is measured once its start-up tuning is over
(``encoder.tuned``). Both paths reach the same worker and model with the same texts
(STS-B test sentences), and they take turns, so that drift on a shared machine hits both:

- single: ``--requests`` one-text requests one after another (closed loop) on each path:
  ``POST /v1/embeddings`` on one keep-alive ``httpx.AsyncClient`` connection, and
  ``EmbedClient.embed()`` in this process; in ``--blocks`` blocks, the two paths
  alternating block by block (and which goes first alternating too), each block's texts
  the same on both. p50 / p95 / p99 per path, the gateway's p50 minus the SDK's
  (target: at most 2 ms), and the CPU time each process spent per request.
- throughput: ``--texts`` texts in requests of ``--batch``, sent by ``--clients``
  concurrent senders (HTTP clients on one httpx pool of that many connections, or
  ``embed()`` calls on one ``EmbedClient``), each sender taking the next request when its
  last one is answered; timed from the first send to the last answer. ``--rounds`` rounds,
  the order of the paths alternating; texts/s per path (median of the rounds), the ratio
  gateway / SDK of each round (the two paths back to back, so that a change in the
  machine's load between rounds cancels out) and their median (target: at least 0.95), and
  the CPU time each process spent per 1,000 texts (worker, broker, gateway, this load
  generator) and the mean rows of the worker's batches.

Each path is warmed up first (single calls and one unmeasured throughput round). Every
answer is checked (HTTP 200 with one vector per input; an SDK call that raises fails the
run). ``report.md`` and ``report.json`` go to ``--out`` (default
``loadtest/reports/gateway-<time>``); nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest import cputime
from loadtest.data import stsb_sentences
from loadtest.files import report_folder, save_report
from loadtest.gateway_report import (
    GATEWAY,
    LATENCY_TARGET_MS,
    PATHS,
    SDK,
    THROUGHPUT_TARGET,
    report_markdown,
    targets,
)
from loadtest.run import percentiles, worker_batches
from producer_sdk import EmbedClient
from scripts.kafka_local import DEFAULT_TOPICS, LocalKafka, TopicSpec
from scripts.local_server import free_port
from scripts.worker_process import WorkerProcess, stop_process

__all__ = [
    "LATENCY_TARGET_MS",
    "THROUGHPUT_TARGET",
    "GatewayProcess",
    "batched",
    "main",
    "order",
    "report_markdown",
    "round_ratios",
    "split_blocks",
    "targets",
]

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_RESULTS = "embed.results.loadtest-gateway"  # the gateway's own reply topic
SDK_RESULTS = "embed.results.loadtest-sdk"  # this process's: neither reads the other's
CALL_TIMEOUT_S = 60.0

Embed = Callable[[list[str]], Awaitable[int]]
"""One request on one path: the texts in, the number of vectors that came back."""


# ------------------------------------------------------------------ pure helpers


def order(paths: Sequence[str], turn: int) -> list[str]:
    """The paths in the order they run in turn ``turn``: rotated by one each turn, so
    that each goes first (and so last) equally often."""
    shift = turn % len(paths)
    return [*paths[shift:], *paths[:shift]]


def split_blocks(items: Sequence[str], blocks: int) -> list[list[str]]:
    """``items`` cut into ``blocks`` consecutive blocks of nearly equal size (the first
    ones one longer when it does not divide), none empty."""
    blocks = max(1, min(blocks, len(items)))
    size, extra = divmod(len(items), blocks)
    out, start = [], 0
    for index in range(blocks):
        end = start + size + (1 if index < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def batched(texts: Sequence[str], size: int) -> list[list[str]]:
    """Requests of ``size`` texts (the last one may be shorter)."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


def round_ratios(gateway: Sequence[float], sdk: Sequence[float]) -> list[float]:
    """Gateway texts/s over SDK texts/s, round by round (each round ran both paths back to
    back)."""
    if len(gateway) != len(sdk):
        raise ValueError("both paths need the same number of rounds")
    return [g / s for g, s in zip(gateway, sdk, strict=True)]


# ------------------------------------------------------------------ the gateway process


class GatewayProcess:
    """A ``kembed gateway`` process on loopback, its log captured to a file."""

    def __init__(self, bootstrap_servers: str, log_path: Path, **settings: Any) -> None:
        """``settings`` become KEMBED_GATEWAY_* variables."""
        self.log_path = log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "KEMBED_BOOTSTRAP_SERVERS": bootstrap_servers,
            "KEMBED_GATEWAY_HOST": "127.0.0.1",
            "KEMBED_GATEWAY_PORT": str(self.port),
            "KEMBED_GATEWAY_LOG_FORMAT": "json",
        }
        env.update({f"KEMBED_GATEWAY_{k.upper()}": str(v) for k, v in settings.items()})
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kembed_cli", "gateway"],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until ``GET /ready`` answers 200 (Kafka reachable, a live model in the catalog)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/ready", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the gateway is not ready (exit {self.process.poll()}):\n{tail}")

    def stop(self, timeout: float = 30.0) -> None:
        stop_process(self.process, timeout)
        self._log.close()


# ------------------------------------------------------------------ the two paths


class GatewayError(RuntimeError):
    """The gateway answered something other than the vectors asked for."""


def http_path(http: httpx.AsyncClient, model: str, encoding_format: str) -> Embed:
    async def call(texts: list[str]) -> int:
        response = await http.post(
            "/v1/embeddings",
            json={"model": model, "input": texts, "encoding_format": encoding_format},
        )
        if response.status_code != 200:
            raise GatewayError(f"HTTP {response.status_code}: {response.text[:500]}")
        return len(response.json()["data"])

    return call


def sdk_path(client: EmbedClient, model: str) -> Embed:
    async def call(texts: list[str]) -> int:
        return len(await client.embed(texts, model=model, timeout=CALL_TIMEOUT_S))

    return call


async def sequential(call: Embed, texts: Sequence[str]) -> list[float]:
    """Latencies (ms) of one-text requests, one after another."""
    latencies = []
    for text in texts:
        started = time.perf_counter()
        count = await call([text])
        latencies.append((time.perf_counter() - started) * 1000)
        if count != 1:
            raise GatewayError(f"1 text, {count} vectors")
    return latencies


async def concurrent(call: Embed, requests: Sequence[list[str]], clients: int) -> float:
    """Seconds for ``clients`` senders to get every request of ``requests`` answered,
    each sender taking the next request when its last one is answered."""
    queue: Iterator[list[str]] = iter(requests)

    async def sender() -> None:
        for texts in queue:
            count = await call(texts)
            if count != len(texts):
                raise GatewayError(f"{len(texts)} texts, {count} vectors")

    started = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(clients)))
    return time.perf_counter() - started


# ------------------------------------------------------------------ the run


@dataclass
class Plan:
    requests: int
    blocks: int
    clients: int
    batch: int
    texts: int
    rounds: int
    encoding_format: str


async def measure(
    plan: Plan,
    bootstrap: str,
    gateway_url: str,
    model: str | None,
    pids: dict[str, int],
    metrics_url: str,
) -> dict[str, Any]:
    sentences = stsb_sentences()
    limits = httpx.Limits(max_connections=plan.clients, max_keepalive_connections=plan.clients)
    async with (
        EmbedClient(bootstrap, reply_topic=SDK_RESULTS) as client,
        httpx.AsyncClient(base_url=gateway_url, limits=limits, timeout=CALL_TIMEOUT_S) as http,
    ):
        if model is None:
            model = (await client.models())[0].name
        calls = {
            GATEWAY: http_path(http, model, plan.encoding_format),
            SDK: sdk_path(client, model),
        }
        warm = [sentences[i % len(sentences)] for i in range(plan.clients * plan.batch)]
        for path in PATHS:
            await sequential(calls[path], sentences[:20])
            await concurrent(calls[path], batched(warm, plan.batch), plan.clients)
        print("warmed up", file=sys.stderr, flush=True)

        single: dict[str, list[float]] = {path: [] for path in PATHS}
        single_cpu = {path: dict.fromkeys(pids, 0.0) for path in PATHS}
        texts = [sentences[(7919 * i) % len(sentences)] for i in range(plan.requests)]
        for turn, block in enumerate(split_blocks(texts, plan.blocks)):
            for path in order(PATHS, turn):
                before = cputime.sample(pids)
                single[path] += await sequential(calls[path], block)
                for name, seconds in cputime.usage(before, cputime.sample(pids)).items():
                    single_cpu[path][name] += seconds
        print(
            "single: "
            + ", ".join(f"{p} p50 {percentiles(single[p])['p50']:.2f} ms" for p in PATHS),
            file=sys.stderr,
            flush=True,
        )

        rounds: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
        for turn in range(plan.rounds):
            body = [sentences[(turn * 4099 + i) % len(sentences)] for i in range(plan.texts)]
            for path in order(PATHS, turn):
                shapes = worker_batches(metrics_url, "interactive")
                before = cputime.sample(pids)
                seconds = await concurrent(calls[path], batched(body, plan.batch), plan.clients)
                spent = cputime.usage(before, cputime.sample(pids))
                shapes = worker_batches(metrics_url, "interactive").minus(shapes)
                rounds[path].append(
                    {
                        "seconds": seconds,
                        "worker_batches": shapes.batches,
                        "rows_per_batch": shapes.rows / shapes.batches if shapes.batches else 0.0,
                        "texts_per_s": plan.texts / seconds,
                        "cpu_ms_per_1000": {
                            name: cputime.cpu_ms_per_1000(s, plan.texts)
                            for name, s in spent.items()
                        },
                    }
                )
                print(
                    f"round {turn + 1}, {path}: {plan.texts / seconds:,.0f} texts/s",
                    file=sys.stderr,
                    flush=True,
                )
    throughput: dict[str, Any] = {"texts": plan.texts}
    for path in PATHS:
        throughput[path] = {
            "texts_per_s": statistics.median(r["texts_per_s"] for r in rounds[path]),
            "rounds": [r["texts_per_s"] for r in rounds[path]],
            "rows_per_batch": statistics.median(r["rows_per_batch"] for r in rounds[path]),
            "cpu_ms_per_1000": {
                name: statistics.median(r["cpu_ms_per_1000"][name] for r in rounds[path])
                for name in pids
            },
        }
    throughput["round_ratios"] = round_ratios(
        throughput[GATEWAY]["rounds"], throughput[SDK]["rounds"]
    )
    throughput["ratio"] = statistics.median(throughput["round_ratios"])
    return {
        "model": model,
        "single": {
            path: {
                **percentiles(single[path]),
                "cpu_ms_per_request": {
                    name: seconds * 1000 / len(single[path])
                    for name, seconds in single_cpu[path].items()
                },
            }
            for path in PATHS
        },
        "throughput": throughput,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gateway", description=__doc__)
    parser.add_argument("--requests", type=int, default=400, help="single-text requests a path")
    parser.add_argument("--blocks", type=int, default=10, help="alternating single blocks")
    parser.add_argument("--clients", type=int, default=64, help="concurrent senders")
    parser.add_argument("--batch", type=int, default=32, help="texts a throughput request")
    parser.add_argument("--texts", type=int, default=2048, help="texts a throughput round")
    parser.add_argument("--rounds", type=int, default=4, help="throughput rounds a path")
    parser.add_argument(
        "--encoding-format", default="float", choices=["float", "base64"], help="HTTP answers"
    )
    parser.add_argument("--model", default=None, help="default: the catalog's first model")
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    plan = Plan(
        args.requests,
        args.blocks,
        args.clients,
        args.batch,
        args.texts,
        args.rounds,
        args.encoding_format,
    )
    out = report_folder(args.out, "gateway")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    figures: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        **{k: v for k, v in plan.__dict__.items() if k != "texts"},
    }
    for log in ("worker.log", "gateway.log"):
        # The readiness checks read these logs: a reused --out must not answer for this run.
        (out / log).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="kembed-gateway-") as tmp:
        topics = (*DEFAULT_TOPICS, TopicSpec(GATEWAY_RESULTS, 1), TopicSpec(SDK_RESULTS, 1))
        with LocalKafka(Path(tmp) / "kafka", topics=topics) as kafka:
            worker = WorkerProcess(kafka.bootstrap_servers, out / "worker.log")
            gateway: GatewayProcess | None = None
            try:
                print("starting the worker ...", file=sys.stderr, flush=True)
                worker.wait_ready(600)
                loaded = worker.wait_for("model.loaded", timeout=10)
                worker.wait_tuned()  # dtype/compile auto: measure what the tuning settles on
                tuned = [e for e in worker.events() if e.get("event") == "encoder.tuned"]
                served = {**loaded, **tuned[-1]} if tuned else loaded
                figures["worker"] = {k: served.get(k) for k in ("dtype", "compiled", "model")}
                gateway = GatewayProcess(
                    kafka.bootstrap_servers, out / "gateway.log", reply_topic=GATEWAY_RESULTS
                )
                gateway.wait_ready()
                assert kafka.pid is not None
                pids = {
                    "worker": worker.process.pid,
                    "broker": kafka.pid,
                    "gateway": gateway.process.pid,
                    "loadgen": os.getpid(),
                }
                figures.update(
                    asyncio.run(
                        measure(
                            plan,
                            kafka.bootstrap_servers,
                            gateway.url,
                            args.model,
                            pids,
                            f"{worker.http_url}/metrics",
                        )
                    )
                )
            finally:
                if gateway is not None:
                    gateway.stop()
                worker.stop()
    text = report_markdown(figures)
    print(text)
    print(f"report: {save_report(out, figures, text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
