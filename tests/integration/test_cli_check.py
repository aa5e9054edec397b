"""`tether check` (issue 13): the store's own integrity check plus every kept version of every
task loaded as a worker would load it; one line per problem naming the task and version;
exit 0 when nothing is wrong, 1 when something is, 2 when the store cannot be opened."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

import tether as tt
from tether.cli.integrity import check_store
from tether.cli.main import main
from tether.model import Status, TaskRecord
from tether.store import SQLiteStore


def run(*args: str, code: int) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store with three finished tasks of three versions each (1: submitted, 2, 3)."""
    path = tmp_path / "check.db"
    monkeypatch.setenv("TETHER_STORE", f"sqlite:///{path}")
    monkeypatch.setenv("COLUMNS", "300")

    async def go() -> None:
        async with tt.Harness(f"sqlite:///{path}") as h:
            @h.agent("talker")
            class Talker(tt.Agent):
                async def plan(self, task: tt.TaskView) -> tt.Action:
                    if not task.scratch.get("said"):
                        task.scratch["said"] = True
                        return tt.Reply("hello")
                    return tt.Finish("done")

            for name in ("alpha", "bravo", "charlie"):
                await h.submit("talker", {"name": name}, task_id=name)
            await h.run_until_idle(timeout=10)
            for name in ("alpha", "bravo", "charlie"):
                assert [v for v, _, _ in await h.store.list_versions(name)] == [1, 2, 3]

    asyncio.run(go())
    return path


def damage(path: Path, task_id: str, version: int, head: bytes) -> None:
    with sqlite3.connect(path) as db:
        changed = db.execute("UPDATE snapshots SET head = ? WHERE task_id = ? AND version = ?",
                             (head, task_id, version)).rowcount
    assert changed == 1


def stored_head(path: Path, task_id: str, version: int) -> dict[str, object]:
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT head FROM snapshots WHERE task_id = ? AND version = ?",
                         (task_id, version)).fetchone()
    parsed: dict[str, object] = orjson.loads(row[0])
    return parsed


def test_a_clean_store_exits_0(db: Path) -> None:
    out = run("check", code=0)
    assert "checked 3 tasks, 9 versions: no problems" in " ".join(out.split())
    report = json.loads(run("check", "--json", code=0))
    assert report["ok"] is True and report["problems"] == [] and report["store_checked"] is True


def test_damaged_versions_are_named_one_line_each_and_exit_1(db: Path) -> None:
    """A head whose JSON parses but holds a wrong-typed field, a head that is not JSON at all,
    and a task whose every version is damaged: each named by task and version."""
    wrong_type = stored_head(db, "alpha", 2)
    wrong_type["step"] = "three"
    damage(db, "alpha", 2, orjson.dumps(wrong_type))
    damage(db, "bravo", 3, b"\x00\x01 not json {")
    for version in (1, 2, 3):
        damage(db, "charlie", version, b"[]")
    out = run("check", code=1)
    lines = out.splitlines()
    alpha = [line for line in lines if line.startswith("task alpha")]
    assert len(alpha) == 1 and alpha[0].startswith("task alpha version 2: ") and "step" in alpha[0]
    bravo = [line for line in lines if line.startswith("task bravo")]
    assert len(bravo) == 1 and bravo[0].startswith("task bravo version 3: snapshot is unreadable")
    charlie = [line for line in lines if line.startswith("task charlie")]
    assert [line.split(":")[0] for line in charlie] == [
        "task charlie version 1", "task charlie version 2", "task charlie version 3",
        "task charlie"]
    assert "no readable version at all" in charlie[-1]
    assert "6 problem(s), 1 task(s) with no readable version" in " ".join(out.split())
    report = json.loads(run("check", "--json", code=1))
    assert report["unreadable"] == ["charlie"]
    assert {(p["task_id"], p["version"]) for p in report["problems"]} == {
        ("alpha", 2), ("bravo", 3), ("charlie", 1), ("charlie", 2), ("charlie", 3),
        ("charlie", None)}


def test_a_missing_large_value_and_a_missing_head_row_are_problems(db: Path) -> None:
    """A head referring to a large value the blob table lost; a task row whose head row is
    gone (the store's own check says so; the other versions still load)."""
    head = stored_head(db, "alpha", 3)
    head["input"] = {"$tether_blob": "sha256:" + "0" * 64, "bytes": 10}
    damage(db, "alpha", 3, orjson.dumps(head))
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM snapshots WHERE task_id = 'bravo' AND version = 3")
    out = run("check", code=1)
    assert "task alpha version 3: large value sha256:000" in out
    assert "task bravo" in out and "version 3" in out and "missing" in out
    assert "charlie" not in out


def test_an_old_store_id_with_markup_and_escapes_is_reported_visibly(db: Path) -> None:
    """Ids the id alphabet refuses today may sit in an older store; check names them too."""
    weird = "[/]old\x1b[2J"

    async def go() -> None:
        async with tt.Harness(f"sqlite:///{db}") as h:
            await h.store.create_task(TaskRecord(weird, "talker", Status.PENDING, 1.0, 1.0, 1),
                                      b'{"format": 1}')
            report = await check_store(h)
        assert [(p.task_id, p.version) for p in report.problems] == [(weird, 1), (weird, None)]

    asyncio.run(go())
    out = run("check", code=1)
    assert "task [/]old\\x1b[2J version 1: " in out and "\x1b" not in out


def test_a_store_that_cannot_be_opened_exits_2_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.db"
    out = run("--store", f"sqlite:///{missing}", "check", code=2)
    assert out.startswith("error: ") and "does not exist" in out
    assert not missing.exists()
    run("--store", f"sqlite:///{tmp_path / 'no-folder' / 'x.db'}", "check", code=2)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database at all" * 100)
    out = run("--store", f"sqlite:///{garbage}", "check", code=2)
    assert "garbage.db" in out


class Pruning:
    """A store whose version listing names one version more than it then has: what a check
    sees when a worker's commit prunes a version between the listing and the loading."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        return [(0, 0.0, 10), *await self.store.list_versions(task_id)]


def test_a_version_pruned_while_checking_is_skipped_not_reported(db: Path) -> None:
    async def go() -> None:
        store = SQLiteStore(str(db))
        async with tt.Harness(Pruning(store)) as h:
            report = await check_store(h)
        assert report.ok and report.tasks == 3 and report.versions == 9, report

    asyncio.run(go())


def test_an_empty_store_checks_clean() -> None:
    async def go() -> None:
        async with tt.Harness("memory://") as empty:
            report = await check_store(empty)
        assert report.ok and report.tasks == 0 and report.store_checked

    asyncio.run(go())
