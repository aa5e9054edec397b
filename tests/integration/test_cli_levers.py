"""The levers from the command line name who pulled them (issue 13): ``tether decide`` settles
a call whose outcome is unknown, ``resume`` refuses one (naming the three answers), and
resume, decide, rollback and cancel are recorded as ``cli:<login name>``."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether.cli.main import main

APP = '''
import os
import tether as tt

harness = tt.Harness()

@harness.tool(side_effect=True)
async def refund(ctx: tt.ToolContext, amount: int) -> dict:
    with open(os.environ["REFUND_LEDGER"], "a") as ledger:
        ledger.write(ctx.idempotency_key + "\\n")
    raise tt.OutcomeUnknown("the provider took the request; no answer came")

@harness.agent("refunder")
class Refunder(tt.Agent):
    async def plan(self, task: tt.TaskView) -> tt.Action:
        if not task.scratch.get("asked"):
            task.scratch["asked"] = True
            return tt.ToolCall("refund", {"amount": 30})
        return tt.Finish({"result": task.last_tool_result, "error": task.last_tool_error})
'''
ME = f"cli:{getpass.getuser()}"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    (tmp_path / "refundapp.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TETHER_STORE", f"sqlite:///{tmp_path / 'levers.db'}")
    monkeypatch.setenv("TETHER_APP", "refundapp:harness")
    monkeypatch.setenv("REFUND_LEDGER", str(tmp_path / "ledger.txt"))
    monkeypatch.setenv("COLUMNS", "300")

    def invoke(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == code, result.output
        assert "Traceback" not in result.output
        return " ".join(result.output.split())

    return invoke


def parked_in_doubt(cli, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    task_id: str = cli("submit", "refunder")
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    assert shown["snapshot"]["status"] == "needs_human"
    assert shown["snapshot"]["call"]["status"] == "started"
    assert len((tmp_path / "ledger.txt").read_text().split()) == 1
    return task_id


def test_decide_happened_records_the_result_and_who_without_calling_again(
        cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    task_id = parked_in_doubt(cli, tmp_path)
    out = cli("resume", task_id, code=1)
    assert out.startswith("error: ") and all(
        answer in out for answer in ("happened", "not_happened", "skip"))
    assert "a result goes with 'happened' only" in cli("decide", task_id, "skip", "--result",
                                                       '{"x": 1}', code=1)
    assert "Invalid value" in cli("decide", task_id, "maybe", code=2)
    assert "--result is not valid JSON" in cli("decide", task_id, "happened", "--result", "{no",
                                               code=2)
    assert f"{task_id}: decide happened applied" in cli(
        "decide", task_id, "happened", "--result", '{"refunded": 30, "by": "bank statement"}')
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    assert shown["snapshot"]["status"] == "completed"
    assert shown["snapshot"]["result"] == {"result": {"refunded": 30, "by": "bank statement"},
                                           "error": None}
    assert len((tmp_path / "ledger.txt").read_text().split()) == 1  # never called again
    decided = [row for row in json.loads(cli("history", task_id, "--json"))
               if row.get("type") == "decide"]
    assert [(row["content"]["outcome"], row["content"]["by"]) for row in decided] == [
        ("happened", ME)]


def test_decide_skip_drops_the_call_and_the_agent_sees_who_skipped_it(
        cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    task_id = parked_in_doubt(cli, tmp_path)
    assert "decide skip applied" in cli("decide", task_id, "skip")
    cli("worker", "--until-idle")
    result = json.loads(cli("show", task_id, "--json"))["snapshot"]["result"]
    assert result["result"] is None and result["error"]["skipped"] is True
    assert result["error"]["by"] == ME
    assert "nothing to decide" in cli("decide", task_id, "happened", code=1)


def test_resume_rollback_and_cancel_name_the_cli_user(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    task_id = parked_in_doubt(cli, tmp_path)
    cli("decide", task_id, "happened", "--result", "{}")
    versions = json.loads(cli("versions", task_id, "--json"))
    assert "applied" in cli("rollback", task_id, "--to", str(versions[-1]["version"]))
    assert "cancel applied; now cancelled" in cli("cancel", task_id)
    cli("export", task_id, "-o", str(tmp_path / "bundle.json"))
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    details = {r["resume_strategy"]: r["detail"] for r in bundle["recovery_log"]}
    assert ME in details["human_decision"] and ME in details["rollback"]
    cancel = [e for e in bundle["events"] if e["type"] == "cancel"]
    assert [e["payload"]["by"] for e in cancel] == [ME]


def test_resume_names_the_cli_user(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The built-in inventory example parks for a person; a resume records who."""
    monkeypatch.setenv("TETHER_APP", "tether.examples:demo_app")
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "demo-ledger.db"))
    task_id = cli("submit", "inventory")
    cli("worker", "--until-idle")
    assert "resume applied" in cli("resume", task_id, "--message", "use the mirror")
    cli("export", task_id, "-o", str(tmp_path / "bundle.json"))
    bundle = json.loads((tmp_path / "bundle.json").read_text())
    resumed = [r for r in bundle["recovery_log"] if r["resume_strategy"] == "human_resume"]
    assert len(resumed) == 1 and f"resumed by {ME}" in resumed[0]["detail"]


def test_show_says_what_a_person_can_do_and_recovery_lists_the_log(
        cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 29: a task that needs a person shows the commands that move it (the decision
    first, naming the call in doubt); `tether recovery` lists its recovery log and
    `history` puts those records among the dialog rows."""
    task_id = parked_in_doubt(cli, tmp_path)
    shown = cli("show", task_id)
    assert "what a person can do:" in shown
    assert f"tether decide {task_id} happened --result JSON | not_happened | skip" in shown
    assert f"tether resume {task_id}" in shown and f"tether versions {task_id}" in shown
    assert f"tether fork {task_id} --paused" in shown
    log = json.loads(cli("recovery", task_id, "--json"))
    assert log and log[-1]["resume_strategy"] == "needs_human"
    assert "needs_human" in cli("recovery", task_id)
    assert "recovery: needs_human" in cli("history", task_id)
    assert "no task 'ghost'" in cli("recovery", "ghost", code=1)


def test_fork_starts_a_new_task_from_a_kept_version_and_names_who(
        cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`tether fork` from the parked version, after a person said the refund happened: the
    fork finishes from the source's record (the refund is not made again) and its first
    recovery record names the source, the version and who forked it."""
    task_id = parked_in_doubt(cli, tmp_path)
    parked = json.loads(cli("versions", task_id, "--json"))[-1]["version"]
    cli("decide", task_id, "happened", "--result", '{"refunded": 30}')
    cli("worker", "--until-idle")
    forked = cli("fork", task_id, "--from", str(parked), "--id", "refund-again")
    assert forked.split()[0] == "refund-again" and f"forked from {task_id} v{parked}" in forked
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", "refund-again", "--json"))["snapshot"]
    assert shown["status"] == "completed"
    assert shown["result"]["result"] == {"refunded": 30}
    assert len((tmp_path / "ledger.txt").read_text().split()) == 1  # not refunded again
    cli("export", "refund-again", "-o", str(tmp_path / "fork.json"))
    first = json.loads((tmp_path / "fork.json").read_text())["recovery_log"][0]
    assert first["resume_strategy"] == "fork" and ME in first["detail"]
    assert f"forked from task {task_id} version {parked}" in first["detail"]
    paused = cli("fork", task_id, "--from", str(parked), "--id", "look-first", "--paused")
    assert "it is paused: `tether resume look-first` starts it" in paused
    cli("worker", "--until-idle")
    assert json.loads(cli("show", "look-first", "--json"))["snapshot"]["status"] == "paused"
    assert "already exists" in cli("fork", task_id, "--id", "refund-again", code=1)
    assert "no task 'ghost'" in cli("fork", "ghost", code=1)
    assert "is not kept" in cli("fork", task_id, "--from", "999", code=1)


def test_delete_asks_first_and_gc_reports_what_it_removed(
        cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    task_id = parked_in_doubt(cli, tmp_path)
    result = CliRunner().invoke(main, ["delete", task_id], input="n\n")
    assert result.exit_code == 1 and "everything it stored?" in result.output
    assert json.loads(cli("show", task_id, "--json"))["snapshot"]["status"] == "needs_human"
    assert cli("delete", task_id, "--yes") == f"{task_id}: deleted"
    assert f"no task {task_id!r}" in cli("show", task_id, code=1)
    assert "no task 'ghost'" in cli("delete", "ghost", "--yes", code=1)
    assert cli("gc") == ("deleted 0 finished task(s) past their retention and 0 large"
                         " value(s) nothing refers to; retention is off"
                         " (Settings.retain_completed, retain_failed, retain_cancelled are"
                         " unset): finished tasks are kept for ever")


REPEATS = '''
import tether as tt

harness = tt.Harness()

@harness.tool(side_effect=True)
async def refund(ctx: tt.ToolContext, order: str) -> dict:
    return {"refunded": order, "key": ctx.idempotency_key}

@harness.agent("again")
class Again(tt.Agent):
    async def plan(self, task: tt.TaskView) -> tt.Action:
        asked = task.scratch.get("asked", 0)
        task.scratch["asked"] = asked + 1
        return tt.ToolCall("refund", {"order": "A1"}) if asked < 2 \\
            else tt.Finish(task.last_tool_result)
'''


def test_r10_r26_resume_earlier_result_answers_a_held_repeat_without_running_it(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """R10/R26: the same refund asked twice is held; `tether resume --earlier-result` answers
    it with the first call's result (its key shows the first call's), and refuses a task
    that holds no repeat."""
    (tmp_path / "repeats.py").write_text(REPEATS)
    monkeypatch.setenv("TETHER_APP", "repeats:harness")
    task_id = cli("submit", "again")
    cli("worker", "--until-idle")
    assert "holds no repeat" not in cli("resume", task_id, "--earlier-result")
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    first = next(r for r in json.loads(cli("history", task_id, "--json"))
                 if r.get("tool_call"))["tool_call"]["key"]
    assert shown["snapshot"]["status"] == "completed"
    assert shown["snapshot"]["result"] == {"refunded": "A1", "key": first}
    assert "holds no repeat" in cli("resume", task_id, "--earlier-result", code=1)


def test_resume_with_the_etag_show_printed_is_refused_once_the_task_moved_on(
        cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """R26: `tether resume --etag` with the etag `show` printed resumes the stop that was
    shown; after the task moved on (here it was resumed once and stopped again), the same
    etag is refused, naming why, and nothing is sent."""
    monkeypatch.setenv("TETHER_APP", "tether.examples:demo_app")
    monkeypatch.setenv("TETHER_DEMO_LEDGER", str(tmp_path / "demo-ledger.db"))
    task_id = cli("submit", "inventory")
    cli("worker", "--until-idle")
    shown = json.loads(cli("show", task_id, "--json"))
    assert "resume applied" in cli("resume", task_id, "--etag", shown["etag"])
    cli("worker", "--until-idle")

    def events() -> int:
        cli("export", task_id, "-o", str(tmp_path / "bundle.json"))
        return len(json.loads((tmp_path / "bundle.json").read_text())["events"])

    before = events()
    refused = cli("resume", task_id, "--etag", shown["etag"], code=1)
    assert "no longer as it was shown" in refused
    assert events() == before
