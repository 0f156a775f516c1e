"""``kembed validate``: the quality gate, this precision against fp32 (needs kembed[worker])."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kembed_cli.commands.worker import model_settings
from kembed_cli.common import add_settings_flags, write_json
from worker.settings import WorkerSettings

__all__ = ["DESCRIPTION", "add_arguments", "run", "tuning_table"]


DESCRIPTION = (
    "Embed reference pairs (default: STS-B test, English) with the "
    "configured model, dtype, quantization and compilation and with fp32, and report "
    "Spearman x100 against gold for both and the cosine between them. Exit 0 when the "
    "gate passes, 1 when it fails. Takes the worker's flags and KEMBED_* variables."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings_flags(parser, WorkerSettings)
    parser.add_argument(
        "--pairs",
        type=Path,
        default=None,
        help="CSV text1,text2,score (default: STS-B test, English, shipped with kembed)",
    )
    parser.add_argument("--limit", type=int, default=None, help="use the first N pairs")
    parser.add_argument(
        "--max-spearman-drop", type=float, default=None, help="gate threshold (default 0.5)"
    )
    parser.add_argument(
        "--min-mean-cosine", type=float, default=None, help="gate threshold (default 0.99)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    # Log events (the tuner's, the model's) go to stderr: stdout holds the report alone.
    settings = model_settings(args, "validate")
    if settings is None:
        return 2
    from worker.quality import GateThresholds, gate_pairs_path, load_pairs, validate

    thresholds = GateThresholds(
        settings.quality_max_spearman_drop
        if args.max_spearman_drop is None
        else args.max_spearman_drop,
        settings.quality_min_mean_cosine if args.min_mean_cosine is None else args.min_mean_cosine,
    )
    path = gate_pairs_path(args.pairs or settings.quality_gate_pairs)
    try:
        pairs = load_pairs(path, args.limit)
    except (OSError, ValueError, IndexError) as exc:
        print(f"kembed validate: cannot read reference pairs {path}: {exc}", file=sys.stderr)
        return 2
    passed = True
    specs = settings.model_specs()
    for spec in specs:  # KEMBED_MODELS: each model as its worker would serve it
        if _is_reranker(settings.for_model(spec)):
            print(
                f"kembed validate: {spec.served_name()} is a reranker (kind rerank); the "
                "STS-B gate judges embedding models only: skipped",
                file=sys.stderr,
            )
            continue
        report = validate(settings.for_model(spec), pairs, thresholds)
        report.pairs_source = str(path)
        passed = passed and report.passed
        name = spec.served_name()
        if args.json:
            write_json(report.as_dict() | ({"model": name} if len(specs) > 1 else {}))
        else:
            if report.tuning is not None:
                print(tuning_table(name, report.tuning))
            print(f"{name}: {report.summary()}" if len(specs) > 1 else report.summary())
    return 0 if passed else 1


def _is_reranker(settings: Any) -> bool:
    """Whether a single-model ``settings`` serves a cross-encoder (its kind, or what its
    config says: worker.encoder.models.detect_kind)."""
    from schemas import Kind
    from worker.encoder.models import detect_kind, resolve_model_dir

    if settings.model_kind != "auto":
        return bool(settings.model_kind == Kind.RERANK)
    return detect_kind(resolve_model_dir(settings.model)) == Kind.RERANK


def tuning_table(name: str, tuning: dict[str, Any]) -> str:
    """dtype/torch_compile auto as measured, one line per candidate."""
    lines = [f"{name}: auto measured {len(tuning['table'])} candidates, chose {tuning['chosen']}"]
    for row in tuning["table"]:
        speed = "-" if row["texts_per_s"] is None else f"{row['texts_per_s']:.0f} texts/s"
        cosine = "-" if row["mean_cosine"] is None else f"{row['mean_cosine']:.5f}"
        mark = " <- chosen" if row["chosen"] else ""
        lines.append(
            f"  {row['candidate']:<18} {row['status']:<8} {speed:>14}  cosine {cosine}{mark}"
        )
    return "\n".join(lines)
