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
from collections.abc import Mapping

from tether.errors import MissingExtra
from tether.model import TaskRecord
from tether.store.base import Checkpoint, Claim, Store

try:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtra("the Redis cache needs redis-py", "redis") from exc

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
        # Everything else is the store's own answer: bound here, so each keeps the inner
        # store's exact signature (checked against Store by mypy) without a wrapper per method.
        self.get_task = inner.get_task
        self.load_blobs = inner.load_blobs
        self.read_history = inner.read_history
        self.list_versions = inner.list_versions
        self.claim = inner.claim
        self.claim_task = inner.claim_task
        self.renew = inner.renew
        self.release = inner.release
        self.set_status = inner.set_status
        self.next_epoch = inner.next_epoch
        self.add_event = inner.add_event
        self.pending_events = inner.pending_events
        self.get_idempotency = inner.get_idempotency
        self.wake_all = inner.wake_all
        self.wait_for_change = inner.wait_for_change
        self.ping = inner.ping
        self.list_tasks = inner.list_tasks
        self.find_tasks = inner.find_tasks
        self.acquire_limit = inner.acquire_limit
        self.release_limit = inner.release_limit
        self.block_limit = inner.block_limit
        self.spend_limit = inner.spend_limit
        self.limit_usage = inner.limit_usage
        self.delete_task = inner.delete_task  # a re-used id rewrites its cached heads
        self.purge_finished = inner.purge_finished
        self.collect_blobs = inner.collect_blobs
        self.put_schedule = inner.put_schedule
        self.due_schedules = inner.due_schedules
        self.advance_schedule = inner.advance_schedule
        self.delete_schedule = inner.delete_schedule
        self.list_schedules = inner.list_schedules
        self.count_by_status = inner.count_by_status
        self.count_pending_events = inner.count_pending_events
        self.list_events = inner.list_events
        self.list_idempotency = inner.list_idempotency
        self.list_recovery_log = inner.list_recovery_log
        self.integrity_check = inner.integrity_check  # the cache holds no truth to check
        self.migrate = inner.migrate

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
