"""Removing what is no longer kept: a task deleted on demand, finished tasks past their
retention, and large values (R20) that no kept version refers to any more.

Written once as steps for every SQL backend. A task is deleted under its row's lock and only
when no live lease holds it, so a deletion never races the worker running it (a finished
task whose worker died before letting it go may be deleted once that lease has run out).
"""

from __future__ import annotations

from collections.abc import Mapping

from tether import blobs
from tether.errors import TaskHeld
from tether.model import TERMINAL, Status
from tether.store import queries as q
from tether.store.steps import (
    Missing,
    Statement,
    Steps,
    change,
    change_many,
    every,
    keys_of,
    one,
)

GRACE = 60.0
"""Seconds a new large value is left alone by the collector, whatever refers to it."""


def delete_task(task_id: str, now: float) -> Steps[None]:
    row = yield one(q.TASK_FOR_DELETE, task_id, lock=True)
    if row is None:
        raise Missing(task_id, "; nothing was deleted")
    owner, until = row["lease_owner"], row["lease_until"]
    finished_and_abandoned = Status(row["status"]) in TERMINAL and (until or 0) < now
    if owner is not None and not finished_and_abandoned:
        raise TaskHeld(f"task {task_id} is held by worker {owner} (status {row['status']}):"
                       " cancel it, let the worker let it go, then delete it; nothing was"
                       " deleted")
    yield change(q.DELETE_IDEMPOTENCY, *keys_of(task_id))
    for statement in q.DELETE_TASK_ROWS:
        yield change(statement, task_id)


def purge(cutoffs: Mapping[str, float], now: float, limit: int) -> Steps[list[str]]:
    """Delete up to *limit* finished tasks that last changed before their status's cutoff.
    Workers purge side by side: the rows are locked as they are found (PostgreSQL), and a
    task another worker deleted or took meanwhile is passed over, not an error."""
    deleted: list[str] = []
    for status, cutoff in cutoffs.items():
        found = yield Statement(q.EXPIRED, (status, cutoff, now, limit - len(deleted)), "all",
                                lock=True)
        for row in found:
            task_id = str(row["task_id"])
            try:
                yield from delete_task(task_id, now)
            except (Missing, TaskHeld):
                continue
            deleted.append(task_id)
        if len(deleted) >= limit:
            break
    return deleted


def collect_blobs(now: float) -> Steps[int]:
    """Delete the large values no stored head refers to (older than :data:`GRACE`). The
    backend runs this with commits of snapshots held off, so no head can start referring to
    a value between the look and the delete."""
    if (yield one(q.ANY_OLD_BLOB, now - GRACE)) is None:
        return 0  # most stores keep no large value at all: nothing to read
    referred: set[str] = set()
    for row in (yield every(q.ALL_HEADS)):
        referred |= blobs.references(bytes(row["head"]))
    stale = [str(row["digest"]) for row in (yield every(q.BLOB_DIGESTS, now - GRACE))
             if str(row["digest"]) not in referred]
    if stale:
        yield change_many(q.DELETE_BLOB, [(digest,) for digest in stale])
    return len(stale)
