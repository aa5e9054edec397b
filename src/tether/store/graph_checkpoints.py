"""LangGraph checkpoints kept in tether's store: the part of the store protocol that
:class:`tether.integrations.tether_saver.TetherSaver` stands on (issue 28).

A team that runs LangGraph threads beside tether tasks keeps both in one store, with one
backup, one retention and one set of credentials. The store knows nothing of LangGraph: it
keeps typed byte strings (what the saver's serializer made) under the keys LangGraph uses:

- a **checkpoint** per (thread, namespace, checkpoint id), with its parent, its metadata,
  the run that made it and the channel versions it reads;
- a **blob** per (thread, namespace, channel, version): a channel's value is stored when it
  changes, not with every checkpoint; a blob may hold only what a list gained since an
  earlier version (*base*), so a conversation costs what it adds per step;
- a **write** per (thread, namespace, checkpoint, task, index): what a node wrote before the
  next checkpoint. A write at a non-negative index is kept as first written (a retried node
  writes the same); a special write (an error, an interrupt: a negative index) is replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

Typed = tuple[str, bytes]
"""A value as the saver's serializer typed it: (type name, bytes)."""


@dataclass(frozen=True)
class GraphBlob:
    """One channel's value at one version. Whole (*base* None), or a list that keeps the
    first *keep* items of the list at version *base* of the same channel and adds the list
    *value* holds; *root* is the version of the whole blob such a chain starts from (its own
    version when whole), so a chain is read in one statement."""

    channel: str
    version: str
    value: Typed
    root: str
    base: str | None = None
    keep: int = 0


@dataclass(frozen=True)
class GraphWrite:
    task_id: str
    index: int
    channel: str
    value: Typed
    task_path: str = ""


@dataclass(frozen=True)
class GraphCheckpoint:
    """A stored checkpoint (its channel values apart, as blobs) and what was written after it."""

    thread_id: str
    namespace: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed
    metadata: Typed
    versions: dict[str, str]
    """Channel -> the version of it this checkpoint reads."""
    run_id: str | None = None
    writes: list[GraphWrite] = field(default_factory=list)
    blobs: dict[tuple[str, str], GraphBlob] = field(default_factory=dict)
    """(channel, version) -> blob: those at the versions read, and the blobs they extend."""


@dataclass(frozen=True)
class GraphQuery:
    """Which checkpoints to read, newest first: a thread's (or every thread's), in one
    namespace or all, one checkpoint id or those before one, at most *limit*."""

    thread_id: str | None = None
    namespace: str | None = None
    checkpoint_id: str | None = None
    before: str | None = None
    limit: int | None = None


class GraphCheckpointStore(Protocol):
    """The store's LangGraph part. All methods are coroutines."""

    async def graph_put(self, checkpoint: GraphCheckpoint, blobs: Sequence[GraphBlob],
                        now: float, keep: int | None = None) -> set[str]:
        """Store *checkpoint* (its writes ignored) and the blobs of the channels it changed,
        and with *keep*, prune its namespace to the newest *keep* checkpoints (as
        :meth:`graph_prune`) in the same transaction; returns the channels whose blob at that
        version was stored already (a version names one value: the stored blob is kept as it
        was). :class:`GraphBaseGone` if a blob adds to a version that is not there (nothing
        written)."""

    async def graph_put_writes(self, thread_id: str, namespace: str, checkpoint_id: str,
                               writes: Sequence[GraphWrite]) -> None:
        """Store what a task wrote after a checkpoint (see the module for which are kept)."""

    async def graph_checkpoints(self, query: GraphQuery) -> list[GraphCheckpoint]:
        """The checkpoints *query* names, newest first, each with its writes and blobs."""

    async def graph_delete_threads(self, thread_ids: Sequence[str]) -> None:
        """Every checkpoint, blob and write of these threads, gone."""

    async def graph_delete_runs(self, run_ids: Sequence[str]) -> None:
        """The checkpoints these runs made, and their writes, gone."""

    async def graph_copy_thread(self, source: str, target: str) -> None:
        """Every checkpoint, blob and write of *source*, copied to *target*."""

    async def graph_prune(self, thread_ids: Sequence[str], keep: int) -> None:
        """Keep the newest *keep* checkpoints of each namespace of these threads (0: none),
        with their writes and the blobs they read."""
