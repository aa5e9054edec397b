"""The application of the levers-under-fire test (``tests/chaos/test_levers_under_fire.py``).

Workers run it as ``tether worker --app tests.chaos._levers_app:harness``; lever processes
with the app's code load it the same way. Its side effects go to a *provider* outside
tether: an append-only ledger file (``LEVERS_DIR/effects.jsonl``), one JSON line per payment,
written and fsynced before the tool returns, naming the task, the idempotency key, the
order and the lease's fencing token. Nothing tether does can roll it back.

The agent ``levers`` makes the calls its input lists, one per step, in order:

- ``lookup``    idempotent (re-run freely after a crash; not a payment);
- ``refund``    side-effecting, NO reconcile hook: after a crash in flight it is in doubt and
                only a person may settle it. Its name and arguments are those of the
                built-in examples' ``refund``, which has a hook: a process that steers the
                task with the examples' code instead of this app's judges it by the wrong
                rules (issue 26, defect 1);
- ``charge``    side-effecting with a reconcile hook that looks the key up in the ledger;
- ``transfer``  side-effecting with a reconcile hook and a retry policy; its first attempt
                always fails before paying ("bank busy"), so the task waits out a backoff
                with the call open (forks and rollbacks of that version are taken);
- ``wait``      a Wait for an ``approval`` event (``check_wait`` also finds an approval
                filed outside tether, in ``LEVERS_DIR/approvals/<task>``).

Order ids are ``<task id>.<input nonce>.<step>``: a fork's own calls (planned after the
version it was taken from) have orders of their own, a call it copied keeps its source's.

**The provider fences** (tether's guide: a worker paused past its lease can still call the
outside world; only the provider can refuse it). Before paying it asks the store whether
the caller's fencing token is still the task's and its lease still has a while to run, and
refuses otherwise. The check and the append are one critical section under a shared lock on
``LEVERS_DIR/provider.lock``; the test freezes a worker (SIGSTOP) only while it holds that
lock exclusively, so no worker is ever frozen between the check and the payment.

**Gates** make some interleavings exact instead of lucky: while
``LEVERS_DIR/gates/<order>.before`` (or ``.after``) exists, a call for that order stops
before paying (or after paying, before returning), and a first ``transfer`` attempt stops
before failing while ``.fail`` exists; each says so in ``gates/<order>.<phase>.at.<task>``
(its pid).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import tether as tt
from tether.failpoints import failpoint

LEASE = float(os.environ.get("LEVERS_LEASE", "1.0"))
FENCE_MARGIN = 0.3 * LEASE
"""A payment is refused when the caller's lease has less than this left: a live worker renews
once a third of its lease has passed, so only a worker frozen or far behind gets near it."""
RETRY_BACKOFF = float(os.environ.get("LEVERS_RETRY_BACKOFF", "1.5"))
STEPS = ("lookup", "refund", "charge", "transfer", "wait")
PAYING = ("refund", "charge", "transfer")

SETTINGS = tt.Settings(
    lease_seconds=LEASE,
    poll_interval=0.02,
    recovery_backoff=0.05,
    max_recovery_attempts=5,
    recovery_timeout=float(os.environ.get("LEVERS_RECOVERY_TIMEOUT", "3.0")),
    keep_versions=1000,           # every version stays readable: the checker loads them
    housekeeping_interval=3600.0,  # only the test's purge lever purges
)


def _dump_tasks(signum: int, frame: Any) -> None:
    """SIGUSR1: print every asyncio task's stack to stderr (the test asks a worker that holds
    a task without moving it on what it is waiting for)."""
    loop = asyncio._get_running_loop()
    print(f"--- asyncio tasks of pid {os.getpid()}", file=sys.stderr)
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


if "LEVERS_DIR" in os.environ and threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGUSR1, _dump_tasks)


# ---------------------------------------------------------------------- the provider


def site_dir() -> Path:
    return Path(os.environ["LEVERS_DIR"])


def effects_path(folder: Path | None = None) -> Path:
    return (folder or site_dir()) / "effects.jsonl"


def read_effects(folder: Path | None = None) -> list[dict[str, Any]]:
    """Every payment the provider made, in the order it made them."""
    path = effects_path(folder)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def order_paid(order_id: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The first payment for *order_id* under any key (what a person sees on the provider's
    dashboard when they look the order up)."""
    return next((row for row in read_effects(folder) if row["order"] == order_id), None)


def paid_result(tool: str, order_id: str, cents: int) -> dict[str, Any]:
    return {"tool": tool, "order": order_id, "cents": cents, "paid": True}


@contextlib.contextmanager
def provider_frozen(folder: Path) -> Iterator[None]:
    """Hold the provider lock exclusively: no call is between its fence check and its payment
    while this is held (the test freezes workers only inside it)."""
    fd = os.open(folder / "provider.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Fences:
    """The provider's question to the store: is this token still the task's, with time left?"""

    def __init__(self, url: str) -> None:
        self.url = url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: Any = None

    def current(self, task_id: str) -> tuple[int, float | None] | None:
        sql = "SELECT fence, lease_until FROM tasks WHERE task_id = "
        if self.url.startswith(("postgresql://", "postgres://")):
            import psycopg

            if self._pg is None or self._pg.closed:
                self._pg = psycopg.connect(self.url, autocommit=True)
            row = self._pg.execute(sql + "%s", (task_id,)).fetchone()
        else:
            if self._sqlite is None:
                self._sqlite = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30,
                                               isolation_level=None)
            row = self._sqlite.execute(sql + "?", (task_id,)).fetchone()
        return None if row is None else (int(row[0]), row[1])

    def refusal(self, ctx: tt.ToolContext) -> str | None:
        found = self.current(ctx.task_id)
        if found is None:
            return f"task {ctx.task_id} is gone"
        fence, until = found
        if fence != ctx.fence:
            return f"fencing token {ctx.fence} is stale (the task's is {fence} now)"
        if until is None or until - time.time() < FENCE_MARGIN:
            return f"the lease under token {ctx.fence} has (nearly) run out"
        return None


async def _gate(order_id: str, phase: str, task_id: str) -> None:
    gate = site_dir() / "gates" / f"{order_id}.{phase}"
    if not gate.exists():
        return
    marker = gate.parent / f"{order_id}.{phase}.at.{task_id}"
    marker.write_text(str(os.getpid()))
    while gate.exists():
        await asyncio.sleep(0.01)


async def _get_lock() -> int:
    """The provider lock, shared, without blocking the worker's event loop."""
    fd = os.open(site_dir() / "provider.lock", os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            await asyncio.sleep(0.002)


async def pay(fences: Fences, ctx: tt.ToolContext, tool: str, order_id: str,
              cents: int) -> dict[str, Any]:
    await _gate(order_id, "before", ctx.task_id)
    fd = await _get_lock()
    try:
        refused = fences.refusal(ctx)
        if refused is not None:
            raise RuntimeError(f"provider refused {tool} {order_id}: {refused}")
        line = json.dumps({"tool": tool, "key": ctx.idempotency_key, "task": ctx.task_id,
                           "order": order_id, "cents": cents, "attempt": ctx.attempt,
                           "fence": ctx.fence, "pid": os.getpid(), "at": time.time()})
        out = os.open(effects_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(out, (line + "\n").encode())
            os.fsync(out)
        finally:
            os.close(out)
    finally:
        os.close(fd)
    failpoint("inside_tool")  # paid; the result is not returned yet
    await _gate(order_id, "after", ctx.task_id)
    return paid_result(tool, order_id, cents)


def find_payment(ctx: tt.ToolContext, order_id: str) -> dict[str, Any] | None:
    """What a reconcile hook asks the provider: was this key paid for this order?"""
    for row in read_effects():
        if row["key"] == ctx.idempotency_key and row["order"] == order_id:
            return paid_result(row["tool"], order_id, int(row["cents"]))
    return None


# ---------------------------------------------------------------------- the agent


def order_of(task: tt.TaskView, step: int) -> str:
    return f"{task.task_id}.{task.input['nonce']}.{step}"


class Levers(tt.Agent):
    """Makes the calls of ``input.steps`` in order, then finishes with what it was told."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        steps = task.input["steps"]
        i = int(task.scratch.get("i", 0))
        if i >= len(steps):
            results = [row.get("content") for row in task.history if row.get("role") == "tool"]
            return tt.Finish({"steps": len(steps), "results": results})
        task.scratch["i"] = i + 1
        kind = steps[i]
        if kind == "wait":
            return tt.Wait("approval")
        order = order_of(task, i)
        if kind == "lookup":
            return tt.ToolCall("lookup", {"order_id": order})
        return tt.ToolCall(kind, {"order_id": order, "cents": 100 + i})

    async def check_wait(self, task: tt.TaskView, wait: Mapping[str, Any]) -> Any | None:
        filed = site_dir() / "approvals" / task.task_id
        return {"approved_by": filed.read_text()} if filed.exists() else None


# ---------------------------------------------------------------------- a person


def observe(info: tt.TaskInfo) -> dict[str, Any]:
    """What a person sees of a task: status, version, dialog branch, the open call, and
    whether a worker runs it now (holds it under a live lease while it is running)."""
    record, snap = info.record, info.snapshot
    call = snap.call
    live = record.runner() is not None  # a parked task's lease is a worker leaving or applying
    return {
        "status": record.status.value, "version": info.version, "reason": record.reason,
        "branch": snap.history_segments[-1][0] if snap.history_segments else 0,
        "lease_owner": record.lease_owner, "live": live, "etag": info.etag,
        "call": None if call is None else {
            "tool": call.tool, "key": call.key, "attempt": call.attempt,
            "status": str(call.status), "retry_at": call.retry_at, "args": dict(call.args)},
    }


PARKED_FOR_A_PERSON = frozenset({"needs_human", "failed", "paused"})


def why_not_decide(seen: Mapping[str, Any], persona: str, queued_levers: int) -> str | None:
    """Why this person does not decide now (None: they do). A *careful* person decides only
    about a call in doubt on a task parked for a person, that no worker holds and that has
    no lever still queued (so the task cannot move between their look and their answer); a
    *hasty* one decides about any started call, even one running under a live lease."""
    call = seen["call"]
    if call is None or call.get("status") != "started":
        return "no call in doubt to look at"
    if persona == "careful":
        if seen["live"]:
            return "a worker holds it; the careful person waits"
        if seen["status"] not in PARKED_FOR_A_PERSON:
            return f"it is {seen['status']}, not parked for a person; the careful person waits"
        if queued_levers:
            return "levers are still queued for it; the careful person waits"
    return None


def honest_answer(call: Mapping[str, Any], skip: bool, folder: Path | None = None
                  ) -> tuple[str, Any, bool]:
    """What an honest person says about *call* after looking the order up at the provider:
    ``happened`` (with what the provider shows) if it is paid under any key, else
    ``not_happened``; or ``skip``. Never ``not_happened`` about an order shown paid.
    Returns (outcome, result, whether the order was shown paid)."""
    order = call["args"].get("order_id")
    paid = order_paid(order, folder) if order else None
    if skip:
        return "skip", None, paid is not None
    if paid is not None:
        return "happened", paid_result(paid["tool"], order, int(paid["cents"])), True
    return "not_happened", None, False


# ---------------------------------------------------------------------- the harness


def harness(url: str) -> tt.Harness:
    """The factory ``--app tests.chaos._levers_app:harness`` names."""
    h = tt.Harness(url, settings=SETTINGS, protocol={"approval": 1})
    fences = Fences(url)

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order_id: str) -> dict[str, Any]:
        return {"order": order_id, "balance": 1000}

    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any]:
        return await pay(fences, ctx, "refund", order_id, cents)

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any]:
        return await pay(fences, ctx, "charge", order_id, cents)

    @charge.reconcile
    async def _charged(ctx: tt.ToolContext, order_id: str, cents: int) -> Any:
        return find_payment(ctx, order_id)

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=3, backoff=RETRY_BACKOFF,
                                                   jitter=0.0))
    async def transfer(ctx: tt.ToolContext, order_id: str, cents: int) -> dict[str, Any]:
        if ctx.attempt == 1:
            await _gate(order_id, "fail", ctx.task_id)
            raise RuntimeError("bank busy, try again")  # known to have failed: nothing paid
        return await pay(fences, ctx, "transfer", order_id, cents)

    @transfer.reconcile
    async def _transferred(ctx: tt.ToolContext, order_id: str, cents: int) -> Any:
        return find_payment(ctx, order_id)

    h.add_agent("levers", Levers())
    return h
