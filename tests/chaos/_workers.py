"""Real ``tether worker`` processes on the chaos app, for the operating tests (E5, E6, E8).

Imported as ``_workers``. Each worker is the installed CLI (``python -m tether worker``)
loading ``tests/chaos/app.py`` with ``--app app:cli_harness``, exactly as an operator
would run one; the parent reads the store with a harness of its own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from _child import ChildProcess

import tether as tt

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("tether_chaos_app_workers", HERE / "app.py")
assert _spec is not None and _spec.loader is not None
app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(app)

T = TypeVar("T")
CHILD_TIMEOUT = 30.0
LEASE = "1.0"


@dataclass
class Site:
    """One store and its provider ledger, and the workers started on them."""

    dir: Path
    db: Path
    ledger: Path
    started: list[ChildProcess]

    @classmethod
    def make(cls, tmp: Path) -> Site:
        site = cls(tmp, tmp / "tether.db", tmp / "provider.db", [])
        app.init_ledger(site.ledger)
        return site

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k != "TETHER_FAILPOINTS" and not k.startswith("TETHER_CHAOS")}
        env.update(TETHER_CHAOS_DB=str(self.db), TETHER_CHAOS_LEDGER=str(self.ledger),
                   PYTHONPATH=str(HERE), PYTHONUNBUFFERED="1", TETHER_CHAOS_LEASE=LEASE,
                   TETHER_CHAOS_POLL="0.02", TETHER_CHAOS_DEADLINE=str(CHILD_TIMEOUT))
        env.update(extra or {})
        return env

    def worker(self, *args: str, env: dict[str, str] | None = None) -> ChildProcess:
        """``tether worker`` on this site, as an operator starts one."""
        argv = [sys.executable, "-m", "tether", "--store", f"sqlite:///{self.db}", "--app",
                "app:cli_harness", "worker", *args]
        child = ChildProcess(argv, self.env(env), self.dir, f"worker{len(self.started) + 1}",
                             CHILD_TIMEOUT)
        self.started.append(child)
        return child

    @staticmethod
    def wait_ready(child: ChildProcess) -> ChildProcess:
        """Wait until a worker has installed its signal handlers (a SIGTERM before then
        would simply kill it, as it would any process still starting)."""
        end = time.monotonic() + CHILD_TIMEOUT
        while "serving" not in child.stderr():
            assert child.proc.poll() is None, f"worker exited early: {child.stderr()}"
            assert time.monotonic() < end, f"worker never started: {child.stderr()}"
            time.sleep(0.02)
        return child

    def app_child(self, mode: str, env: dict[str, str] | None = None) -> ChildProcess:
        """app.py itself (``drain`` exits once every task is settled)."""
        child = ChildProcess([sys.executable, str(HERE / "app.py"), mode], self.env(env),
                             self.dir, f"app{len(self.started) + 1}", CHILD_TIMEOUT)
        self.started.append(child)
        return child

    def kill_all(self) -> None:
        for child in self.started:
            if child.proc.poll() is None:
                child.kill()

    def read(self, fn: Callable[[tt.Harness], Awaitable[T]]) -> T:
        """Run *fn* with a harness of the parent's own on this store (it runs no task)."""
        async def go() -> T:
            harness = app.build_harness(self.db, self.ledger)
            try:
                return await fn(harness)
            finally:
                await harness.close()

        return asyncio.run(go())

    def submit(self, agent: str, input: Any, task_id: str) -> None:
        self.read(lambda h: h.submit(agent, input, task_id=task_id))

    def info(self, task_id: str) -> tt.TaskInfo:
        return self.read(lambda h: h.get(task_id))

    def strategies(self, task_id: str) -> list[str]:
        async def go(h: tt.Harness) -> list[str]:
            return [r["resume_strategy"] for r in await h.store.list_recovery_log(task_id)]

        return self.read(go)

    def wait_for(self, task_id: str, *statuses: tt.Status, timeout: float = 20.0) -> tt.TaskInfo:
        end = time.monotonic() + timeout
        while True:
            info = self.info(task_id)
            if info.record.status in statuses:
                return info
            assert time.monotonic() < end, f"{task_id} stayed {info.record.status.value}"
            time.sleep(0.05)
