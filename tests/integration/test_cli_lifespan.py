"""App lifespans (``@harness.lifespan``) under real ``tether worker`` and ``tether serve
--with-worker`` processes (R17: the harness starts and cleans up around the agents; E5: a
graceful stop drains first).

Every process is a real ``python -m tether --store sqlite:///... --app _lifespan_app:harness``
on a SQLite file; the app (``tests/integration/_lifespan_app.py``) writes what it does to a
journal, in the order the worker does it, so each test asserts on the order of acts, never
on how long anything took. Interleavings are made exact with files: a gate holds a call
inside its tool until the test has seen the worker start to drain.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pytest
from _lifespan_app import read_journal

import tether as tt

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent
APP = "_lifespan_app:harness"
TIMEOUT = 60.0
"""How long a process or a file may take before the test gives up (a hang guard, not a
measurement: nothing is asserted about how long anything took)."""
TOKEN = "lifespan-operator-token-0123456789"
ENTER = ["enter first", "enter second"]
EXIT = ["exit second", "exit first"]
NAMES = "_lifespan_app.harness.first, _lifespan_app.harness.second"


@dataclass
class Child:
    """A long-lived tether process, its stdout and stderr in files."""

    proc: subprocess.Popen[str]
    out: Path
    err: Path
    files: list[TextIO]

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def said(self) -> str:
        return " ".join((self.stdout() + self.stderr()).split())

    def wait_for_text(self, text: str, *, stdout: bool = False) -> None:
        end = time.monotonic() + TIMEOUT
        while text not in (self.stdout() if stdout else self.stderr()):
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.said()}"
            assert time.monotonic() < end, f"never said {text!r}: {self.said()}"
            time.sleep(0.02)

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {TIMEOUT}s: {self.said()}") from None
        for f in self.files:
            f.close()
        return code

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)  # this child only, by its own pid


@dataclass
class Site:
    """One store, the app's folder (journal, gates, MCP ledger) and the processes started."""

    dir: Path
    extra: dict[str, str] = field(default_factory=dict)
    started: list[Child] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"sqlite:///{self.dir / 'tether.db'}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "LIFESPAN_"))}
        path = os.environ.get("PYTHONPATH")
        env.update(LIFESPAN_DIR=str(self.dir), PYTHONUNBUFFERED="1", COLUMNS="300",
                   PYTHONPATH=str(HERE) + (os.pathsep + path if path else ""))
        env.update(self.extra)
        env.update(extra or {})
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tether", "--store", self.url, "--app", APP, *args]

    def tether(self, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.env(env), cwd=self.dir,
                              capture_output=True, text=True, timeout=TIMEOUT)

    def ok(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = self.tether(*args, env=env)
        assert done.returncode == 0, said(done)
        return done.stdout

    def start(self, *args: str, env: dict[str, str] | None = None) -> Child:
        n = len(self.started) + 1
        out, err = self.dir / f"child{n}.stdout", self.dir / f"child{n}.stderr"
        files = [open(out, "w"), open(err, "w")]  # noqa: SIM115 - closed in Child.wait
        proc = subprocess.Popen(self.argv(*args), env=self.env(env), cwd=self.dir,
                                stdout=files[0], stderr=files[1], text=True)
        child = Child(proc, out, err, files)
        self.started.append(child)
        return child

    def submit(self, agent: str, task_input: Any, task_id: str) -> None:
        assert self.ok("submit", agent, "--input", json.dumps(task_input),
                       "--id", task_id).strip() == task_id

    def journal(self) -> list[str]:
        return read_journal(self.dir)

    def gate(self, task_id: str) -> Path:
        gate = self.dir / "gates" / task_id
        gate.parent.mkdir(exist_ok=True)
        gate.write_text("")
        return gate

    def wait_at_gate(self, task_id: str, child: Child) -> None:
        marker = self.dir / "gates" / f"{task_id}.at"
        end = time.monotonic() + TIMEOUT
        while not marker.exists():
            assert child.proc.poll() is None, f"exited {child.proc.returncode}: {child.said()}"
            assert time.monotonic() < end, f"no call of {task_id} reached its gate"
            time.sleep(0.01)

    def info(self, task_id: str) -> tt.TaskInfo:
        async def go() -> tt.TaskInfo:
            async with tt.Harness(self.url) as h:
                return await h.get(task_id)

        return asyncio.run(go())

    def recovery_log(self, task_id: str) -> list[dict[str, Any]]:
        async def go() -> list[dict[str, Any]]:
            async with tt.Harness(self.url) as h:
                return await h.reads.recovery_log(task_id)

        return asyncio.run(go())

    def history(self, task_id: str) -> list[dict[str, Any]]:
        return list(json.loads(self.ok("history", task_id, "--json")))


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = Site(tmp_path)
    yield s
    for child in s.started:  # only the processes this test started, each by its own pid
        if child.proc.poll() is None:
            child.proc.kill()
            child.wait()


def said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


def calls(task_id: str, *steps: int) -> list[str]:
    return [line for i in steps for line in (f"call start {task_id} {i}", f"call end {task_id} {i}")]


# ---------------------------------------------------------------------- tether worker


def test_r17_a_worker_enters_the_lifespans_before_its_first_call_and_leaves_after_its_last(
        site: Site) -> None:
    """R17: ``tether worker --until-idle`` enters the app's lifespans, in the order they were
    registered, before it runs any call, and leaves them, in reverse, after the last; a
    command that only submits enters none."""
    site.submit("calls", {"calls": 2}, "t1")
    site.submit("calls", {"calls": 2}, "t2")
    assert site.journal() == []  # `tether submit` with the app: no lifespan entered
    done = site.tether("worker", "--until-idle", "--concurrency", "2")
    assert done.returncode == 0, said(done)
    journal = site.journal()
    assert journal[:2] == ENTER
    assert journal[-2:] == EXIT
    assert sorted(journal[2:-2]) == sorted(calls("t1", 0, 1) + calls("t2", 0, 1))
    out = said(done)
    assert f"entering the app's lifespans ({NAMES})" in out
    assert "left the app's lifespans" in out
    for task_id in ("t1", "t2"):
        assert site.info(task_id).record.status is tt.Status.COMPLETED


@pytest.mark.parametrize("mode", [["--until-idle"], []], ids=["until_idle", "long_lived"])
def test_r17_a_lifespan_that_raises_on_enter_stops_the_worker_before_it_claims_a_task(
        site: Site, mode: list[str]) -> None:
    """R17: a lifespan that raises on enter: the worker exits 1 with one line naming the
    lifespan and its error (its traceback logged above it), the lifespan entered before it is
    left, and no task is claimed: the task is still pending, unleased, with no history."""
    site.submit("calls", {"calls": 1}, "t1")
    done = site.tether("worker", *mode, env={"LIFESPAN_FAIL": "enter"})
    assert done.returncode == 1, said(done)
    assert ("error: lifespan '_lifespan_app.harness.second' raised on enter (RuntimeError: the"
            " database pool at db.internal refused the connection): the workers did not start"
            " and no task was claimed") in said(done)
    assert "Traceback" in done.stderr and "refused the connection" in done.stderr
    assert "serving (concurrency" not in said(done)
    assert site.journal() == ["enter first", "exit first"]
    info = site.info("t1")
    assert info.record.status is tt.Status.PENDING
    assert info.record.lease_owner is None
    assert site.history("t1") == []
    assert site.recovery_log("t1") == []


def test_r17_a_lifespan_that_raises_on_exit_is_logged_and_the_worker_exits_1(site: Site) -> None:
    """R17: a lifespan that raises on exit, after the work is done: its traceback is logged,
    the other lifespans are still left, and the worker exits 1 naming the lifespan."""
    site.submit("calls", {"calls": 1}, "t1")
    done = site.tether("worker", "--until-idle", env={"LIFESPAN_FAIL": "exit"})
    assert done.returncode == 1, said(done)
    assert ("error: lifespan '_lifespan_app.harness.second' raised on exit (RuntimeError: the"
            " database pool did not close in time), after the workers had stopped") in said(done)
    assert "Traceback" in done.stderr
    assert site.journal() == [*ENTER, *calls("t1", 0), *EXIT]
    assert site.info("t1").record.status is tt.Status.COMPLETED


def test_e5_r17_sigterm_drains_the_call_in_flight_then_leaves_the_lifespans(site: Site) -> None:
    """E5, R17: SIGTERM to a long-lived worker while a side-effecting call runs: the call
    finishes inside the lifespans (the worker was seen draining before the call was let go),
    the task is released, and only then are the lifespans left; exit 0. The next worker
    enters its own lifespans and finishes the task."""
    site.submit("calls", {"calls": 2}, "t1")
    gate = site.gate("t1")
    worker = site.start("worker")
    site.wait_at_gate("t1", worker)
    assert site.journal() == [*ENTER, "call start t1 0"]
    worker.signal(signal.SIGTERM)
    worker.wait_for_text("SIGTERM: draining")
    gate.unlink()
    assert worker.wait() == 0, worker.said()
    assert site.journal() == [*ENTER, *calls("t1", 0), *EXIT]
    assert "left the app's lifespans" in worker.said()
    info = site.info("t1")
    assert info.record.lease_owner is None
    assert [r["resume_strategy"] for r in site.recovery_log("t1")] == ["released"]
    done = site.tether("worker", "--until-idle")
    assert done.returncode == 0, said(done)
    assert site.journal() == [*ENTER, *calls("t1", 0), *EXIT, *ENTER, *calls("t1", 1), *EXIT]
    assert site.info("t1").record.status is tt.Status.COMPLETED


# ---------------------------------------------------------------------- tether serve --with-worker


def test_e5_r17_serve_with_worker_enters_the_lifespans_before_listening_and_leaves_after_the_drain(
        site: Site) -> None:
    """E5, R17: ``tether serve --with-worker`` enters the lifespans before it listens; on
    SIGTERM its worker drains the call in flight, then the lifespans are left; exit 0."""
    server = site.start("serve", "--with-worker", "--port", "0", "--tokens", f"{TOKEN}:operator")
    server.wait_for_text("tether serve listening on", stdout=True)
    assert site.journal() == ENTER
    gate = site.gate("t1")
    site.submit("calls", {"calls": 2}, "t1")
    site.wait_at_gate("t1", server)
    server.signal(signal.SIGTERM)
    server.wait_for_text("SIGTERM: stopping")
    gate.unlink()
    assert server.wait() == 0, server.said()
    assert site.journal() == [*ENTER, *calls("t1", 0), *EXIT]
    out = server.said()
    assert f"entering the app's lifespans ({NAMES})" in out
    assert "tether serve stopped: its worker released its tasks" in out
    assert out.index("tether serve stopped") < out.index("left the app's lifespans")
    assert site.info("t1").record.lease_owner is None


def test_r17_serve_with_worker_whose_lifespan_raises_on_enter_never_listens(site: Site) -> None:
    """R17: a lifespan that raises on enter stops ``tether serve --with-worker`` with exit 1
    naming it, before it listens or claims; the API alone (no --with-worker) enters none."""
    site.submit("calls", {"calls": 1}, "t1")
    done = site.tether("serve", "--with-worker", "--port", "0", "--tokens", f"{TOKEN}:operator",
                       env={"LIFESPAN_FAIL": "enter"})
    assert done.returncode == 1, said(done)
    assert "error: lifespan '_lifespan_app.harness.second' raised on enter" in said(done)
    assert "listening on" not in done.stdout
    assert site.journal() == ["enter first", "exit first"]
    assert site.info("t1").record.status is tt.Status.PENDING

    api = site.start("serve", "--port", "0", "--tokens", f"{TOKEN}:operator",
                     env={"LIFESPAN_FAIL": "enter"})
    api.wait_for_text("tether serve listening on", stdout=True)
    api.signal(signal.SIGTERM)
    assert api.wait() == 0, api.said()
    assert site.journal() == ["enter first", "exit first"]  # nothing more: no lifespan entered


# ---------------------------------------------------------------------- a real MCP server


def test_r10_r17_a_real_mcp_tool_runs_under_tether_worker_through_a_lifespan(site: Site) -> None:
    """R10, R17: MCPTools entered from an app lifespan under a real ``tether worker``: the
    stdio MCP server is started and its tools registered before the first call (its ledger
    has no refund then), the refund carries tether's idempotency key to the server, and the
    server is left after the last call (one refund in the ledger by then). ``tether submit``
    with the same app starts no server."""
    pytest.importorskip("mcp")
    site.extra["LIFESPAN_MCP"] = "1"
    site.submit("mcp_refund", {"order": "A1"}, "m1")
    assert site.journal() == []
    assert not (site.dir / "mcp.pid").exists()  # no MCP server was started by `submit`
    done = site.tether("worker", "--until-idle")
    assert done.returncode == 0, said(done)
    journal = site.journal()
    assert journal[:2] == ENTER
    entered = journal[2].split()
    assert entered[:3] == ["enter", "mcp", "refunds=0"]
    assert set(entered[3].removeprefix("tools=").split(",")) == {"pay_refund", "pay_read_balance"}
    assert journal[3:] == ["exit mcp refunds=1", *EXIT]
    info = site.info("m1")
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    refund = info.snapshot.result["refund"]
    assert refund["order"] == "A1" and refund["cents"] == 250 and not refund["duplicate"]
    keys = [row["tool_call"]["key"] for row in site.history("m1")
            if row.get("tool_call", {}).get("name") == "pay_refund"]
    assert keys == [refund["key"]]  # the server saw the call's own key, in _meta
    assert info.snapshot.result["balance"] == {"order": "A1", "refunded": 250, "refunds": 1}
    assert (site.dir / "mcp.pid").exists()  # the worker did start it


async def test_r17_mcp_tools_in_a_lifespan_are_entered_again_by_each_run(tmp_path: Path) -> None:
    """R17: an ``MCPTools`` entered from a lifespan is left after each run and entered again
    by the next (a new server process each time), with its tools registered only while it is
    open; entering it a second time while it is open is refused, naming it."""
    pytest.importorskip("mcp")
    from _lifespan_app import MCP_SERVER

    from tether.integrations.mcp import MCPTools

    h = tt.Harness("memory://")
    env = {"MCP_LEDGER": str(tmp_path / "ledger.db"), "MCP_PIDFILE": str(tmp_path / "mcp.pid")}
    payments = MCPTools.stdio(h, sys.executable, [str(MCP_SERVER)], env=env, prefix="pay_",
                              only=("read_balance",))
    pids: list[str] = []

    @h.lifespan
    async def mcp(h: tt.Harness) -> AsyncIterator[None]:
        async with payments:
            pids.append((tmp_path / "mcp.pid").read_text())
            yield

    for _ in range(2):
        async with h.lifespan_context():
            assert [tool.name for tool in payments.registered] == ["pay_read_balance"]
            assert "pay_read_balance" in h.tools
            with pytest.raises(tt.ConfigurationError, match="is entered already: enter it in one"
                                                            " place"):
                await payments.__aenter__()
        assert "pay_read_balance" not in h.tools
    assert len(pids) == 2 and pids[0] != pids[1]  # each entry started its own server
    await h.close()
