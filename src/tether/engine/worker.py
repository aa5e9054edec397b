"""The worker: claims tasks under leases, runs them, keeps leases alive, recovers the dead.

Any number of workers (in one process or many) can share a store: a task is
run by at most one of them, because every write is fenced by the lease's
token (R13). A worker that dies stops renewing; once its lease expires,
another worker claims the task and recovers it. A worker told to stop lets
each task finish the step it is in (a side-effecting call in flight is never
cut off), commits, and releases it cleanly, so the next worker resumes at
once and no recovery is counted (E5).

A worker never dies of a transient store fault (issue 13). When the store is unavailable
(:class:`StoreUnavailable`: PostgreSQL restarting, a SQLite write lock held past the busy
timeout) it logs one WARNING, keeps retrying its claims with bounded back-off (0.1 s
doubling to 5 s, jittered) and renewing its leases, and logs one INFO once the store
answers again. A task whose write failed that way stops where it is, without being
parked for a person: its last checkpoint is its resume point. Once the store is back the
worker hands such tasks over cleanly (a release, so no recovery is counted) unless a
side-effecting call may be in flight, which is left to crash recovery and its reconcile
hook. A lease that lapsed meanwhile may have been taken over; the fence refuses this
worker's writes for it. The worker exits only when told to, on a configuration error, or
on a damaged store (:class:`CorruptStore`: a person must restore it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterable
from typing import Any, Protocol

from tether.engine.admission import HELD_BACK
from tether.engine.holders import certainly_dead
from tether.engine.host import RunnerHost
from tether.engine.housekeeping import keep_house
from tether.engine.runner import Runner
from tether.engine.scheduling import keep_schedules
from tether.engine.timers import local_time
from tether.errors import (
    CorruptSnapshot,
    CorruptStore,
    LeaseLost,
    SnapshotTooNew,
    StoreError,
    StoreUnavailable,
    TaskNotFound,
    TetherError,
    VersionNotFound,
)
from tether.model import Status, TaskRecord
from tether.store import Claim
from tether.store.base import SLOT_NOTICE, ScheduleRecord
from tether.store.retry import Outage
from tether.tools import traceback_text

QUICK_LOOK = 0.01
"""Seconds between looks for events other processes stored, while a worker runs tasks: a
P0 sent from another process preempts within about ten milliseconds (E1). Idle workers look
every ``poll_interval`` instead, so waiting costs what it did."""
IDLE_WATCH = 2.0
"""Seconds an idle worker's watcher waits between looks (a polling store) or LISTENs before
asking again (PostgreSQL, told at once by NOTIFY); it wakes as soon as a task starts."""
CLAIMS_AT_ONCE = 32
"""The most tasks a worker with free slots claims in one batch (one transaction)."""



class WorkerHost(RunnerHost, Protocol):
    """What a worker needs from the application around it, beyond what its runners need."""

    @property
    def worker_id(self) -> str: ...

    @property
    def runners(self) -> dict[str, Runner]:
        """The tasks this process is running now, by id (events for them are delivered here)."""

    @property
    def work_arrived(self) -> asyncio.Event:
        """Set when this process stores a task or an event, so an idle worker looks at once."""

    async def notify(self, task_id: str) -> None:
        """Export the task's bundle and tell someone it needs a person (R26)."""

    async def wake_waiting(self) -> int:
        """Have every waiting task re-checked once (R16)."""

    async def running_tasks(self, limit: int) -> list[TaskRecord]:
        """Tasks marked running, wherever they run (a run until idle looks for tasks held
        back by a limit)."""

    async def leased_tasks(self, limit: int) -> list[TaskRecord]:
        """Unfinished tasks under any worker's lease (looked through for dead holders)."""

    async def start_run(self, schedule: ScheduleRecord, task_id: str) -> None:
        """Start one run of a schedule: its agent's task under *task_id* (TaskExists if it
        was started already)."""


class Renewals:
    """When each lease a worker holds is next renewed: once a third of it has passed since it
    was taken or last renewed.

    Renewing every held lease on one schedule also rewrote leases taken a moment before, and
    on SQLite each renewal is a write transaction of its own (an fsync, made on the event
    loop): a worker recovering a thousand tasks renewed dozens taken milliseconds earlier. No
    lease waits longer than it did: the keeper still looks every ``min(poll_interval, lease /
    3)``. Times are ``time.monotonic()`` readings taken before the write that set the lease.
    """

    def __init__(self, lease_seconds: float) -> None:
        self._third = lease_seconds / 3
        self._due: dict[str, float] = {}

    def started(self, task_id: str, at: float) -> None:
        """The lease on *task_id* was taken or renewed by a write begun at *at*."""
        self._due[task_id] = at + self._third

    def due(self, task_id: str, now: float) -> bool:
        """Whether the lease on *task_id* should be renewed at *now* (one not known: yes)."""
        return now >= self._due.get(task_id, now)

    def forget(self, task_id: str) -> None:
        """The worker no longer holds *task_id*."""
        self._due.pop(task_id, None)


class Stranded(Exception):
    """A task stopped because the store became unavailable under it (internal)."""

    def __init__(self, error: StoreUnavailable, releasable: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.releasable = releasable
        """Whether the task may be handed over cleanly once the store is back (no
        side-effecting call in flight)."""


PARKED = {Status.RUNNING: "parked until its next due time, or handed over by a stopping worker",
          Status.WAITING: "waiting for an event", Status.PAUSED: "paused",
          Status.NEEDS_HUMAN: "needs a person", Status.COMPLETED: "completed",
          Status.FAILED: "failed", Status.CANCELLED: "cancelled"}
"""How the log says what became of a task a worker let go of."""
LEASES_LOOKED_AT = 1000
"""Running tasks a run until idle looks through for leases left by a dead worker."""


class Worker:
    """Runs up to ``concurrency`` tasks at once from one store."""

    def __init__(self, harness: WorkerHost, concurrency: int = 4) -> None:
        if concurrency < 1:
            raise TetherError("concurrency must be at least 1")
        self.harness = harness
        self.concurrency = concurrency
        self.active: dict[str, asyncio.Task[None]] = {}
        self._claims: dict[str, Claim] = {}
        self._renewals = Renewals(harness.settings.lease_seconds)
        self.outage = Outage(harness.log)
        """The store's availability as this worker sees it (riding out outages)."""
        self._stranded: list[Claim] = []
        self._leases_seen: dict[str, float] = {}
        """Leases held elsewhere, as an idle run until idle saw them (task id -> expiry)."""
        self._next_dead_look = 0.0
        self._alive: set[str] = set()
        """Tasks whose holder renewed its lease meanwhile: a live worker, not waited for."""
        self._fatal: CorruptStore | None = None
        self._changed = asyncio.Event()
        self._started = asyncio.Event()
        """Set when a task starts running here: the watcher switches to its short look."""

    async def run(self, until_idle: bool, stop: asyncio.Event | None = None,
                  wake_waiting: bool = False) -> None:
        """Claim and run tasks until stopped (or, with *until_idle*, until none is left).
        With *wake_waiting*, first have every waiting task re-checked once (R16), riding out
        a store that is not there yet like any other outage."""
        keeper = asyncio.create_task(self._keep_alive())
        watcher = asyncio.create_task(self._watch())
        housekeeper = asyncio.create_task(keep_house(self.harness.store, self.harness.settings,
                                                     self.harness.log))
        scheduler = asyncio.create_task(keep_schedules(self.harness.store,
                                                       self.harness.start_run, self.harness.log,
                                                       self.harness.agents,
                                                       self.harness.settings.schedule_hold))
        try:
            while not (stop and stop.is_set()) and self._fatal is None:
                try:
                    if self.outage.active:  # ended once the store takes a write again
                        await self.harness.store.ping()
                        self.outage.succeeded()
                        await self._renew_all()  # keep what was not taken over meanwhile
                    if wake_waiting:
                        await self.harness.wake_waiting()
                        wake_waiting = False
                    await self._release_stranded()
                    await self._take_from_the_dead()
                    claimed = await self._fill()
                except StoreUnavailable as error:
                    await self._pause(self.outage.failed(error), stop)
                    continue
                except CorruptStore as error:  # met by a claim round (an idle worker, say)
                    self._stop_for(error)
                    break
                if until_idle and not self.active and not claimed and not self._stranded \
                        and not await self._others_to_wait_for():
                    return
                await self._wait_for_change(stop)
        finally:
            await self._drain()
            helpers = (keeper, watcher, housekeeper, scheduler)
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal

    def _stop_for(self, error: CorruptStore) -> None:
        """A damaged store, or its file replaced under this worker: said once, then the
        worker stops (whichever of its tasks, renewals or claims met it first)."""
        if self._fatal is None:
            self.harness.log.error("%s", error)
            self._fatal = error
        self._changed.set()

    async def _pause(self, delay: float, stop: asyncio.Event | None) -> None:
        """Wait out one back-off delay, or less if told to stop or the store failed for good."""
        if self._fatal is not None:
            return
        self._changed.clear()
        await _first_of([self._changed.wait(), *([stop.wait()] if stop else [])], delay)

    async def _renew_all(self) -> None:
        for task_id, claim in list(self._claims.items()):
            try:
                await self._look_after(task_id, claim, renew=True)
            except StoreUnavailable:
                raise
            except Exception:  # one task's trouble must not stop the others' renewals
                self.harness.log.exception("task %s: lease upkeep failed", task_id)

    async def _release_stranded(self) -> None:
        """Hand over cleanly the tasks an outage stopped, now that the store answers (a
        task another worker took meanwhile is its own: LeaseLost is fine)."""
        while self._stranded:
            claim = self._stranded[0]
            try:
                await self.harness.store.release(claim)
            except LeaseLost:
                self.harness.log.warning("task %s: lease lost to another worker while the store"
                                         " was unavailable; that worker carries it on",
                                         claim.task_id)
            self._stranded.pop(0)

    async def _take_from_the_dead(self) -> None:
        """End the leases of unfinished tasks whose holder is a worker of this place whose
        process is gone (:mod:`tether.engine.holders`): the claim round right after takes
        them, instead of waiting out the lease. Looked at while this worker has room."""
        clock = time.monotonic()
        if clock < self._next_dead_look or len(self.active) >= self.concurrency:
            return
        self._next_dead_look = clock + max(1.0, self.harness.settings.lease_seconds / 10)
        now = time.time()
        try:
            leased = await self.harness.leased_tasks(LEASES_LOOKED_AT)
        except (StoreUnavailable, CorruptStore):
            raise
        except Exception:  # a look that fails must not stop the worker: leases run out anyway
            self.harness.log.exception("looking for tasks held by dead workers failed")
            return
        for task in leased:
            holder = task.lease_owner
            if holder is None or holder == self.harness.worker_id \
                    or (task.lease_until or 0.0) <= now or not certainly_dead(holder):
                continue
            if await self.harness.store.break_lease(task.task_id, holder):
                self.harness.log.info("task %s: its worker %s is dead (its process is gone);"
                                      " taking it over now, not when its lease runs out",
                                      task.task_id, holder)

    async def _fill(self) -> bool:
        """Claim work for the free slots, a batch at a time (one look at the candidates, one
        transaction: after a crash, a thousand orphaned tasks are not a thousand fsyncs)."""
        claimed = False
        while len(self.active) < self.concurrency:
            wave = min(self.concurrency - len(self.active), CLAIMS_AT_ONCE)
            busy, now, clock = tuple(self.active), time.time(), time.monotonic()
            claims = await self.harness.store.claim_many(
                self.harness.worker_id, now, self.harness.settings.lease_seconds, wave, busy=busy)
            for claim in claims:
                claimed = True
                self._claims[claim.task_id] = claim
                self._renewals.started(claim.task_id, clock)
                self.active[claim.task_id] = asyncio.create_task(self._run_one(claim))
                self._started.set()
            if len(claims) < wave:
                break
        return claimed

    async def _others_to_wait_for(self) -> bool:
        """Whether a run until idle must go on for a task it does not hold: one leased by a
        worker that died (running, or claimed and not yet running), or one held back by a
        limit."""
        if self._held_by_the_dead(await self.harness.leased_tasks(LEASES_LOOKED_AT)):
            return True
        return any(task.lease_owner is None and (task.reason or "").startswith(HELD_BACK)
                   for task in await self.harness.running_tasks(LEASES_LOOKED_AT))

    def _held_by_the_dead(self, running: list[TaskRecord]) -> bool:
        """Whether a run until idle must go on: a task is held under a lease its holder
        stopped renewing (a worker killed mid-task leaves its tasks leased until the lease
        runs out), so it is waited for and then taken over. A lease renewed meanwhile is a
        live worker's: that task is left to it, and the log says so."""
        now = time.time()
        waiting = []
        for task in running:
            until = task.lease_until or 0.0
            if until <= now and self._leases_seen.pop(task.task_id, None) is not None:
                waiting.append(task)  # ran out since the last claim round: one more to take it
                continue
            if task.lease_owner in (None, self.harness.worker_id) or until <= now \
                    or task.task_id in self._alive:
                continue
            seen = self._leases_seen.get(task.task_id)
            if seen is not None and until > seen:
                self._alive.add(task.task_id)
                self.harness.log.info("task %s: held by %s, which renews its lease; left to it",
                                      task.task_id, task.lease_owner)
                continue
            if seen is None:
                self.harness.log.info("task %s: held by %s until %s, which has not renewed its"
                                      " lease; waiting to take it over", task.task_id,
                                      task.lease_owner, local_time(until))
            self._leases_seen[task.task_id] = until
            waiting.append(task)
        return bool(waiting)

    async def _wait_for_change(self, stop: asyncio.Event | None) -> None:
        """Until a task ends, work arrives (stored here, or seen by :meth:`_watch`), a poll
        interval passes, or the worker is told to stop."""
        interval = self.harness.settings.poll_interval
        self.harness.work_arrived.clear()
        self._changed.clear()
        await _first_of([self.harness.work_arrived.wait(), self._changed.wait(),
                         *([stop.wait()] if stop else [])], interval, also=self.active.values())

    async def _watch(self) -> None:
        """Pass on what other processes store: new work wakes the claim loop, and an event
        for a task this worker is running reaches its runner at once (a P0 preempts, E1).

        While it runs tasks the worker asks the store to look every :data:`QUICK_LOOK`
        seconds (SQLite; PostgreSQL is told by NOTIFY). Idle, it hardly looks at all
        (:data:`IDLE_WATCH`): the claim loop polls for new work as it always did, so an idle
        worker costs what it did.
        """
        interval = self.harness.settings.poll_interval
        while True:
            running = self._running()
            self._started.clear()
            idle = max(interval, IDLE_WATCH)  # idle, the claim loop's own poll finds work
            try:
                changed = await self.harness.store.wait_for_change(
                    interval if running else idle, QUICK_LOOK if running else idle,
                    hurry=None if running else self._started)
            except StoreError:  # the claim loop rides the outage out; look again later
                await asyncio.sleep(interval)
                continue
            changed = self._slots_freed(changed)
            if changed is not None and not changed:
                continue
            self.harness.work_arrived.set()
            for task_id in self._running():
                if changed is None or task_id in changed:
                    with contextlib.suppress(StoreError):
                        await self._pass_on_events(task_id)

    def _slots_freed(self, changed: frozenset[str] | None) -> frozenset[str] | None:
        """Hand the slots the store's notices say were let go to the tasks waiting here for
        them; what is left is what other processes stored."""
        if not changed:
            return changed
        slots = {name for name in changed if name.startswith(SLOT_NOTICE)}
        for name in slots:
            self.harness.slot_freed(name.removeprefix(SLOT_NOTICE))
        return changed - slots

    def _running(self) -> list[str]:
        """The tasks this worker holds and is running now."""
        return [task_id for task_id in self._claims if task_id in self.harness.runners]

    async def _drain(self) -> None:
        """Stop at step boundaries, wait up to ``drain_timeout``, then cut off what is left."""
        if not self.active:
            return
        for task_id in self.active:
            runner = self.harness.runners.get(task_id)
            if runner is not None:
                runner.stop()
        tasks = list(self.active.values())
        self.harness.log.info("stopping: %d task(s) finish their step, then are handed over",
                              len(tasks))
        _, late = await asyncio.wait(tasks, timeout=self.harness.settings.drain_timeout)
        if len(late) < len(tasks):
            self.harness.log.info("drained: %d task(s) handed over at a step boundary",
                                  len(tasks) - len(late))
        for task in late:
            task.cancel()
        if late:
            self.harness.log.warning("%d task(s) did not finish their step within drain_timeout;"
                                     " they were cut off and will be recovered", len(late))
            await asyncio.gather(*late, return_exceptions=True)

    async def _run_one(self, claim: Claim) -> None:
        this = asyncio.current_task()
        if claim.crashed:
            self.harness.log.info("task %s: taken over from a worker that stopped holding it"
                                  " (crash %d in a row); recovering from its last checkpoint",
                                  claim.task_id, claim.crashes)
        try:
            await _run(self.harness, claim, steps=True)
        except Stranded as stranded:
            self.outage.noted(stranded.error)
            self.harness.log.info("task %s: stopped by the store outage; it goes on from its"
                                  " last checkpoint", claim.task_id)
            if stranded.releasable:
                self._stranded.append(claim)
        except CorruptStore as error:
            self._stop_for(error)
        except Exception:  # a bug: say so, and leave the task to recovery
            self.harness.log.exception("task %s: could not be run here; leaving it for"
                                       " recovery", claim.task_id)
        finally:
            if self.active.get(claim.task_id) is this:
                del self.active[claim.task_id]
            if self._claims.get(claim.task_id) is claim:
                del self._claims[claim.task_id]
                self._renewals.forget(claim.task_id)

    async def _keep_alive(self) -> None:
        """Renew the leases that are due (:class:`Renewals`), each with a look at its task's
        inbox (:meth:`_look_after`). While the store is unavailable, one renewal a round
        probes it; the rest wait. A renewal that failed is due again at the next look."""
        settings = self.harness.settings
        while True:  # a long poll interval must not let leases lapse
            await asyncio.sleep(min(settings.poll_interval, settings.lease_seconds / 3))
            for task_id, claim in list(self._claims.items()):
                try:
                    await self._look_after(task_id, claim,
                                           self._renewals.due(task_id, time.monotonic()))
                except StoreUnavailable as error:
                    self.outage.noted(error)
                    break
                except CorruptStore as error:  # damaged, or the file replaced: stop
                    self._stop_for(error)
                    return
                except Exception:  # one task's trouble must not stop the others' renewals
                    self.harness.log.exception("task %s: lease upkeep failed", task_id)

    async def _look_after(self, task_id: str, claim: Claim, renew: bool) -> None:
        """Renew *task_id*'s lease when it is due, then pass on the events other processes
        stored for it. The watcher passes events on as their notice arrives; this is the
        backstop for a notice it missed, at the renewals' pace: reading every held task's
        inbox each poll interval cost a worker holding 1,000 long calls 5,000 reads a
        second."""
        if not renew:
            return
        runner = self.harness.runners.get(task_id)
        try:
            at = time.monotonic()
            await self.harness.store.renew(claim, time.time() + self.harness.settings.lease_seconds)
            if self._claims.get(task_id) is claim:  # not ended meanwhile
                self._renewals.started(task_id, at)
        except (LeaseLost, TaskNotFound) as lost:
            # A task that ended meanwhile may be gone already (released, then purged by a
            # worker's housekeeping): the keeper looked at a list taken before it ended.
            if self._claims.get(task_id) is claim and runner is not None:
                self.harness.log.warning(
                    "task %s: %s; stopping it", task_id,
                    "deleted while this worker ran it" if isinstance(lost, TaskNotFound)
                    else "lease lost to another worker")
                task = self.active.get(task_id)
                if task is not None:
                    task.cancel()
            return
        await self._pass_on_events(task_id)

    async def _pass_on_events(self, task_id: str) -> None:
        """Tell the task's runner of events other processes stored for it (a P0 preempts)."""
        runner = self.harness.runners.get(task_id)
        if runner is not None:
            fresh = runner.unseen(await self.harness.store.pending_events(task_id))
            if fresh:
                runner.notify(min(e.priority for e in fresh))


async def _first_of(waits: list[Coroutine[Any, Any, Any]], timeout: float,
                    also: Iterable[asyncio.Future[Any]] = ()) -> None:
    """Until the first of *waits* (or of the futures in *also*, which are left running) is
    done, or *timeout* passes; the waits still pending are cancelled."""
    helpers = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait([*helpers, *also], timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)


async def run_claimed(harness: WorkerHost, claim: Claim, steps: bool = True) -> Status | None:
    """Run (or, with ``steps=False``, only apply the inbox of) one claimed task, then release it.

    Returns the status it was left in, or None when the lease was lost or the task could not
    be run here (the lease then expires and another worker recovers it). A damaged store
    raises CorruptStore.
    """
    try:
        return await _run(harness, claim, steps)
    except Stranded as stranded:
        harness.log.warning("task %s: %s; leaving it for recovery", claim.task_id,
                            stranded.error)
        return None


async def _run(harness: WorkerHost, claim: Claim, steps: bool) -> Status | None:
    """run_claimed, but a task stopped by an unavailable store raises Stranded."""
    try:
        return await _run_task(harness, claim, steps)
    except Stranded:
        raise
    except StoreUnavailable as error:  # loading it, or handing it over after its run
        raise Stranded(error, releasable=True) from error


async def _run_task(harness: WorkerHost, claim: Claim, steps: bool) -> Status | None:
    store = harness.store
    try:
        runner = await Runner.load(harness, claim)
    except SnapshotTooNew as error:
        harness.log.error("%s", error)
        if claim.started:  # left as it was for a newer worker: nobody runs it yet
            await store.set_status(claim, Status.PENDING, None)
        await store.release(claim, hold_until=time.time() + 4 * harness.settings.lease_seconds)
        return None
    except (CorruptSnapshot, VersionNotFound) as error:  # no head to run it from: damage
        await store.set_status(claim, Status.NEEDS_HUMAN, str(error))
        return await _hand_over(harness, claim, Status.NEEDS_HUMAN)
    harness.runners[claim.task_id] = runner
    run = harness.telemetry.task_run(
        runner.snap, **{"tether.task_id": claim.task_id, "tether.version": runner.version,
                        "tether.worker": harness.worker_id, "tether.crashed": claim.crashed})
    try:
        with run:
            status = await _drive(runner, steps)
    except asyncio.CancelledError:
        if runner.safe_to_release():  # cut off by the drain timeout: hand over, no crash
            with contextlib.suppress(Exception):
                await store.release(claim)
        raise
    except StoreUnavailable as error:  # the store went away: not the task's fault
        raise Stranded(error, releasable=runner.safe_to_release()) from error
    except CorruptStore:
        raise
    except (LeaseLost, StoreError) as error:
        harness.log.warning("task %s: %s; leaving it for recovery", claim.task_id, error)
        return None
    except Exception as error:  # agent or tool code may raise anything; park it for a person
        harness.log.exception("task %s: unexpected error; handing it to a person", claim.task_id)
        parked = await _park_after_error(harness, claim, error)
        if parked is None:
            return None
        status = parked
    finally:
        if harness.runners.get(claim.task_id) is runner:
            del harness.runners[claim.task_id]
    return await _hand_over(harness, claim, status)


async def _drive(runner: Runner, steps: bool) -> Status:
    if steps:
        return await runner.run()
    return await runner.apply_levers()  # a crashed task is recovered first


async def _hand_over(harness: WorkerHost, claim: Claim, status: Status) -> Status:
    """Tell a person if needed (while still holding the task), then release it cleanly."""
    if status in (Status.NEEDS_HUMAN, Status.FAILED):
        try:
            await harness.notify(claim.task_id)
        except Exception:  # a failing notifier must not keep the task leased
            harness.log.exception("task %s: the notifier failed", claim.task_id)
    with contextlib.suppress(LeaseLost):
        await harness.store.release(claim)
    harness.log.info("task %s: %s; released", claim.task_id, PARKED.get(status, status.value))
    return status


async def _park_after_error(harness: WorkerHost, claim: Claim, error: Exception) -> Status | None:
    """Reload the last committed state (not the half-changed one) and hand it to a person."""
    try:
        runner = await Runner.load(harness, claim)
        if runner.snap.status.is_terminal:
            return runner.snap.status
        reason = f"{type(error).__name__}: {error}"
        await runner.hand_over(f"unexpected error while running: {reason}",
                               traceback=traceback_text(error))
        return Status.NEEDS_HUMAN
    except StoreUnavailable as unavailable:  # parked by the next worker, after its recovery
        raise Stranded(unavailable, releasable=False) from unavailable
    except TetherError:
        harness.log.exception("task %s: could not even park it; leaving it for recovery",
                              claim.task_id)
        return None
