"""Events over Redis Streams: an optional transport into the inbox (R3, R19).

Senders that already speak Redis ``XADD`` an entry with one field, ``event`` (JSON:
``type``, ``task_id``, and optionally ``payload``, ``priority``, ``source_event_id``), to
a stream (default ``tether:events``). Every worker may run a :class:`StreamIngest`; they
share one consumer group, so each entry is taken by one of them.

What makes it safe:

- An entry becomes a tether event through ``Harness.emit``: stored in the store, under
  dedup by ``source_event_id`` (the sender's, else ``redis:<stream>:<entry id>``), before
  anything else happens. Redis on these machines keeps nothing on disk, so the store is
  where an event is durable; the entry stays pending in Redis until then.
- An entry is acknowledged (``XACK``) only once the task's loop has *applied* the event
  (or coalesced, ignored or refused it for good). Until then it stays in the consumer's
  pending list: a consumer that restarts reads its own pending entries first; entries of
  a consumer that died are taken over with ``XAUTOCLAIM`` after ``claim_idle`` seconds
  (and so are this consumer's own entries refused for now: a full inbox, the store down).
  Delivering one twice is harmless: the second emit is a duplicate.
- An entry that can never become an event (not JSON, no task, an unknown type, a
  ``source_event_id`` that is not printable: a NUL, a line break) is copied to the
  dead-letter stream ``<stream>:dead`` with the reason, then acknowledged: never silently
  dropped, never retried forever (a NUL would otherwise reach PostgreSQL, whose refusal
  looks like a store error: the entry would be retried for ever).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import orjson

from tether.errors import InboxFull, MissingExtra, StoreError, TetherError
from tether.model import Event
from tether.reading import TaskReader

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("Redis Streams need redis-py", "redis") from exc

if TYPE_CHECKING:
    from tether.harness import Harness
    from tether.store import ReadStore

log = logging.getLogger("tether.streams")
DONE = frozenset({"applied", "coalesced", "ignored", "duplicate", "failed"})


async def send(url: str, event: Event, stream: str = "tether:events",
               durable_in: ReadStore | None = None, timeout: float = 10.0) -> str:
    """XADD *event*; returns the entry id. Redis having it is not durability (it may keep
    nothing on disk): with *durable_in* (the tether store), return only once an ingest has
    stored the event there, and raise :class:`StoreError` if none does within *timeout*.
    The store is only read, through a :class:`TaskReader`: a sender only has to look."""
    client = aioredis.from_url(url)
    try:
        fields = {"event": orjson.dumps({k: v for k, v in event.to_dict().items()
                                         if k in ("type", "task_id", "payload", "priority",
                                                  "source_event_id") and v is not None})}
        entry = _text(await client.xadd(stream, fields))  # type: ignore[arg-type]
    finally:
        await client.aclose()
    if durable_in is not None:
        await _until_stored(TaskReader(durable_in), event.task_id,
                            event.source_event_id or f"redis:{stream}:{entry}", timeout)
    return entry


async def _until_stored(reads: TaskReader, task_id: str, source_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(e.event.source_event_id == source_id for e in await reads.events(task_id)):
        if time.monotonic() > deadline:
            raise StoreError(f"event {source_id} for task {task_id} is in Redis but no worker"
                             f" stored it within {timeout}s; is a worker running with --events?")
        await asyncio.sleep(0.02)


class StreamIngest:
    """One consumer of the stream, feeding one harness's inbox."""

    def __init__(self, harness: Harness, url: str, stream: str = "tether:events",
                 group: str = "tether", consumer: str | None = None,
                 claim_idle: float = 30.0, block: float = 0.5) -> None:
        self.harness = harness
        self.stream = stream
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}"
        self.claim_idle_ms = int(claim_idle * 1000)
        self.block_ms = int(block * 1000)
        self.redis = aioredis.from_url(url)
        self.waiting: dict[str, tuple[str, int]] = {}
        """Entry id -> (task id, event id) of entries stored but not yet applied."""

    async def run(self, stop: asyncio.Event) -> None:
        """Ingest until *stop* is set; Redis trouble is logged and retried, never fatal."""
        started = False
        while not stop.is_set():
            try:
                if not started:
                    await self._ensure_group()
                    await self._read("0")  # what this consumer took before a restart, first
                    started = True
                await self.step()
            except (RedisError, OSError) as exc:
                log.warning("stream %s: %s; retrying", self.stream, exc)
                await asyncio.sleep(1.0)

    async def step(self) -> None:
        """Take over a dead consumer's entries, read new ones, acknowledge applied ones."""
        claimed = await self.redis.xautoclaim(self.stream, self.group, self.consumer,
                                              self.claim_idle_ms, "0-0", count=100)
        for entry_id, fields in claimed[1]:
            await self._ingest(_text(entry_id), fields)
        await self._read(">")
        await self.acknowledge_applied()

    async def _ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _read(self, start: str) -> None:
        block = self.block_ms if start == ">" else None
        answer: list[Any] = await self.redis.xreadgroup(  # type: ignore[assignment]
            self.group, self.consumer, {self.stream: start}, count=100, block=block)
        for _, entries in answer or []:
            for entry_id, fields in entries:
                if fields:  # an entry deleted from the stream reads back empty
                    await self._ingest(_text(entry_id), fields)

    async def _ingest(self, entry_id: str, fields: dict[Any, Any]) -> None:
        try:
            event = self._event(entry_id, fields)
            receipt = await self.harness.emit(event)
        except (InboxFull, StoreError) as exc:  # for now: stays pending, taken again later
            log.warning("stream %s entry %s: %s; will retry", self.stream, entry_id, exc)
            return
        except TetherError as exc:  # not JSON, no such task, task closed, unknown type
            await self._dead(entry_id, fields, str(exc))
            return
        self.waiting[entry_id] = (event.task_id, receipt.event_id)

    def _event(self, entry_id: str, fields: dict[Any, Any]) -> Event:
        raw = fields.get(b"event", fields.get("event"))
        try:
            data = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError as exc:
            raise TetherError(f"entry {entry_id}: field 'event' is not JSON ({exc})") from None
        if not isinstance(data, dict) or not data.get("type") or not data.get("task_id"):
            raise TetherError(f"entry {entry_id}: needs a field 'event' holding a JSON object"
                              " with 'type' and 'task_id'")
        return Event(type=str(data["type"]), task_id=str(data["task_id"]),
                     payload=data.get("payload"), priority=data.get("priority"),
                     source_event_id=data.get("source_event_id")
                     or f"redis:{self.stream}:{entry_id}")

    async def _dead(self, entry_id: str, fields: dict[Any, Any], reason: str) -> None:
        log.warning("stream %s entry %s cannot become an event: %s", self.stream, entry_id, reason)
        await self.redis.xadd(f"{self.stream}:dead", {**fields, "reason": reason,
                                                      "entry": entry_id})
        await self.redis.xack(self.stream, self.group, entry_id)

    async def acknowledge_applied(self) -> int:
        """XACK every ingested entry whose event the task's loop is done with."""
        status: dict[int, str] = {}
        for task_id in {task for task, _ in self.waiting.values()}:  # one read per task
            status.update((e.event.id or 0, e.status)
                          for e in await self.harness.reads.events(task_id))
        done = [entry_id for entry_id, (_, event_id) in self.waiting.items()
                if status.get(event_id, "missing") in DONE | {"missing"}]
        if done:
            await self.redis.xack(self.stream, self.group, *done)
            for entry_id in done:
                del self.waiting[entry_id]
        return len(done)

    async def close(self) -> None:
        await self.redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
