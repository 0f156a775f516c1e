"""``kembed``'s dispatch: one module per subcommand, imported only when it runs, and a
missing install extra reported in one line with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kembed_cli import extras
from kembed_cli.main import COMMANDS, build_parser, main
from tests.conftest import ROOT


def test_every_subcommand_has_a_module_with_add_parser_and_run() -> None:
    for name in COMMANDS:
        parser = build_parser(name)
        positional = {"embed": ["x"], "ingest": ["x"], "topics": ["check"]}.get(name, [])
        args = parser.parse_args([name, *positional])
        assert args.command == name


def test_an_unknown_command_prints_the_choices_and_returns_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'serve'" in err
    assert "worker, validate, embed" in err


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("kembed ")


@pytest.mark.parametrize(
    ("command", "extra"), [("worker", "worker"), ("sink", "sink"), ("gateway", "gateway")]
)
def test_a_missing_extra_is_one_line_naming_it_and_exit_2(
    command: str, extra: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = extras.EXTRAS[extra][0]
    real = extras._find
    monkeypatch.setattr(extras, "_find", lambda name: None if name == module else real(name))
    argv = [command, *(["--target", "postgresql://u@h/db"] if command == "sink" else [])]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert f"kembed[{extra}]" in lines[0]
    assert module in lines[0]


def test_a_client_command_imports_neither_the_worker_nor_a_model_package() -> None:
    """``kembed embed --help`` loads its own module only: no worker runtime, no torch."""
    probe = (
        "import sys\n"
        "from kembed_cli.main import main\n"
        "try:\n"
        "    main(['embed', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = {'torch', 'transformers', 'worker.app', 'worker.pipeline', 'sink.app',"
        " 'kembed_cli.commands.worker', 'kembed_cli.commands.sink', 'fastapi', 'uvicorn',"
        " 'gateway.app'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_validate_json_is_the_report_alone_on_stdout(tmp_path: Path) -> None:
    """``kembed validate --json``: log events (the tuner's, the model's) go to stderr, so
    stdout parses as JSON. The measurement is replaced by one that logs an event, as the
    tuner does, and returns a report."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("a,b,1\nc,d,2\n")
    script = tmp_path / "validate.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import structlog
            import worker.quality as quality

            def validate(settings, pairs, thresholds):
                structlog.get_logger("kembed.worker").info("encoder.tuned", chosen="x")
                return quality.QualityReport(
                    pairs=len(pairs), reference_spearman=80.0, candidate_spearman=80.0,
                    mean_cosine=1.0, min_cosine=1.0, thresholds=thresholds, passed=True,
                    failures=[],
                )

            quality.validate = validate
            from kembed_cli.main import main
            sys.exit(main(["validate", "--json", "--pairs", sys.argv[1]]))
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEMBED_")}
    done = subprocess.run(
        [sys.executable, str(script), str(pairs)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pairs"] == 2
    assert "encoder.tuned" in done.stderr
