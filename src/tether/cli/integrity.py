"""Checking a whole store: can every task still be run, rolled back and shown? (issue 13)

:func:`check_store` asks the store to look for damage in itself (``Store.integrity_check``:
the file or the tables, head rows that went missing), then loads every kept version of every
task the way a worker or a rollback would (the head, its large values from the blob table,
the typed snapshot) and reads the dialog of the newest readable one. Every problem is one
:class:`Problem` naming the task and version; a task with no readable version at all is
named once more, since nothing can run it or roll it back. The command line prints the
report (``tether check``); this module only finds.

It only reads, through the harness's :class:`~tether.reading.TaskReader`. Workers may run
meanwhile: a version they prune between the listing and the loading is skipped, not reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether.errors import CorruptSnapshot, SnapshotTooNew, TetherError, VersionNotFound
from tether.model import Snapshot, TaskRecord

if TYPE_CHECKING:
    from tether.harness import Harness
    from tether.reading import TaskReader

ALL_TASKS = 2**62
"""The listing limit that means every task (the store lists newest first, up to a limit)."""


class StoreUnreachable(TetherError):
    """The store could not be opened or read at all, so nothing could be checked."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong: in the store itself (no task), a task, or one version of a task."""

    what: str
    task_id: str | None = None
    version: int | None = None

    def line(self) -> str:
        where = "store" if self.task_id is None else f"task {self.task_id}"
        if self.version is not None:
            where += f" version {self.version}"
        return f"{where}: {self.what}"


@dataclass
class Report:
    """What :func:`check_store` found; ``ok`` when nothing."""

    tasks: int = 0
    versions: int = 0
    store_checked: bool = False
    """Whether the store ran an integrity check of its own (a backend may not have one)."""
    problems: list[Problem] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Tasks with no readable version at all."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tasks": self.tasks, "versions": self.versions,
                "store_checked": self.store_checked, "unreadable": self.unreadable,
                "problems": [{"task_id": p.task_id, "version": p.version, "what": p.what,
                              "line": p.line()} for p in self.problems]}


async def check_store(harness: Harness) -> Report:
    """Check the harness's store; raises :class:`StoreUnreachable` only if it cannot be
    opened or read at all (every other failure is a problem in the report).

    It takes the harness, not its :attr:`~tether.harness.Harness.reads`, because opening the
    store is part of the check: a store that cannot be opened is reported as unreachable
    (``tether check`` exits 2), not raised as whatever the backend raised."""
    report = Report()
    try:
        reads = harness.reads
        found = await reads.integrity_check()
    except Exception as exc:
        raise StoreUnreachable(f"cannot open the store: {_reason(exc)}") from exc
    if found is not None:
        report.store_checked = True
        report.problems += [Problem(str(line)) for line in found]
    try:
        tasks = await reads.tasks(None, limit=ALL_TASKS)
    except Exception as exc:
        if found is None:  # nothing has been read from the store yet: it is not there
            raise StoreUnreachable(f"cannot read the store: {_reason(exc)}") from exc
        report.problems.append(Problem(f"the task list cannot be read: {_reason(exc)}"))
        return report
    for record in tasks:
        await _check_task(reads, record, report)
    report.tasks = len(tasks)
    return report


async def _check_task(reads: TaskReader, record: TaskRecord, report: Report) -> None:
    task_id = record.task_id

    def problem(what: str, version: int | None = None) -> None:
        report.problems.append(Problem(what, task_id, version))

    try:
        kept = [version for version, _, _ in await reads.versions(task_id)]
    except Exception as exc:
        problem(f"its versions cannot be listed: {_reason(exc)}")
        report.unreadable.append(task_id)
        return
    newest: tuple[int, Snapshot] | None = None
    for version in kept:
        try:
            snap = await _load(reads, task_id, version)
        except VersionNotFound:
            continue  # pruned by a worker's commit since the listing
        except Exception as exc:
            report.versions += 1
            problem(_unreadable(exc, task_id), version)
            continue
        report.versions += 1
        newest = (version, snap)
    try:
        await reads.head(task_id)  # through the task row, as every worker reads it
    except VersionNotFound:
        if not report.store_checked:  # else the store's own check said so already
            problem(f"its task row points at version {record.head_version}, which is not kept"
                    f" (kept: {', '.join(map(str, kept)) or 'none'})")
    except Exception as exc:
        problem(f"its current head cannot be read: {_reason(exc)}")
    if newest is None:
        problem("no readable version at all: no worker can run it and nothing can be rolled"
                " back to" + ("" if kept else " (no version is kept)"))
        report.unreadable.append(task_id)
        return
    await _check_dialog(reads, task_id, *newest, problem)


async def _load(reads: TaskReader, task_id: str, version: int) -> Snapshot:
    """Load one version as a runner or a rollback would: head, large values, typed snapshot."""
    _, head = await reads.head(task_id, version)
    return Snapshot.loads(await reads.whole(task_id, version, head), task_id, version)


async def _check_dialog(reads: TaskReader, task_id: str, version: int, snap: Snapshot,
                        problem: Callable[[str, int | None], None]) -> None:
    """The newest readable version's dialog is all there and every row reads."""
    try:
        rows = await reads.history(task_id, snap.history_segments)
    except Exception as exc:
        problem(f"its dialog cannot be read: {_reason(exc)}", version)
        return
    if len(rows) < snap.history_len:
        problem(f"its dialog has {len(rows)} of its {snap.history_len} rows", version)


def _unreadable(exc: Exception, task_id: str) -> str:
    """Why a version cannot be loaded, without the 'task X version N: ' the line says."""
    text = str(exc)
    if isinstance(exc, CorruptSnapshot | SnapshotTooNew) and text.startswith(f"task {task_id} version "):
        text = text.split(": ", 1)[-1]
    if isinstance(exc, SnapshotTooNew):
        return f"written by a newer tether, which alone can read it ({text})"
    return text if isinstance(exc, CorruptSnapshot) else f"cannot be loaded: {_reason(exc)}"


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return text if isinstance(exc, TetherError) and text else f"{type(exc).__name__}: {text}"
