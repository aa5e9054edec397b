"""The processes of the levers-under-fire test, seen from the parent (imported as ``_levers_site``).

A :class:`Site` is one store (SQLite, PostgreSQL, or PostgreSQL behind the Redis cache) with
its provider ledger, and the long-lived processes on it:

- worker slots running ``tether worker --app tests.chaos._levers_app:harness`` (the installed
  command line, as an operator starts one). Slot 0 is never armed; the others are SIGKILLed
  and restarted with a failpoint armed (``TETHER_FAILPOINTS=point@n``), and frozen with
  SIGSTOP past their lease. A worker that dies is restarted (unarmed) by the site;
- lever consoles (``_levers_console``): ``app`` with the app's code, ``bare`` a plain
  ``tt.Harness(store)`` with nothing registered;
- one-off command lines: ``tether --app ... <lever>``, and ``tether <lever>`` without
  ``--app`` (which falls back to the built-in examples).

Only processes started here are signalled, each by its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import re
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _child import stopped

import tether as tt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
APP = "tests.chaos._levers_app:harness"
_spec = importlib.util.spec_from_file_location("tether_levers_app", HERE / "_levers_app.py")
assert _spec is not None and _spec.loader is not None
levers_app = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(levers_app)

LEASE = levers_app.LEASE
START_TIMEOUT = 30.0
WORKER_SLOTS = 3
CONCURRENCY = 4
FROZEN_AT_ONCE = 2
"""Workers frozen at the same time, at most (of WORKER_SLOTS): one always runs."""


def child_env(site: Site, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TETHER_FAILPOINTS", "TETHER_CACHE", "TETHER_STORE", "TETHER_APP")
           and not k.startswith(("LEVERS_", "TETHER_CHAOS"))}
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join([*path, str(ROOT)]), PYTHONUNBUFFERED="1",
               LEVERS_DIR=str(site.dir), LEVERS_STORE=site.url, LEVERS_LEASE=str(LEASE),
               TETHER_DEMO_LEDGER=str(site.dir / "examples-ledger.db"))
    if site.cache:
        env["TETHER_CACHE"] = site.cache
    env.update(extra or {})
    return env


class Proc:
    """A child process with its stderr in a file of the site's folder."""

    def __init__(self, site: Site, label: str) -> None:
        self.site = site
        self.label = label
        self.proc: asyncio.subprocess.Process | None = None
        self.killed = False
        self.stderr_path = site.dir / "logs" / f"{label}.stderr"
        site.started.append(self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def stderr(self, tail: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-tail:]
        except FileNotFoundError:
            return ""

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)  # this child only, by its own pid

    async def kill(self) -> int | None:
        self.killed = True
        if self.proc is None:
            return None
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        return await self.proc.wait()


class Worker(Proc):
    def __init__(self, site: Site, slot: int, n: int, failpoints: str | None) -> None:
        super().__init__(site, f"worker{slot}-{n}")
        self.slot = slot
        self.failpoints = failpoints
        self.stopped = False

    async def start(self) -> None:
        cli = ["-m", "tests.chaos._levers_unsafe"] if self.site.unsafe else ["-m", "tether"]
        argv = [sys.executable, *cli, "--store", self.site.url, "--app", APP, "worker",
                "--concurrency", str(CONCURRENCY)]
        extra = {"TETHER_FAILPOINTS": self.failpoints} if self.failpoints else {}
        with open(self.stderr_path, "wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, cwd=str(self.site.dir), env=child_env(self.site, extra),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=err)
        end = time.monotonic() + START_TIMEOUT
        while "serving" not in self.stderr():
            if not self.alive():
                if self.failpoints or self.killed:  # died at its failpoint, or killed: fine
                    return
                raise AssertionError(f"{self.label} exited at start: {self.stderr()}")
            assert time.monotonic() < end, f"{self.label} never started: {self.stderr()}"
            await asyncio.sleep(0.02)


class Console(Proc):
    """A lever process: JSON requests in, JSON answers out, many at once."""

    def __init__(self, site: Site, code: str, n: int, failpoints: str | None = None) -> None:
        super().__init__(site, f"console-{code}-{n}")
        self.code = code
        self.failpoints = failpoints
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._eof = False

    def alive(self) -> bool:
        return super().alive() and not self._eof

    @classmethod
    async def started(cls, site: Site, code: str, n: int) -> Console:
        console = cls(site, code, n)
        await console.start()
        return console

    async def start(self) -> None:
        extra = {"LEVERS_CODE": self.code}
        if self.site.unsafe:
            extra["LEVERS_UNSAFE"] = "1"
        if self.failpoints:
            extra["TETHER_FAILPOINTS"] = self.failpoints
        with open(self.stderr_path, "wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.chaos._levers_console", cwd=str(self.site.dir),
                env=child_env(self.site, extra), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=err, limit=1 << 24)
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        assert line and json.loads(line).get("ready"), f"{self.label}: {line!r} {self.stderr()}"
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            reply = json.loads(line)
            future = self._waiting.pop(reply["id"], None)
            if future is not None and not future.done():
                future.set_result(reply)
        self._eof = True  # dead (or dying): no request is sent to it any more
        for future in self._waiting.values():  # the console died: nobody will answer these
            if not future.done():
                future.set_result({"ok": False, "error_type": "SenderDied",
                                   "error": f"{self.label} died ({self.stderr(300)})"})
        self._waiting.clear()

    async def request(self, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        if not self.alive() or self.proc is None or self.proc.stdin is None:
            return {"ok": False, "error_type": "SenderDied", "error": f"{self.label} is dead"}
        n = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = future
        try:
            self.proc.stdin.write((json.dumps({"id": n, "op": op, **args}) + "\n").encode())
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._waiting.pop(n, None)
            return {"ok": False, "error_type": "SenderDied", "error": f"{self.label} is dead"}
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            self._waiting.pop(n, None)
            self.signal(signal.SIGUSR1)  # its threads' stacks, into its stderr
            await asyncio.sleep(0.5)
            self.site.errors.append(f"{self.label} gave no answer to {op} {args} in {timeout}s;"
                                    f" its stacks:\n{self.stderr(6000)}")
            return {"ok": False, "error_type": "Timeout", "error": f"{op}: no answer in {timeout}s"}

    async def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and self.alive():
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                await self.kill()
        if self._reader is not None:
            await self._reader


@dataclass
class Site:
    """One backend's store, ledger and long-lived processes."""

    kind: str
    dir: Path
    url: str
    cache: str | None = None
    unsafe: bool = False
    workers: dict[int, Worker] = field(default_factory=dict)
    consoles: dict[str, Console] = field(default_factory=dict)
    kills: Counter[str] = field(default_factory=Counter)
    stops: int = 0
    cli_runs: int = 0
    purged: set[str] = field(default_factory=set)
    rounds: list[tuple[float, float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: list[Proc] = field(default_factory=list)
    """Every process this site started, so that each is killed at the end."""
    notes: list[str] = field(default_factory=list)
    _serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _supervisors: list[asyncio.Task[None]] = field(default_factory=list)
    _closing: bool = False
    _freeze: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FROZEN_AT_ONCE))
    _console_lock: dict[str, asyncio.Lock] = field(
        default_factory=lambda: {"app": asyncio.Lock(), "bare": asyncio.Lock()})
    reader: tt.Harness | None = None

    @classmethod
    def make(cls, kind: str, folder: Path, url: str, cache: str | None = None,
             unsafe: bool = False) -> Site:
        for sub in ("logs", "gates", "approvals"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / "effects.jsonl").touch()
        return cls(kind, folder, url, cache, unsafe)

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        self.reader = tt.Harness(self.url, settings=levers_app.SETTINGS)
        _ = self.reader.store  # create the schema before any child races to
        await self.reader.store.count_by_status()
        await asyncio.gather(*(self._start_worker(slot) for slot in range(WORKER_SLOTS)))
        for code in ("app", "bare"):
            self.consoles[code] = await Console.started(self, code, next(self._serial))
        for slot in range(WORKER_SLOTS):
            self._supervisors.append(asyncio.create_task(self._supervise(slot)))

    async def _start_worker(self, slot: int, failpoints: str | None = None) -> Worker:
        worker = Worker(self, slot, next(self._serial), failpoints)
        self.workers[slot] = worker
        await worker.start()
        return worker

    async def _supervise(self, slot: int) -> None:
        """Restart a slot's worker whenever it dies (unarmed), counting how it died."""
        while not self._closing:
            worker = self.workers[slot]
            if worker.proc is None:  # being started (armed) right now
                await asyncio.sleep(0.02)
                continue
            code = await worker.proc.wait()
            if self._closing:
                return
            if self.workers.get(slot) is not worker:
                continue  # replaced on purpose (armed); the new one is watched next round
            if code == -signal.SIGKILL and worker.failpoints:
                self.kills[worker.failpoints.partition("@")[0]] += 1
            elif code != -signal.SIGKILL:
                self.kills[f"exit {code}"] += 1
                self.errors.append(f"{worker.label} exited {code}: {worker.stderr(1500)}")
            try:
                await self._start_worker(slot)
            except AssertionError as exc:  # reported; the slot is tried again
                self.errors.append(str(exc)[:1500])
                await self.workers[slot].kill()
                await asyncio.sleep(0.5)

    async def arm(self, slot: int, spec: str) -> None:
        """SIGKILL the slot's worker now and start one that dies at *spec* (``point@n``)."""
        old = self.workers[slot]
        new = Worker(self, slot, next(self._serial), spec)
        self.workers[slot] = new
        await old.kill()
        self.kills["aimed"] += 1
        await new.start()

    async def kill_pid(self, pid: int) -> bool:
        """SIGKILL the worker with this pid (one of ours), if it is still alive."""
        for worker in list(self.workers.values()):
            if worker.alive() and worker.pid == pid:
                worker.killed = True
                worker.signal(signal.SIGKILL)
                self.kills["aimed"] += 1
                return True
        return False

    def holder_dead(self, lease_owner: str) -> bool:
        """Whether the process a lease names (worker ids carry the pid) is one of ours that
        has died."""
        found = re.search(r":(\d+):[0-9a-f]+$", lease_owner)
        if found is None:
            return False
        pid = int(found.group(1))
        ours = [p for p in self.started if p.proc is not None and p.proc.pid == pid]
        return bool(ours) and not any(p.proc is not None and p.proc.returncode is None
                                      for p in ours)

    async def ask_holders(self, owners: list[str]) -> None:
        """SIGUSR1 the live workers named by these lease owners: each prints its asyncio
        tasks' stacks (``_levers_app``); kept in the notes."""
        pids = {int(m.group(1)) for o in owners if (m := re.search(r":(\d+):[0-9a-f]+$", o))}
        for worker in list(self.workers.values()):
            if worker.alive() and worker.pid in pids:
                worker.signal(signal.SIGUSR1)
                await asyncio.sleep(0.5)
                self.notes.append(f"{worker.label} (pid {worker.pid}) tasks:\n"
                                  f"{worker.stderr(12000)}")

    def worker_by_pid(self, pid: int) -> Worker | None:
        return next((w for w in self.workers.values() if w.alive() and w.pid == pid), None)

    @contextlib.asynccontextmanager
    async def frozen(self, worker: Worker, wait: bool = True) -> AsyncIterator[bool]:
        """SIGSTOP *worker* for the body of the ``async with`` (yields whether it was stopped),
        then SIGCONT it. One worker is frozen at a time; without *wait*, a freeze already
        under way means this one is skipped.

        Frozen only while this holds the provider lock exclusively (no call is between its
        fence check and its payment) and, on SQLite, while it holds no write lock on the store
        (a frozen writer would stall every process, not just its own tasks)."""
        if not wait and self._freeze.locked():
            yield False
            return
        async with self._freeze:
            loop = asyncio.get_running_loop()
            stopped = worker.alive() and await loop.run_in_executor(
                None, self._stop_cleanly, worker)
            if stopped:
                self.stops += 1
                worker.stopped = True
            try:
                yield stopped
            finally:
                if stopped:
                    worker.signal(signal.SIGCONT)
                    worker.stopped = False

    def _stop_cleanly(self, worker: Worker) -> bool:
        for _ in range(200):
            if not worker.alive():
                return False
            with levers_app.provider_frozen(self.dir):  # held only for this one try
                worker.signal(signal.SIGSTOP)
                # kill() returns before the process has stopped: until it has, it may still
                # take a lock, so look only once the kernel says it is stopped
                if stopped(worker.pid) and (not self.url.startswith("sqlite:///")
                                             or self._store_writable()):
                    return True
                worker.signal(signal.SIGCONT)
            time.sleep(0.01)
        return False

    def _store_writable(self) -> bool:
        probe = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0.05,
                                isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()

    async def restart_console(self, code: str, failpoints: str | None = None) -> Console:
        async with self._console_lock[code]:
            return await self._restart_console(code, failpoints)

    async def _restart_console(self, code: str, failpoints: str | None) -> Console:
        old = self.consoles.get(code)
        if old is not None:
            if old.failpoints and not old.alive() and not old.killed:  # died at it
                self.kills[f"console:{old.failpoints.partition('@')[0]}"] += 1
            await old.kill()
        console = Console(self, code, next(self._serial), failpoints)
        await console.start()
        self.consoles[code] = console
        return console

    async def armed_console(self, spec: str) -> Console:
        """A lever process of its own with the app's code, that SIGKILLs itself at *spec*."""
        console = Console(self, "app", next(self._serial), spec)
        await console.start()
        return console

    async def done_with_armed(self, console: Console) -> None:
        if console.failpoints and not console.alive():
            self.kills[f"console:{console.failpoints.partition('@')[0]}"] += 1
        await console.kill()

    async def console(self, code: str) -> Console:
        """The console with (``app``) or without (``bare``) the code, restarted if it died."""
        async with self._console_lock[code]:
            console = self.consoles[code]
            if not console.alive():
                console = await self._restart_console(code, None)
            return console

    async def cli(self, code: bool, *args: str, timeout: float = 60.0) -> tuple[int, str]:
        """``tether --store ... [--app APP] <args>``, in the site's folder; exit code and output."""
        self.cli_runs += 1
        app = ["--app", APP] if code else []
        cli = ["-m", "tests.chaos._levers_unsafe"] if self.unsafe else ["-m", "tether"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *cli, "--store", self.url, *app, *args, cwd=str(self.dir),
            env=child_env(self), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -1, f"no answer in {timeout}s"
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace")

    async def close(self) -> None:
        """Kill every process this site started (each by its pid), then stop watching them."""
        self._closing = True
        await self._kill_all()
        done, pending = await asyncio.wait(self._supervisors, timeout=START_TIMEOUT + 5)
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                error = task.exception()
                self.errors.append(f"supervisor: {type(error).__name__}: {error}")
        await self._kill_all()  # any a supervisor started while we were stopping the others
        if self.reader is not None:
            await self.reader.close()

    async def _kill_all(self) -> None:
        for proc in self.started:
            if proc.alive() or (proc.proc is not None and proc.proc.returncode is None):
                await proc.kill()

    # ------------------------------------------------------------------ gates

    def gate(self, order: str, phase: str) -> None:
        (self.dir / "gates" / f"{order}.{phase}").touch()

    def ungate(self, order: str, phase: str | None = None) -> None:
        for path in (self.dir / "gates").glob(f"{order}.*"):
            if phase is None or path.name == f"{order}.{phase}":
                path.unlink(missing_ok=True)

    def ungate_all(self) -> None:
        for path in (self.dir / "gates").iterdir():
            if "." in path.name and ".at." not in path.name:
                path.unlink(missing_ok=True)

    def at_gate(self, order: str, phase: str, task_id: str) -> int | None:
        """The pid of the worker holding *task_id*'s call for *order* at the gate, if any."""
        marker = self.dir / "gates" / f"{order}.{phase}.at.{task_id}"
        try:
            return int(marker.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def clear_marker(self, order: str, phase: str, task_id: str) -> None:
        (self.dir / "gates" / f"{order}.{phase}.at.{task_id}").unlink(missing_ok=True)

    def approve_outside(self, task_id: str, by: str) -> None:
        (self.dir / "approvals" / task_id).write_text(by)
