"""Benchmark report: targets with pass/fail, Markdown and JSON, and two PNG plots."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

__all__ = ["REFERENCE_RATE", "backlog_reference", "targets", "write_report"]

REFERENCE_RATE = 10.0  # offered interactive load (req/s) at which backlog targets are judged


def backlog_reference(loaded: list[dict[str, Any]]) -> dict[str, Any]:
    """The backlog runs at the rate nearest REFERENCE_RATE (the scenario runs several
    times there), summarised by their medians: rate, runs, p99 and bulk texts/s."""
    rate = min((row["rate"] for row in loaded), key=lambda r: abs(r - REFERENCE_RATE))
    runs = [row for row in loaded if row["rate"] == rate]
    return {
        "rate": rate,
        "runs": len(runs),
        "p99": statistics.median(row["p99"] for row in runs),
        "bulk_texts_per_s": statistics.median(row["bulk_texts_per_s"] for row in runs),
    }


def worker_cpu_ratio(results: dict[str, Any]) -> float:
    """Worker CPU per bulk sentence / in-process CPU per sentence (same texts and budget)."""
    worker = results["e2e"]["bulk"]["sentences"]["cpu"]["worker"]["cpu_ms_per_1000"]
    ratio: float = worker / results["inprocess"]["cpu"]["cpu_ms_per_1000"]
    return ratio


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each computed from figures measured in this run."""
    inproc, e2e = results["inprocess"], results["e2e"]
    bulk = e2e["bulk"]["sentences"]["texts_per_s"]
    alone = e2e["interactive"]["alone"]
    low = min(alone, key=lambda row: row["rate"])
    ref = backlog_reference(e2e["interactive"]["with_backlog"])
    floor = inproc["single_ms"]["p50"] + 15
    return [
        _target(
            "worker CPU per text / in-process CPU per text", worker_cpu_ratio(results), "<=", 1.10
        ),
        _target(
            f"single-text p50 at {low['rate']:g} req/s (ms) vs in-process p50 + 15",
            low["p50"],
            "<=",
            floor,
        ),
        _target(
            f"single-text p99 with backlog at {ref['rate']:g} req/s (ms), "
            f"median of {ref['runs']} runs",
            ref["p99"],
            "<=",
            250.0,
        ),
        _target(
            f"bulk with interactive at {ref['rate']:g} req/s / bulk alone "
            f"(median of {ref['runs']} runs)",
            ref["bulk_texts_per_s"] / bulk,
            ">=",
            0.75,
        ),
    ]


def _target(name: str, value: float, op: str, threshold: float) -> dict[str, Any]:
    ok = value >= threshold if op == ">=" else value <= threshold
    return {"name": name, "value": value, "op": op, "threshold": threshold, "pass": ok}


def write_report(results: dict[str, Any], out: Path) -> bool:
    results["targets"] = targets(results)
    (out / "report.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(_markdown(results))
    _plot_latency(results, out / "latency_vs_load.png")
    _plot_budget(results, out / "throughput_vs_max_batch_tokens.png")
    return all(t["pass"] for t in results["targets"])


def _markdown(r: dict[str, Any]) -> str:
    inproc, e2e = r["inprocess"], r["e2e"]
    lines = [
        "# kembed benchmark",
        "",
        f"Model all-MiniLM-L6-v2, dtype {inproc['dtype']}, worker settings "
        f"{r['worker_settings']}. All figures from this one run.",
        "",
        "## Targets",
        "",
        "| target | measured | threshold | result |",
        "| --- | --- | --- | --- |",
    ]
    for t in r["targets"]:
        verdict = "pass" if t["pass"] else "FAIL"
        lines.append(
            f"| {t['name']} | {t['value']:.3f} | {t['op']} {t['threshold']:.2f} | {verdict} |"
        )
    lines += [
        "",
        "## Throughput (texts/s)",
        "",
        "| what | sentences | mixed (1 in 5 long) |",
        "| --- | --- | --- |",
    ]
    lines.append(
        f"| end to end through Kafka (bulk lane) | "
        f"{e2e['bulk']['sentences']['texts_per_s']:.0f} | "
        f"{e2e['bulk']['mixed']['texts_per_s']:.0f} |"
    )
    lines.append(
        f"| in-process limit (max_batch_tokens {inproc['best_max_batch_tokens']}) | "
        f"{inproc['limit']['sentences']['texts_per_s']:.0f} | "
        f"{inproc['limit']['mixed']['texts_per_s']:.0f} |"
    )
    lines.append(
        f"| sentence-transformers encode(), fp32, batch 32 | "
        f"{inproc['st_default']['texts_per_s']:.0f} | |"
    )
    bulk = e2e["bulk"]["sentences"]["texts_per_s"]
    limit = inproc["limit"]["sentences"]["texts_per_s"]
    lines += [
        "",
        f"Bulk end to end / in-process limit: {bulk / limit:.2f}; "
        f"/ sentence-transformers encode(): {bulk / inproc['st_default']['texts_per_s']:.2f} "
        "(wall-clock ratios: on a small machine they measure the broker and the load "
        "generator beside the worker as much as the worker, so they are not targets).",
    ]
    lines += _cpu_lines(r)
    lines += [
        "",
        "In-process sweep of max_batch_tokens:",
        "",
        "| max_batch_tokens | sentences texts/s | mixed texts/s | mixed tokens/s |",
        "| --- | --- | --- | --- |",
    ]
    for row in inproc["sweep"]:
        lines.append(
            f"| {row['max_batch_tokens']} | {row['sentences']['texts_per_s']:.0f} | "
            f"{row['mixed']['texts_per_s']:.0f} | {row['mixed']['tokens_per_s']:.0f} |"
        )
    single = inproc["single_ms"]
    lines += [
        "",
        "## Interactive latency (ms), single-text embed()",
        "",
        f"In-process single text: p50 {single['p50']:.1f}, p99 {single['p99']:.1f}.",
        "",
        "| offered req/s | backlog | n | p50 | p95 | p99 | bulk texts/s meanwhile |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in e2e["interactive"]["alone"]:
        lines.append(
            f"| {row['rate']:g} | none | {row['n']} | {row['p50']:.1f} | "
            f"{row['p95']:.1f} | {row['p99']:.1f} | |"
        )
    for row in e2e["interactive"]["with_backlog"]:
        lines.append(
            f"| {row['rate']:g} | {row['backlog_texts']} texts | {row['n']} | "
            f"{row['p50']:.1f} | {row['p95']:.1f} | {row['p99']:.1f} | "
            f"{row['bulk_texts_per_s']:.0f} |"
        )
    ref = backlog_reference(e2e["interactive"]["with_backlog"])
    lines += [
        "",
        f"With backlog at {ref['rate']:g} req/s, {ref['runs']} runs: median p99 "
        f"{ref['p99']:.1f} ms, median bulk {ref['bulk_texts_per_s']:.0f} texts/s.",
    ]
    lines += [
        "",
        "![latency](latency_vs_load.png)",
        "![throughput](throughput_vs_max_batch_tokens.png)",
        "",
    ]
    return "\n".join(lines)


def _cpu_lines(r: dict[str, Any]) -> list[str]:
    bulk, inproc = r["e2e"]["bulk"], r["inprocess"]["cpu"]
    lines = [
        "",
        "## CPU per text",
        "",
        "CPU time of each whole process (all threads, from /proc/<pid>/stat) over the bulk "
        f"runs above; in-process: this process tokenizing, batching and encoding the same "
        f"{inproc['texts']} sentences at the worker's max_batch_tokens "
        f"({inproc['max_batch_tokens']}), just before and just after the worker's bulk "
        "run (mean of the two). CPU-ms per 1,000 texts.",
        "",
        "| process | sentences | mixed (1 in 5 long) |",
        "| --- | --- | --- |",
    ]
    for process in bulk["sentences"]["cpu"]:
        per = [bulk[name]["cpu"][process]["cpu_ms_per_1000"] for name in ("sentences", "mixed")]
        lines.append(f"| {process} | {per[0]:.0f} | {per[1]:.0f} |")
    around = " and ".join(f"{run['cpu_ms_per_1000']:.0f}" for run in inproc["runs"])
    lines += [
        f"| in-process (tokenize + batch + encode), mean of {around} | "
        f"{inproc['cpu_ms_per_1000']:.0f} | |",
        "",
        f"Worker / in-process: {worker_cpu_ratio(r):.3f} (in-process ran "
        f"{inproc['texts'] / inproc['wall_s']:.0f} texts/s while measured).",
        "",
        "Batch shapes of the same sentences (worker: bulk lane, from its metrics; "
        "in-process: kembed's batcher with every text queued at once):",
        "",
        "| path | batches | rows per batch | padded tokens per batch | real / padded tokens |"
        " encoder s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, shapes in (
        ("worker", bulk["sentences"]["batches"]),
        ("in-process", inproc["batches"]),
    ):
        encoder = inproc["wall_s"] if shapes["encoder_s"] is None else shapes["encoder_s"]
        lines.append(
            f"| {name} | {shapes['batches']:.0f} | {shapes['rows_per_batch']:.1f} | "
            f"{shapes['padded_tokens_per_batch']:.0f} | {shapes['token_efficiency']:.3f} | "
            f"{encoder:.1f} |"
        )
    lines += [
        "",
        "(encoder s: the worker's encoder time for the batches; in-process: the whole "
        "tokenize + batch + encode time.)",
    ]
    return lines


def _plot_latency(r: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("alone", "alone", "-"), ("with_backlog", "bulk backlog", "--")):
        rows = sorted(r["e2e"]["interactive"][key], key=lambda row: row["rate"])
        rates = [row["rate"] for row in rows]
        for q, marker in (("p50", "o"), ("p99", "s")):
            ax.plot(rates, [row[q] for row in rows], style, marker=marker, label=f"{q}, {label}")
    ax.axhline(250, color="grey", linewidth=0.8, label="p99 target with backlog")
    ax.set(
        xlabel="offered load (single-text requests/s)",
        ylabel="latency (ms)",
        title="Interactive embed() latency",
        yscale="log",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_budget(r: dict[str, Any], path: Path) -> None:
    sweep = r["inprocess"]["sweep"]
    budgets = [row["max_batch_tokens"] for row in sweep]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in ("sentences", "mixed"):
        ax.plot(
            budgets,
            [row[name]["tokens_per_s"] for row in sweep],
            marker="o",
            label=f"{name} (in-process)",
        )
    ax.set(
        xlabel="max_batch_tokens (padded)",
        ylabel="tokens/s",
        xscale="log",
        title="Encoder throughput against the batch token budget",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
