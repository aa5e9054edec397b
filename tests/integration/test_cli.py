"""The `tether` command line against a real SQLite file (R26 levers, R2 answers, R24 table)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether.cli.main import main


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TETHER_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("TETHER_APP", "tether.examples:demo_app")  # the code: levers apply at once
    runner = CliRunner()

    def invoke(*args: str, ok: bool = True) -> str:
        result = runner.invoke(main, list(args), catch_exceptions=False)
        assert (result.exit_code == 0) is ok, result.output
        return result.output

    return invoke


def test_submit_run_show_and_list_as_json(cli) -> None:  # type: ignore[no-untyped-def]
    """R2: `show --json` says the status, step and result of a task the worker ran."""
    task_id = cli("submit", "report", "--input", '{"report": "FY25"}').strip()
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    assert shown["snapshot"]["status"] == "completed"
    assert set(shown["snapshot"]["result"]) == {"extract_metrics", "compare_history", "write_summary"}
    listed = json.loads(cli("ls", "--json", "--status", "completed"))
    assert [t["task_id"] for t in listed] == [task_id]
    history = json.loads(cli("history", task_id, "--json"))
    assert sum(1 for row in history if row.get("event") == "spawn") == 4


def test_needs_human_then_resume_with_patch_then_export(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """R26: a parked task is resumed from the CLI with a patch, and its bundle is exported."""
    task_id = cli("submit", "inventory").strip()
    cli("worker", "--until-idle")
    assert json.loads(cli("ls", "--json"))[0]["status"] == "needs_human"
    assert "running" in cli("resume", task_id, "--message", "use the mirror",
                            "--patch", '{"source": "mirror"}')
    cli("worker", "--until-idle")
    assert json.loads(cli("show", task_id, "--json"))["snapshot"]["result"]["source"] == "mirror"
    out = tmp_path / "bundle.json"
    cli("export", task_id, "-o", str(out))
    bundle = json.loads(out.read_text())
    assert bundle["task"]["task_id"] == task_id
    assert any(r["resume_strategy"] == "human_resume" for r in bundle["recovery_log"])


def test_emit_dedup_and_versions_and_rollback(cli) -> None:  # type: ignore[no-untyped-def]
    """R6, R14: a repeated source_event_id is reported as duplicate; a rollback names the version."""
    task_id = cli("submit", "contracts", "--input", '{"files": ["contract-01.pdf"]}').strip()
    assert "stored" in cli("emit", task_id, "user_message", "--payload", '"hi"',
                           "--source-event-id", "m-1")
    assert "duplicate" in cli("emit", task_id, "user_message", "--payload", '"hi"',
                              "--source-event-id", "m-1")
    cli("worker", "--until-idle")
    kept = json.loads(cli("versions", task_id, "--json"))
    assert len(kept) >= 3
    assert kept[-1]["status"] == "completed" and kept[-1]["step"] > kept[0]["step"]
    assert {"version", "step", "status", "created_at", "bytes"} <= set(kept[0])
    shown = cli("versions", task_id)
    assert "step" in shown and "status" in shown and "completed" in shown
    out = cli("rollback", task_id, "--to", str(kept[0]["version"]))
    assert f"rollback to version {kept[0]['version']} applied" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", "nope"), "no task 'nope'"),
        (("submit", "nosuch"), "no agent 'nosuch'"),
        (("emit", "nope", "made_up_type"), "not in the interruption protocol"),
        (("rollback", "nope", "--to", "1"), "no task 'nope'"),
        (("schedule", "add", "feb", "--cron", "0 0 30 2 *", "--agent", "report"),
         "'0 0 30 2 *' never fires"),
        (("schedule", "add", "six", "--cron", "0 0 9 * * * *", "--agent", "report"),
         "is not a cron expression"),
    ],
)
def test_errors_are_one_clear_line_and_exit_1(cli, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    """Bad input gets a clear error naming the problem and a non-zero exit, no traceback."""
    out = cli(*args, ok=False)
    assert message in " ".join(out.split())
    assert "Traceback" not in out


def test_bad_json_input_is_refused_before_anything_is_stored(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("submit", "report", "--input", "{not json", ok=False)
    assert "--input is not valid JSON" in out
    assert json.loads(cli("ls", "--json")) == []


def test_protocol_table_lists_priorities(cli) -> None:  # type: ignore[no-untyped-def]
    """R24: the interruption protocol is printable from one place."""
    table = json.loads(cli("protocol", "--json"))
    assert table["user_interrupt"]["priority"] == 0
    assert table["heartbeat"]["priority"] == 4
    assert table["user_message"]["supersedes"] is True and table["heartbeat"]["supersedes"] is False
    assert "sets the answer aside" in cli("protocol")


def test_worker_takes_the_app_as_an_argument(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """`tether worker myapp:harness` loads the user's harness from an import path."""
    (tmp_path / "myapp.py").write_text(
        "import tether as tt\n"
        "harness = tt.Harness()\n"
        "@harness.agent('hello')\n"
        "class Hello(tt.Agent):\n"
        "    async def plan(self, task):\n"
        "        return tt.Finish('hello from myapp')\n"
    )
    monkeypatch.chdir(tmp_path)
    task_id = cli("--app", "myapp:harness", "submit", "hello").strip()
    cli("worker", "myapp:harness", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    assert shown["snapshot"]["result"] == "hello from myapp"
    out = cli("worker", "nosuchmodule:harness", "--until-idle", ok=False)
    assert "cannot load app" in out


async def test_harness_is_an_async_context_manager(tmp_path: Path) -> None:
    """The store opened by a harness is closed when its `async with` block ends."""
    import tether as tt

    async with tt.Harness(f"sqlite:///{tmp_path / 'h.db'}") as harness:
        assert await harness.store.list_tasks() == []
        store = harness.store
    assert harness._store is None
    with pytest.raises(Exception, match="closed"):
        await store.list_tasks()


def test_a_lever_that_is_not_applied_says_why_and_exits_1(cli) -> None:  # type: ignore[no-untyped-def]
    """R21, R26: a second resume of a task that is already running again is not applied; the
    CLI says so with the reason and exits 1, instead of claiming success."""
    task_id = cli("submit", "inventory").strip()
    cli("worker", "--until-idle")
    assert "resume applied; now running" in " ".join(cli("resume", task_id).split())
    out = " ".join(cli("resume", task_id, ok=False).split())
    assert "resume was not applied" in out
    assert "duplicate resume signal" in out
    closed = " ".join(cli("cancel", task_id).split())
    assert "cancel applied; now cancelled" in closed


@pytest.mark.postgres
def test_r13_migrate_creates_then_keeps_a_postgres_schema_and_workers_run_on_it(
        cli, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """R13: `tether migrate` on a PostgreSQL store says what it applied, and nothing the second
    time; `worker --store postgresql://...` then runs the example tasks there."""
    import services

    fresh = services.create_database()
    try:
        monkeypatch.setenv("TETHER_STORE", fresh)
        assert cli("migrate").strip() == ("applied: 0001_initial.sql, 0002_blobs.sql,"
                                     " 0003_checkpoint_function.sql, 0004_limits.sql,"
                                     " 0005_schedules.sql,"
                                     " 0006_schedule_claims_and_limit_sizes.sql,"
                                     " 0007_checkpoint_if_inbox_seen.sql,"
                                     " 0008_graph_checkpoints.sql,"
                                     " 0009_limit_functions.sql,"
                                     " 0010_limit_handover.sql,"
                                     " 0011_idempotency_by_key_prefix.sql,"
                                     " 0012_checkpoint_reading.sql")
        assert cli("migrate").strip() == "schema is up to date"
        task_id = cli("submit", "report", "--input", '{"report": "FY25"}').strip()
        cli("worker", "--until-idle")
        shown = json.loads(cli("show", task_id, "--json"))
        assert shown["snapshot"]["status"] == "completed"
    finally:
        services.drop_database(fresh)


def test_r13_migrate_on_sqlite_has_nothing_to_do(cli) -> None:  # type: ignore[no-untyped-def]
    said = " ".join(cli("migrate").split())
    assert said == ("the SQLite schema is created when a store is opened: it is there, up to"
                    " date")


def test_gc_says_whether_retention_is_on_and_demo_keep_says_how_to_look(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: `gc` with no retention says it is off (not only "deleted 0"); `demo --keep`
    prints the command that looks at what it kept."""
    said = " ".join(cli("gc").split())
    assert "deleted 0 finished task(s)" in said and "retention is off" in said
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    kept = " ".join(cli("demo", "--keep").split())
    folder = re.search(r"demo files kept in (\S+) look at them with:", kept)
    assert folder is not None, kept
    assert f"tether --store sqlite:///{folder[1]}/tether.db ls" in kept
    listed = cli("--store", f"sqlite:///{folder[1]}/tether.db", "ls", "--json")
    assert len(json.loads(listed)) >= 4


def test_r13_an_unreachable_postgres_store_is_one_clear_line(cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TETHER_STORE", "postgresql://nobody:secret@127.0.0.1:1/none")
    out = cli("ls", ok=False)
    assert out.startswith("error: PostgreSQL store") and out.count("\n") == 1, out
    assert "is unavailable for now" in out and "secret" not in out


def test_the_app_is_named_by_its_module_and_read_only_commands_never_import_it(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: `--app billing` means `billing:harness`; an app that cannot be loaded is one
    line (exit 1, no usage banner); commands that only read the store (ls, show, history,
    versions, export, watch, limits, schedule ls) do not import the app at all, so a slow
    or broken import costs them nothing."""
    (tmp_path / "billing.py").write_text(
        "import os, tether as tt\n"
        "if os.environ.get('BILLING_BROKEN'):\n"
        "    raise RuntimeError('billing cannot start: no credentials')\n"
        "harness = tt.Harness()\n"
        "@harness.agent('invoice')\n"
        "class Invoice(tt.Agent):\n"
        "    async def plan(self, task):\n"
        "        return tt.Finish('invoiced')\n")
    monkeypatch.chdir(tmp_path)
    task_id = cli("--app", "billing", "submit", "invoice").strip()
    cli("--app", "billing", "worker", "--until-idle")
    monkeypatch.setenv("BILLING_BROKEN", "1")
    monkeypatch.delitem(sys.modules, "billing")  # this process imported it: forget it
    for command in (["ls"], ["show", task_id], ["history", task_id], ["versions", task_id],
                    ["limits"], ["schedule", "ls"]):
        assert "billing cannot start" not in cli("--app", "billing", *command)
    assert "billing" not in sys.modules
    out = cli("--app", "billing", "submit", "invoice", ok=False)
    assert "cannot load app 'billing'" in out and "no credentials" in out
    assert "Usage:" not in out and "Traceback" not in out


def test_the_worker_logs_each_recovery_it_makes_and_takes_its_lease_from_the_command_line(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: one INFO line per recovery (default --log-level info); --lease-seconds and
    --log-level are checked like any option."""
    (tmp_path / "flaky.py").write_text(
        "import tether as tt\n"
        "harness = tt.Harness(settings=tt.Settings(recovery_backoff=0.01))\n"
        "CALLS = []\n"
        "@harness.tool(idempotent=True, retry=tt.RetryPolicy(max_attempts=1))\n"
        "async def fetch(ctx):\n"
        "    CALLS.append(1)\n"
        "    if len(CALLS) == 1:\n"
        "        raise ConnectionError('upstream reset the connection')\n"
        "    return 'fetched'\n"
        "@harness.agent('reader')\n"
        "class Reader(tt.Agent):\n"
        "    async def plan(self, task):\n"
        "        if task.last_tool_result is None:\n"
        "            return tt.ToolCall('fetch')\n"
        "        return tt.Finish(task.last_tool_result)\n")
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_APP": "flaky",
           "COLUMNS": "300"}
    tether = [sys.executable, "-m", "tether"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*tether, *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)

    task_id = run("submit", "reader").stdout.strip()
    worked = run("worker", "--until-idle", "--lease-seconds", "7")
    assert worked.returncode == 0, worked.stderr
    assert f"recovery retry_backoff on task {task_id}" in worked.stderr
    assert "upstream reset the connection" in worked.stderr
    assert json.loads(cli("show", task_id, "--json"))["snapshot"]["result"] == "fetched"
    again = run("submit", "reader").stdout.strip()
    quiet = run("worker", "--until-idle", "--log-level", "warning")
    assert quiet.returncode == 0 and "recovery" not in quiet.stderr  # it failed once too: hidden
    assert json.loads(cli("show", again, "--json"))["snapshot"]["status"] == "completed"
    refused = run("worker", "--lease-seconds", "0.2")
    assert refused.returncode == 2 and "--lease-seconds" in refused.stderr
