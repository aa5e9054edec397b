"""The application the chaos tests run in real child processes (and kill with SIGKILL).

It is a tether harness on a SQLite file plus a fake *payment provider*: a
ledger in a separate SQLite file that the harness does not own and cannot
roll back. Whatever a tool wrote there before a crash stays written, exactly
like a refund a real provider already paid out.

Tools (all call ``failpoint("inside_tool")`` right after the ledger write,
when the outside world has changed but the result has not been returned):

- ``refund_keyed``      side_effect=True; the provider honours the idempotency
                        key (UNIQUE column); ``reconcile`` looks the key up.
- ``refund_reconciled`` side_effect=True; the provider ignores keys (every call
                        pays), but stores the key as a memo, which
                        ``reconcile`` searches. It fences: a call or lookup
                        brings the lease's token, and a call with a token
                        smaller than one already seen is refused (so a worker
                        paused past its lease cannot pay after a takeover).
- ``refund_blind``      side_effect=True, no reconcile: after a crash in
                        flight nobody can say whether it paid.
- ``lookup``            idempotent; counts its calls in the ledger.

Environment (read by :func:`main`):

- ``TETHER_CHAOS_DB`` / ``TETHER_CHAOS_LEDGER``  the store (a SQLite file, or a
                                 ``postgresql://`` URL) and the ledger (a SQLite file).
- ``TETHER_CHAOS_CONCURRENCY``   worker concurrency (default 4).
- ``TETHER_CHAOS_UNSAFE=1``      NEGATIVE CONTROL ONLY: ``refund_keyed`` ignores
                                 its key (no provider dedup) and is declared
                                 ``idempotent=True`` with no reconcile, so the
                                 harness re-runs it after a crash.
- ``TETHER_CHAOS_SLOW_TOOL`` / ``TETHER_CHAOS_SLOW``  that tool prints
                                 ``IN_TOOL <order>`` after its ledger write and
                                 then blocks for that many seconds.
- ``TETHER_CHAOS_RECONCILE_KILL=1``  reconcile hooks SIGKILL their own process.
- ``TETHER_CHAOS_TOOL_DELAY``    seconds every tool sleeps before its write.
- ``TETHER_CHAOS_TOOL_DELAY_AFTER``  seconds every tool sleeps after its write (paid, result
                                 not yet returned).
- ``TETHER_CHAOS_CODE=2``         the code after a deploy (E8): agents at version 2, and
                                 ``refund_blind`` removed.
- ``TETHER_CHAOS_GATE``          a path: after READY, wait until it exists (all modes).
- ``TETHER_CHAOS_DEADLINE``      drain mode gives up (exit 3) after this long.
- ``TETHER_CHAOS_EVENT``         JSON event for ``emit`` mode.
- ``TETHER_CHAOS_LEASE`` / ``TETHER_CHAOS_POLL`` / ``TETHER_CHAOS_MAX_RECOVERIES``
                                 lease_seconds, poll_interval and max_recovery_attempts
                                 (defaults 1.0, 0.05 and 3); the torture schedules use a
                                 short lease so a dead worker's tasks are free again soon.
- ``TETHER_CHAOS_BREAK``         NEGATIVE CONTROLS ONLY: switch ONE guard of tether off in
                                 this child (see :func:`break_guard`): ``idempotency`` (an
                                 in-doubt call is re-run blindly), ``fence`` (stale lease
                                 holders may write) or ``resume_point`` (no checkpoint
                                 before a tool call).

Modes: ``serve`` (worker forever), ``drain`` (worker until every task is
settled: completed, failed, cancelled or needs_human; then exit 0) and
``emit`` (emit one event, print ``EMITTED <id> <outcome>``, then block).

The ``tether`` CLI can drive the same application: ``--app app:cli_harness``
(with ``tests/chaos`` on ``PYTHONPATH`` and ``TETHER_CHAOS_LEDGER`` set).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tether as tt
from tether.failpoints import failpoint

# The enumerated failpoint table assumes every result commits at once
# (defer_results_under=0); TETHER_CHAOS_DEFER=1 runs with the default deferral of
# quick idempotent results instead, for the invariant-only kill tests.
SETTINGS = tt.Settings(
    lease_seconds=float(os.environ.get("TETHER_CHAOS_LEASE", "1.0")),
    poll_interval=float(os.environ.get("TETHER_CHAOS_POLL", "0.05")),
    max_recovery_attempts=int(os.environ.get("TETHER_CHAOS_MAX_RECOVERIES", "3")),
    recovery_backoff=0.01,
    defer_results_under=0.05 if os.environ.get("TETHER_CHAOS_DEFER") == "1" else 0.0)
SETTLED = frozenset({"completed", "failed", "cancelled", "needs_human"})

_LEDGER_SCHEMA = """
CREATE TABLE IF NOT EXISTS refunds (
    id INTEGER PRIMARY KEY,
    order_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    tool TEXT NOT NULL,
    idem_key TEXT UNIQUE,          -- honoured by the provider (refund_keyed only)
    memo TEXT,                     -- stored, never deduplicated
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
-- The largest lease fencing token the provider has seen per memo (refund_reconciled only):
-- a call or lookup with a larger one makes every later call with a smaller one refused.
CREATE TABLE IF NOT EXISTS fences (
    memo  TEXT PRIMARY KEY,
    fence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS lookups (
    id INTEGER PRIMARY KEY,
    order_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
    task_id TEXT PRIMARY KEY,
    approver TEXT NOT NULL
);
"""


# ---------------------------------------------------------------------- the provider's ledger


def _ledger(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def init_ledger(path: str | Path) -> None:
    conn = _ledger(path)
    try:
        conn.executescript(_LEDGER_SCHEMA)
    finally:
        conn.close()


def ledger_query(path: str | Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = _ledger(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def refund_counts(path: str | Path) -> Counter[str]:
    """How many times the provider paid out each order."""
    return Counter(row[0] for row in ledger_query(path, "SELECT order_id FROM refunds"))


def lookup_counts(path: str | Path) -> Counter[str]:
    return Counter(row[0] for row in ledger_query(path, "SELECT order_id FROM lookups"))


def ledger_pids(path: str | Path) -> set[int]:
    rows = ledger_query(path, "SELECT pid FROM refunds UNION SELECT pid FROM lookups")
    return {int(row[0]) for row in rows}


def record_approval(path: str | Path, task_id: str, approver: str) -> None:
    """The external approval system says yes, without sending tether any event."""
    ledger_query(path, "INSERT INTO approvals (task_id, approver) VALUES (?, ?)", (task_id, approver))


# ---------------------------------------------------------------------- agents


def refund_result(order: str, amount: int) -> dict[str, Any]:
    return {"order": order, "amount": amount, "refunded": True}


def lookup_result(order: str) -> dict[str, Any]:
    return {"order": order, "balance": 1000 - 7 * len(order)}


def call_args(tool: str, order: str, amount: int) -> dict[str, Any]:
    return {"order": order} if tool == "lookup" else {"order": order, "amount": amount}


def summarise(tool_results: list[Any]) -> dict[str, Any]:
    refunds = [r for r in tool_results if isinstance(r, dict) and r.get("refunded")]
    lookups = [r for r in tool_results if isinstance(r, dict) and "balance" in r]
    return {"refunds": refunds, "lookups": lookups,
            "total_refunded": sum(int(r["amount"]) for r in refunds)}


def expected_summary(calls: list[list[Any]]) -> dict[str, Any]:
    """What the refunder agent returns for *calls* if nothing goes wrong."""
    results = [lookup_result(order) if tool == "lookup" else refund_result(order, amount)
               for tool, order, amount in calls]
    return summarise(results)


def answered(history: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The results of the calls that ran: a call set aside by a newer message (its result
    row says ``not_run``) is not among them, so the agent asks for it again (R4)."""
    return [row["content"] for row in history
            if row.get("role") == "tool" and not row.get("not_run")]


class Refunder(tt.Agent):
    """Makes the calls listed in its input one after another, then finishes with a summary.
    Where it is comes from the dialog, as a model's would: a user message that arrives before
    a call starts sets the call aside, and the next plan asks for it again."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        calls = task.input["calls"]
        results = answered(task.history)
        if len(results) < len(calls):
            tool, order, amount = calls[len(results)]
            return tt.ToolCall(tool, call_args(tool, order, amount))
        return tt.Finish(summarise(results))


class Approver(tt.Agent):
    """Waits for an approval (``input.timeout``: for that long), then refunds once and finishes;
    a timed-out wait finishes with ``{"timed_out": True}`` and refunds nothing."""

    def __init__(self, ledger: str) -> None:
        self.ledger = ledger

    async def plan(self, task: tt.TaskView) -> tt.Action:
        stage = task.scratch.get("stage")
        if stage is None:
            task.scratch["stage"] = "waiting"
            return tt.Wait("approval", timeout=task.input.get("timeout"))
        if stage == "waiting":
            event = task.last_event or {}
            if event.get("timeout"):
                return tt.Finish({"timed_out": True, "code": self.version})
            task.scratch["stage"] = "refunding"
            task.scratch["approval"] = event.get("payload")
            task.scratch["approval_source"] = event.get("source", "event")
            return tt.ToolCall("refund_keyed", {"order": task.input["order"],
                                                "amount": task.input["amount"]})
        return tt.Finish({"approval": task.scratch.get("approval"),
                          "approval_source": task.scratch.get("approval_source"),
                          "refund": task.last_tool_result, "code": self.version})

    async def check_wait(self, task: tt.TaskView, wait: Mapping[str, Any]) -> Any | None:
        rows = ledger_query(self.ledger, "SELECT approver FROM approvals WHERE task_id = ?",
                            (task.task_id,))
        return {"approver": rows[0][0]} if rows else None


# ---------------------------------------------------------------------- the harness


def store_url(db: str | Path) -> str:
    """A SQLite file's path, or a PostgreSQL URL as it is."""
    return str(db) if str(db).startswith(("postgresql://", "postgres://")) else f"sqlite:///{db}"


def build_harness(db: str | Path, ledger: str | Path, unsafe: bool = False) -> tt.Harness:
    ledger = str(ledger)
    init_ledger(ledger)
    harness = tt.Harness(store_url(db), settings=SETTINGS)
    slow_tool = os.environ.get("TETHER_CHAOS_SLOW_TOOL")
    slow = float(os.environ.get("TETHER_CHAOS_SLOW", "0"))
    delay = float(os.environ.get("TETHER_CHAOS_TOOL_DELAY", "0"))
    delay_after = float(os.environ.get("TETHER_CHAOS_TOOL_DELAY_AFTER", "0"))
    code = os.environ.get("TETHER_CHAOS_CODE", "1")

    async def before_write() -> None:
        if delay:
            await asyncio.sleep(delay)

    async def after_write(tool: str, order: str) -> None:
        failpoint("inside_tool")  # the outside world changed; the result is not returned yet
        if delay_after:
            await asyncio.sleep(delay_after)
        if tool == slow_tool and slow:
            print(f"IN_TOOL {order}", flush=True)
            await asyncio.sleep(slow)

    def pay(tool: str, order: str, amount: int, key: str | None, memo: str | None) -> None:
        ledger_query(
            ledger,
            "INSERT INTO refunds (order_id, amount, tool, idem_key, memo, pid, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idem_key) DO NOTHING",
            (order, amount, tool, key, memo, os.getpid(), time.time()),
        )

    def fenced(memo: str, fence: int) -> None:
        """Provider-side fencing: remember the largest token per memo, refuse a smaller one."""
        seen = ledger_query(
            ledger, "INSERT INTO fences (memo, fence) VALUES (?, ?) ON CONFLICT (memo) DO UPDATE"
            " SET fence = MAX(fence, excluded.fence) RETURNING fence", (memo, fence))
        if seen[0][0] > fence:
            raise RuntimeError(f"provider refused {memo}: fencing token {fence} is stale"
                               f" ({seen[0][0]} seen); another worker owns this call now")

    def find(column: str, key: str) -> dict[str, Any] | None:
        if os.environ.get("TETHER_CHAOS_RECONCILE_KILL") == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # the provider's SDK takes the process down
        rows = ledger_query(ledger, f"SELECT order_id, amount FROM refunds WHERE {column} = ?",
                            (key,))
        return refund_result(rows[0][0], rows[0][1]) if rows else None

    # refund_keyed: the provider deduplicates by key; after a crash, reconcile asks it.
    async def refund_keyed(ctx: tt.ToolContext, order: str, amount: int) -> dict[str, Any]:
        await before_write()
        key = None if unsafe else ctx.idempotency_key  # unsafe: the key is ignored
        pay("refund_keyed", order, amount, key, None)
        await after_write("refund_keyed", order)
        return refund_result(order, amount)

    if unsafe:
        # NEGATIVE CONTROL: no provider dedup and no harness protection (re-run after a crash).
        harness.tool(refund_keyed, idempotent=True)
    else:
        keyed = harness.tool(refund_keyed, side_effect=True)

        @keyed.reconcile
        async def _reconcile_keyed(ctx: tt.ToolContext, order: str, amount: int) -> Any:
            return find("idem_key", ctx.idempotency_key)

    # refund_reconciled: every call pays; the key is only a memo that reconcile searches.
    @harness.tool(side_effect=True)
    async def refund_reconciled(ctx: tt.ToolContext, order: str, amount: int) -> dict[str, Any]:
        await before_write()
        fenced(ctx.idempotency_key, ctx.fence)
        pay("refund_reconciled", order, amount, None, ctx.idempotency_key)
        await after_write("refund_reconciled", order)
        return refund_result(order, amount)

    @refund_reconciled.reconcile
    async def _reconcile_memo(ctx: tt.ToolContext, order: str, amount: int) -> Any:
        fenced(ctx.idempotency_key, ctx.fence)  # from now on, an older holder's call is refused
        return find("memo", ctx.idempotency_key)

    # refund_blind: pays, and nobody can ask afterwards whether it did.
    async def refund_blind(ctx: tt.ToolContext, order: str, amount: int) -> dict[str, Any]:
        await before_write()
        pay("refund_blind", order, amount, None, ctx.idempotency_key)
        await after_write("refund_blind", order)
        return refund_result(order, amount)

    if code == "1":  # the "new code" of a deploy (code 2) no longer has this tool
        harness.tool(refund_blind, side_effect=True)

    @harness.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        await before_write()
        ledger_query(ledger, "INSERT INTO lookups (order_id, pid, at) VALUES (?, ?, ?)",
                     (order, os.getpid(), time.time()))
        await after_write("lookup", order)
        return lookup_result(order)

    refunder, approver = Refunder(), Approver(ledger)
    refunder.version = approver.version = code
    harness.add_agent("refunder", refunder)
    harness.add_agent("approver", approver)
    return harness


# ---------------------------------------------------------------------- the child process


async def _all_settled(harness: tt.Harness) -> bool:
    counts = await harness.store.count_by_status()
    return bool(counts) and all(status in SETTLED for status in counts)


async def _run(mode: str, harness: tt.Harness) -> int:
    concurrency = int(os.environ.get("TETHER_CHAOS_CONCURRENCY", "4"))
    deadline = time.monotonic() + float(os.environ.get("TETHER_CHAOS_DEADLINE", "30"))
    _ = harness.store  # open the store (creates the schema) before the handshake
    gate = os.environ.get("TETHER_CHAOS_GATE")
    if mode == "emit":
        spec = json.loads(os.environ["TETHER_CHAOS_EVENT"])
        print("READY", flush=True)
        while gate and not os.path.exists(gate):
            await asyncio.sleep(0.002)
        receipt = await harness.emit(tt.Event(**spec))
        print(f"EMITTED {receipt.event_id} {receipt.outcome}", flush=True)
        await asyncio.sleep(3600)  # the parent kills us here
        return 0
    print("READY", flush=True)
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            return 4
        await asyncio.sleep(0.01)
    stop = asyncio.Event()
    server = asyncio.create_task(harness.serve(concurrency=concurrency, stop=stop))
    await asyncio.sleep(0)
    print("SERVING", flush=True)
    code = 0
    while not server.done():
        if mode == "drain" and await _all_settled(harness):
            break
        if time.monotonic() > deadline:
            print("DEADLINE", flush=True)
            code = 3
            break
        await asyncio.sleep(0.05)
    stop.set()
    await server  # re-raises a crash of the worker loop itself
    print("DONE", flush=True)
    return code


# ---------------------------------------------------------------------- negative-control builds


BROKEN_GUARDS = ("idempotency", "fence", "resume_point")


def break_guard(name: str) -> None:
    """NEGATIVE CONTROL: switch one of tether's guards off in this process (test-only).

    - ``idempotency``: a call whose outcome a crash left unknown is re-run blindly, as if
      the idempotency table and the reconcile hooks did not exist.
    - ``fence``: lease fencing tokens are never checked, so a worker that lost its lease
      (paused past it, say) still writes to the store.
    - ``resume_point``: the checkpoint before a tool call is skipped; what it would have
      written rides along with the result's commit instead.
    """
    if name == "idempotency":
        import tether.engine.calls as calls_module

        async def rerun_blindly(runner: Any) -> None:
            call = runner.snap.call
            call.status = "planned"
            runner.log_recovery("rerun_blindly", detail="NEGATIVE CONTROL: no idempotency check")

        calls_module.resolve_in_doubt = rerun_blindly  # type: ignore[assignment]
    elif name == "fence":
        from tether.store.sqlite import SQLiteStore

        def unfenced(self: Any, db: sqlite3.Connection, claim: Any,
                     read: str = "SELECT * FROM tasks WHERE task_id = ?") -> Any:
            return db.execute(read, (claim.task_id,)).fetchone()  # the row, fence unchecked

        SQLiteStore._check_fence = unfenced  # type: ignore[method-assign]
    elif name == "resume_point":
        from tether.engine.runner import Runner

        original = Runner.commit

        async def commit(self: Any, inbox_seen: frozenset[int] | None = None) -> None:
            if sys._getframe(1).f_code.co_name == "call_tool":
                return  # the resume point: skipped; its buffered rows go with the next commit
            await original(self, inbox_seen)

        Runner.commit = commit  # type: ignore[method-assign]
    else:
        raise ValueError(f"unknown guard {name!r}; known: {', '.join(BROKEN_GUARDS)}")


def cli_harness(url: str) -> tt.Harness:
    """The factory ``tether --app app:cli_harness`` calls with the store URL."""
    broken = os.environ.get("TETHER_CHAOS_BREAK")
    if broken:
        break_guard(broken)
    return build_harness(url.removeprefix("sqlite:///"), os.environ["TETHER_CHAOS_LEDGER"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else "serve"
    if mode not in ("serve", "drain", "emit"):
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    broken = os.environ.get("TETHER_CHAOS_BREAK")
    if broken:
        break_guard(broken)
    harness = build_harness(os.environ["TETHER_CHAOS_DB"], os.environ["TETHER_CHAOS_LEDGER"],
                            unsafe=os.environ.get("TETHER_CHAOS_UNSAFE") == "1")

    async def go() -> int:
        try:
            return await _run(mode, harness)
        finally:
            await harness.close()

    return asyncio.run(go())


if __name__ == "__main__":
    sys.exit(main())
