"""A lifespan whose start hangs is cut by the first SIGTERM (or Ctrl-C) of a real ``tether
worker`` or ``tether serve --with-worker`` process (R17, E5).

The module is also the app those processes run (``--app test_lifespan_hung_start:harness``,
this folder on PYTHONPATH). Its lifespans, in order: ``first`` (starts at once), then the
one that hangs, then ``last`` (never reached). ``HUNG_KIND`` says which hangs:

- ``mcp``: ``payments``, an :class:`~tether.integrations.mcp.MCPTools` whose stdio server is
  a real process that reads its stdin and never answers the MCP handshake;
- ``wait``: ``pool``, a lifespan awaiting what never comes (a pool that never connects).

Every act goes to ``HUNG_DIR/journal.txt``, appended and flushed by the worker, so its order
is the order the worker did things in. The hung start writes ``HUNG_DIR/starting`` once it
is under way (the MCP server writes its pid there when it runs): the test polls for that
marker before it sends the signal, so the signal always lands inside the hung start; no
sleep stands in for "long enough".
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import tether as tt

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent
APP = f"{Path(__file__).stem}:harness"
TIMEOUT = 60.0
"""How long a process or a file may take before the test gives up (a hang guard: nothing is
asserted about how long anything took)."""
TOKEN = "hung-start-operator-token-0123456789"
SILENT_SERVER = ("import os, sys\n"
                 "with open(os.environ['HUNG_MARK'] + '.tmp', 'w') as f: f.write(str(os.getpid()))\n"
                 "os.replace(os.environ['HUNG_MARK'] + '.tmp', os.environ['HUNG_MARK'])\n"
                 "sys.stdin.read()  # takes the handshake, never answers it; ends at EOF\n")
"""An MCP server in name only: a real process on the other end of stdio that never answers."""


# ---------------------------------------------------------------------- the app


def journal(line: str) -> None:
    with open(Path(os.environ["HUNG_DIR"]) / "journal.txt", "a") as out:
        out.write(line + "\n")
        out.flush()
        os.fsync(out.fileno())


def harness(url: str) -> tt.Harness:
    """The factory ``--app test_lifespan_hung_start:harness`` names."""
    folder = Path(os.environ["HUNG_DIR"])
    h = tt.Harness(url, settings=tt.Settings(poll_interval=0.02, housekeeping_interval=3600.0))

    @h.tool(side_effect=True)
    async def record(ctx: tt.ToolContext) -> str:
        journal(f"call {ctx.task_id}")
        return "recorded"

    class Once(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_tool_result is None:
                return tt.ToolCall("record", {})
            return tt.Finish(task.last_tool_result)

    h.add_agent("once", Once())

    @h.lifespan
    async def first(h: tt.Harness) -> AsyncIterator[None]:
        journal("enter first")
        yield
        journal("exit first")

    if os.environ["HUNG_KIND"] == "mcp":
        from tether.integrations.mcp import MCPTools

        tools = MCPTools.stdio(h, sys.executable, ["-c", SILENT_SERVER],
                               env={"HUNG_MARK": str(folder / "starting")})

        @h.lifespan
        async def payments(h: tt.Harness) -> AsyncIterator[None]:
            try:
                async with tools:
                    journal("enter payments")
                    yield
            finally:
                journal("left payments")
    else:

        @h.lifespan
        async def pool(h: tt.Harness) -> AsyncIterator[None]:
            try:
                (folder / "starting").write_text("connecting")
                await asyncio.Event().wait()  # the pool's server never answers
                journal("enter pool")
                yield
            finally:
                journal("left pool")

    @h.lifespan
    async def last(h: tt.Harness) -> AsyncIterator[None]:
        journal("enter last")
        yield
        journal("exit last")

    return h


# ---------------------------------------------------------------------- the processes


@dataclass
class Site:
    dir: Path
    kind: str

    @property
    def url(self) -> str:
        return f"sqlite:///{self.dir / 'tether.db'}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "HUNG_"))}
        path = os.environ.get("PYTHONPATH")
        env.update(HUNG_DIR=str(self.dir), HUNG_KIND=self.kind, PYTHONUNBUFFERED="1",
                   COLUMNS="300", PYTHONPATH=str(HERE) + (os.pathsep + path if path else ""))
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tether", "--store", self.url, "--app", APP, *args]

    def run(self, *args: str) -> str:
        done = subprocess.run(self.argv(*args), env=self.env(), cwd=self.dir,
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def journal(self) -> list[str]:
        path = self.dir / "journal.txt"
        return path.read_text().splitlines() if path.exists() else []

    def info(self, task_id: str) -> tt.TaskInfo:
        async def go() -> tt.TaskInfo:
            async with tt.Harness(self.url) as h:
                return await h.get(task_id)

        return asyncio.run(go())


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:  # only the processes this test started, each by its own pid
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(site: Site, started: list[subprocess.Popen[str]], *args: str
          ) -> tuple[subprocess.Popen[str], Path]:
    """A long-lived tether process; what it says (stdout, then stderr) goes to one file."""
    said = site.dir / f"child{len(started)}.said"
    with open(said, "w") as out:
        proc = subprocess.Popen(site.argv(*args), env=site.env(), cwd=site.dir,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    started.append(proc)
    return proc, said


def wait_for_start_in_flight(site: Site, proc: subprocess.Popen[str], err: Path) -> None:
    """Until the hung lifespan's start is under way (its marker), the process still alive."""
    end = time.monotonic() + TIMEOUT
    while not (site.dir / "starting").exists():
        assert proc.poll() is None, f"exited {proc.returncode}: {err.read_text()}"
        assert time.monotonic() < end, f"the hung start never began: {err.read_text()}"
        time.sleep(0.01)


def wait_exit(proc: subprocess.Popen[str], err: Path) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"still running {TIMEOUT}s after one signal: {err.read_text()}"
                             ) from None
    return code, " ".join(err.read_text().split())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    return False


HUNG = {"mcp": "payments", "wait": "pool"}


@pytest.mark.parametrize(("kind", "signum", "mode"), [
    ("mcp", signal.SIGTERM, []), ("mcp", signal.SIGINT, ["--until-idle"]),
    ("wait", signal.SIGTERM, ["--until-idle"]), ("wait", signal.SIGINT, [])],
    ids=["mcp-sigterm", "mcp-ctrl_c-until_idle", "wait-sigterm-until_idle", "wait-ctrl_c"])
def test_r17_e5_one_signal_stops_a_worker_whose_lifespan_start_hangs(
        tmp_path: Path, processes: list[subprocess.Popen[str]], kind: str,
        signum: signal.Signals, mode: list[str]) -> None:
    """R17, E5: one SIGTERM (or Ctrl-C) while a lifespan's start hangs: the start is
    cancelled (its own cleanup runs; a silent MCP server's process is stopped), the lifespan
    started before it is left after it, the one after it is never started, no task is
    claimed, and the worker exits 1 with one line naming the lifespan and the signal."""
    site = Site(tmp_path, kind)
    name = signal.Signals(signum).name
    hung = HUNG[kind]
    site.run("submit", "once", "--id", "t1")
    worker, err = start(site, processes, "worker", *mode)
    wait_for_start_in_flight(site, worker, err)
    os.kill(worker.pid, signum)  # the one signal, to this child only
    code, said = wait_exit(worker, err)
    assert code == 1, said
    assert (f"{name}: stopping: the app's lifespans have not finished starting, so the start"
            " in flight is cancelled") in said
    assert (f"error: lifespan 'test_lifespan_hung_start.harness.{hung}' did not finish"
            f" starting before {name}: its start was cancelled and the lifespans started"
            " before it were left; the workers did not start and no task was claimed") in said
    assert "again: exiting now" not in said and "serving (concurrency" not in said
    assert site.journal() == ["enter first", f"left {hung}", "exit first"]
    if kind == "mcp":
        assert gone(int((site.dir / "starting").read_text()))  # the silent server was stopped
    info = site.info("t1")
    assert info.record.status is tt.Status.PENDING and info.record.lease_owner is None
    assert json.loads(site.run("history", "t1", "--json")) == []


def test_r17_e5_one_sigterm_stops_serve_with_worker_whose_lifespan_start_hangs(
        tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    """R17, E5: the same under ``tether serve --with-worker``: it never listens, the silent
    MCP server is stopped, and it exits 1 naming the lifespan."""
    site = Site(tmp_path, "mcp")
    server, err = start(site, processes, "serve", "--with-worker", "--port", "0",
                        "--tokens", f"{TOKEN}:operator")
    wait_for_start_in_flight(site, server, err)
    os.kill(server.pid, signal.SIGTERM)
    code, said = wait_exit(server, err)
    assert code == 1, said
    assert ("error: lifespan 'test_lifespan_hung_start.harness.payments' did not finish"
            " starting before SIGTERM") in said
    assert "again: exiting now" not in said
    assert site.journal() == ["enter first", "left payments", "exit first"]
    assert gone(int((site.dir / "starting").read_text()))
