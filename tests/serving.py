"""The API and console on a real loopback socket, for the tests that speak HTTP to them (a
browser, a stream reader): uvicorn in this event loop, a worker beside it when asked."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn

import tether as tt
from tether.web.server import ServerConfig, create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """Where the server listens, and its worker (started with it, or later on request, so a
    test can let a worker in another process take a task first)."""

    def __init__(self, base: str, harness: tt.Harness) -> None:
        self.base, self.harness = base, harness
        self.stop = asyncio.Event()
        self.worker: asyncio.Task[None] | None = None

    def start_worker(self) -> None:
        self.worker = asyncio.create_task(self.harness.serve(stop=self.stop))


async def until(harness: tt.Harness, task_id: str, status: tt.Status) -> None:
    """Wait (up to 20 s) for a task to reach *status*; a worker runs it in the background."""
    for _ in range(400):
        if (await harness.store.get_task(task_id)).status is status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task_id} never became {status.value}")


@contextlib.asynccontextmanager
async def served(harness: tt.Harness, config: ServerConfig, *, worker: bool = True
                 ) -> AsyncIterator[Served]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(harness, config), host="127.0.0.1",
                                           port=port, log_level="error"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    running = Served(f"http://127.0.0.1:{port}", harness)
    if worker:
        running.start_worker()
    try:
        yield running
    finally:
        server.should_exit = True
        running.stop.set()
        await asyncio.gather(serving, *([running.worker] if running.worker else []))
        await harness.close()
