"""Loading a task's snapshot: the newest version that reads back whole (R8, R22).

A runner claiming a task and a person looking at it both need the newest readable head:
a damaged newest version (or one whose dialog rows are gone) falls back to an older kept
one, and says why, instead of failing the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tether import blobs
from tether.engine.dialog_rows import DialogRows
from tether.errors import CorruptSnapshot
from tether.model import Snapshot


class SnapshotSource(blobs.HeadSource, Protocol):
    """The reads loading needs (any store)."""

    async def read_history(self, task_id: str,
                           segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]: ...

    async def count_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> int: ...

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]: ...


EAGER_ROWS = 64
"""A dialog up to this many rows is read at load (one query gives both its rows and that it
is whole); a longer one is counted, and read when something needs it (dialog_rows)."""


async def _dialog(store: SnapshotSource, snap: Snapshot, version: int) -> DialogRows:
    """The head's dialog (read now if short, else counted and read on demand), or
    CorruptSnapshot if rows it counts on are missing from the store."""
    task_id, wanted = snap.task_id, snap.history_len
    segments = [list(segment) for segment in snap.history_segments]  # the branch as loaded
    if wanted <= EAGER_ROWS:
        rows = (await store.read_history(task_id, segments))[:wanted]
        found = len(rows)
    else:
        rows, found = [], await store.count_history(task_id, segments)
    if found < wanted:
        raise CorruptSnapshot(f"task {task_id} version {version}: dialog rows are missing"
                              f" (the head counts {wanted}, the store has {found})")
    if rows or not wanted:
        return DialogRows(rows)
    return DialogRows([], wanted, lambda: store.read_history(task_id, segments),
                      f"task {task_id} version {version}")


async def newest_readable(store: SnapshotSource, task_id: str, with_dialog: bool = False
                          ) -> tuple[int, Snapshot, list[str], DialogRows]:
    """The newest version that reads back whole, why each newer one did not, and (with
    *with_dialog*) its dialog; a version whose dialog rows are missing is unreadable too."""
    version, data = await store.load_head(task_id)
    skipped: list[str] = []
    while True:
        try:
            snap = Snapshot.loads(await blobs.resolve(store, data, task_id, version), task_id,
                                  version)
            dialog = await _dialog(store, snap, version) if with_dialog else DialogRows([])
            return version, snap, skipped, dialog
        except CorruptSnapshot as exc:
            skipped.append(str(exc))
            older = [v for v, _, _ in await store.list_versions(task_id) if v < version]
            if not older:
                raise CorruptSnapshot(f"task {task_id}: no readable snapshot is kept"
                                      f" ({'; '.join(skipped)})") from exc
            version, data = await store.load_head(task_id, older[-1])
