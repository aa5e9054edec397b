"""Admitting a task's calls and plans under the named limits they declare (issue 19).

Before a tool call's resume point (and before an agent that declares limits plans), every
limit named is asked, all or nothing: if one holds the task back, the slots already taken
for it are let go again, and the runner parks the task in the store until the answer's
time (or until a slot is let go: the store wakes the first task in line). After the call
the slots are let go. A provider's 429 (:class:`~tether.errors.RateLimited`) closes the
limits for everyone until its Retry-After.

A task held back by a full concurrency limit first waits a short while in memory
(``Settings.slot_wait``), still leased: letting a slot go names the task first in line, and
whoever holds that task hands it the slot at once (:meth:`Admission.slot_freed`: this
process directly, another through the store's notice). Parking, waking, claiming and
loading a task cost more than the call it waited for; on PostgreSQL they halved the rate at
which a limit handed its slots over.
"""

from __future__ import annotations

import asyncio
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
    hands_over_slots: bool

    async def acquire_limit(self, request: LimitRequest, now: float) -> LimitAnswer: ...

    async def release_limit(self, name: str, key: str, holder: str, now: float
                            ) -> str | None: ...

    async def block_limit(self, name: str, key: str, until: float, now: float) -> None: ...

    async def spend_limit(self, name: str, key: str, holder: str, tokens: int) -> None: ...


class HeldBack(Exception):
    """Internal: an agent's plan is held back by a limit; the runner parks the task."""


class Admission:
    """One runner's door to the shared limits."""

    def __init__(self, store: LimitStore, limits: Mapping[str, Limit],
                 hand_over: Callable[[str], None]) -> None:
        self.store = store
        self.limits = limits
        self.held_back: LimitAnswer | None = None
        """Why and until when the task was last held back (the runner parks it)."""
        self._task_names: tuple[str, ...] = ()
        self.admitted_at: float | None = None
        """When the last admission was granted (the time its rate limits count it at)."""
        self._hand_over = hand_over
        """Tells this process's runner of a task that a slot was let go for it."""
        self._freed = asyncio.Event()
        """A slot may be free for this task: set by :meth:`slot_freed`, cleared when it asks."""
        self._waited = 0.0
        """Seconds waited in memory since the task was last admitted."""

    def slot_freed(self) -> None:
        """A slot was let go and this task is first in line for it: a wait in memory ends."""
        self._freed.set()

    async def wait_here(self, wake: asyncio.Event, budget: float) -> bool:
        """Wait in memory for a slot of the limit that held the task back, until one is let
        go for it, *wake* is set (an event arrived) or what is left of *budget* (seconds since
        it was last admitted) runs out; then True: ask again. False when waiting here cannot
        help: park it instead. That is when it was not held back for a slot, or the budget
        is spent, or the store cannot tell a worker that a slot was let go for its task."""
        answer = self.held_back
        left = budget - self._waited
        if answer is None or not answer.slot or left <= 0 or not self.store.hands_over_slots:
            return False
        started = time.monotonic()
        waits = [asyncio.ensure_future(self._freed.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        self._waited += time.monotonic() - started
        self.held_back = None
        return True

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
        self._freed.clear()  # a slot let go from now on is noticed, even before a wait starts
        for limit in self._named(names):
            key = limit.key_for(snap.input)
            answer = await self.store.acquire_limit(LimitRequest(
                limit.name, key, snap.task_id, fence, holder, priority, limit.concurrency,
                limit.rate, limit.tokens), self.admitted_at)
            if not answer.granted:
                for got, got_key in taken:
                    await self._let_go(got.name, got_key, holder)
                shown = f"{limit.name}[{key}]" if key else limit.name
                self.held_back = LimitAnswer(False, answer.retry_at,
                                             f"{HELD_BACK} {shown}: {answer.why}", answer.slot)
                return False
            taken.append((limit, key))
        self._waited = 0.0
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
                await self._let_go(limit.name, key, holder)

    async def _let_go(self, name: str, key: str, holder: str) -> None:
        """A slot let go, handed to the task first in line if this process holds it."""
        first = await self.store.release_limit(name, key, holder, time.time())
        if first is not None:
            self._hand_over(first)

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
