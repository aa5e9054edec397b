"""A graph's LangGraph checkpoint as a tether task's plain data (used by ``LangGraphAgent``).

LangGraph keeps a run's place in a checkpointer: the channels' values, which versions each
node has seen, and the writes of a super-step's finished nodes (and of an ``interrupt()``)
that the next run must not redo. tether keeps the same thing in the task's scratch, so it is
committed with the step, rolled back with the task, copied by a fork and gone with a delete:
no second store, no thread id that could outlive its task. This saver holds only the newest
checkpoint of each namespace (a subgraph run has its own, dropped once the graph's next
super-step begins); tether's versions are the history.

Values are serialised by LangGraph's own serializer (``JsonPlusSerializer``: messages,
pydantic models, dataclasses) and kept as base64 text. A channel's value is stored whole
when it changes, as LangGraph's own savers store it.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from tether.errors import MissingExtra

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
    raise MissingExtra("the LangGraph integration needs langgraph", "langchain") from exc

__all__ = ["TaskSaver"]


class TaskSaver(BaseCheckpointSaver[Any]):
    """The newest checkpoint of one task's graph, per namespace, made from and back into
    plain data (:meth:`plain`, :meth:`from_plain`). One saver serves one task: the thread id
    is not looked at. A channel's value is kept serialised, with its text once made, so a
    step encodes only the channels it changed."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ plain data

    @classmethod
    def from_plain(cls, data: Mapping[str, Any] | None) -> TaskSaver:
        saver = cls()
        for ns, entry in (data or {}).items():
            saver.entries[ns] = {
                "id": entry["id"], "parent": entry.get("parent"),
                "checkpoint": _typed(entry["checkpoint"]), "metadata": _typed(entry["metadata"]),
                "blobs": {channel: (version, _typed(blob), blob)
                          for channel, (version, blob) in entry["blobs"].items()},
                "writes": {(w[0], w[1]): (w[0], w[2], _typed(w[3]), w[4])
                           for w in entry["writes"]}}
        return saver

    def plain(self) -> dict[str, Any]:
        """Every namespace's newest checkpoint as JSON data (what the task's scratch keeps)."""
        return {ns: {"id": e["id"], "parent": e["parent"],
                     "checkpoint": _text(e["checkpoint"]), "metadata": _text(e["metadata"]),
                     "blobs": {channel: [version, text or _text(blob)]
                               for channel, (version, blob, text) in e["blobs"].items()},
                     "writes": [[task, idx, channel, _text(value), path]
                                for (task, idx), (_, channel, value, path) in e["writes"].items()]}
                for ns, e in self.entries.items()}

    def started(self) -> bool:
        """Whether the graph has run (it has a checkpoint). Not ``__bool__``: LangGraph reads
        a falsy saver as no saver at all."""
        return bool(self.entries)

    # ------------------------------------------------------------------ the saver protocol

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ns = config["configurable"].get("checkpoint_ns", "")
        entry = self.entries.get(ns)
        wanted = get_checkpoint_id(config)
        if entry is None or (wanted and wanted != entry["id"]):
            return None
        checkpoint: Checkpoint = self.serde.loads_typed(entry["checkpoint"])
        checkpoint["channel_values"] = {
            channel: self.serde.loads_typed(blob) for channel, (version, blob, _)
            in entry["blobs"].items()
            if checkpoint["channel_versions"].get(channel) == version and blob[0] != "empty"}
        stored = entry["writes"]
        writes = [stored[k] for k in sorted(stored, key=lambda k: writes_sort_key(stored[k][3], *k))]
        ids = {"thread_id": config["configurable"].get("thread_id"), "checkpoint_ns": ns}
        return CheckpointTuple(
            config={"configurable": {**ids, "checkpoint_id": entry["id"]}},
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(entry["metadata"]),
            parent_config={"configurable": {**ids, "checkpoint_id": entry["parent"]}}
            if entry["parent"] else None,
            pending_writes=[(task, channel, self.serde.loads_typed(value))
                            for task, channel, value, _ in writes])

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        if config is not None and (found := self.get_tuple(config)) is not None:
            yield found

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        ns = config["configurable"].get("checkpoint_ns", "")
        kept: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = kept.pop("channel_values")
        old = self.entries.get(ns)
        blobs = {channel: blob for channel, blob in (old["blobs"] if old else {}).items()
                 if checkpoint["channel_versions"].get(channel) == blob[0]}
        for channel, version in new_versions.items():
            blobs[channel] = (version, self.serde.dumps_typed(values[channel])
                              if channel in values else ("empty", b""), None)
        if not ns:  # a new super-step of the graph: every subgraph run of the last one ended
            self.entries.clear()
        self.entries[ns] = {
            "id": checkpoint["id"], "parent": config["configurable"].get("checkpoint_id"),
            "checkpoint": self.serde.dumps_typed(kept),
            "metadata": self.serde.dumps_typed(get_checkpoint_metadata(config, metadata)),
            "blobs": blobs, "writes": {}}
        return {"configurable": {"thread_id": config["configurable"].get("thread_id"),
                                 "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """A finished node's (or an interrupt's) writes to the newest checkpoint; a node's
        own writes are kept as first written, LangGraph's special ones replaced."""
        entry = self.entries.get(config["configurable"].get("checkpoint_ns", ""))
        if entry is None or entry["id"] != config["configurable"].get("checkpoint_id"):
            return
        for idx, (channel, value) in enumerate(writes):
            key = (task_id, WRITES_IDX_MAP.get(channel, idx))
            if key[1] >= 0 and key in entry["writes"]:
                continue
            entry["writes"][key] = (task_id, channel, self.serde.dumps_typed(value), task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.entries.clear()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config):
            yield found

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)


def _text(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _typed(text: Sequence[str]) -> tuple[str, bytes]:
    return text[0], base64.b64decode(text[1])
