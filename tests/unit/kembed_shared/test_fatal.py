"""Every way a worker ends is one structured log event and a documented exit status.

Each test runs ``kembed worker``'s code path (``kembed_cli.main.main``) in a fresh Python
process, so that what reaches stdout and stderr is exactly what an operator's log
collector would see, with the real logging set-up, the real ``run_worker`` (HTTP server,
loop, hooks) and only its Kafka-and-model body, ``worker.app._serve``, replaced by one
that fails in the way under test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from kembed_shared.observability.fatal import ExitCode
from tests.support.cli import without_kembed_env

ROOT = Path(__file__).resolve().parents[3]
RAW_TRACEBACK = "Traceback (most recent call last)"


def run_script(path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """The Python script ``path`` run against this source tree (whatever the environment
    has installed), without this process's KEMBED_* variables but with ``env``; the
    finished process and its stdout and stderr together."""
    environ = without_kembed_env({"PYTHONPATH": str(ROOT), **env})
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, done.stdout + done.stderr


def run_worker_with(
    tmp_path: Path, body: str, prelude: str = "", **env: str
) -> tuple[int, list[dict[str, Any]], str]:
    """Run the worker command with ``_serve`` replaced by ``body`` (the body of an async
    function of (settings, metrics, probes, info, load)), after the statement ``prelude``; its
    exit status, its output parsed as JSON lines, and the raw output."""
    script = textwrap.dedent(
        """
        import asyncio, sys, threading
        import worker.app

        async def _serve(settings, metrics, probes, info, load):
        {body}

        worker.app._serve = _serve
        {prelude}
        from kembed_cli.main import main
        sys.exit(main(["worker"]))
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), "    "), prelude=prelude)
    path = tmp_path / "failing_worker.py"
    path.write_text(script)
    done, output = run_script(
        path,
        KEMBED_LOG_FORMAT="json",
        KEMBED_HTTP_PORT="0",
        KEMBED_HTTP_HOST="127.0.0.1",
        HF_HUB_OFFLINE="1",
        **env,
    )
    events = []
    for line in output.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"a line that is not JSON: {line!r}\n{output}") from None
        assert isinstance(event, dict), line
        events.append(event)
    return done.returncode, events, output


def assert_no_raw_traceback(events: list[dict[str, Any]], output: str) -> None:
    """Tracebacks appear only inside a field of a JSON event."""
    inside = sum(json.dumps(event).count(RAW_TRACEBACK) for event in events)
    assert output.count(RAW_TRACEBACK) == inside, output


def test_an_unexpected_error_is_one_fatal_event_with_its_traceback_and_exit_status_1(
    tmp_path: Path,
) -> None:
    """A pipeline failing with an exception type the command has no case for (LookupError,
    raised from a task the pipeline awaits) ends the worker with exactly one ``worker.fatal``
    JSON event carrying the type, the message and the traceback, and exit status 1; nothing
    else reaches stdout or stderr but JSON lines."""
    code, events, output = run_worker_with(
        tmp_path,
        """
        async def stage():
            await asyncio.sleep(0)
            raise LookupError("partition 3 has no owner")

        await asyncio.create_task(stage())
        """,
    )

    assert code == int(ExitCode.FAILED) == 1
    fatal = [e for e in events if "traceback" in e or e.get("level") in ("error", "critical")]
    assert len(fatal) == 1, events
    (event,) = fatal
    assert event["event"] == "worker.fatal"
    assert event["level"] == "critical"
    assert event["error_type"] == "LookupError"
    assert event["error"] == "partition 3 has no owner"
    assert event["exit_code"] == 1
    assert event["traceback"].startswith(RAW_TRACEBACK)
    assert 'raise LookupError("partition 3 has no owner")' in event["traceback"]
    assert event["traceback"].endswith("LookupError: partition 3 has no owner")
    assert_no_raw_traceback(events, output)
    # run_worker's own clean-up ran: the HTTP server was started and the loop closed.
    assert [e["event"] for e in events][:2] == ["worker.starting", "http.started"]


def test_the_fatal_event_masks_the_settings_secrets(tmp_path: Path) -> None:
    """An error whose message holds the Kafka password (as a careless library might write
    it) is logged with the password masked, in the message and in the traceback."""
    password = "s3cr3t-Pa55w0rd"
    code, events, output = run_worker_with(
        tmp_path,
        """
        raise ConnectionError("login as carol with " + settings.sasl_password.get_secret_value())
        """,
        KEMBED_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KEMBED_SASL_MECHANISM="SCRAM-SHA-512",
        KEMBED_SASL_USERNAME="carol",
        KEMBED_SASL_PASSWORD=password,
    )

    assert code == 1
    (event,) = [e for e in events if e["event"] == "worker.fatal"]
    assert event["error_type"] == "ConnectionError"
    assert event["error"] == "login as carol with ***"
    assert "ConnectionError: login as carol with ***" in event["traceback"]
    assert password not in output
    assert_no_raw_traceback(events, output)


def test_errors_in_threads_and_unretrieved_tasks_are_log_events(tmp_path: Path) -> None:
    """What Python and asyncio would print on their own, an exception in a thread and a
    task whose exception is never retrieved, are log events with a traceback field; the
    worker that then stops normally exits 0 with no raw traceback anywhere."""
    code, events, output = run_worker_with(
        tmp_path,
        """
        def crash():
            raise KeyError("in a thread")

        thread = threading.Thread(target=crash, name="helper")
        thread.start()
        thread.join()

        async def forgotten():
            raise ValueError("never retrieved")

        task = asyncio.create_task(forgotten())
        await asyncio.sleep(0.05)
        del task
        import gc
        gc.collect()
        """,
    )

    assert code == int(ExitCode.OK) == 0
    by_name = {e["event"]: e for e in events}
    assert by_name["thread.failed"]["thread"] == "helper"
    assert by_name["thread.failed"]["error_type"] == "KeyError"
    assert "raise KeyError" in by_name["thread.failed"]["traceback"]
    assert by_name["asyncio.error"]["error_type"] == "ValueError"
    assert "never retrieved" in by_name["asyncio.error"]["message"]
    assert "raise ValueError" in by_name["asyncio.error"]["traceback"]
    assert "worker.fatal" not in by_name
    assert by_name["worker.stopped"]["level"] == "info"
    assert_no_raw_traceback(events, output)


def test_a_model_that_cannot_be_loaded_exits_with_the_start_up_status(tmp_path: Path) -> None:
    """The exit status table: a model that cannot be loaded is a start-up error (2),
    reported by its own event and not again as worker.fatal."""
    code, events, output = run_worker_with(
        tmp_path,
        """
        from worker.settings import ModelSpec
        raise worker.app._load_failed(
            ModelSpec(model="/nonexistent/model"), "loading", FileNotFoundError("gone")
        )
        """,
    )

    assert code == int(ExitCode.STARTUP) == 2
    assert [e["event"] for e in events if e["level"] != "info"] == ["model.load_failed"]
    assert_no_raw_traceback(events, output)


def test_the_sink_ends_an_unexpected_error_the_same_way(tmp_path: Path) -> None:
    """``kembed sink`` with a failure it has no case for: one ``sink.fatal`` event with the
    traceback, the database password (given in the target URI) masked, status 1."""
    script = tmp_path / "failing_sink.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import sink.app

            async def run_sink(settings, kafka):
                raise RuntimeError("cannot use " + settings.target)

            sink.app.run_sink = run_sink
            from kembed_cli.main import main
            sys.exit(main(["sink"]))
            """
        )
    )
    done, output = run_script(
        script,
        KEMBED_SINK_TARGET="postgresql://sink:db-Pa55word@127.0.0.1:5432/app",
        KEMBED_SINK_LOG_FORMAT="json",
    )
    events = [json.loads(line) for line in output.splitlines()]

    assert done.returncode == 1
    assert [e["event"] for e in events] == ["sink.fatal"], output
    (event,) = events
    assert event["error_type"] == "RuntimeError"
    assert event["error"] == "cannot use postgresql://sink:***@127.0.0.1:5432/app"
    assert "raise RuntimeError" in event["traceback"]
    assert "db-Pa55word" not in output
    assert_no_raw_traceback(events, output)


def test_a_worker_whose_encoder_cannot_be_imported_ends_with_worker_fatal(tmp_path: Path) -> None:
    """A failure before run_worker even starts (here: worker.app, which brings torch and
    transformers, cannot be imported) is the same one worker.fatal event and status 1."""
    code, events, output = run_worker_with(
        tmp_path, "pass", prelude="sys.modules['worker.app'] = None"
    )

    assert code == 1
    assert [e["event"] for e in events] == ["worker.fatal"], output
    assert events[0]["error_type"] in ("ImportError", "ModuleNotFoundError")
    assert "worker.app" in events[0]["error"]
    assert_no_raw_traceback(events, output)
