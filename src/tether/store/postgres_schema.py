"""The PostgreSQL store's schema: numbered migrations (``sql/postgres/NNNN_*.sql``) applied
in order under an advisory lock, and the cheap integrity checks ``tether check`` runs."""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any

import psycopg

from tether.errors import StoreError

MIGRATIONS_LOCK = 0x7E7E_0001
TABLES = ("tether_migrations", "tasks", "snapshots", "history", "events", "idempotency",
          "recovery_log", "blobs", "limit_locks", "limit_holds", "limit_waiters", "limit_grants",
          "schedules", "graph_checkpoints", "graph_blobs", "graph_writes")
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """The shipped migrations as (number, file name, SQL), in order."""
    folder = resources.files("tether.store").joinpath("sql/postgres")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text()))
    return sorted(found)


async def apply_migrations(conn: psycopg.AsyncConnection[Any], where: str) -> list[str]:
    """Apply, inside the caller's transaction, the migrations the database has not had yet;
    returns the files applied. A database at a newer schema is refused by name."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATIONS_LOCK,))
    await conn.execute("CREATE TABLE IF NOT EXISTS tether_migrations ("
                       " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                       " applied_at DOUBLE PRECISION NOT NULL)")
    cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM tether_migrations")
    current = (await cur.fetchone() or (0,))[0]
    shipped = migrations()
    newest = shipped[-1][0] if shipped else 0
    if current > newest:
        raise StoreError(f"PostgreSQL store {where} is at schema version {current},"
                         f" newer than this tether ({newest}); upgrade tether")
    for number, name, sql in shipped:
        if number > current:
            await conn.execute(sql.encode())
            await conn.execute("INSERT INTO tether_migrations VALUES (%s, %s, %s)",
                               (number, name, time.time()))
            applied.append(name)
    return applied


async def problems(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """What is wrong with the tether tables: one missing, a schema version other than this
    tether's, a task whose head row is gone (the first 100); [] = nothing found."""
    cur = await conn.execute("SELECT name FROM unnest(%s::text[]) AS name"
                             " WHERE to_regclass(name) IS NULL", (list(TABLES),))
    missing = [f"table {name} is missing" for (name,) in await cur.fetchall()]
    if missing:
        return missing
    newest = migrations()[-1][0]
    cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM tether_migrations")
    current = (await cur.fetchone() or (0,))[0]
    found = [] if current == newest else [
        f"schema version {current}, this tether expects {newest}: run tether migrate"]
    cur = await conn.execute("SELECT task_id, head_version FROM tasks t WHERE NOT EXISTS"
                             " (SELECT 1 FROM snapshots s WHERE s.task_id = t.task_id AND"
                             " s.version = t.head_version) ORDER BY task_id LIMIT 100")
    return found + [f"task {task_id}: its head row (version {version}) is missing"
                    for task_id, version in await cur.fetchall()]
