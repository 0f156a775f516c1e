"""Unit tests for kembed_cli.main: flags generated from WorkerSettings, env vars, precedence."""

from __future__ import annotations

import pytest

from kembed_cli.main import main
from worker.settings import WorkerSettings

FIELDS = list(WorkerSettings.model_fields)


def worker_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["worker", "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_help_lists_a_flag_and_env_var_for_every_setting(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kembed worker --help` names the flag and the KEMBED_* env var of every setting."""
    out = worker_help(capsys)
    assert len(FIELDS) >= 20
    for name in FIELDS:
        assert f"--{name.replace('_', '-')}" in out, name
        assert f"KEMBED_{name.upper()}" in out, name


def test_help_states_each_default_once(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each flag's help states the setting's real default, never a contradictory second one."""
    text = " ".join(worker_help(capsys).split())
    assert text.count("(default:") == len(WorkerSettings.model_fields)
    for name, field in WorkerSettings.model_fields.items():
        assert f"[env: KEMBED_{name.upper()}] (default: {field.default})" in text, name


def test_flag_wins_over_env_and_env_fills_the_rest(
    started: list[WorkerSettings], clean_env: pytest.MonkeyPatch
) -> None:
    """A flag overrides its env var, and env vars apply to settings given no flag."""
    clean_env.setenv("KEMBED_MAX_BATCH_TOKENS", "99")
    clean_env.setenv("KEMBED_GROUP_ID", "env-group")
    assert main(["worker", "--max-batch-tokens", "1234"]) == 0
    assert len(started) == 1
    assert started[0].max_batch_tokens == 1234
    assert started[0].group_id == "env-group"


def test_no_flags_no_env_gives_defaults(started: list[WorkerSettings]) -> None:
    """Without flags or env vars the worker starts with WorkerSettings' defaults."""
    assert main(["worker"]) == 0
    assert len(started) == 1
    for name, field in WorkerSettings.model_fields.items():
        assert getattr(started[0], name) == field.default, name


def test_flags_of_every_kind_are_converted(started: list[WorkerSettings]) -> None:
    """Flags convert to the field's type: str, int, optional int, float and Literal."""
    argv = [
        "worker",
        "--group-id",
        "g2",
        "--max-batch-size",
        "7",
        "--max-seq-length",
        "128",
        "--max-batch-wait-ms",
        "0.5",
        "--dtype",
        "bfloat16",
        "--model-name",
        "served",
    ]
    assert main(argv) == 0
    settings = started[0]
    assert settings.group_id == "g2"
    assert settings.max_batch_size == 7
    assert settings.max_seq_length == 128
    assert settings.max_batch_wait_ms == 0.5
    assert settings.dtype == "bfloat16"
    assert settings.served_name() == "served"


def test_value_violating_a_constraint_exits_2(
    started: list[WorkerSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag value the settings reject (max_batch_tokens=0) returns 2 and starts nothing."""
    assert main(["worker", "--max-batch-tokens", "0"]) == 2
    assert started == []
    assert "max_batch_tokens" in capsys.readouterr().err


def test_env_var_alone_is_used(
    started: list[WorkerSettings], clean_env: pytest.MonkeyPatch
) -> None:
    """An env var with no matching flag sets the setting."""
    clean_env.setenv("KEMBED_MAX_BATCH_TOKENS", "99")
    assert main(["worker"]) == 0
    assert started[0].max_batch_tokens == 99


def test_invalid_env_var_exits_2(
    started: list[WorkerSettings], clean_env: pytest.MonkeyPatch
) -> None:
    """An env var the settings reject returns 2 and starts nothing."""
    clean_env.setenv("KEMBED_MAX_BATCH_SIZE", "lots")
    assert main(["worker"]) == 2
    assert started == []


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["worker", "--max-batch-tokens", "many"], id="not an int"),
        pytest.param(["worker", "--dtype", "int8"], id="not a choice"),
        pytest.param(["worker", "--no-such-flag", "1"], id="unknown flag"),
    ],
)
def test_unparseable_flag_exits_2(started: list[WorkerSettings], argv: list[str]) -> None:
    """A flag argparse cannot convert exits with status 2 before starting anything."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert started == []


def test_no_command_prints_help_and_returns_2(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kembed` without a command prints the usage and returns 2."""
    assert main([]) == 2
    assert "worker" in capsys.readouterr().out
