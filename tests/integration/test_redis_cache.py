"""R13 with Redis in front of PostgreSQL: heads served from Redis, the store still the truth.

The restart test starts its own ``redis-server`` on a free loopback port (never touching the
machine's shared Redis) and kills it with SIGKILL while tasks run.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import services
import tether as tt
from tether.store.redis_cache import CachedStore

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def app(pg_url: str, cache: str | None, paid: Counter[str], prefix: str = "") -> tt.Harness:
    h = tt.Harness(pg_url, settings=tt.Settings(poll_interval=0.02, lease_seconds=2),
                   cache=cache)
    if cache and prefix:
        h.store.prefix = prefix  # type: ignore[attr-defined]

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, n: int) -> int:
        paid[ctx.idempotency_key] += 1
        await asyncio.sleep(0.01)
        return n

    @h.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.ToolCall("pay", {"n": t.step}) if t.step < 5 else tt.Finish(t.step)

    return h


async def test_r13_heads_come_from_redis_but_a_write_around_the_cache_is_never_served_stale(
        pg_url: str) -> None:
    cache = services.redis_url()
    prefix = f"tether-test-{uuid.uuid4().hex[:8]}"
    paid: Counter[str] = Counter()
    cached = app(pg_url, cache, paid, prefix)
    tid = await cached.submit("payer")
    await cached.run_until_idle(timeout=10)
    store = cached.store
    assert isinstance(store, CachedStore)
    before = store.hits
    info = await cached.get(tid)
    assert store.hits == before + 1 and info.snapshot.result == 5

    around = app(pg_url, None, paid)  # a CLI lever run without --cache, say
    await around.rollback(tid, info.version - 2)
    await around.close()
    fresh = await cached.get(tid)  # the cache holds the old newest head; it is not served
    assert fresh.version > info.version
    assert fresh.snapshot.status is tt.Status.RUNNING and fresh.snapshot.result is None
    await cached.close()
    services.clear_redis(cache, prefix)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    binary = shutil.which("redis-server")
    if binary is None:
        services.unavailable("redis-server binary", "not on PATH")
    port = free_port()
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([str(binary), "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        end = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return proc
            except OSError:
                assert time.monotonic() < end, "private redis-server did not start"
                time.sleep(0.05)

    start()
    yield f"redis://127.0.0.1:{port}/0", started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_r13_redis_killed_and_restarted_while_tasks_run_loses_nothing(
        pg_url: str, private_redis: tuple[str, list[subprocess.Popen[bytes]]]) -> None:
    url, started = private_redis
    paid: Counter[str] = Counter()
    h = app(pg_url, url, paid)
    ids = [await h.submit("payer") for _ in range(40)]
    stop = asyncio.Event()
    serving = asyncio.create_task(h.serve(concurrency=8, stop=stop))
    while sum(paid.values()) < 40:
        await asyncio.sleep(0.01)
    started[0].send_signal(signal.SIGKILL)  # the cache dies with everything in it
    started[0].wait()
    await asyncio.sleep(0.5)
    port = url.rsplit(":", 1)[1].split("/")[0]
    restarted = subprocess.Popen(["redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
                                  "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    started.append(restarted)
    end = time.monotonic() + 60
    while (await h.store.count_by_status()) != {"completed": 40}:
        assert time.monotonic() < end, await h.store.count_by_status()
        await asyncio.sleep(0.05)
    stop.set()
    await serving
    store = h.store
    assert isinstance(store, CachedStore)
    assert store.errors >= 1  # it noticed Redis was gone, and carried on from the store
    assert all(n == 1 for n in paid.values()) and len(paid) == 40 * 5
    for tid in ids:
        assert (await h.get(tid)).snapshot.result == 5
    await h.close()
