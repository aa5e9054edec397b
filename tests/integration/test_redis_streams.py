"""R3, R19: events over Redis Streams. An entry is stored in the inbox (deduplicated) before
anything else, acknowledged only once its task applied it, and taken over from a consumer
that died; an entry that can never be an event goes to a dead-letter stream with the reason."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

import services
import tether as tt
from tether.streams import StreamIngest, send

pytestmark = pytest.mark.redis


@pytest.fixture
async def stream() -> AsyncIterator[tuple[str, str]]:
    url = services.redis_url()
    name = f"tether-test-{uuid.uuid4().hex[:8]}:events"
    yield url, name
    client = aioredis.from_url(url)
    await client.delete(name, f"{name}:dead")
    await client.aclose()


def approvals(tmp_path_db: str) -> tt.Harness:
    h = tt.Harness(tmp_path_db, settings=tt.Settings(poll_interval=0.01))

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("approval") if t.last_event is None else tt.Finish(t.last_event["payload"])

    return h


async def pending_count(url: str, name: str) -> int:
    client = aioredis.from_url(url)
    try:
        info = await client.xpending(name, "tether")
        return int(info["pending"])
    finally:
        await client.aclose()


async def test_r19_an_entry_is_acknowledged_only_after_its_task_applied_it(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    tid = await h.submit("gate")
    await h.run_until_idle(timeout=5)
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    await ingest._ensure_group()
    await send(url, tt.Event("approval", tid, {"by": "ann"}), stream=name)
    await ingest.step()
    stored = [e for e in await h.store.list_events(tid) if e.event.type == "approval"]
    assert [e.status for e in stored] == ["pending"]  # durable in the store, not yet applied
    assert stored[0].event.source_event_id is not None
    assert await pending_count(url, name) == 1  # so not acknowledged
    await h.run_until_idle(timeout=5)
    assert await ingest.acknowledge_applied() == 1
    assert await pending_count(url, name) == 0
    assert (await h.get(tid)).snapshot.result == {"by": "ann"}
    await ingest.close()
    await h.close()


async def test_r19_entries_of_a_consumer_that_died_are_taken_over_and_applied_once(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    ids = [await h.submit("gate") for _ in range(5)]
    await h.run_until_idle(timeout=5)
    doomed = StreamIngest(h, url, stream=name, consumer="doomed", block=0.05)
    await doomed._ensure_group()
    for i, tid in enumerate(ids):
        await send(url, tt.Event("approval", tid, {"n": i}), stream=name)
    await doomed._read(">")  # took all five, stored them, then died before acknowledging
    await doomed.close()
    heir = StreamIngest(h, url, stream=name, consumer="heir", claim_idle=0.1, block=0.05)
    await asyncio.sleep(0.3)
    await heir.step()  # XAUTOCLAIM: the entries are the heir's now; emitting again is a no-op
    await h.run_until_idle(timeout=5)
    assert await heir.acknowledge_applied() == 5
    assert await pending_count(url, name) == 0
    for i, tid in enumerate(ids):
        approvals_seen = [e for e in await h.store.list_events(tid) if e.event.type == "approval"]
        assert [e.status for e in approvals_seen] == ["applied"]
        assert (await h.get(tid)).snapshot.result == {"n": i}
    await heir.close()
    await h.close()


async def test_r03_an_entry_that_cannot_be_an_event_goes_to_the_dead_letter_stream(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    await ingest._ensure_group()
    client = aioredis.from_url(url)
    await client.xadd(name, {"event": b"{not json"})
    await client.xadd(name, {"event": b'{"type": "approval", "task_id": "ghost"}'})
    await client.xadd(name, {"something": b"else"})
    await ingest.step()
    dead = await client.xrange(f"{name}:dead")
    reasons = [fields[b"reason"].decode() for _, fields in dead]
    assert len(reasons) == 3
    assert "not JSON" in reasons[0] and "ghost" in reasons[1] and "'type'" in reasons[2]
    assert await pending_count(url, name) == 0
    await client.aclose()
    await ingest.close()
    await h.close()


async def test_r03_r26_levers_sent_over_the_stream_go_to_the_dead_letter_stream(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """R3/R26: whoever can XADD to the intake may send messages, not levers: cancel, resume,
    rollback, decide and the harness's timers are dead-lettered with the reason, and the task
    is untouched."""
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    tid = await h.submit("gate")
    await h.run_until_idle(timeout=5)
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    await ingest._ensure_group()
    client = aioredis.from_url(url)
    levers = ["cancel", "resume", "rollback", "decide", "task_timeout", "timer"]
    for lever in levers:
        await client.xadd(name, {"event": tt_json({"type": lever, "task_id": tid,
                                                   "payload": {"version": 1}})})
    await ingest.step()
    dead = await client.xrange(f"{name}:dead")
    reasons = [fields[b"reason"].decode() for _, fields in dead]
    assert [r.split("'")[1] for r in reasons] == levers
    assert all("is a lever" in r for r in reasons)
    assert await h.store.list_events(tid) == []
    assert (await h.get(tid)).record.status is tt.Status.WAITING
    assert await pending_count(url, name) == 0
    await client.aclose()
    await ingest.close()
    await h.close()


def tt_json(value: object) -> bytes:
    import orjson

    return orjson.dumps(value)


async def test_r19_run_feeds_a_serving_worker_until_stopped(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """R19: ``StreamIngest.run`` beside ``Harness.serve`` (what ``tether worker --events`` does)."""
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    tid = await h.submit("gate")
    stop = asyncio.Event()
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    tasks = [asyncio.create_task(h.serve(stop=stop)), asyncio.create_task(ingest.run(stop))]
    await send(url, tt.Event("approval", tid, {"via": "stream"}), stream=name)
    for _ in range(200):
        if (await h.get(tid)).record.status is tt.Status.COMPLETED and \
                await pending_count(url, name) == 0:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*tasks)
    assert (await h.get(tid)).snapshot.result == {"via": "stream"}
    assert await pending_count(url, name) == 0
    await ingest.close()
    await h.close()


async def test_r19_a_sender_can_wait_until_its_event_is_durable_in_the_store(
        stream: tuple[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """R19: ``send(durable_in=store)`` answers only once an ingest stored the event (Redis here
    keeps nothing on disk), and says so clearly when no worker is ingesting."""
    url, name = stream
    h = approvals(f"sqlite:///{tmp_path / 's.db'}")
    tid = await h.submit("gate")
    with pytest.raises(tt.StoreError, match="no worker stored it"):
        await send(url, tt.Event("approval", tid, {"n": 0}, source_event_id="a0"), stream=name,
                   durable_in=h.store, timeout=0.3)
    stop = asyncio.Event()
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    feeding = asyncio.create_task(ingest.run(stop))
    await send(url, tt.Event("approval", tid, {"n": 1}, source_event_id="a1"), stream=name,
               durable_in=h.store)
    ids = {e.event.source_event_id for e in await h.store.list_events(tid)}
    assert "a1" in ids
    stop.set()
    await feeding
    await ingest.close()
    await h.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_r03_r19_a_source_event_id_that_is_not_printable_goes_to_the_dead_letter_stream(
        stream: tuple[str, str], tmp_path, request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]
        backend: str) -> None:
    """R3, R19, issue 26: a NUL in a ``source_event_id`` reached PostgreSQL, whose refusal
    looks like a store outage, so the entry stayed pending and was retried for ever (and
    SQLite stored it); a line break was stored on both. Each is dead-lettered now with the
    field named, nothing is stored, and a good entry behind them is taken as usual."""
    url, name = stream
    where = request.getfixturevalue("pg_url") if backend == "postgres" \
        else f"sqlite:///{tmp_path / 's.db'}"
    h = approvals(where)
    tid = await h.submit("gate")
    await h.run_until_idle(timeout=5)
    ingest = StreamIngest(h, url, stream=name, block=0.05)
    await ingest._ensure_group()
    client = aioredis.from_url(url)
    for bad in ("nul\x00here", "two\nlines", "tab\there", "esc\x1b[31m"):
        await client.xadd(name, {"event": tt_json({"type": "approval", "task_id": tid,
                                                   "source_event_id": bad})})
    await client.xadd(name, {"event": tt_json({"type": "approval", "task_id": tid,
                                               "source_event_id": "fine-1", "payload": 1})})
    await ingest.step()
    dead = await client.xrange(f"{name}:dead")
    reasons = [fields[b"reason"].decode() for _, fields in dead]
    assert len(reasons) == 4 and all("source_event_id" in r and "printable" in r
                                     for r in reasons), reasons
    assert [e.event.source_event_id for e in await h.store.list_events(tid)] == ["fine-1"]
    await h.run_until_idle(timeout=5)
    await ingest.acknowledge_applied()
    assert await pending_count(url, name) == 0
    assert (await h.get(tid)).snapshot.result == 1
    await client.aclose()
    await ingest.close()
    await h.close()
