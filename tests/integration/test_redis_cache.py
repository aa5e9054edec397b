"""R13 with Redis in front of a store: heads served from Redis, the store still the truth.

The restart test starts its own ``redis-server`` on a free loopback port (never touching the
machine's shared Redis) and kills it with SIGKILL while tasks run. The incarnation tests
(issue 26, defect 4) run on SQLite and PostgreSQL: a task deleted (or purged) and submitted
again under its id, and two stores sharing one Redis database, with every payment counted
in a ledger outside tether.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import services
import tether as tt
from tether.store import open_store
from tether.store.redis_cache import CachedStore, label, unlabel

pytestmark = [pytest.mark.redis]


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


@pytest.mark.postgres
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


@pytest.mark.postgres
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


# ---------------------------------------------------------------------- incarnations (issue 26)

PAYER_APP = '''
import json
import os

import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.02, lease_seconds=2))


@harness.tool(side_effect=True)
async def pay(ctx: tt.ToolContext, order: str, n: int) -> int:
    with open(os.environ["LEDGER"], "a") as ledger:  # outside tether: every payment made
        ledger.write(json.dumps({"task": ctx.task_id, "order": order, "n": n}) + "\\n")
    return n


@harness.agent("payer")
class Payer(tt.Agent):
    async def plan(self, t: tt.TaskView) -> tt.Action:
        return tt.ToolCall("pay", {"order": t.input, "n": t.step}) if t.step < 3 else tt.Finish(t.input)
'''
PAYMENTS = 3
"""Payments one order makes (steps 0, 1, 2), each under its own idempotency key."""


def paid_once(*orders: str) -> Counter[tuple[str, int]]:
    """The ledger when each of *orders* was paid exactly once, and nothing else was."""
    return Counter({(order, n): 1 for order in orders for n in range(PAYMENTS)})


def payer(url: str, cache: str | None, paid: Counter[tuple[str, int]]) -> tt.Harness:
    """An in-process harness of the payer app (with the cache or without it)."""
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.02, lease_seconds=2), cache=cache)

    @h.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, order: str, n: int) -> int:
        paid[(order, n)] += 1
        return n

    @h.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return (tt.ToolCall("pay", {"order": t.input, "n": t.step}) if t.step < PAYMENTS
                    else tt.Finish(t.input))

    return h


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))  # skipped (or failed in CI) if absent
    return f"sqlite:///{tmp_path / 'orders.db'}"


def cached(h: tt.Harness) -> CachedStore:
    store = h.store
    assert isinstance(store, CachedStore)
    return store


async def entry_row(store: CachedStore, task_id: str) -> tuple[float, int] | None:
    """The (created_at, version) label of the task's entry in Redis, None if there is none."""
    import redis

    key = await store.key(task_id)
    assert key is not None
    entry = redis.Redis.from_url(store.url).get(key)
    assert entry is None or isinstance(entry, bytes)
    return None if entry is None else unlabel(entry)[0]


async def clear(store: CachedStore) -> None:
    namespace = await store.namespace()
    assert namespace is not None and namespace.startswith(f"{store.prefix}:")
    services.clear_redis(store.url, namespace)


async def completed(h: tt.Harness, task_id: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while (await h.store.get_task(task_id)).status is not tt.Status.COMPLETED:
        assert time.monotonic() < end, await h.store.get_task(task_id)
        await asyncio.sleep(0.05)


async def delete(h: tt.Harness, task_id: str) -> None:
    """Delete a completed task (its worker may let the lease go a moment after completing)."""
    end = time.monotonic() + 10
    while True:
        try:
            await h.delete(task_id)
            return
        except tt.TaskHeld:
            assert time.monotonic() < end
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("worker", ["kept running", "killed in between"])
async def test_r13_r10_a_task_deleted_and_submitted_again_by_a_process_without_the_cache_runs_its_new_input_once(  # noqa: E501
        store_url: str, worker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R13, R10 (issue 26, defect 4): order A runs under a ``tether worker --cache``
    process; a process without the cache deletes the task and submits order B under the
    same id. The worker (the same one, or a new one after the first was SIGKILLed) runs B,
    never A's cached head again: in the ledger A was paid once and B once. Before the fix
    the cache served A's head for B's version 1: A was paid twice, B never."""
    cache = services.redis_url()
    name = f"payerapp_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(PAYER_APP)
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TETHER_CACHE", raising=False)
    monkeypatch.setenv("LEDGER", str(ledger))
    around: tt.Harness = __import__(name).harness  # a CLI without --cache, say
    around.use_store(store_url)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TETHER_STORE": store_url,
           "TETHER_APP": f"{name}:harness", "TETHER_CACHE": cache}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "tether", "worker"], env=env, cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    probe = CachedStore(open_store(store_url), cache)  # this test's view of the cache
    tid = f"order-{uuid.uuid4().hex[:8]}"
    workers = [start()]
    try:
        await around.submit("payer", "A", task_id=tid)
        await completed(around, tid)
        old = await around.store.get_task(tid)
        assert await entry_row(probe, tid) == (old.created_at, old.head_version)  # A is cached
        if worker == "killed in between":
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
        await delete(around, tid)
        await around.submit("payer", "B", task_id=tid)  # the same id, another incarnation
        if worker == "killed in between":
            workers.append(start())
        await completed(around, tid)
        new = await around.store.get_task(tid)
        assert (await around.get(tid)).snapshot.result == "B"
        assert await entry_row(probe, tid) == (new.created_at, new.head_version)  # replaced
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        errors = [proc.communicate(timeout=60)[1] for proc in workers]
        await clear(probe)
        await probe.close()
        await around.close()
    payments = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert Counter((p["order"], p["n"]) for p in payments) == paid_once("A", "B")
    assert all("Traceback" not in err for err in errors), errors


async def test_r13_r10_two_sqlite_stores_sharing_one_redis_db_never_see_each_other_s_heads(
        tmp_path: Path) -> None:
    """R13, R10 (issue 26, defect 4): two SQLite stores behind one Redis database, the
    default key prefix, and a task id that is the same in both. Each store's worker runs
    its own order (before the fix, the second submit overwrote the first's cached head and
    the east store paid the west's order). The key names the store: the same file opened
    again shares its entries; a copy of the file is another store."""
    cache = services.redis_url()
    paid = {"east": Counter[tuple[str, int]](), "west": Counter[tuple[str, int]]()}
    east = payer(f"sqlite:///{tmp_path / 'east.db'}", cache, paid["east"])
    west = payer(f"sqlite:///{tmp_path / 'west.db'}", cache, paid["west"])
    tid = f"order-{uuid.uuid4().hex[:8]}"
    try:
        await east.submit("payer", "east-order", task_id=tid)
        await west.submit("payer", "west-order", task_id=tid)
        await east.run_until_idle(timeout=30)
        await west.run_until_idle(timeout=30)
        assert paid == {"east": paid_once("east-order"), "west": paid_once("west-order")}
        assert (await east.get(tid)).snapshot.result == "east-order"
        assert (await west.get(tid)).snapshot.result == "west-order"
        assert cached(east).hits >= 1 and cached(west).hits >= 1  # each served its own
        assert await cached(east).namespace() != await cached(west).namespace()
    finally:
        await clear(cached(east))
        await clear(cached(west))
        await east.close()
        await west.close()
    again = CachedStore(open_store(f"sqlite:///{tmp_path / 'east.db'}"), cache)
    shutil.copyfile(tmp_path / "east.db", tmp_path / "copy.db")
    copy = CachedStore(open_store(f"sqlite:///{tmp_path / 'copy.db'}"), cache)
    try:
        assert await again.namespace() == await cached(east).namespace()
        assert await copy.namespace() != await cached(east).namespace()
    finally:
        await again.close()
        await copy.close()


@pytest.mark.parametrize("purged_by", ["the cached store", "a process without the cache"])
async def test_r13_r10_a_purged_task_s_id_used_again_runs_the_new_task_once(
        store_url: str, purged_by: str) -> None:
    """R13, R10 (issue 26, defect 4): retention purges a completed task; a process without
    the cache submits a new task under its id, and the worker with the cache runs the new
    one. A purge through the cache drops the entry at once; one made around the cache
    leaves it in Redis, and it is not served: its incarnation is not the row's."""
    cache = services.redis_url()
    paid: Counter[tuple[str, int]] = Counter()
    worker = payer(store_url, cache, paid)
    around = payer(store_url, None, paid)
    tid = f"order-{uuid.uuid4().hex[:8]}"
    try:
        await around.submit("payer", "A", task_id=tid)
        await worker.run_until_idle(timeout=30)
        old = await around.store.get_task(tid)
        assert await entry_row(cached(worker), tid) == (old.created_at, old.head_version)
        purger = worker if purged_by == "the cached store" else around
        assert await purger.store.purge_finished({"completed": time.time() + 1},
                                                 time.time()) == [tid]
        left = await entry_row(cached(worker), tid)
        assert left == (None if purger is worker else (old.created_at, old.head_version))
        await around.submit("payer", "B", task_id=tid)
        await worker.run_until_idle(timeout=30)
        assert (await around.get(tid)).snapshot.result == "B"
        assert paid == paid_once("A", "B")
        assert cached(worker).stale == (0 if purger is worker else 1)
    finally:
        await clear(cached(worker))
        await worker.close()
        await around.close()


async def test_r13_a_head_from_the_cache_is_checked_against_the_claim_s_row_with_no_store_read(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """R13 (issue 26, defect 4): a claim carries the task row's version and incarnation (read
    where the lease was taken), so a worker's load after a claim is one Redis read and no
    store read. An entry that does not match the row (another incarnation's, planted here)
    is not served: the store's head is, and it replaces the entry."""
    cache = services.redis_url()
    h = payer(store_url, cache, Counter())
    store = cached(h)
    tid = await h.submit("payer", "A")
    try:
        row = await store.inner.get_task(tid)
        _, truth = await store.inner.load_head(tid)
        reads: Counter[str] = Counter()
        for name in ("get_task", "load_head"):
            method = getattr(store.inner, name)

            async def counted(*args: object, _method: Any = method, _name: str = name) -> Any:
                reads[_name] += 1
                return await _method(*args)

            monkeypatch.setattr(store.inner, name, counted)
        claim = await store.claim_task(tid, "w1", time.time(), 30)
        assert claim is not None
        assert (claim.created_at, claim.head_version) == (row.created_at, row.head_version)
        reads.clear()  # PostgreSQL's claim_task looks the task up first: not the load's read
        assert await store.load_head(tid) == (1, truth) and store.hits == 1
        assert reads == Counter()  # the create's entry, checked against the claim's row
        await store.release(claim)

        key = await store.key(tid)
        assert key is not None
        import redis

        redis.Redis.from_url(cache).set(key, label(row.created_at - 1.0, 1) + b"another task")
        claim = await store.claim_task(tid, "w1", time.time(), 30)
        assert claim is not None
        reads.clear()
        assert await store.load_head(tid) == (1, truth)
        assert (store.hits, store.stale) == (1, 1)
        assert reads == Counter({"load_head": 1})  # the store's head, read once
        assert await entry_row(store, tid) == (row.created_at, 1)  # replaced by the store's
        await store.release(claim)
        reads.clear()
        assert await store.load_head(tid) == (1, truth)  # no claim: the row read beside it
        assert store.hits == 2 and reads == Counter({"get_task": 1})
    finally:
        await clear(store)
        await h.close()
