"""The SQL every backend runs alike, written once (R13).

The SQLite and PostgreSQL stores hold the same rows (``sql/sqlite_schema.sql``,
``sql/postgres/``), so most of what they say to their databases is word for word the same.
It is written here once, with ``?`` placeholders (SQLite's own style); the PostgreSQL store
runs each statement through :func:`pyformat` (``%s``), once per statement text.

What is not here differs on purpose and stays in its backend, each with a comment saying
why: claiming (partial-index branches in SQLite; ``FOR UPDATE SKIP LOCKED`` in PostgreSQL),
lease times (PostgreSQL judges them by the server's clock), list parameters (PostgreSQL
arrays; SQLite has none and uses ``json_each``), reusing a snapshot row in place (SQLite's
``rowid``), LISTEN/NOTIFY and row locks (PostgreSQL only).

Columns that a caller reads by name and that are not plain columns carry an ``AS`` name,
so every backend names them alike.
"""

from __future__ import annotations

import functools

OPEN = "('pending', 'running', 'waiting', 'paused', 'needs_human')"
"""Unfinished statuses, in the words of the partial index ``tasks_open`` (a partial index is
only used when the query repeats its WHERE term word for word)."""
FINISHED = ("completed", "failed", "cancelled")
"""A task in one of these whose holder never released it did not crash: it had finished."""

TASK_COLUMNS = ("task_id, agent, status, created_at, updated_at, head_version, reason,"
                " lease_owner, lease_until, wake_at")
_EVENT_COLUMNS = ("id, task_id, type, priority, payload, source_event_id, created_at, status,"
                  " coalesce_class")
_IDEMPOTENCY_COLUMNS = "key, task_id, tool, args_hash, status, result, error, attempts, updated_at"

# ------------------------------------------------------------------ tasks

GET_TASK = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ?"
LIST_TASKS = f"SELECT {TASK_COLUMNS} FROM tasks ORDER BY created_at DESC LIMIT ?"
LIST_TASKS_IN = f"SELECT {TASK_COLUMNS} FROM tasks WHERE status = ? ORDER BY created_at DESC LIMIT ?"
LEASED_TASKS = (f"SELECT {TASK_COLUMNS} FROM tasks WHERE lease_owner IS NOT NULL"
                f" AND status IN {OPEN} ORDER BY lease_until LIMIT ?")
COUNT_BY_STATUS = "SELECT status, COUNT(*) AS tasks FROM tasks GROUP BY status"
_URGENCY = ("CASE status WHEN 'needs_human' THEN 0 WHEN 'running' THEN 1 WHEN 'paused' THEN 2"
            " WHEN 'waiting' THEN 3 WHEN 'pending' THEN 4 WHEN 'failed' THEN 5"
            " WHEN 'completed' THEN 6 ELSE 7 END")
_FIND_TERMS = ("status = ?", "agent = ?",
               "(lower(task_id) LIKE ? ESCAPE '!' OR lower(coalesce(reason, '')) LIKE ? ESCAPE '!')")


@functools.cache
def find_tasks(by_status: bool, by_agent: bool, by_text: bool) -> str:
    """A page of tasks for a person: filtered by status, agent and a piece of the id or
    reason (LIKE patterns escaped with ``!``), people's work first, then newest first."""
    terms = [term for term, used in zip(_FIND_TERMS, (by_status, by_agent, by_text),
                                        strict=True) if used]
    where = f" WHERE {' AND '.join(terms)}" if terms else ""
    return (f"SELECT {TASK_COLUMNS} FROM tasks{where}"
            f" ORDER BY {_URGENCY}, updated_at DESC, task_id LIMIT ? OFFSET ?")
INSERT_TASK = ("INSERT INTO tasks (task_id, agent, status, created_at, updated_at, head_version,"
               " wake_at, fence, reason) VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?)"
               " ON CONFLICT (task_id) DO NOTHING")
TASK_STATUS = "SELECT status FROM tasks WHERE task_id = ?"
FENCE = "SELECT fence, head_version, status, wake_at, lease_until FROM tasks WHERE task_id = ?"
SET_STATUS = "UPDATE tasks SET status = ?, reason = ?, updated_at = ?, wake_at = ? WHERE task_id = ?"
WAKE_TASK = "UPDATE tasks SET wake_at = ? WHERE task_id = ?"
WAKE_ALL = "UPDATE tasks SET wake_at = ? WHERE status = ?"
NEXT_EPOCH = "UPDATE tasks SET max_epoch = max_epoch + 1 WHERE task_id = ? RETURNING max_epoch"


def start_pending(now: str = "?", row: str = "") -> str:
    """A claim's own start of a pending task, as SET items of its UPDATE: what SET_STATUS
    (running, no reason, no wake time) writes, at time *now*, and nothing to a task in any
    other status. *row* qualifies the task row's columns where the UPDATE joins another."""
    pending = f"{row}status = 'pending'"
    return (f"status = CASE WHEN {pending} THEN 'running' ELSE {row}status END,"
            f" reason = CASE WHEN {pending} THEN NULL ELSE {row}reason END,"
            f" wake_at = CASE WHEN {pending} THEN NULL ELSE {row}wake_at END,"
            f" updated_at = CASE WHEN {pending} THEN {now} ELSE {row}updated_at END")


def wake_in(statuses: int) -> str:
    """Make a task due now if it is in one of *statuses* statuses (given as parameters)."""
    return f"UPDATE tasks SET wake_at = ? WHERE task_id = ? AND status IN ({', '.join('?' * statuses)})"


# ------------------------------------------------------------------ snapshots, blobs, history

NEWEST_HEAD = ("SELECT s.version AS version, s.head AS head FROM tasks t JOIN snapshots s"
               " ON s.task_id = t.task_id AND s.version = t.head_version WHERE t.task_id = ?")
HEAD_AT = "SELECT version, head FROM snapshots WHERE task_id = ? AND version = ?"
NEWEST_VERSION = "SELECT MAX(version) AS newest FROM snapshots WHERE task_id = ?"
LIST_VERSIONS = ("SELECT version, created_at, length(head) AS size FROM snapshots WHERE task_id = ?"
                 " ORDER BY version")
INSERT_SNAPSHOT = "INSERT INTO snapshots (task_id, version, created_at, head) VALUES (?, ?, ?, ?)"
DROP_SNAPSHOTS_TO = "DELETE FROM snapshots WHERE task_id = ? AND version <= ?"
INSERT_BLOB = ("INSERT INTO blobs (digest, data, created_at) VALUES (?, ?, ?)"
               " ON CONFLICT (digest) DO NOTHING")
HISTORY = ("SELECT entry FROM history WHERE task_id = ? AND epoch = ? AND seq BETWEEN ? AND ?"
           " ORDER BY seq")
COUNT_HISTORY = ("SELECT COUNT(*) AS n FROM history WHERE task_id = ? AND epoch = ?"
                 " AND seq BETWEEN ? AND ?")
INSERT_HISTORY = "INSERT INTO history (task_id, epoch, seq, entry) VALUES (?, ?, ?, ?)"

# ------------------------------------------------------------------ events

_SELECT_EVENTS = f"SELECT {_EVENT_COLUMNS} FROM events"
PENDING_EVENTS = f"{_SELECT_EVENTS} WHERE task_id = ? AND status = 'pending' ORDER BY priority, id"
LIST_EVENTS = f"{_SELECT_EVENTS} WHERE task_id = ? ORDER BY id"
COUNT_PENDING = "SELECT COUNT(*) AS pending FROM events WHERE status = 'pending'"
COUNT_PENDING_OF = "SELECT COUNT(*) AS pending FROM events WHERE task_id = ? AND status = 'pending'"
SEEN_EVENT = "SELECT id FROM events WHERE task_id = ? AND source_event_id = ?"
INSERT_EVENT = ("INSERT INTO events (task_id, type, priority, payload, source_event_id,"
                " coalesce_class, control, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id")
EVENT_DONE = "UPDATE events SET status = ?, done_at = ? WHERE id = ? AND task_id = ?"
# What a new event replaces: older pending events at the same or a lower priority (coalescing
# never swallows a more urgent event) of its coalescing class inside the window, and for a
# P3/P4 event (state only) older pending ones of its type at any age. Parameters: priority,
# coalescing class, window start, whether the event is P3/P4 and classed, type.
_SUPERSEDED = ("status = 'pending' AND priority >= ? AND ((coalesce_class = ? AND created_at >= ?)"
               " OR (? AND type = ?))")
ANY_SUPERSEDED = f"SELECT 1 FROM events WHERE task_id = ? AND {_SUPERSEDED} LIMIT 1"
COALESCE = (f"UPDATE events SET status = 'coalesced', done_at = ? WHERE task_id = ? AND id <> ?"
            f" AND {_SUPERSEDED}")
# A task that finished can never apply its pending events; levers that may reopen it (rollback
# of a completed task) stay pending. Parameters: now, task, the status it finished in.
IGNORE_PENDING = ("UPDATE events SET status = 'ignored', done_at = ? WHERE task_id = ?"
                  " AND status = 'pending' AND NOT (control AND ? = 'completed')")
URGENT = "(priority <= 2 OR control)"
"""Pending events that wake a parked task: P0-P2, and levers."""
LEVERS = "control"
"""Pending events that still reach a finished task: levers only."""


def pending_where(condition: str) -> str:
    """Whether the task has a pending event matching *condition* (:data:`URGENT`, :data:`LEVERS`)."""
    return f"SELECT 1 FROM events WHERE task_id = ? AND status = 'pending' AND {condition} LIMIT 1"


# ------------------------------------------------------------------ idempotency, recovery log

GET_IDEMPOTENCY = f"SELECT {_IDEMPOTENCY_COLUMNS} FROM idempotency WHERE key = ?"
_OF_TASK = "key >= ? AND key < ? AND task_id = ?"
"""A task's records, by the range of keys that begin with its id and a colon (the index of
keys finds them; ``task_id`` leaves out another task whose id begins with this one's and a
colon). Parameters: :func:`tether.store.steps.keys_of`. The range compares bytes: SQLite's
default collation, and PostgreSQL's ``C`` collation of the column (migration 11)."""
IDEMPOTENCY_KEYS = f"SELECT key FROM idempotency WHERE {_OF_TASK}"
LIST_IDEMPOTENCY = f"SELECT {_IDEMPOTENCY_COLUMNS} FROM idempotency WHERE {_OF_TASK} ORDER BY updated_at"
DELETE_IDEMPOTENCY = f"DELETE FROM idempotency WHERE {_OF_TASK}"
# A key names one call of one task, so its task_id never changes: it is left out of the update,
# and SQLite (which rewrites an index entry even for the same value) updates the row in place.
PUT_IDEMPOTENCY = (f"INSERT INTO idempotency ({_IDEMPOTENCY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                   " ON CONFLICT (key) DO UPDATE SET tool = excluded.tool,"
                   " args_hash = excluded.args_hash, status = excluded.status,"
                   " result = excluded.result, error = excluded.error,"
                   " attempts = excluded.attempts, updated_at = excluded.updated_at")
RECOVERY_LOG = "SELECT record FROM recovery_log WHERE task_id = ? ORDER BY id"
INSERT_RECOVERY = "INSERT INTO recovery_log (task_id, at, record) VALUES (?, ?, ?)"


@functools.cache
def pyformat(sql: str) -> str:
    """*sql* with PostgreSQL's (psycopg's) placeholders: ``?`` becomes ``%s``, a literal ``%``
    doubles. No statement here has a ``?`` inside a string literal."""
    return sql.replace("%", "%%").replace("?", "%s")

# ------------------------------------------------------------------ named limits

LIMIT_ROW = ("INSERT INTO limit_locks (name, key, blocked_until) VALUES (?, ?, NULL)"
             " ON CONFLICT (name, key) DO NOTHING")
LIMIT_SIZED_ROW = ("INSERT INTO limit_locks (name, key, blocked_until, size) VALUES (?, ?, NULL, ?)"
                   " ON CONFLICT (name, key) DO UPDATE SET size = excluded.size"
                   " WHERE limit_locks.size IS NULL OR limit_locks.size <> excluded.size")
"""The row of a limit, with its size as the admitting worker's app defines it (written only
when it changed), so operators see sizes without the app's code."""
LIMIT_LOCK = "SELECT blocked_until FROM limit_locks WHERE name = ? AND key = ?"
LIMIT_BLOCK = ("UPDATE limit_locks SET blocked_until = ? WHERE name = ? AND key = ?"
               " AND (blocked_until IS NULL OR blocked_until < ?)")
_LIVE_HOLD = ("EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = limit_holds.task_id"
              " AND t.fence = limit_holds.fence AND t.lease_owner IS NOT NULL)")
LIMIT_DROP_DEAD_HOLDS = f"DELETE FROM limit_holds WHERE name = ? AND key = ? AND NOT {_LIVE_HOLD}"
LIMIT_HOLDS = "SELECT holder FROM limit_holds WHERE name = ? AND key = ?"
LIMIT_HOLD = ("INSERT INTO limit_holds (name, key, holder, task_id, fence, since)"
              " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name, key, holder) DO UPDATE"
              " SET task_id = excluded.task_id, fence = excluded.fence, since = excluded.since")
LIMIT_UNHOLD = "DELETE FROM limit_holds WHERE name = ? AND key = ? AND holder = ?"
_OPEN_WAITER = (f"EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = limit_waiters.task_id"
                f" AND t.status IN {OPEN})")
LIMIT_DROP_GONE_WAITERS = ("DELETE FROM limit_waiters WHERE name = ? AND key = ?"
                           f" AND (expires <= ? OR NOT {_OPEN_WAITER})")
LIMIT_WAITER_SINCE = ("SELECT since, priority FROM limit_waiters WHERE name = ? AND key = ?"
                      " AND task_id = ?")
LIMIT_AHEAD = ("SELECT task_id FROM limit_waiters WHERE name = ? AND key = ? AND task_id <> ?"
               " AND (priority < ? OR (priority = ? AND since < ?))"
               " ORDER BY priority, since, task_id LIMIT 1")
LIMIT_FIRST_WAITER = ("SELECT task_id FROM limit_waiters WHERE name = ? AND key = ?"
                      " ORDER BY priority, since, task_id LIMIT 1")
LIMIT_WAIT = ("INSERT INTO limit_waiters (name, key, task_id, priority, since, expires)"
              " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name, key, task_id) DO UPDATE"
              " SET expires = excluded.expires, priority = CASE WHEN excluded.priority"
              " < limit_waiters.priority THEN excluded.priority ELSE limit_waiters.priority END")
LIMIT_UNWAIT = "DELETE FROM limit_waiters WHERE name = ? AND key = ? AND task_id = ?"
LIMIT_FORGET_GRANTS = "DELETE FROM limit_grants WHERE name = ? AND key = ? AND at <= ?"
LIMIT_GRANTS = ("SELECT COUNT(*) AS n, COALESCE(SUM(tokens), 0) AS tokens, MIN(at) AS oldest"
                " FROM limit_grants WHERE name = ? AND key = ? AND at > ?")
LIMIT_GRANT = "INSERT INTO limit_grants (name, key, at, holder) VALUES (?, ?, ?, ?)"
LIMIT_SPENT = ("UPDATE limit_grants SET tokens = tokens + ? WHERE name = ? AND key = ?"
               " AND holder = ?")
WAKE_PARKED = "UPDATE tasks SET wake_at = ? WHERE task_id = ? AND lease_owner IS NULL"
LIMIT_USAGE = (
    "SELECT l.name, l.key, l.blocked_until, l.size,"
    f" (SELECT COUNT(*) FROM limit_holds WHERE limit_holds.name = l.name"
    f"  AND limit_holds.key = l.key AND {_LIVE_HOLD}) AS in_use,"
    f" (SELECT COUNT(*) FROM limit_waiters WHERE limit_waiters.name = l.name"
    f"  AND limit_waiters.key = l.key AND expires > ? AND {_OPEN_WAITER}) AS waiting,"
    " (SELECT COUNT(*) FROM limit_grants g WHERE g.name = l.name AND g.key = l.key"
    "  AND g.at > ?) AS admitted_last_minute"
    " FROM limit_locks l ORDER BY l.name, l.key")

# ------------------------------------------------------------------ retention

TASK_FOR_DELETE = "SELECT status, lease_owner, lease_until FROM tasks WHERE task_id = ?"
DELETE_TASK_ROWS = tuple(f"DELETE FROM {table} WHERE task_id = ?" for table in (
    "snapshots", "history", "events", "recovery_log", "limit_holds", "limit_waiters", "tasks"))
"""Everything a task stored but its idempotency records (:data:`DELETE_IDEMPOTENCY`), its
index row last."""
EXPIRED = ("SELECT task_id FROM tasks WHERE status = ? AND updated_at < ?"
           " AND (lease_owner IS NULL OR lease_until < ?) ORDER BY updated_at LIMIT ?")
ANY_OLD_BLOB = "SELECT digest FROM blobs WHERE created_at < ? LIMIT 1"
ALL_HEADS = "SELECT head FROM snapshots"
BLOB_DIGESTS = "SELECT digest FROM blobs WHERE created_at < ?"
DELETE_BLOB = "DELETE FROM blobs WHERE digest = ?"

# ------------------------------------------------------------------ schedules

_SCHEDULE_COLUMNS = ("name, cron, timezone, agent, input, catch_up, paused, next_at, last_run_at,"
                     " created_at")
PUT_SCHEDULE = (f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET cron = excluded.cron,"
                " timezone = excluded.timezone, agent = excluded.agent, input = excluded.input,"
                " catch_up = excluded.catch_up, paused = excluded.paused,"
                " next_at = excluded.next_at, claimed_until = NULL")
GET_SCHEDULE = f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE name = ?"
LIST_SCHEDULES = f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY name"


def _due_terms(agents: int | None) -> str:
    of_agents = "" if agents is None else f" AND agent IN ({', '.join('?' * agents)})"
    return (f"next_at <= ? AND paused = 0{of_agents}"
            " AND (claimed_until IS NULL OR claimed_until <= ?)")


@functools.cache
def any_due_schedule(agents: int | None) -> str:
    """Whether a schedule :func:`claim_schedules` would take is there: read first, so an
    idle worker's look each second takes no write lock (SQLite) and writes nothing."""
    return f"SELECT 1 AS due FROM schedules WHERE {_due_terms(agents)} LIMIT 1"


@functools.cache
def claim_schedules(agents: int | None, skip_locked: str) -> str:
    """Take the most overdue due schedules that no worker holds (of *agents* named agents
    only, as many placeholders, when given) and hold them until a time: each worker takes its
    own share, so workers side by side start different schedules instead of racing for the
    same ones. *skip_locked* is PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (rows another worker
    is taking are passed over); SQLite writes one transaction at a time and needs none."""
    return (f"UPDATE schedules SET claimed_until = ? WHERE name IN (SELECT name FROM schedules"
            f" WHERE {_due_terms(agents)} ORDER BY next_at LIMIT ?{skip_locked})"
            f" RETURNING {_SCHEDULE_COLUMNS}")


ADVANCE_SCHEDULE = ("UPDATE schedules SET next_at = ?, last_run_at = ?, claimed_until = NULL"
                    " WHERE name = ?"
                    " AND next_at = ? AND paused = 0")
DELETE_SCHEDULE = "DELETE FROM schedules WHERE name = ?"
