"""The worker: claims tasks under leases, runs them, keeps leases alive, recovers the dead.

Any number of workers (in one process or many) can share a store: a task is
run by at most one of them, because every write is fenced by the lease's
token (R13). A worker that dies stops renewing; once its lease expires,
another worker claims the task and recovers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from tether.errors import LeaseLost, SnapshotTooNew, TetherError
from tether.model import Status
from tether.recovery import hand_to_person
from tether.runner import Runner
from tether.store import Claim

if TYPE_CHECKING:
    from tether.harness import Harness


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs up to ``concurrency`` tasks at once from one store."""

    def __init__(self, harness: Harness, concurrency: int = 4) -> None:
        if concurrency < 1:
            raise TetherError("concurrency must be at least 1")
        self.harness = harness
        self.concurrency = concurrency
        self.active: dict[str, asyncio.Task[None]] = {}
        self._claims: dict[str, Claim] = {}

    async def run(self, until_idle: bool, stop: asyncio.Event | None = None) -> None:
        """Claim and run tasks until stopped (or, with *until_idle*, until none is left)."""
        settings = self.harness.settings
        keeper = asyncio.create_task(self._keep_alive())
        try:
            while not (stop and stop.is_set()):
                claimed = await self._fill()
                if until_idle and not self.active and not claimed:
                    return
                await self._wait_for_change(settings.poll_interval)
        finally:
            keeper.cancel()
            for task in self.active.values():
                task.cancel()
            await asyncio.gather(keeper, *self.active.values(), return_exceptions=True)

    async def _fill(self) -> bool:
        claimed = False
        while len(self.active) < self.concurrency:
            claim = await self.harness.store.claim(
                self.harness.worker_id, time.time(), self.harness.settings.lease_seconds)
            if claim is None:
                break
            claimed = True
            self._claims[claim.task_id] = claim
            self.active[claim.task_id] = asyncio.create_task(self._run_one(claim))
        return claimed

    async def _wait_for_change(self, timeout: float) -> None:
        if not self.active:
            await asyncio.sleep(timeout)
            return
        await asyncio.wait(self.active.values(), timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)

    async def _run_one(self, claim: Claim) -> None:
        try:
            await run_claimed(self.harness, claim)
        finally:
            self.active.pop(claim.task_id, None)
            self._claims.pop(claim.task_id, None)

    async def _keep_alive(self) -> None:
        """Renew leases and pass on events stored by other processes (P0 preempts at once)."""
        settings = self.harness.settings
        last_renew = time.time()
        while True:
            await asyncio.sleep(settings.poll_interval)
            renew = time.time() - last_renew > settings.lease_seconds / 3
            for task_id, claim in list(self._claims.items()):
                runner = self.harness.runners.get(task_id)
                if renew:
                    await self._renew(claim, task_id)
                if runner is not None:
                    pending = await self.harness.store.pending_events(task_id)
                    if pending:
                        runner.notify(min(e.priority for e in pending))
            if renew:
                last_renew = time.time()

    async def _renew(self, claim: Claim, task_id: str) -> None:
        try:
            await self.harness.store.renew(claim, time.time() + self.harness.settings.lease_seconds)
        except LeaseLost:
            self.harness.log.warning("task %s: lease lost to another worker; stopping it", task_id)
            task = self.active.get(task_id)
            if task is not None:
                task.cancel()


async def run_claimed(harness: Harness, claim: Claim, steps: bool = True) -> Status | None:
    """Run (or, with ``steps=False``, only apply the inbox of) one claimed task, then release it."""
    runner: Runner | None = None
    status: Status | None
    try:
        runner = await Runner.load(harness, claim)
        harness.runners[claim.task_id] = runner
        if steps:
            status = await runner.run()
        else:
            await runner.tick()
            await runner.flush()
            status = runner.snap.status
        await harness.store.release(claim)
    except LeaseLost:
        return None
    except SnapshotTooNew as error:
        harness.log.error("%s", error)
        with contextlib.suppress(LeaseLost):
            await harness.store.release(claim)
        return None
    except Exception as error:  # agent or tool code may raise anything; park it for a person
        harness.log.exception("task %s: unexpected error; handing it to a person", claim.task_id)
        status = await _park_after_error(harness, claim, error)
    finally:
        if runner is not None and harness.runners.get(claim.task_id) is runner:
            del harness.runners[claim.task_id]
    if status in (Status.NEEDS_HUMAN, Status.FAILED):
        await harness.notify(claim.task_id)
    return status


async def _park_after_error(harness: Harness, claim: Claim, error: Exception) -> Status | None:
    """Reload the last committed state (not the half-changed one) and hand it to a person."""
    with contextlib.suppress(LeaseLost):
        runner = await Runner.load(harness, claim)
        if runner.snap.status.is_terminal:
            await harness.store.release(claim)
            return runner.snap.status
        reason = f"{type(error).__name__}: {error}"
        await hand_to_person(runner, f"unexpected error while running: {reason}")
        await harness.store.release(claim)
        return Status.NEEDS_HUMAN
    return None
