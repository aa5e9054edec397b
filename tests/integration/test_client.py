"""tether.client against a real ``tether serve --with-worker`` in its own process (issue 29).

Every route through the client, errors raised again as tether's own exceptions, a submit
and an emit that are idempotent by key, a request sent before the server is up (retried
until it is), a full inbox (429, retried after Retry-After, then InboxFull), the stream
followed to the end, and the same through the sync ``Client``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether as tt
from tether.client import AsyncClient, Client
from tether.errors import ServerError

TOKEN = "client-test-token-0123456789"
APP = '''
import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.02, inbox_capacity=3))


@harness.agent("echo")
class Echo(tt.Agent):
    async def plan(self, t):
        return tt.Finish({"echo": t.input})


@harness.agent("waiter")
class Waiter(tt.Agent):
    async def plan(self, t):
        if t.last_event is None:
            return tt.Wait("approval")
        return tt.Finish({"approved": t.last_event.get("payload")})
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, folder: Path, port: int, worker: bool = True) -> None:
        (folder / "clientapp.py").write_text(APP)
        env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONUNBUFFERED": "1"}
        env.pop("TETHER_STORE", None)
        self.log = open(folder / f"serve-{port}.log", "w")  # noqa: SIM115 - closed in stop
        args = [sys.executable, "-m", "tether", "--store", f"sqlite:///{folder / 't.db'}",
                "--app", "clientapp:harness", "serve", "--port", str(port),
                "--tokens", f"{TOKEN}:operator", *(["--with-worker"] if worker else [])]
        self.proc = subprocess.Popen(args, env=env, cwd=folder, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True)
        self.path = folder / f"serve-{port}.log"
        self.url = f"http://127.0.0.1:{port}"

    def ready(self) -> Server:
        end = time.monotonic() + 30
        while "listening on" not in self.path.read_text():
            assert self.proc.poll() is None, self.path.read_text()
            assert time.monotonic() < end, self.path.read_text()
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path, free_port()).ready()
    yield running
    running.stop()


async def test_a_task_submitted_watched_and_answered_through_the_client(server: Server) -> None:
    async with AsyncClient(server.url, TOKEN) as client:
        task = await client.submit("waiter", {"order": "A1"})
        assert re.fullmatch(r"[0-9a-f]{16}", task)
        seen = []
        async for change in client.watch(task):
            seen.append(change.kind)
            if change.kind == "state" and change.data["status"] == "waiting":
                receipt = await client.emit(task, "approval", "yes")
                assert receipt["outcome"] == "stored"
        assert seen[-1] == "end" and "row" in seen
        done = await client.get(task)
        assert done.status == "completed" and done.result == {"approved": "yes"}
        assert done.etag and done.version >= 2
        rows = await client.history(task)
        assert any(r.get("role") == "event" and r.get("type") == "approval" for r in rows)
        assert [v["version"] for v in await client.versions(task)][-1] == done.version
        listed = await client.list("completed")
        assert task in [t["task_id"] for t in listed["tasks"]]
        assert listed["counts"]["completed"] >= 1
        assert isinstance(await client.recovery(task), list)


async def test_server_errors_come_back_as_tethers_own_exceptions(server: Server) -> None:
    async with AsyncClient(server.url, TOKEN, retry_for=1.0) as client:
        with pytest.raises(tt.TaskNotFound, match="no task 'nope'"):
            await client.get("nope")
        with pytest.raises(tt.UnknownAgent, match="nosuch"):
            await client.submit("nosuch")
        task = await client.submit("echo", 1)
        with pytest.raises(tt.UnknownEventType):
            await client.emit(task, "made_up_type")
        with pytest.raises(ServerError) as lever:
            await client.emit(task, "cancel")  # a lever has a route of its own
        assert lever.value.status == 403
    async with AsyncClient(server.url, "wrong-token-0000000000000") as stranger:
        with pytest.raises(ServerError) as refused:
            await stranger.get(task)
        assert refused.value.status == 401


async def test_submit_and_emit_are_idempotent_by_key(server: Server) -> None:
    async with AsyncClient(server.url, TOKEN) as client:
        task = await client.submit("waiter", None, task_id="order-7")
        with pytest.raises(tt.TaskExists):  # a second submit of one id, not a resend
            await client.submit("waiter", None, task_id="order-7")
        first = await client.emit(task, "approval", "ok", key="approval-1")
        again = await client.emit(task, "approval", "ok", key="approval-1")
        assert first["outcome"] == "stored" and again["outcome"] == "duplicate"
        assert again["event_id"] == first["event_id"]


async def test_levers_through_the_client(server: Server) -> None:
    async with AsyncClient(server.url, TOKEN) as client:
        task = await client.submit("waiter", None)
        async for change in client.watch(task):
            if change.kind == "state" and change.data["status"] == "waiting":
                break
        fork = await client.fork(task, new_task_id="the-fork")
        assert fork == "the-fork"
        answer = await client.cancel(task)
        assert answer["outcome"] in {"stored", "applied"}
        ended = [c async for c in client.watch(task)][-1]
        assert ended.kind == "end" and ended.data["status"] == "cancelled"
        await client.delete(task)
        with pytest.raises(tt.TaskNotFound):
            await client.get(task)
        with pytest.raises(tt.IllegalTransition, match="no longer as it was shown"):
            await client.resume("the-fork", "go on", etag="0" * 16)  # not the view it has
        resumed = await client.resume("the-fork", "go on",  # a person ends its wait
                                      etag=(await client.get("the-fork")).etag)
        assert "event_id" in resumed
        ended = [c async for c in client.watch("the-fork")][-1]
        assert ended.data["status"] == "completed"
        assert (await client.get("the-fork")).result["approved"]["message"] == "go on"
        with pytest.raises(tt.IllegalTransition):
            await client.decide("the-fork", "skip")  # no call in doubt to decide
        versions = await client.versions("the-fork")
        rolled = await client.rollback("the-fork", versions[0]["version"])
        assert "event_id" in rolled


async def test_a_request_sent_before_the_server_is_up_is_retried_until_it_is(
        tmp_path: Path) -> None:
    port = free_port()
    async with AsyncClient(f"http://127.0.0.1:{port}", TOKEN, retry_for=30.0) as client:
        import asyncio

        submitting = asyncio.create_task(client.submit("echo", "early"))
        await asyncio.sleep(0.5)
        assert not submitting.done()  # nothing listens yet: it is being retried
        late = Server(tmp_path, port)
        try:
            task = await asyncio.wait_for(submitting, 60)
            ended = [c async for c in client.watch(task)][-1]
            assert ended.data["status"] == "completed"
            assert (await client.get(task)).result == {"echo": "early"}
        finally:
            late.stop()
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", TOKEN, retry_for=0.5) as never:
        with pytest.raises(ServerError, match="could not reach"):
            await never.get("x")


async def test_a_full_inbox_is_retried_after_retry_after_then_raised(tmp_path: Path) -> None:
    """The app's inbox holds 3 events a task; with no worker to drain it, a 4th of low
    priority is a 429
    with Retry-After: the client waits and tries again until *retry_for*, then raises."""
    idle = Server(tmp_path, free_port(), worker=False).ready()
    try:
        async with AsyncClient(idle.url, TOKEN, retry_for=2.5) as client:
            task = await client.submit("waiter", None)
            for n in range(3):  # low priority (P4): the first refused under backpressure
                await client.emit(task, "user_message", f"m{n}", priority=4)
            started = time.monotonic()
            with pytest.raises(tt.InboxFull):
                await client.emit(task, "user_message", "one too many", priority=4)
            assert time.monotonic() - started >= 1.0  # it waited out a Retry-After first
    finally:
        idle.stop()


def test_the_sync_client_does_the_same_without_async(server: Server) -> None:
    with Client(server.url, TOKEN) as client:
        task = client.submit("echo", {"n": 1})
        changes = list(client.watch(task))
        assert changes[-1].kind == "end" and changes[-1].data["status"] == "completed"
        assert client.get(task).result == {"echo": {"n": 1}}
        with pytest.raises(tt.TaskNotFound):
            client.get("nope")
