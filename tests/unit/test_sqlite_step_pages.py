"""R8, R10, R13 (issue 30): what a step writes to the SQLite log, read from the log itself.

Each WAL frame names the page it holds; ``dbstat`` names the table or index a page belongs
to. Once a task has its kept versions, a step writes its head over the row of the version
that falls out: that must move no index entry (schema 7 keys snapshots by task only), and a
call record must be written to the idempotency table and its key index only (the records of
a task are found by their keys, not by an index of tasks).
"""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from pathlib import Path

import tether as tt

STEPS = 40
KEEP = 3
SETTLED = 10
"""Commits left out at the start: the task's first versions are inserted, not rewritten."""


def app(path: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{path}", settings=tt.Settings(keep_versions=KEEP))

    @h.tool(idempotent=True)
    async def add(ctx: tt.ToolContext, a: int, b: int) -> int:
        return a + b

    @h.agent("counter")
    class Counter(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.step < STEPS:
                return tt.ToolCall("add", {"a": t.step, "b": 1})
            return tt.Finish(t.step)

    return h


def commits_in_log(wal: bytes) -> list[list[int]]:
    """The pages of each committed transaction in a WAL file, in order."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    commits: list[list[int]] = []
    pages: list[int] = []
    offset = 32
    while offset + 24 <= len(wal):
        page, size_after_commit = struct.unpack(">II", wal[offset:offset + 8])
        pages.append(page)
        if size_after_commit:
            commits.append(pages)
            pages = []
        offset += 24 + page_size
    return commits


def owners(path: Path) -> dict[int, str]:
    db = sqlite3.connect(path)
    found = {int(page): str(name) for name, page in db.execute("SELECT name, pageno FROM dbstat")}
    db.close()
    return found


async def test_a_step_writes_no_index_page_of_the_heads_and_none_of_tasks_for_records(
        tmp_path: Path) -> None:
    path = tmp_path / "pages.db"
    async with app(path) as h:
        h.store.pragma("wal_checkpoint(TRUNCATE)")
        h.store.pragma("wal_autocheckpoint = 0")  # every frame of the run stays in the log
        task_id = await h.submit("counter")
        await h.run_until_idle(timeout=60)
        assert (await h.get(task_id)).snapshot.result == STEPS
        wal = (tmp_path / "pages.db-wal").read_bytes()
    commits = commits_in_log(wal)
    assert len(commits) > STEPS  # a commit a step at least: the log holds the whole run
    belongs = owners(path)
    written = Counter(belongs.get(page, "?") for pages in commits[SETTLED:-2] for page in pages)
    assert written["snapshots"] >= STEPS - SETTLED - 2  # a head rewritten each step ...
    assert "snapshots_by_task" not in written  # ... moving no index entry
    assert "sqlite_autoindex_snapshots_1" not in written
    assert written["sqlite_autoindex_idempotency_1"] > 0  # a record per call, by its key ...
    assert not [name for name in written if name.startswith("idempotency_")]  # ... only
