"""Real PostgreSQL and Redis for the tests that need them (imported as ``services``).

Locally, a test whose server is not reachable is skipped with one clear line. Under CI
(``CI=true``, or ``TETHER_REQUIRE_SERVICES=1``) the same absence is a failure: CI runs on
a machine where the servers are present, and a silent skip would hide a broken backend.

Each test run gets its own PostgreSQL database, created here and dropped at the end, so
runs never see each other's rows. ``TETHER_TEST_PG`` names the server (an admin URL).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

PG_ADMIN_URL = os.environ.get("TETHER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


PG_FIX = "start it, or set TETHER_TEST_PG"


def required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("TETHER_REQUIRE_SERVICES") == "1"


def unavailable(what: str, why: object, fix: str = "install or start it") -> None:
    """Skip (locally) or fail (CI) a test whose server or program cannot be reached; *fix*
    says what makes it reachable."""
    message = f"{what} not reachable ({why}); {fix}"
    if required():
        pytest.fail(f"{message}. Under CI the service tests are required.", pytrace=False)
    pytest.skip(message)


def create_database(options: str = "") -> str:
    """A fresh, uniquely named database on the test server (*options*: of CREATE DATABASE);
    returns its URL."""
    try:
        import psycopg
    except ImportError as exc:
        unavailable("psycopg (pip install '.[postgres]')", exc)
    name = f"tether_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}" {options}')
    except psycopg.OperationalError as exc:
        unavailable(f"PostgreSQL at {PG_ADMIN_URL}", exc, PG_FIX)
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def drop_database(url: str) -> None:
    import psycopg

    name = url.rpartition("/")[2]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reset_database(url: str) -> None:
    """Empty every tether table (between tests sharing the run's database)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'tether_migrations'")]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")


REDIS_URL = os.environ.get("TETHER_TEST_REDIS", "redis://127.0.0.1:6379/0")


def redis_url() -> str:
    """The test Redis, after checking it answers."""
    try:
        import redis
    except ImportError as exc:
        unavailable("redis-py (pip install '.[redis]')", exc)
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        unavailable(f"Redis at {REDIS_URL}", exc, "start it, or set TETHER_TEST_REDIS")
    return REDIS_URL


def clear_redis(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)


def statements_sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement psycopg's async cursors send from now on, in order (a test counts
    what an operation costs the server in statements)."""
    import psycopg

    sent: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return await execute(cursor, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    return sent
