"""Finding damage in a SQLite store file (issue 13).

- At open, a file up to :data:`QUICK_CHECK_MAX_BYTES` (with its WAL) gets ``PRAGMA
  quick_check``: about 1 ms per MB from the page cache, so at most tens of ms per open, and
  a damaged file is known before anything is written to it (the store then refuses writes).
  A larger file is not checked at open: its damage is found when a damaged page is read
  (every such read raises ``CorruptStore`` and stops writes from then on), or by ``tether
  check``, which runs :func:`problems`.
- :func:`problems` is the full check: ``PRAGMA integrity_check`` (b-trees, and every index
  against its table), the tether tables present, and every task's head row present.
- :func:`hidden` tells a task that is really missing from one that a damaged index hides:
  a task not found through the index is looked for once more by scanning the table, so
  damage is never reported as "no such task".
"""

from __future__ import annotations

import os
import sqlite3

from tether.errors import CorruptStore, TaskNotFound, TetherError
from tether.store.sqlite_faults import Damage, damaged, what_to_do

QUICK_CHECK_MAX_BYTES = 16 * 1024 * 1024
TABLES = ("tether_meta", "tasks", "snapshots", "history", "events", "idempotency",
          "recovery_log", "blobs")


def check_at_open(db: sqlite3.Connection, path: str) -> str | None:
    """What ``PRAGMA quick_check`` finds wrong with a small file (None: fine, or not checked)."""
    if path == ":memory:":
        return None
    size = sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))
    if size > QUICK_CHECK_MAX_BYTES:
        return None
    try:
        rows = db.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    if rows == [("ok",)]:
        return None
    text = " ".join(str(rows[0][0]).replace("*** in database main ***", "").split())
    return f"quick_check: {text}"


def problems(db: sqlite3.Connection) -> list[str]:
    """Everything wrong with the file and its tether tables (empty: nothing found)."""
    try:
        found = [str(row[0]) for row in db.execute("PRAGMA integrity_check(100)")]
    except sqlite3.DatabaseError as exc:
        return [f"the file cannot be checked: {exc}"]
    found = [] if found == ["ok"] else found
    try:
        present = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        found += [f"table {name} is missing" for name in TABLES if name not in present]
        if "tasks" in present and "snapshots" in present:
            found += [f"task {task_id}: its head row (version {version}) is missing"
                      for task_id, version in db.execute(
                          "SELECT task_id, head_version FROM tasks AS t NOT INDEXED WHERE NOT"
                          " EXISTS (SELECT 1 FROM snapshots AS s WHERE s.task_id = t.task_id"
                          " AND s.version = t.head_version) ORDER BY task_id LIMIT 100")]
    except sqlite3.DatabaseError as exc:
        found.append(f"the tether tables cannot be read: {exc}")
    return found


def hidden(db: sqlite3.Connection, task_id: str) -> bool:
    """Whether the tasks table holds *task_id* though its index did not find it."""
    return db.execute("SELECT 1 FROM tasks NOT INDEXED WHERE task_id = ?",
                      (task_id,)).fetchone() is not None


def missing(db: sqlite3.Connection, damage: Damage, task_id: str, outcome: str = "") -> TetherError:
    """The error for a task the index did not find: TaskNotFound only if it really is not
    there; CorruptStore if the table holds it, or if the file is known to be damaged."""
    if hidden(db, task_id):
        return damage.note(damaged(damage.path, f"task {task_id!r} is in the tasks table but"
                                   " its index does not find it"))
    if damage.found is not None:
        return CorruptStore(f"no task {task_id!r} found in SQLite store {damage.path!r}, but"
                            " the store is damaged and the task may be lost in the damage:"
                            f" {what_to_do(damage.path)}")
    return TaskNotFound(f"no task {task_id!r} in store {damage.path}{outcome}")
