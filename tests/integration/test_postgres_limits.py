"""R13 on PostgreSQL (issue 30): a named limit's admission and release are one statement each
(``tether_acquire_limit``, ``tether_release_limit``), so the limit's row lock is held for one
statement; and they answer exactly as the shared steps the SQLite store runs do, for the same
requests at the same times (the two are kept in step by this test)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import services
from tether.store import open_store
from tether.store.base import LimitRequest, Store
from tether.store.conformance.helpers import claim, make_task
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

TASKS = ("a", "b", "c", "d")


def request(task: str, fence: int, holder: str, key: str = "", **size: Any) -> LimitRequest:
    return LimitRequest("provider", key, task, fence, holder, size.pop("priority", 2), **size)


async def script(store: Store, now: float) -> list[Any]:
    """The same admissions, releases, tokens and 429 on any store, at fixed times: what each
    answered (times as offsets from when it asked), when the waiting tasks were woken, and
    the usage operators see. Tasks a and b run (their holds count); c and d wait unclaimed,
    so a slot let go wakes the first of them in line (d: more urgent, though later)."""
    fences = {}
    for task in TASKS:
        await make_task(store, task, created_at=now - 100)
    for task in ("a", "b"):
        fences[task] = (await claim(store, task, now)).fence
    seen: list[Any] = []

    async def ask(task: str, holder: str, at: float, **size: Any) -> None:
        answer = await store.acquire_limit(request(task, fences.get(task, 0), holder, **size),
                                           at)
        seen.append((answer.granted, None if answer.retry_at is None
                     else round(answer.retry_at - at, 6), answer.why))

    two = {"concurrency": 2}
    for task, holder in (("a", "a1"), ("b", "b1"), ("c", "c1"), ("a", "a1")):
        await ask(task, holder, now, **two)
    await ask("d", "d1", now + 1, priority=1, **two)
    seen.append(await store.release_limit("provider", "", "a1", now + 2))  # d: first in line
    seen.append([(task, (await store.get_task(task)).wake_at) for task in ("c", "d")])
    await ask("c", "c1", now + 3, **two)
    await ask("d", "d1", now + 4, priority=1, **two)
    for n in range(3):  # a key of its own: nobody waits in its line
        await ask("a", f"r{n}", now + 5 + n, key="rate", rate=(2, 10.0))
    await ask("b", "t0", now + 9, key="tokens", tokens=(100, 60.0))
    await store.spend_limit("provider", "tokens", "t0", 150)
    await ask("b", "t1", now + 10, key="tokens", tokens=(100, 60.0))
    await store.block_limit("provider", "", now + 30, now + 11)
    await ask("a", "x", now + 12, **two)
    seen.append([(u.in_use, u.waiting) for u in await store.limit_usage(now + 12)])
    return seen


@pytest.fixture
async def postgres(pg_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_url)
    await store.migrate()
    yield store
    await store.close()


async def test_admission_and_release_are_one_statement_each(
        postgres: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    await make_task(postgres, "t")
    fence = (await claim(postgres, "t", now)).fence
    sent = services.statements_sent(monkeypatch)
    assert (await postgres.acquire_limit(request("t", fence, "h", concurrency=1), now)).granted
    refused = await postgres.acquire_limit(request("t", fence, "h2", concurrency=1), now)
    await postgres.release_limit("provider", "", "h", now)
    assert not refused.granted and refused.why == "1 of 1 in use"
    assert len(sent) == 3 and all("tether_" in statement for statement in sent), sent


async def test_postgres_answers_as_the_shared_steps_do(postgres: PostgresStore) -> None:
    now = 1_900_000_000.0
    sqlite = open_store("memory://")
    try:
        expected = await script(sqlite, now)
    finally:
        await sqlite.close()
    assert await script(postgres, now) == expected
    assert expected[:3] == [(True, None, ""), (True, None, ""),
                            (False, 5.0, "2 of 2 in use")]  # the script bites
    assert expected[5:7] == ["d", [("c", None), ("d", now + 2)]]  # the release woke d, first
