"""A task's changes as server-sent events: ``GET /api/tasks/{id}/stream`` and the console's
live task page read the same stream (:func:`tether.watching.follow`).

Each event is ``event: <kind>`` (state, row, recovery, reset, end) with one line of JSON
data and, as its id, the reader's position (rows and recovery records received, and the
dialog's branch); a reader that reconnects sends it back as ``Last-Event-ID`` (or
``?after=``) and misses nothing.
Streams are bounded per process: past ``MAX_STREAMS`` open ones a new one gets 503, so a
caller with a read token cannot make the server poll the store without end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from tether.harness import Harness
from tether.watching import Change, Position, follow
from tether.web.security import HTTPRefusal

MAX_STREAMS = 200
"""Open streams one server process serves at once."""
Shape = Callable[[Change], dict[str, Any] | None]


class StreamSlots:
    """Counts the open streams of one app, so the next past the bound is refused."""

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = limit
        self.open = 0
        self.closing = asyncio.Event()

    def take(self) -> None:
        if self.closing.is_set():
            raise HTTPRefusal(503, "this server is stopping: reconnect to another",
                              {"Retry-After": "1"})
        if self.open >= self.limit:
            raise HTTPRefusal(503, f"{self.limit} streams are open on this server: try again"
                              " later or poll GET /api/tasks/{task_id}", {"Retry-After": "5"})
        self.open += 1

    def give_back(self) -> None:
        self.open -= 1

    def close(self) -> int:
        """End every open stream (the server is stopping) and refuse new ones; how many
        were open. Readers reconnect, from where they were, to the next server."""
        self.closing.set()
        return self.open


async def stream_response(harness: Harness, task_id: str, position: str | None,
                          slots: StreamSlots, *, until_finished: bool = True,
                          shape: Shape | None = None) -> StreamingResponse:
    """The task's stream from *position*; its errors (an unknown task, a bad position) are
    raised here, before the answer starts, so they come back as ordinary error answers."""
    after = Position.parse(position)
    await harness.reads.task(task_id)
    slots.take()
    changes = follow(harness, task_id, after=after, until_finished=until_finished,
                     stop=slots.closing)
    return StreamingResponse(_encoded(changes, slots, shape), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _encoded(changes: AsyncIterator[Change], slots: StreamSlots, shape: Shape | None
                   ) -> AsyncIterator[bytes]:
    try:
        async for change in changes:
            if change.kind == "quiet":
                yield b": still here\n\n"
                continue
            data = shape(change) if shape is not None else change.data
            if data is not None:
                yield encode(change.kind, data, str(change.position))
    finally:
        slots.give_back()


def encode(kind: str, data: Any, event_id: str) -> bytes:
    """One server-sent event; the JSON is one line, so no data line can end the event."""
    return b"event: %s\nid: %s\ndata: %s\n\n" % (kind.encode(), event_id.encode(),
                                                  orjson.dumps(data, default=str))
