"""``TetherSaver``: LangGraph checkpoints in tether's store (issue 28).

A team that runs LangGraph threads of its own beside tether tasks keeps both in one store
(SQLite or PostgreSQL): one file or database to back up, one retention, one set of
credentials. Give the saver to any graph::

    harness = tt.Harness("postgresql://...")
    async with harness:
        graph = builder.compile(checkpointer=TetherSaver(harness))
        await graph.ainvoke(inputs, {"configurable": {"thread_id": "t-1"}})

It is a LangGraph ``BaseCheckpointSaver`` and passes LangGraph's own conformance suite
(``langgraph-checkpoint-conformance``: put, writes, reads, listing, delete, delete by run,
copy and prune). Two things differ from LangGraph's SQL savers:

- **A conversation costs what it adds per step.** A channel whose value is a list that
  extends the list this saver last stored for it (the ``messages`` of an agent) is stored
  as the items it added, with a reference to that earlier version, not whole again. So the
  bytes a step writes stay flat as the conversation grows, where LangGraph's savers write
  the whole list at every step. Items are compared as the serializer writes them, so a
  message changed in place is never mistaken for the one before.
- **Retention**: ``keep=K`` keeps the newest K checkpoints of each thread and namespace
  (with the writes and values they read) and drops the rest as each new one is stored.
  Leave it unset (keep all, LangGraph's default) for graphs that use ``DeltaChannel`` or
  that are replayed from old checkpoints ("time travel").

The graph must run on the event loop the store was opened on (``ainvoke``/``astream``); the
sync methods (``invoke``) work from another thread while that loop runs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tether.errors import ConfigurationError, CorruptStore, GraphBaseGone, MissingExtra
from tether.store import Store
from tether.store.graph_checkpoints import (
    GraphBlob,
    GraphCheckpoint,
    GraphQuery,
    GraphWrite,
    Typed,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("TetherSaver needs langgraph", "langchain") from exc

__all__ = ["TetherSaver"]

T = TypeVar("T")
EMPTY: Typed = ("empty", b"")
"""A channel versioned but holding nothing (LangGraph's own savers write the same)."""
LISTS_KEPT = 256
"""Threads (per namespace and channel) whose last stored list this process remembers, to
store the next one as what it added; the oldest is forgotten first (its next list is then
stored whole once)."""
CHAIN_LINKS = 200
"""A list is stored whole again once this many versions in a row were stored as additions,
so reading one back follows at most this many."""


@dataclass
class _Listed:
    version: str
    root: str
    items: list[Typed]
    links: int = 0
    """How many additions separate it from the whole list its chain starts from."""


class TetherSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on tether's store; *store* is an open store or a harness
    (whose store is used, opened at first use). See the module for what it keeps."""

    def __init__(self, store: Any, *, keep: int | None = None, serde: Any = None) -> None:
        super().__init__(serde=serde)
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ConfigurationError(f"TetherSaver keep={keep!r}: give a whole number of"
                                     " checkpoints of at least 1, or None to keep them all")
        self._source = store
        self.keep = keep
        self._lists: OrderedDict[tuple[str, str, str], _Listed] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = _running_loop()

    @property
    def store(self) -> Store:
        """The store: the one given, or the harness's (opened on first use)."""
        source = self._source
        found = source.store if hasattr(source, "store") and hasattr(source, "submit") else source
        if not hasattr(found, "graph_put"):
            raise ConfigurationError(f"TetherSaver needs a tether store or harness, not"
                                     f" {type(source).__name__}")
        return found  # type: ignore[no-any-return]

    def _bind(self) -> Store:
        self._loop = asyncio.get_running_loop()
        return self.store

    # ------------------------------------------------------------------ writing

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        store = self._bind()
        thread_id, namespace = _thread(config), _namespace(config)
        values = checkpoint["channel_values"]
        stripped = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        meta = get_checkpoint_metadata(config, metadata)
        run_id = meta.get("run_id")
        row = GraphCheckpoint(
            thread_id, namespace, checkpoint["id"], config["configurable"].get("checkpoint_id"),
            self.serde.dumps_typed(stripped), self.serde.dumps_typed(meta),
            {channel: str(v) for channel, v in checkpoint["channel_versions"].items()},
            None if run_id is None else str(run_id))
        changed = [(channel, str(v), values.get(channel),
                    channel in values) for channel, v in new_versions.items()]
        try:
            kept = await store.graph_put(row, self._blobs(thread_id, namespace, changed),
                                         time.time(), self.keep)
        except GraphBaseGone:  # pruned by another process meanwhile: store the values whole
            self._forget(thread_id)
            kept = await store.graph_put(
                row, self._blobs(thread_id, namespace, changed, whole=True), time.time(),
                self.keep)
        for channel in kept:  # stored before, maybe otherwise: extend nothing from memory
            self._lists.pop((thread_id, namespace, channel), None)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": namespace,
                                 "checkpoint_id": checkpoint["id"]}}

    def _blobs(self, thread_id: str, namespace: str,
               changed: Sequence[tuple[str, str, Any, bool]], whole: bool = False
               ) -> list[GraphBlob]:
        return [self._blob(thread_id, namespace, channel, version, value, whole)
                if present else GraphBlob(channel, version, EMPTY, version)
                for channel, version, value, present in changed]

    def _blob(self, thread_id: str, namespace: str, channel: str, version: str, value: Any,
              whole: bool) -> GraphBlob:
        """*value* as a blob: a list that extends the last one stored here for the channel is
        stored as what it added (see the module)."""
        key = (thread_id, namespace, channel)
        if type(value) is not list:
            self._lists.pop(key, None)
            return GraphBlob(channel, version, self.serde.dumps_typed(value), version)
        items = [self.serde.dumps_typed(item) for item in value]
        last = None if whole else self._lists.pop(key, None)
        if last is not None and last.version != version and last.links < CHAIN_LINKS \
                and 0 < len(last.items) <= len(items) and items[:len(last.items)] == last.items:
            blob = GraphBlob(channel, version, self.serde.dumps_typed(value[len(last.items):]),
                             last.root, base=last.version, keep=len(last.items))
            links = last.links + 1
        else:
            blob, links = GraphBlob(channel, version, self.serde.dumps_typed(value), version), 0
        self._lists[key] = _Listed(version, blob.root, items, links)
        while len(self._lists) > LISTS_KEPT:
            self._lists.popitem(last=False)
        return blob

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._bind().graph_put_writes(
            _thread(config), _namespace(config), config["configurable"]["checkpoint_id"],
            [GraphWrite(task_id, WRITES_IDX_MAP.get(channel, index), channel,
                        self.serde.dumps_typed(value), task_path)
             for index, (channel, value) in enumerate(writes)])

    # ------------------------------------------------------------------ reading

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self._bind().graph_checkpoints(GraphQuery(
            _thread(config), _namespace(config), get_checkpoint_id(config), limit=1))
        return self._tuple(found[0]) if found else None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        configurable = (config or {}).get("configurable", {})
        query = GraphQuery(configurable.get("thread_id"), configurable.get("checkpoint_ns"),
                           get_checkpoint_id(config) if config else None,
                           get_checkpoint_id(before) if before else None,
                           None if filter else limit)
        left = limit
        for row in await self._bind().graph_checkpoints(query):
            if left is not None and left <= 0:
                return
            found = self._tuple(row)
            if filter and any(found.metadata.get(k) != v for k, v in filter.items()):
                continue
            left = None if left is None else left - 1
            yield found

    def _tuple(self, row: GraphCheckpoint) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed(row.checkpoint)
        checkpoint["channel_values"] = self._values(row)
        writes = sorted(row.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.index))
        where = {"thread_id": row.thread_id, "checkpoint_ns": row.namespace}
        return CheckpointTuple(
            config={"configurable": {**where, "checkpoint_id": row.checkpoint_id}},
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(row.metadata),
            parent_config=None if row.parent_id is None else
            {"configurable": {**where, "checkpoint_id": row.parent_id}},
            pending_writes=[(w.task_id, w.channel, self.serde.loads_typed(w.value))
                            for w in writes])

    def _values(self, row: GraphCheckpoint) -> dict[str, Any]:
        """The channel values the checkpoint reads, each rebuilt from its chain of blobs."""
        return {channel: self._value(row, channel, version)
                for channel, version in row.versions.items()
                if (channel, version) in row.blobs and row.blobs[(channel, version)].value != EMPTY}

    def _value(self, row: GraphCheckpoint, channel: str, version: str) -> Any:
        """Follow the chain back to its whole blob, then apply each addition in turn."""
        chain = [row.blobs[(channel, version)]]
        while chain[-1].base is not None:
            base = row.blobs.get((channel, chain[-1].base))
            if base is None or len(chain) > len(row.blobs):
                raise CorruptStore(f"LangGraph thread {row.thread_id!r}: version"
                                   f" {chain[-1].base} of channel {channel!r}, which a later"
                                   " version adds to, is missing from the store")
            chain.append(base)
        value = self.serde.loads_typed(chain[-1].value)
        for link in reversed(chain[:-1]):
            del value[link.keep:]
            value.extend(self.serde.loads_typed(link.value))
        return value

    # ------------------------------------------------------------------ removing

    async def adelete_thread(self, thread_id: str) -> None:
        self._forget(thread_id)
        await self._bind().graph_delete_threads([thread_id])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._lists.clear()
        await self._bind().graph_delete_runs([str(run_id) for run_id in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._bind().graph_copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ConfigurationError(f"prune strategy {strategy!r}: use 'keep_latest' or"
                                     " 'delete'")
        for thread_id in thread_ids:
            self._forget(thread_id)
        await self._bind().graph_prune(list(thread_ids), 1 if strategy == "keep_latest" else 0)

    def _forget(self, thread_id: str) -> None:
        for key in [key for key in self._lists if key[0] == thread_id]:
            del self._lists[key]

    # ------------------------------------------------------------------ versions

    def get_next_version(self, current: str | None, channel: None) -> str:
        """As LangGraph's own savers: a counter padded to sort as text, and a random part so
        two branches from one checkpoint never name the same version."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # ------------------------------------------------------------------ sync callers

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self.aget_tuple(config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        async def every() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before,
                                                limit=limit)]
        return iter(self._sync(every()))

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self._sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self._sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._sync(self.aprune(thread_ids, strategy=strategy))

    def _sync(self, work: Coroutine[Any, Any, T]) -> T:
        """Run *work* on the loop the store is used on, from another thread."""
        loop, running = self._loop, _running_loop()
        if loop is None or running is loop or not loop.is_running():
            work.close()
            raise ConfigurationError(
                "TetherSaver is asynchronous: run the graph with ainvoke/astream on the event"
                " loop its store is used on (or call invoke from another thread while that"
                " loop runs)")
        return asyncio.run_coroutine_threadsafe(work, loop).result()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop a saver made inside a coroutine will be used on (None: made outside one)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _thread(config: RunnableConfig) -> str:
    try:
        return str(config["configurable"]["thread_id"])
    except KeyError:
        raise ConfigurationError("TetherSaver needs a thread id: pass"
                                 " {'configurable': {'thread_id': ...}} to the graph") from None


def _namespace(config: RunnableConfig) -> str:
    return str(config["configurable"].get("checkpoint_ns", ""))
