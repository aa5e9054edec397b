"""``tether demo``: four scenarios, covering the three kinds of interruption (R1), shown on a
throwaway SQLite file.

1. Preemption: a user cuts into a 20-contract batch ("stop, re-parse #5").
2. A killed process: a worker is SIGKILLed while a refund is in flight; the
   next worker reconciles with the payment provider instead of paying twice.
3. Nested subtasks: a report analysis three levels deep.
4. A system fault: a flaky upstream is retried, then handed to a person, who
   points the task at a mirror and resumes it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.tree import Tree

import tether as tt
from tether.examples import build_harness, contract_files
from tether.examples.ledger import Ledger

ORDERS: list[dict[str, Any]] = [
    {"id": "A-1001", "cents": 2599}, {"id": "A-1002", "cents": 1250}, {"id": "A-1003", "cents": 9900}]


@dataclass
class DemoOutcome:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    ok: bool = True


async def run_demo(workdir: Path, console: Console, keep: bool = False) -> DemoOutcome:
    """Run every scenario against ``workdir/tether.db``; returns the summary rows. With
    *keep*, the folder outlives the demo, so the files it names are there to open."""
    store_url = f"sqlite:///{workdir / 'tether.db'}"
    ledger_path = str(workdir / "ledger.db")
    os.environ["TETHER_DEMO_LEDGER"] = ledger_path
    parked: list[dict[str, Any]] = []
    harness = build_harness(store_url, ledger_path, notifier=parked.append,
                            bundle_dir=workdir / "bundles")
    outcome = DemoOutcome()
    try:
        await _contracts(harness, console, outcome)
        await _refund(harness, console, outcome, store_url, ledger_path)
        await _report(harness, console, outcome)
        await _inventory(harness, console, outcome, parked, workdir if keep else None)
    finally:
        await harness.close()
    return outcome


async def _contracts(harness: tt.Harness, console: Console, outcome: DemoOutcome) -> None:
    console.rule("[bold]1. A user cuts into a running batch")
    files = contract_files(20)
    task_id = await harness.submit("contracts", {"files": files})
    with Progress(TextColumn("parsing contracts"), BarColumn(), MofNCompleteColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task("parse", total=len(files))

        async def watch_and_interrupt() -> None:
            interrupted = False
            while True:
                info = await harness.get(task_id)
                done = sum(1 for e in await harness.history(task_id)
                           if e.get("role") == "tool" and not e["content"].get("careful"))
                progress.update(bar, completed=done)
                if not interrupted and done >= 7:
                    await harness.emit(tt.Event("user_interrupt", task_id, {
                        "text": "stop, re-parse #5 first", "reparse": files[4]}))
                    progress.console.print("  [yellow]user:[/] stop, re-parse #5 first")
                    interrupted = True
                if info.record.status.is_terminal:
                    return
                await asyncio.sleep(0.02)

        await asyncio.gather(harness.run_until_idle(timeout=60), watch_and_interrupt())
    parses = Counter(e["content"]["file"] for e in await harness.history(task_id)
                     if e.get("role") == "tool")
    twice = [f for f, n in parses.items() if n == 2]
    ok = twice == [files[4]] and all(parses[f] >= 1 for f in files) and sum(parses.values()) == 21
    outcome.ok &= ok
    console.print(f"  {len(files)} contracts parsed once each; {files[4]} re-parsed on request;"
                  f" batch resumed at contract 8 with nothing redone: {_mark(ok)}")
    outcome.rows.append(("contract batch", "user interrupt (P0) mid-batch",
                         "subtask pushed on the stack, batch resumed where it was",
                         f"{sum(parses.values())} parses for 20 files + 1 re-parse"))


async def _refund(harness: tt.Harness, console: Console, outcome: DemoOutcome,
                  store_url: str, ledger_path: str) -> None:
    console.rule("[bold]2. A worker is killed while a refund is in flight")
    task_id = await harness.submit("refund", {"orders": ORDERS})
    env = {**os.environ, "TETHER_DEMO_SLOW_ORDER": str(ORDERS[1]["id"]), "TETHER_DEMO_LEDGER": ledger_path}
    child = subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", store_url, "worker", "--concurrency", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = Ledger(ledger_path)
    try:
        deadline = time.time() + 30
        while ledger.count(str(ORDERS[1]["id"])) == 0 and time.time() < deadline:
            await asyncio.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        console.print(f"  worker pid {child.pid} SIGKILLed after the provider paid {ORDERS[1]['id']}"
                      " but before it answered")
        deadline = time.time() + 30
        while (await harness.get(task_id)).record.status is not tt.Status.COMPLETED:
            if time.time() > deadline:
                break
            await harness.run_until_idle(timeout=30)
            await asyncio.sleep(0.1)
        strategies = [r["resume_strategy"] for r in await harness.reads.recovery_log(task_id)]
        counts = {str(o["id"]): ledger.count(str(o["id"])) for o in ORDERS}
    finally:
        ledger.close()
        if child.poll() is None:
            child.kill()
    ok = all(n == 1 for n in counts.values()) and "reconcile" in strategies
    outcome.ok &= ok
    table = Table("order", "refunds paid", title="payment provider ledger")
    for order, n in counts.items():
        table.add_row(order, f"{n} {_mark(n == 1)}")
    console.print(table)
    console.print(f"  recovery: {', '.join(strategies)}")
    outcome.rows.append(("refunds", "worker SIGKILLed mid-refund",
                         "resumed from snapshot; in-flight refund reconciled, not repeated",
                         "each order refunded exactly once" if ok else f"ledger {counts}"))


async def _report(harness: tt.Harness, console: Console, outcome: DemoOutcome) -> None:
    console.rule("[bold]3. A report analysis with nested subtasks")
    task_id = await harness.submit("report", {"report": "ACME FY2025 annual report"})
    await harness.run_until_idle(timeout=30)
    info = await harness.get(task_id)
    spawns = [e for e in await harness.history(task_id) if e.get("event") == "spawn"]
    console.print(Padding(_task_tree(info.snapshot.agent, spawns), (0, 0, 0, 2), expand=False))
    ok = info.record.status is tt.Status.COMPLETED and max(e["depth"] for e in spawns) == 2
    outcome.ok &= ok
    outcome.rows.append(("report analysis", "none (shows the task stack)",
                         "frames pushed and popped; results handed to parents",
                         f"{info.record.status.value}, {len(spawns)} subtasks, depth 2"))


async def _inventory(harness: tt.Harness, console: Console, outcome: DemoOutcome,
                     parked: list[dict[str, Any]], kept: Path | None) -> None:
    console.rule("[bold]4. A flaky upstream, then a person")
    task_id = await harness.submit("inventory", {})
    await harness.run_until_idle(timeout=30)
    info = await harness.get(task_id)
    console.print(f"  status: [bold]{info.record.status.value}[/]  reason: {info.record.reason}")
    if kept is not None:
        console.print(f"  bundle for the person: {kept / 'bundles' / (task_id + '.json')}")
    else:
        console.print("  a bundle for the person was written (run with --keep to keep it)")
    await harness.resume(task_id, message="primary is in maintenance; use the mirror",
                         frame_patch={"source": "mirror"})
    await harness.run_until_idle(timeout=30)
    final = await harness.get(task_id)
    console.print(f"  after the person resumed it: [bold]{final.record.status.value}[/]"
                  f" {final.snapshot.result}")
    ok = info.record.status is tt.Status.NEEDS_HUMAN and len(parked) == 1 \
        and final.record.status is tt.Status.COMPLETED
    outcome.ok &= ok
    outcome.rows.append(("inventory sync", "upstream 503 on every attempt",
                         "3 attempts with backoff, 1 recovery, same fingerprint → needs_human;"
                         " person patched the source and resumed", final.record.status.value))


def _task_tree(root: str, spawns: list[dict[str, Any]]) -> Tree:
    """The task's frames as a tree: the root agent, then each subtask under its parent (the
    dialog's spawn rows, in order, each with its depth)."""
    tree = Tree(root)
    parents = [tree]  # parents[d]: the newest node at depth d
    for entry in spawns:
        depth = int(entry["depth"])
        del parents[depth:]
        parents.append(parents[-1].add(str(entry["agent"])))
    return tree


def print_summary(console: Console, outcome: DemoOutcome) -> None:
    table = Table("task", "what interrupted it", "how it recovered", "outcome",
                  title="tether demo: summary", show_lines=True)
    for row in outcome.rows:
        table.add_row(*row)
    console.print(table)
    verdict = "every check passed" if outcome.ok else "SOME CHECKS FAILED"
    console.print(f"[bold]{verdict}[/]")


def _mark(ok: bool) -> str:
    return "[green]✓[/]" if ok else "[red]✗[/]"
