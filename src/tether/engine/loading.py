"""Loading a task's snapshot: the newest version that reads back whole (R8, R22).

A runner claiming a task and a person looking at it both need the newest readable head:
a damaged newest version (or one whose dialog rows are gone) falls back to an older kept
one, and says why, instead of failing the task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tether import blobs
from tether.errors import CorruptSnapshot
from tether.model import Snapshot


class SnapshotSource(blobs.HeadSource, Protocol):
    """The reads loading needs (any store)."""

    async def read_history(self, task_id: str,
                           segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]: ...

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]: ...


async def _complete_history(store: SnapshotSource, snap: Snapshot,
                            version: int) -> list[dict[str, Any]]:
    """The head's dialog, or CorruptSnapshot if rows it counts on are missing from the store."""
    history = (await store.read_history(snap.task_id, snap.history_segments))[: snap.history_len]
    if len(history) < snap.history_len:
        raise CorruptSnapshot(f"task {snap.task_id} version {version}: dialog rows are missing"
                              f" (the head counts {snap.history_len}, the store has {len(history)})")
    return history


async def newest_readable(store: SnapshotSource, task_id: str, with_history: bool = False
                          ) -> tuple[int, Snapshot, list[str], list[dict[str, Any]]]:
    """The newest version that reads back whole, why each newer one did not, and (with
    *with_history*) its dialog; a version whose dialog rows are missing is unreadable too."""
    version, data = await store.load_head(task_id)
    skipped: list[str] = []
    while True:
        try:
            snap = Snapshot.loads(await blobs.resolve(store, data, task_id, version), task_id,
                                  version)
            history = await _complete_history(store, snap, version) if with_history else []
            return version, snap, skipped, history
        except CorruptSnapshot as exc:
            skipped.append(str(exc))
            older = [v for v, _, _ in await store.list_versions(task_id) if v < version]
            if not older:
                raise CorruptSnapshot(f"task {task_id}: no readable snapshot is kept"
                                      f" ({'; '.join(skipped)})") from exc
            version, data = await store.load_head(task_id, older[-1])
