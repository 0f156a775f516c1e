"""The gateway benchmark's report: its two targets against the figures, and
``report.md``."""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "CPU_PROCESSES",
    "GATEWAY",
    "LATENCY_TARGET_MS",
    "PATHS",
    "SDK",
    "THROUGHPUT_TARGET",
    "report_markdown",
    "targets",
]

GATEWAY, SDK = "gateway", "sdk"
PATHS = (GATEWAY, SDK)
LATENCY_TARGET_MS = 2.0
"""The gateway may add at most this much to the single-text p50."""
THROUGHPUT_TARGET = 0.95
"""Gateway texts/s over SDK texts/s at the same concurrency: at least this."""
CPU_PROCESSES = ("worker", "broker", "gateway", "loadgen")


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's two targets against the run's figures: what was measured, the
    threshold, and whether it was met."""
    single = figures["single"]
    added = single[GATEWAY]["p50"] - single[SDK]["p50"]
    ratio = figures["throughput"]["ratio"]
    return [
        {
            "target": "single-text p50: gateway minus SDK (ms)",
            "measured": added,
            "threshold": f"<= {LATENCY_TARGET_MS:g}",
            "met": added <= LATENCY_TARGET_MS,
        },
        {
            "target": (
                f"texts/s with {figures['clients']} concurrent clients of "
                f"{figures['batch']} texts: gateway / SDK"
            ),
            "measured": ratio,
            "threshold": f">= {THROUGHPUT_TARGET:g}",
            "met": ratio >= THROUGHPUT_TARGET,
        },
    ]


def _row(*cells: str) -> str:
    return f"| {' | '.join(cells)} |"


def _cpu_cell(cpu: dict[str, float], spec: str) -> str:
    """CPU figures of the processes, in CPU_PROCESSES order."""
    return " / ".join(format(cpu[name], spec) for name in CPU_PROCESSES)


def _single_cells(p: dict[str, Any]) -> list[str]:
    stats = [f"{p[key]:.2f}" for key in ("p50", "p95", "p99", "mean")]
    return [*stats, _cpu_cell(p["cpu_ms_per_request"], ".2f")]


def _throughput_cells(p: dict[str, Any]) -> list[str]:
    each_round = ", ".join(f"{v:,.0f}" for v in p["rounds"])
    cpu = _cpu_cell(p["cpu_ms_per_1000"], ",.0f")
    return [f"{p['texts_per_s']:,.0f}", each_round, f"{p['rows_per_batch']:.1f}", cpu]


def report_markdown(figures: dict[str, Any]) -> str:
    single, throughput = figures["single"], figures["throughput"]
    lines = [
        "# HTTP gateway against the SDK",
        "",
        f"`{' '.join(['python -m loadtest.gateway', *figures['argv']])}`",
        "",
        f"One broker, one worker (default settings; serving {figures['model']}, "
        f"dtype {figures['worker'].get('dtype')}, compiled {figures['worker'].get('compiled')}), "
        f"one gateway (default settings), the load generator; {os.cpu_count()} CPUs shared "
        "by all four. The paths took turns in one run; `POST /v1/embeddings` with "
        f"`encoding_format` {figures['encoding_format']}.",
        "",
        "## Targets",
        "",
        "| target | measured | threshold | result |",
        "| --- | ---: | --- | --- |",
    ]
    for row in targets(figures):
        lines.append(
            f"| {row['target']} | {row['measured']:.2f} | {row['threshold']} "
            f"| {'met' if row['met'] else 'MISSED'} |"
        )
    lines += [
        "",
        f"## Single text, sequential ({single[GATEWAY]['n']} requests a path, "
        f"{figures['blocks']} alternating blocks)",
        "",
        "| path | p50 ms | p95 ms | p99 ms | mean ms | CPU ms per request: "
        "worker / broker / gateway / load generator |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    labels = {GATEWAY: "gateway (httpx, keep-alive)", SDK: "SDK `embed()`"}
    lines += [_row(labels[path], *_single_cells(single[path])) for path in PATHS]
    lines += [
        "",
        f"## Throughput: {figures['clients']} concurrent clients, requests of "
        f"{figures['batch']} texts, {throughput['texts']:,} texts a round",
        "",
        "| path | texts/s, median | texts/s, each round | worker batch rows, median "
        "| CPU ms per 1,000 texts: worker / broker / gateway / load generator (median) |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    labels[GATEWAY] = "gateway"
    lines += [_row(labels[path], *_throughput_cells(throughput[path])) for path in PATHS]
    each = ", ".join(f"{r:.2f}" for r in throughput["round_ratios"])
    lines += [
        "",
        f"Gateway / SDK: **{throughput['ratio']:.2f}x** (median of the rounds' ratios: {each}).",
    ]
    return "\n".join(lines) + "\n"
