"""The CLI prints what tasks hold literally and harmlessly (issue 13).

Task inputs, results, errors, dialog rows, reasons and ids are data: rich markup in them
(``[INST] hi [/INST]``, ``[/]``) is shown as written instead of crashing the command or
styling the terminal, and control characters (ESC, CSI, OSC, other C0 and C1 codes, bidi
overrides) are shown as visible escapes instead of reaching the terminal. Ids refused at
submit today may still sit in an older store: they are inserted with the store API.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tether as tt
from tether.cli.main import main
from tether.cli.render import json_text, visible
from tether.model import Frame, Snapshot, Status, TaskRecord

MARKUP = "[INST] hi [/INST] [/] [bold red]loud[/bold red] [link=http://evil.example]x[/link]"
CONTROL = ("\x1b[2J\x1b]0;owned\x07 \x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\"
           " \x9b31mc1 \u202eabc.exe \u2066iso\u2069 \r\x08\x7f end")
NASTY = f"{MARKUP} {CONTROL}"
OLD_IDS = ["[/]x", "[bold]b", "esc\x1b[31mred", "rtl\u202egnp.exe", "c1\x9b2J"]
"""Ids an older tether accepted; the id alphabet now refuses every one of them."""


def harmful(text: str) -> list[str]:
    """Characters in *text* that would act on a terminal instead of being shown."""
    return [repr(ch) for ch in text
            if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp")]


def same(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("TETHER_STORE", url)
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the width; the checks read whole lines
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    return url


def invoke(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert harmful(result.output) == [], result.output
    return result.output


def head(task_id: str, **fields: Any) -> bytes:
    return Snapshot(task_id=task_id, agent="literal", input=fields.pop("input", NASTY),
                    stack=[Frame(agent="literal", input=None)], **fields).dumps()


async def _old_store_task(store: Any, task_id: str, wake_at: float | None = None,
                          **fields: Any) -> None:
    record = TaskRecord(task_id, "literal", Status.PENDING, 1.0, 1.0, 1)
    await store.create_task(record, head(task_id, **fields), wake_at=wake_at)


def fill(url: str) -> dict[str, str]:
    """Tasks holding markup and control characters everywhere a person reads them."""

    async def go() -> dict[str, str]:
        async with tt.Harness(url) as h:
            @h.agent("literal")
            class Literal(tt.Agent):
                async def plan(self, task: tt.TaskView) -> tt.Action:
                    if not task.scratch.get("said"):
                        task.scratch["said"] = True
                        return tt.Reply(NASTY)
                    return tt.Finish({"answer": NASTY})

            @h.agent("failing")
            class Failing(tt.Agent):
                async def plan(self, task: tt.TaskView) -> tt.Action:
                    return tt.Fail(NASTY)

            ids = {"done": await h.submit("literal", {"prompt": NASTY}),
                   "failed": await h.submit("failing", NASTY)}
            await h.run_until_idle(timeout=10)
            for task_id in OLD_IDS:
                await _old_store_task(h.store, task_id)
            return ids

    return asyncio.run(go())


def test_visible_escapes_what_acts_on_a_terminal_and_keeps_text() -> None:
    assert visible("plain [b]text[/b]\nnext\tline") == "plain [b]text[/b]\nnext\tline"
    assert visible("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert visible("\x9b\x7f\x00\r") == "\\x9b\\x7f\\x00\\x0d"
    assert visible("\u202eabc\u2066") == "\\u202eabc\\u2066"
    assert visible("\U000e0041") == "\\U000e0041"  # a tag character (invisible)
    assert visible("caf\u00e9 \u65e5\u672c \U0001f600 \u200d") == "caf\u00e9 \u65e5\u672c \U0001f600 \u200d"
    assert visible("one\ntwo", one_line=True) == "one\\x0atwo"
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert harmful(visible(every).replace("\u200d", "")) == []
    as_json = json_text({"every": every})
    assert harmful(as_json.replace("\u200d", "")) == [] and json.loads(as_json) == {"every": every}


def test_ls_lists_every_task_though_some_ids_hold_markup_and_escapes(store_url: str) -> None:
    """One id like ``[/]x`` in an older store used to break ``tether ls`` for every task."""
    ids = fill(store_url)
    out = invoke("ls")
    for task_id in [*ids.values(), "[/]x", "[bold]b"]:
        assert task_id in out
    for task_id in OLD_IDS[2:]:
        assert visible(task_id) in out
    assert "\\x1b[31mred" in out and "\\u202egnp.exe" in out
    assert MARKUP[:40] in out  # the start of the failed task's reason


def test_ls_json_round_trips_the_ids_and_escapes_what_json_leaves_raw(store_url: str) -> None:
    """JSON escapes C0 controls but not C1 codes or bidi overrides: those are written as
    \\u escapes too, so the listing is safe on a terminal and decodes to the exact ids."""
    ids = fill(store_url)
    out = invoke("ls", "--json")
    listed = {t["task_id"]: t for t in json.loads(out)}
    assert set(listed) == {*ids.values(), *OLD_IDS}
    assert listed[ids["failed"]]["reason"] == NASTY
    assert "\\u202e" in out and "\\u009b" in out


def test_show_and_history_print_markup_and_escapes_literally(store_url: str) -> None:
    """``[INST] hi [/INST]`` in a task's input, dialog or result used to crash show and
    history; escape sequences reached the terminal."""
    ids = fill(store_url)
    failed = same(invoke("show", ids["failed"]))
    assert f"input: {MARKUP}" in failed and f"reason: {MARKUP}" in failed
    assert same(visible(CONTROL)) in failed
    done = same(invoke("show", ids["done"]))  # input and result shown as JSON: \u001b for ESC
    assert MARKUP in done and "\\u001b[2J" in done and "\\x9b31mc1 \\u202eabc.exe" in done
    history = same(invoke("history", ids["done"]))
    assert MARKUP in history and "\\x1b]0;owned\\x07" in history and "\\u202eabc.exe" in history
    assert json.loads(invoke("show", ids["done"], "--json"))["snapshot"]["result"] == {
        "answer": NASTY}
    assert any(row.get("content") == NASTY for row in json.loads(invoke("history", ids["done"],
                                                                        "--json")))


@pytest.mark.parametrize("task_id", OLD_IDS)
def test_an_error_naming_such_an_id_is_one_plain_line(store_url: str, task_id: str) -> None:
    """The error message quotes the id (refused now, or not found): printed literally."""
    fill(store_url)
    for command in (("show", task_id), ("history", task_id), ("cancel", task_id),
                    ("rollback", task_id, "--to", "1")):
        out = invoke(*command, code=1)
        assert out.startswith("error: ") and out.count("\n") == 1, out
        assert task_id[:2] in out


def test_show_survives_a_deadline_and_a_wake_time_beyond_the_calendar(store_url: str) -> None:
    """Deadlines are bounded at submit now, but an older store may hold one in the year
    31 million: show prints it as a number instead of crashing on the date."""
    async def go() -> None:
        async with tt.Harness(store_url) as h:
            await _old_store_task(h.store, "far-future", wake_at=1e18, deadline_at=1e18)
    asyncio.run(go())
    out = same(invoke("show", "far-future"))
    assert "deadline: 1e+18" in out and "due for a look at 1e+18" in out
    assert "far-future" in same(invoke("ls"))


def test_worker_logs_show_a_reason_with_escapes_harmlessly(store_url: str, tmp_path: Path) -> None:
    """The worker's log lines (a task handed to a person, with its reason) reach the terminal
    too: an agent's error text in them is made visible like everything else. A real process,
    whose logging nobody configured (pytest's log capture would hide the lines in-process)."""
    (tmp_path / "nastyapp.py").write_text(
        "import tether as tt\n"
        "harness = tt.Harness(settings=tt.Settings(recovery_backoff=0.001,"
        " max_recovery_attempts=1))\n"
        "@harness.agent('broken')\n"
        "class Broken(tt.Agent):\n"
        "    async def plan(self, task):\n"
        f"        raise RuntimeError({NASTY!r})\n"
    )
    env = {**os.environ, "TETHER_STORE": store_url, "TETHER_APP": "nastyapp:harness",
           "PYTHONPATH": str(tmp_path)}

    def tether(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "tether", *args], cwd=tmp_path, env=env,
                              capture_output=True, timeout=60, check=False)
        out = (done.stdout + done.stderr).decode()
        assert done.returncode == 0, out
        assert harmful(out) == [], out
        return out

    task_id = tether("submit", "broken").strip()
    logged = tether("worker", "--until-idle")
    assert f"task {task_id} needs a person" in logged and "\\x1b[2J" in logged, logged
    assert json.loads(tether("show", task_id, "--json"))["snapshot"]["status"] == "needs_human"
