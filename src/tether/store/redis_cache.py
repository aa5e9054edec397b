"""Redis in front of a store: snapshot heads served from memory, the store still the truth (R13).

Only what never changes is cached: a head is stored in Redis under its task *and
version* (``tether:head:<task>:<version>``), written when a task is created or a worker
commits it, and
read when a worker loads the newest head again after a claim. The newest version
number always comes from the store's task row, so a write that went around the
cache (a CLI lever without ``--cache``, another deployment) can never make a
worker resume from an old head: the worst a missing or stale cache costs is a
read from the store. Entries expire after ``ttl`` seconds, so only active tasks
stay hot.

Redis failing (restarted, unreachable, out of memory) is never an error: the
wrapper falls back to the store, counts the miss, and tries Redis again later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tether.errors import ConfigurationError
from tether.model import EmitReceipt, Event, IdempotencyRecord, Status, TaskRecord
from tether.store.base import Checkpoint, Claim, InboxLimits, Store, StoredEvent

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError("the Redis cache needs redis-py: pip install 'tether[redis]'") from exc

log = logging.getLogger("tether.cache")
RETRY_AFTER = 5.0
"""Seconds to leave Redis alone after it failed, instead of paying a timeout per read."""


class CachedStore:
    """A :class:`~tether.store.base.Store` that keeps recent snapshot heads in Redis."""

    def __init__(self, inner: Store, url: str, ttl: float = 3600.0, prefix: str = "tether") -> None:
        self.inner = inner
        self.url = url
        self.ttl = int(ttl)
        self.prefix = prefix
        self.redis = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self._down_until = 0.0

    def _key(self, task_id: str, version: int) -> str:
        return f"{self.prefix}:head:{task_id}:{version}"

    async def _get(self, key: str) -> bytes | None:
        if time.monotonic() < self._down_until:
            return None
        try:
            value = await self.redis.get(key)
            return value if isinstance(value, bytes) else None
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None

    async def _put(self, key: str, head: bytes) -> None:
        if time.monotonic() < self._down_until:
            return
        try:
            await self.redis.set(key, head, ex=self.ttl)
        except (RedisError, OSError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + RETRY_AFTER
        log.warning("Redis cache %s unavailable (%s); reading the store for %.0fs", self.url,
                    exc, RETRY_AFTER)

    # ------------------------------------------------------------------ what the cache changes

    async def load_head(self, task_id: str, version: int | None = None) -> tuple[int, bytes]:
        """The newest head from Redis if it is there; an older version (a rollback, a listing)
        always from the store, which knows whether it is still kept."""
        if version is not None:
            return await self.inner.load_head(task_id, version)
        version = (await self.inner.get_task(task_id)).head_version
        cached = await self._get(self._key(task_id, version))
        if cached is not None:
            self.hits += 1
            return version, cached
        self.misses += 1
        version, head = await self.inner.load_head(task_id, version)
        await self._put(self._key(task_id, version), head)
        return version, head

    async def commit(self, claim: Claim, checkpoint: Checkpoint, keep: int, lease_until: float) -> int:
        version = await self.inner.commit(claim, checkpoint, keep, lease_until)
        await self._put(self._key(claim.task_id, version), checkpoint.head)  # after it is durable
        return version

    async def create_task(self, record: TaskRecord, head: bytes, wake_at: float | None = None,
                          blobs: Mapping[str, bytes] | None = None) -> None:
        await self.inner.create_task(record, head, wake_at, blobs)
        await self._put(self._key(record.task_id, 1), head)

    async def close(self) -> None:
        try:
            await self.redis.aclose()
        finally:
            await self.inner.close()

    # ------------------------------------------------------------------ passed through


    async def get_task(self, task_id: str) -> TaskRecord:
        return await self.inner.get_task(task_id)

    async def list_tasks(self, status: Status | None = None, limit: int = 1000) -> list[TaskRecord]:
        return await self.inner.list_tasks(status, limit)

    async def wake_all(self, status: Status, now: float) -> int:
        return await self.inner.wake_all(status, now)

    async def count_by_status(self) -> dict[str, int]:
        return await self.inner.count_by_status()

    async def claim(self, worker: str, now: float, lease: float,
                    busy: Collection[str] = ()) -> Claim | None:
        return await self.inner.claim(worker, now, lease, busy)

    async def claim_task(self, task_id: str, worker: str, now: float, lease: float) -> Claim | None:
        return await self.inner.claim_task(task_id, worker, now, lease)

    async def renew(self, claim: Claim, until: float) -> None:
        await self.inner.renew(claim, until)

    async def release(self, claim: Claim, hold_until: float | None = None) -> None:
        await self.inner.release(claim, hold_until)

    async def set_status(self, claim: Claim, status: Status, reason: str | None,
                         wake_at: float | None = None) -> None:
        await self.inner.set_status(claim, status, reason, wake_at)

    async def load_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        return await self.inner.load_blobs(digests)

    async def list_versions(self, task_id: str) -> list[tuple[int, float, int]]:
        return await self.inner.list_versions(task_id)

    async def read_history(self, task_id: str, segments: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        return await self.inner.read_history(task_id, segments)

    async def next_epoch(self, task_id: str) -> int:
        return await self.inner.next_epoch(task_id)

    async def add_event(self, event: Event, priority: int, limits: InboxLimits, now: float) -> EmitReceipt:
        return await self.inner.add_event(event, priority, limits, now)

    async def pending_events(self, task_id: str) -> list[StoredEvent]:
        return await self.inner.pending_events(task_id)

    async def count_pending_events(self) -> int:
        return await self.inner.count_pending_events()

    async def list_events(self, task_id: str) -> list[StoredEvent]:
        return await self.inner.list_events(task_id)

    async def get_idempotency(self, key: str) -> IdempotencyRecord | None:
        return await self.inner.get_idempotency(key)

    async def list_idempotency(self, task_id: str) -> list[IdempotencyRecord]:
        return await self.inner.list_idempotency(task_id)

    async def list_recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        return await self.inner.list_recovery_log(task_id)

    async def wait_for_work(self, timeout: float) -> None:
        await self.inner.wait_for_work(timeout)

    async def migrate(self) -> list[str]:
        return await self.inner.migrate()

    async def ping(self) -> None:
        await self.inner.ping()

    async def integrity_check(self) -> list[str]:
        return await self.inner.integrity_check()  # the cache holds no truth to check
