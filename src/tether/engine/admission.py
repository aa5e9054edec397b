"""Admitting a task's calls and plans under the named limits they declare (issue 19).

Before a tool call's resume point (and before an agent that declares limits plans), every
limit named is asked, all or nothing: if one holds the task back, the slots already taken
for it are let go again, and the runner parks the task in the store until the answer's
time (or until a slot is let go: the store wakes the first task in line). After the call
the slots are let go. A provider's 429 (:class:`~tether.errors.RateLimited`) closes the
limits for everyone until its Retry-After.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

from tether.errors import ConfigurationError, RateLimited
from tether.model import Snapshot
from tether.store.base import LimitAnswer, LimitRequest
from tether.throttling import Limit

HELD_BACK = "held back by limit"
"""How the reason of a task held back by a limit begins (a run until idle waits for it)."""


class LimitStore(Protocol):
    async def acquire_limit(self, request: LimitRequest, now: float) -> LimitAnswer: ...

    async def release_limit(self, name: str, key: str, holder: str, now: float) -> None: ...

    async def block_limit(self, name: str, key: str, until: float, now: float) -> None: ...

    async def spend_limit(self, name: str, key: str, holder: str, tokens: int) -> None: ...


class HeldBack(Exception):
    """Internal: an agent's plan is held back by a limit; the runner parks the task."""


class Admission:
    """One runner's door to the shared limits."""

    def __init__(self, store: LimitStore, limits: Mapping[str, Limit]) -> None:
        self.store = store
        self.limits = limits
        self.held_back: LimitAnswer | None = None
        """Why and until when the task was last held back (the runner parks it)."""
        self._task_names: tuple[str, ...] = ()
        self.admitted_at: float | None = None
        """When the last admission was granted (the time its rate limits count it at)."""

    def parked(self) -> tuple[float, str]:
        """Until when and why the task held back waits (the runner parks it so)."""
        assert self.held_back is not None, "parked() is asked only of a task held back"
        return self.held_back.parked()

    def _named(self, names: Sequence[str]) -> list[Limit]:
        missing = [name for name in names if name not in self.limits]
        if missing:
            raise ConfigurationError(f"limit {missing[0]!r} is declared but not defined:"
                                     f" add harness.limit({missing[0]!r}, concurrency=...)")
        return sorted((self.limits[name] for name in names), key=lambda limit: limit.name)

    async def admit(self, snap: Snapshot, fence: int, names: Sequence[str], holder: str,
                    priority: int = 2) -> bool:
        """Take a slot of every limit in *names* for *holder*, or none (and say why in
        :attr:`held_back`)."""
        taken: list[tuple[Limit, str]] = []
        self.admitted_at = time.time()
        for limit in self._named(names):
            key = limit.key_for(snap.input)
            answer = await self.store.acquire_limit(LimitRequest(
                limit.name, key, snap.task_id, fence, holder, priority, limit.concurrency,
                limit.rate, limit.tokens), self.admitted_at)
            if not answer.granted:
                for got, got_key in taken:
                    await self.store.release_limit(got.name, got_key, holder, time.time())
                shown = f"{limit.name}[{key}]" if key else limit.name
                self.held_back = LimitAnswer(False, answer.retry_at,
                                             f"{HELD_BACK} {shown}: {answer.why}")
                return False
            taken.append((limit, key))
        return True

    async def release(self, snap: Snapshot, names: Sequence[str], holder: str,
                      tokens: int = 0) -> None:
        """Let *holder*'s slots go, counting the *tokens* its call used where a limit has a
        token budget."""
        for limit in self._named(names):
            key = limit.key_for(snap.input)
            if limit.tokens is not None and tokens > 0:
                await self.store.spend_limit(limit.name, key, holder, tokens)
            if limit.concurrency is not None:
                await self.store.release_limit(limit.name, key, holder, time.time())

    @contextlib.asynccontextmanager
    async def plan_slot(self, snap: Snapshot, fence: int, names: Sequence[str],
                        priority: int, spent: Callable[[], int] = lambda: 0
                        ) -> AsyncIterator[None]:
        """Hold the agent's limits while it plans (its model call), counting the tokens
        *spent* says it used; :class:`HeldBack` if a limit holds it back, or if the provider
        answered 429 (the limits then close)."""
        if not names:
            yield
            return
        holder = f"plan:{snap.task_id}:{snap.step}"
        if not await self.admit(snap, fence, names, holder, priority):
            raise HeldBack
        try:
            yield
        except RateLimited as cut:
            until = await self.block(snap, names, cut.retry_after)
            self.held_back = LimitAnswer(False, until, f"{HELD_BACK} {', '.join(names)}: {cut}")
            raise HeldBack from cut
        finally:
            await self.release(snap, names, holder, spent())

    async def hold_task(self, snap: Snapshot, fence: int, names: Sequence[str],
                        priority: int) -> bool:
        """Take the task's own limits for as long as it runs here (once: later calls are
        free); False (and :attr:`held_back` set) if one holds it back."""
        if not names or self._task_names:
            return True
        if not await self.admit(snap, fence, names, f"task:{snap.task_id}", priority):
            return False
        self._task_names = tuple(names)
        return True

    async def let_task_go(self, snap: Snapshot) -> None:
        """Let the task's own limits go (it parks, waits or ends)."""
        if self._task_names:
            names, self._task_names = self._task_names, ()
            await self.release(snap, names, f"task:{snap.task_id}")

    async def block(self, snap: Snapshot, names: Sequence[str], retry_after: float) -> float:
        """Close *names* for everyone for *retry_after* seconds; when they open again."""
        now = time.time()
        until = now + retry_after
        for limit in self._named(names):
            await self.store.block_limit(limit.name, limit.key_for(snap.input), until, now)
        return until
