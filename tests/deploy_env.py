"""The environment variables each kembed service reads, from its settings models: the
deploy files (Compose file, Helm chart) are checked against them, so a misspelt or
removed ``KEMBED_*`` variable there fails a test instead of being silently ignored."""

from __future__ import annotations

from pydantic_settings import BaseSettings

from gateway.settings import GatewaySettings
from kembed_shared.settings import KafkaClientSettings
from sink.settings import SinkSettings
from worker.settings import WorkerSettings

# Each role's settings models: its own, plus the Kafka connection settings (KEMBED_<FLAG>)
# that every kembed process shares.
ROLE_SETTINGS: dict[str, tuple[type[BaseSettings], ...]] = {
    "worker": (WorkerSettings,),
    "sink": (SinkSettings, KafkaClientSettings),
    "gateway": (GatewaySettings, KafkaClientSettings),
}


def env_names(*models: type[BaseSettings]) -> set[str]:
    """``KEMBED_...`` names the models read (env_prefix + field name, upper case)."""
    names: set[str] = set()
    for model in models:
        prefix = str(model.model_config.get("env_prefix", ""))
        names |= {f"{prefix}{field}".upper() for field in model.model_fields}
    return names


def role_env_names(role: str) -> set[str]:
    """The ``KEMBED_*`` variables ``kembed <role>`` reads (worker, sink or gateway)."""
    return env_names(*ROLE_SETTINGS[role])


def kembed_args_problem(args: list[str]) -> str | None:
    """None if ``kembed <args>`` parses with kembed's own command line (the subcommand
    and every flag exist, each value has the right type); else what argparse says."""
    import contextlib
    import io

    from kembed_cli.main import build_parser

    if not args or args[0].startswith("-"):
        return f"no subcommand in {args}"
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            build_parser(args[0]).parse_args(args)
    except SystemExit as exit_:
        return f"kembed {' '.join(args)}: exit {exit_.code}: {errors.getvalue().strip()}"
    return None
