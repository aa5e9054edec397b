"""R10, R21, R26, E4 (issue 26): levers at the seams never pay twice, with real processes.

Every scenario runs real ``tether worker --app _seams_app:harness`` processes, SIGKILLed at
named failpoints (``TETHER_FAILPOINTS``) or held inside a call by a gate file the test
controls, and pulls levers from real ``tether`` command lines (with the app, with another
app, with none) and a real ``tether serve``. The judge is the ledger outside tether
(``_seams_app``: one fsynced line per payment, naming its idempotency key):

1. a process without the task's code (no ``--app``; or the built-in examples, whose
   ``refund`` has a reconcile hook) never judges the task: a plain resume of a call in doubt
   is refused, a decision is stored for a worker that has the code and says so, no file of
   the examples appears, one refund;
2. a decision about a call running under a live lease is refused naming the worker, so a
   later crash is not followed by a stale decision: the next worker asks a person, one refund;
3. a failed task whose call is in doubt (``recovery_timeout`` ran out) refuses a plain resume
   and takes a decision, one refund;
8. a fork of a task whose call is in flight (or in doubt) is refused naming the call; a fork
   at a resume point whose call the source completed answers from a record of its own (also
   once the source is deleted), nothing run again;

and what the issue saw besides: a resume of a running task whose call is in flight is handed
to its worker, not answered "outcome unknown"; a resume from a process without the code of a
task parked on an idempotent call is not refused as in doubt.

No test waits on luck: each waits for a file, an exit, or the store's state, with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import _seams_app as seams
import httpx
import pytest
from _child import ChildProcess

import tether as tt

HERE = Path(__file__).resolve().parent
APP = "_seams_app:harness"
EXAMPLES = "tether.examples:demo_app"
TIMEOUT = 30.0
KILLED = -signal.SIGKILL
TOKEN = "seams-operator-token-0123456789"
LIVE = {"SEAMS_LEASE": "10.0"}
"""A worker held inside a call renews a lease of 10 s about every 3.3 s: the lease stays live
while the test pulls its levers unless the machine stalls that worker for over 6.5 s."""
T = TypeVar("T")

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------------- the site


@dataclass
class Site:
    """One store and its ledger (``dir``), an empty folder the lever commands run in
    (``cwd``: nothing may appear there), and the processes started on them."""

    dir: Path
    cwd: Path
    started: list[ChildProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"sqlite:///{self.dir / 'tether.db'}"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a child: no TETHER_* of the test's own (no TETHER_APP: a lever
        command without --app has no app), this folder's app importable, and the same
        tether the test runs (PYTHONPATH kept, so a run against another checkout holds)."""
        env = {k: v for k, v in os.environ.items()  # TETHER_DEMO_LEDGER too: the examples'
               if not k.startswith(("TETHER_", "SEAMS_"))}  # ledger.db would be made in cwd
        path = os.environ.get("PYTHONPATH")
        env.update(SEAMS_DIR=str(self.dir), PYTHONUNBUFFERED="1", COLUMNS="300",
                   PYTHONPATH=str(HERE) + (os.pathsep + path if path else ""))
        env.update(extra or {})
        return env

    def worker(self, *args: str, failpoints: str | None = None,
               env: dict[str, str] | None = None) -> ChildProcess:
        """``tether worker`` with this app, as an operator starts one."""
        extra = dict(env or {})
        if failpoints:
            extra["TETHER_FAILPOINTS"] = failpoints
        child = ChildProcess([sys.executable, "-m", "tether", "--store", self.url, "--app", APP,
                              "worker", *args], self.env(extra), self.dir,
                             f"worker{len(self.started) + 1}", TIMEOUT)
        self.started.append(child)
        return child

    def cli(self, *args: str, app: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """A ``tether`` command run in the empty folder, with *app* (or none at all)."""
        argv = [sys.executable, "-m", "tether", "--store", self.url,
                *(["--app", app] if app else []), *args]
        return subprocess.run(argv, env=self.env(env), cwd=self.cwd, capture_output=True,
                              text=True, timeout=TIMEOUT)

    def serve(self) -> tuple[ChildProcess, str]:
        """``tether serve`` without --app (API only), in the empty folder; its base URL."""
        child = ChildProcess([sys.executable, "-m", "tether", "--store", self.url, "serve",
                              "--port", "0", "--tokens", f"{TOKEN}:operator"], self.env(),
                             self.cwd, "server", TIMEOUT)
        self.started.append(child)
        line = child.expect("tether serve listening on ")
        return child, line.split(" listening on ")[1].split()[0]

    def created_in_cwd(self) -> list[str]:
        """What appeared in the lever commands' folder (their own stderr files aside)."""
        return sorted(p.name for p in self.cwd.iterdir() if not p.name.endswith(".stderr"))

    def run(self, fn: Callable[[tt.Harness], Awaitable[T]]) -> T:
        """*fn* with a harness of the test's own, with the app's code, on this store."""
        async def go() -> T:
            h = seams.harness(self.url)
            try:
                return await fn(h)
            finally:
                await h.close()

        return asyncio.run(go())

    def run_codeless(self, fn: Callable[[tt.Harness], Awaitable[T]]) -> T:
        """*fn* with a harness that has no code of any app (a lever process without --app)."""
        async def go() -> T:
            h = tt.Harness(self.url)
            try:
                return await fn(h)
            finally:
                await h.close()

        return asyncio.run(go())

    def submit(self, task_id: str, *steps: str) -> None:
        self.run(lambda h: h.submit("refund", {"steps": list(steps)}, task_id=task_id))

    def info(self, task_id: str) -> tt.TaskInfo:
        return self.run(lambda h: h.get(task_id))

    def log(self, task_id: str) -> list[dict[str, Any]]:
        return self.run(lambda h: h.store.list_recovery_log(task_id))

    def strategies(self, task_id: str) -> list[str]:
        return [r["resume_strategy"] for r in self.log(task_id)]

    def wait_for(self, task_id: str, *statuses: tt.Status) -> tt.TaskInfo:
        end = time.monotonic() + TIMEOUT
        while True:
            info = self.info(task_id)
            if info.record.status in statuses:
                return info
            assert time.monotonic() < end, f"{task_id} stayed {info.record.status.value}"
            time.sleep(0.05)

    def wait_lease_gone(self, task_id: str) -> None:
        """Until no live lease holds the task (its worker died and the lease ran out)."""
        end = time.monotonic() + TIMEOUT
        while True:
            record = self.info(task_id).record
            if record.lease_until is None or record.lease_until < time.time():
                return
            assert time.monotonic() < end, f"{task_id}'s lease never ran out"
            time.sleep(0.05)

    def gate(self, order: str) -> Path:
        """Hold every call for *order* before it pays, until the returned file is removed."""
        gate = self.dir / "gates" / order
        gate.parent.mkdir(exist_ok=True)
        gate.write_text("")
        return gate

    def wait_at_gate(self, order: str) -> None:
        marker = self.dir / "gates" / f"{order}.at"
        end = time.monotonic() + TIMEOUT
        while not marker.exists():
            for child in self.started:
                assert child.proc.poll() is None, f"{child.label} exited: {child.stderr()}"
            assert time.monotonic() < end, f"no call for {order} reached its gate"
            time.sleep(0.01)

    def fail_once(self, order: str) -> None:
        flag = self.dir / "fail" / order
        flag.parent.mkdir(exist_ok=True)
        flag.write_text("")

    def payments(self) -> list[dict[str, Any]]:
        return seams.payments(self.dir)

    def kill_all(self) -> None:
        for child in self.started:
            if child.proc.poll() is None:
                child.kill()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    (tmp_path / "site").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.setenv("SEAMS_DIR", str(tmp_path / "site"))
    s = Site(tmp_path / "site", tmp_path / "cwd")
    yield s
    s.kill_all()  # only the processes this test started, each by its own pid


def said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stdout + done.stderr).split())


def killed(child: ChildProcess) -> None:
    code = child.wait()
    assert code == KILLED, f"{child.label}: exit {code}, the failpoint never fired:\n{child.stderr()}"


def exits_clean(child: ChildProcess) -> None:
    code = child.wait()
    assert code == 0, f"{child.label}: exit {code}:\n{child.stderr()}"


def one_refund(site: Site, order: str) -> None:
    paid = site.payments()
    assert [p["order"] for p in paid] == [order], paid
    assert seams.keys_paid_twice(site.dir) == []


def parked_in_doubt(site: Site, task_id: str, *, park: bool = True) -> tt.TaskInfo:
    """The task's refund paid, then its worker SIGKILLed before the result was committed;
    with *park*, the next worker parks it for a person (else its lease is left to run out)."""
    site.submit(task_id, "refund")
    killed(site.worker(failpoints="after_tool_before_commit"))
    one_refund(site, f"{task_id}.0")
    if not park:
        site.wait_lease_gone(task_id)
        info = site.info(task_id)
        assert info.record.status is tt.Status.RUNNING
        assert info.snapshot.call is not None and info.snapshot.call.status == "started"
        return info
    exits_clean(site.worker("--until-idle"))
    info = site.info(task_id)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert "outcome unknown" in (info.record.reason or "")
    return info


def finished_with_one_refund(site: Site, task_id: str) -> tt.TaskInfo:
    exits_clean(site.worker("--until-idle"))
    info = site.info(task_id)
    assert info.record.status is tt.Status.COMPLETED, (info.record.reason, site.strategies(task_id))
    one_refund(site, f"{task_id}.0")
    return info


# ---------------------------------------------------------------------- 1: no code, no judging


@pytest.mark.parametrize("lever_app", [None, EXAMPLES], ids=["no_app", "examples_app"])
def test_r10_r26_a_lever_process_without_the_tasks_code_refuses_resume_and_queues_decide(
        site: Site, lever_app: str | None) -> None:
    """R10/R26 (defect 1): the refund paid, its worker died, the next worker parked it. From a
    command line with no app (or with the built-in examples, whose ``refund`` of the same
    name and arguments has a reconcile hook): ``tether resume`` is refused naming the three
    answers; ``tether decide happened`` is queued and says this process lacks the task's code;
    no file (the examples' ledger.db) appears; the task is untouched until a worker with the
    app applies the decision; one refund."""
    parked = parked_in_doubt(site, "t1")
    refused = site.cli("resume", "t1", app=lever_app)
    assert refused.returncode == 1, said(refused)
    for answer in ("happened", "not_happened", "skip"):
        assert answer in said(refused), said(refused)
    decided = site.cli("decide", "t1", "happened", "--result", '{"paid": "by statement"}',
                       app=lever_app)
    assert decided.returncode == 0, said(decided)
    assert "decide happened queued" in said(decided), said(decided)
    assert "does not have the task's code" in said(decided), said(decided)
    if lever_app == EXAMPLES:  # the examples' refund is another tool under the same name
        assert "with a reconcile hook" in said(decided) and "declared" in said(decided)
    assert site.created_in_cwd() == []  # no ledger.db, no tether.db: no examples ran here
    still = site.info("t1")
    assert still.record.status is tt.Status.NEEDS_HUMAN and still.version == parked.version
    done = finished_with_one_refund(site, "t1")
    assert done.snapshot.result == {"steps": 1, "last": {"paid": "by statement"}}
    assert site.strategies("t1").count("human_decision") == 1
    assert site.created_in_cwd() == []


@pytest.mark.parametrize("lever_app", [None, EXAMPLES], ids=["no_app", "examples_app"])
def test_r10_r26_a_decide_on_a_task_whose_worker_died_is_stored_untouched_for_a_worker_with_the_code(
        site: Site, lever_app: str | None) -> None:
    """R10/R26 (defect 1): the worker died inside the refund (it paid) and its lease ran out;
    no worker recovered the task yet. ``tether decide happened`` from a process without the
    app (or with the examples') neither recovers the task itself (no reconcile hook of
    another app is asked, the call is not turned back to planned) nor says "not applied": it
    is queued, the task stays as the dead worker left it, and the app's worker applies it."""
    before = parked_in_doubt(site, "t1", park=False)
    decided = site.cli("decide", "t1", "happened", "--result", '{"paid": "by statement"}',
                       app=lever_app)
    assert decided.returncode == 0, said(decided)
    assert "decide happened queued" in said(decided), said(decided)
    assert "does not have the task's code" in said(decided), said(decided)
    assert "not applied" not in said(decided)
    assert site.created_in_cwd() == []
    after = site.info("t1")
    assert after.version == before.version and after.record.status is tt.Status.RUNNING
    assert after.snapshot.call is not None and after.snapshot.call.status == "started"
    assert "reconcile_not_done" not in site.strategies("t1")
    finished_with_one_refund(site, "t1")
    assert site.strategies("t1").count("human_decision") == 1


def test_r10_r26_the_api_of_a_server_without_an_app_refuses_resume_and_queues_decide(
        site: Site) -> None:
    """R10/R26 (defect 1): ``tether serve`` started without --app has no app's code (never
    the examples). POST /api/tasks/{id}/resume on the parked refund is 409 naming the answers;
    POST .../decide is 202, queued, and names the code the server lacks; nothing appears in
    the server's folder; the app's worker applies the decision; one refund."""
    parked_in_doubt(site, "t1")
    server, base = site.serve()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=TIMEOUT) as client:
        resumed = client.post("/api/tasks/t1/resume", json={})
        assert resumed.status_code == 409, resumed.text
        assert all(answer in resumed.text for answer in ("happened", "not_happened", "skip"))
        decided = client.post("/api/tasks/t1/decide",
                              json={"outcome": "happened", "result": {"paid": "by statement"}})
        assert decided.status_code == 202, decided.text
        body = decided.json()
        assert body["queued"] is True and body["status"] == "needs_human", body
        assert any("agent 'refund'" in lack for lack in body["lacks_code"]), body
    server.signal(signal.SIGTERM)
    exits_clean(server)
    assert site.created_in_cwd() == []
    assert site.info("t1").record.status is tt.Status.NEEDS_HUMAN
    finished_with_one_refund(site, "t1")


# ---------------------------------------------------------------------- 2: live calls


def test_r10_r26_a_decision_about_a_call_in_flight_is_refused_so_a_later_crash_asks_a_person(
        site: Site) -> None:
    """R10/R26 (defect 2): while a live worker is inside the refund, ``decide not_happened``
    raises CallInFlight naming that worker, and nothing is stored. The worker then pays and
    is SIGKILLed before committing; the next worker finds the call in doubt and parks it for
    a person: no decision made about the live call is applied after the crash; one refund."""
    site.submit("t1", "refund")
    gate = site.gate("t1.0")
    worker = site.worker(failpoints="after_tool_before_commit", env=LIVE)
    site.wait_at_gate("t1.0")
    holder = site.info("t1").record.lease_owner
    assert holder is not None

    async def decide(h: tt.Harness) -> None:
        with pytest.raises(tt.IllegalTransition, match="running now") as refused:
            await h.decide("t1", "not_happened")
        assert isinstance(refused.value, tt.CallInFlight) and holder in str(refused.value)
        assert not [e for e in await h.reads.events("t1") if e.event.type == "decide"]

    site.run(decide)
    refused = site.cli("decide", "t1", "not_happened")  # from a command line too
    assert refused.returncode == 1 and "running now" in said(refused), said(refused)
    gate.unlink()
    killed(worker)
    one_refund(site, "t1.0")
    exits_clean(site.worker("--until-idle", env=LIVE))  # once the dead worker's lease ran out
    info = site.info("t1")
    assert info.record.status is tt.Status.NEEDS_HUMAN and "outcome unknown" in (info.record.reason or "")
    assert "human_decision" not in site.strategies("t1")
    one_refund(site, "t1.0")


def test_r10_r26_a_decision_about_a_call_seen_running_is_refused_once_its_worker_died(
        site: Site) -> None:
    """R10/R26 (defect 2, the hasty person): a person is shown the refund running under a
    live lease and answers only after its worker paid, was SIGKILLed and its lease ran out.
    The version is the same and no lease holds the task, so only what they were shown can
    tell: with the view's etag (harness, CLI) the decision is refused as stale and nothing
    is stored; looked at again, the in-doubt call takes the decision; one refund."""
    site.submit("t1", "refund")
    gate = site.gate("t1.0")
    worker = site.worker(failpoints="after_tool_before_commit", env=LIVE)
    site.wait_at_gate("t1.0")
    shown = site.info("t1")
    assert shown.record.runner() is not None
    gate.unlink()
    killed(worker)
    site.wait_lease_gone("t1")
    assert site.info("t1").version == shown.version

    async def decide(h: tt.Harness) -> None:
        with pytest.raises(tt.StaleDecision, match="no longer as it was shown"):
            await h.decide("t1", "not_happened", etag=shown.etag)
        assert not [e for e in await h.reads.events("t1") if e.event.type == "decide"]

    site.run(decide)
    refused = site.cli("decide", "t1", "not_happened", "--etag", shown.etag)
    assert refused.returncode == 1 and "no longer as it was shown" in said(refused), said(refused)
    looked_again = site.info("t1")

    async def decide_again(h: tt.Harness) -> None:
        receipt = await h.decide("t1", "happened", {"refunded": "t1.0"}, etag=looked_again.etag)
        assert receipt.accepted

    site.run(decide_again)
    exits_clean(site.worker("--until-idle", env=LIVE))
    assert site.info("t1").record.status is tt.Status.COMPLETED
    one_refund(site, "t1.0")


@pytest.mark.parametrize("with_code", [True, False], ids=["with_code", "without_code"])
def test_r10_r21_a_resume_of_a_running_task_whose_call_is_in_flight_goes_to_its_worker(
        site: Site, with_code: bool) -> None:
    """R10/R21 (issue 26, also seen): a resume of a running task whose refund is running under
    a live lease is not answered "outcome unknown" (from a process with the code or without):
    the call is not in doubt, the resume is stored for the worker holding the task, which
    finishes the call once; one refund."""
    site.submit("t1", "refund")
    gate = site.gate("t1.0")
    worker = site.worker("--until-idle", env=LIVE)
    site.wait_at_gate("t1.0")

    async def resume(h: tt.Harness) -> int:
        receipt = await h.resume("t1", by="operator")
        assert receipt.accepted and receipt.event_id is not None
        return receipt.event_id

    event_id = (site.run if with_code else site.run_codeless)(resume)
    gate.unlink()
    exits_clean(worker)
    assert site.info("t1").record.status is tt.Status.COMPLETED
    one_refund(site, "t1.0")
    events = site.run(lambda h: h.reads.events("t1"))
    assert [e.status for e in events if e.event.id == event_id] == ["applied"]
    assert site.strategies("t1") == ["resume_ignored"]  # "already running": nothing to resume


# ---------------------------------------------------------------------- 3: failed, in doubt


def test_r10_r26_a_failed_task_whose_call_is_in_doubt_refuses_resume_and_takes_a_decision(
        site: Site) -> None:
    """R10/R26 (defect 3): the refund failed once (nothing paid; recovery retries it), then
    paid and its worker was SIGKILLed before committing. The next worker finds recovery has
    taken longer than recovery_timeout: the task is failed with the call in doubt. A plain
    resume (command line, and the harness) is refused naming the answers; ``decide
    happened`` is accepted and applied; the task completes; one refund."""
    env = {"SEAMS_RECOVERY_TIMEOUT": "0.3"}
    site.submit("t1", "refund")
    site.fail_once("t1.0")
    killed(site.worker(failpoints="after_tool_before_commit", env=env))
    one_refund(site, "t1.0")
    time.sleep(0.5)  # longer than recovery_timeout: the dead worker's task is taken over
    exits_clean(site.worker("--until-idle", env=env))  # at once, so the wait is made here
    failed = site.info("t1")
    assert failed.record.status is tt.Status.FAILED, failed.record.reason
    assert "recovery_timeout" in (failed.snapshot.error or "")
    assert failed.snapshot.call is not None and failed.snapshot.call.status == "started"
    refused = site.cli("resume", "t1", app=APP, env=env)
    assert refused.returncode == 1, said(refused)
    assert all(answer in said(refused) for answer in ("happened", "not_happened", "skip"))

    async def resume(h: tt.Harness) -> None:
        with pytest.raises(tt.InDoubtCall, match="unknown"):
            await h.resume("t1")

    site.run(resume)
    assert site.info("t1").record.status is tt.Status.FAILED
    decided = site.cli("decide", "t1", "happened", "--result", '{"paid": "by statement"}',
                       app=APP, env=env)
    assert decided.returncode == 0 and "decide happened applied" in said(decided), said(decided)
    finished_with_one_refund(site, "t1")
    assert site.strategies("t1").count("human_decision") == 1


# ---------------------------------------------------------------------- 8: forks


def test_e4_r10_a_fork_of_a_task_whose_call_is_in_flight_is_refused_naming_the_call(
        site: Site) -> None:
    """E4/R10 (defect 8): while the source's refund runs under a live lease, a fork (of its
    newest version, or of the resume point's) is refused naming the running call and its
    worker; no fork task exists; the source finishes; one refund."""
    site.submit("t1", "refund")
    gate = site.gate("t1.0")
    worker = site.worker("--until-idle", env=LIVE)
    site.wait_at_gate("t1.0")
    info = site.info("t1")
    assert info.snapshot.call is not None

    async def fork(h: tt.Harness) -> None:
        for version in (None, info.version):
            with pytest.raises(tt.IllegalTransition, match="running now") as refused:
                await h.fork("t1", version, new_task_id="f1")
            message = str(refused.value)
            assert "refund" in message and info.snapshot.call.key in message  # type: ignore[union-attr]
            assert str(info.record.lease_owner) in message
        with pytest.raises(tt.TaskNotFound):
            await h.get("f1")

    site.run(fork)
    gate.unlink()
    exits_clean(worker)
    assert site.info("t1").record.status is tt.Status.COMPLETED
    one_refund(site, "t1.0")


def test_e4_r10_a_fork_of_a_task_whose_call_is_in_doubt_is_refused_until_a_person_decides(
        site: Site) -> None:
    """E4/R10 (defect 8): the source's refund paid, its worker died, the call is parked in
    doubt. A fork cannot know whether it happened either, so it is refused, pointing at
    ``tether decide`` on the source (a fork in doubt too would be a second chance to pay).
    Once a person said it happened, a fork of that same version answers from the record it
    copied: both finish, one refund."""
    parked = parked_in_doubt(site, "t1")

    async def fork(h: tt.Harness) -> None:
        with pytest.raises(tt.IllegalTransition, match="is in doubt in task t1") as refused:
            await h.fork("t1", parked.version, new_task_id="f1")
        assert "tether decide t1" in str(refused.value)
        with pytest.raises(tt.TaskNotFound):
            await h.get("f1")

    site.run(fork)
    decided = site.cli("decide", "t1", "happened", "--result", '{"paid": "by statement"}',
                       app=APP)
    assert decided.returncode == 0, said(decided)
    site.run(lambda h: h.fork("t1", parked.version, new_task_id="f1"))
    exits_clean(site.worker("--until-idle"))
    for task_id in ("t1", "f1"):
        info = site.info(task_id)
        assert info.record.status is tt.Status.COMPLETED, (task_id, info.record.reason)
        assert info.snapshot.result["last"] == {"paid": "by statement"}
    assert "needs_human" not in site.strategies("f1")
    one_refund(site, "t1.0")


@pytest.mark.parametrize("delete_source", [False, True], ids=["source_kept", "source_deleted"])
def test_e4_r10_a_fork_at_a_resume_point_the_source_completed_answers_from_its_own_record(
        site: Site, delete_source: bool) -> None:
    """E4/R10 (defect 8): the source paid its refund and completed. A fork of the version at
    the refund's resume point (the call started there) is not in doubt: a resume of it is
    not refused as "outcome unknown" (source kept), and with the source deleted before any
    worker ran the fork, nothing the fork needs is gone. No person is asked; a worker
    finishes the fork from a record it owns, under a key of its own; the refund is not made
    again."""
    site.submit("t1", "refund")
    exits_clean(site.worker("--until-idle"))
    one_refund(site, "t1.0")

    async def fork(h: tt.Harness) -> str:
        for version, _, _ in await h.store.list_versions("t1"):
            _, data = await h.store.load_head("t1", version)
            snap = tt.Snapshot.loads(data, "t1", version)
            if snap.call is not None and snap.call.status == "started":
                break
        else:
            raise AssertionError("no kept version of t1 is at the refund's resume point")
        source_key = snap.call.key
        await h.fork("t1", version, new_task_id="f1")
        if delete_source:
            await h.delete("t1")
        else:
            await h.resume("f1", by="operator")  # not refused: the call is not in doubt
        return source_key

    source_key = site.run(fork)
    exits_clean(site.worker("--until-idle"))
    info = site.info("f1")
    assert info.record.status is tt.Status.COMPLETED, (info.record.reason, site.strategies("f1"))
    assert info.snapshot.result["last"]["paid"] is True
    strategies = site.strategies("f1")
    assert "reuse_result" in strategies and "needs_human" not in strategies, strategies
    records = site.run(lambda h: h.store.list_idempotency("f1"))
    assert [(r.tool, r.status) for r in records] == [("refund", "succeeded")]
    assert records[0].key != source_key
    one_refund(site, "t1.0")


# ---------------------------------------------------------------------- idempotent, parked


def test_r10_r26_a_resume_without_the_code_of_a_task_parked_on_an_idempotent_call_is_not_refused(
        site: Site) -> None:
    """R10/R26 (issue 26, also seen): workers die twice inside an idempotent lookup, so the
    recovery budget (max_recovery_attempts=1) parks the task with the call started. From a
    command line without the app, ``tether resume`` is not refused as in doubt (the call
    recorded that its tool is idempotent): it is queued for a worker with the code, which
    runs the lookup again and completes the task."""
    env = {"SEAMS_MAX_RECOVERY": "1"}
    site.submit("t1", "lookup")
    killed(site.worker(failpoints="after_resume_point", env=env))
    killed(site.worker(failpoints="after_resume_point", env=env))
    exits_clean(site.worker("--until-idle", env=env))
    parked = site.info("t1")
    assert parked.record.status is tt.Status.NEEDS_HUMAN, parked.record.reason
    assert parked.snapshot.call is not None and parked.snapshot.call.status == "started"
    resumed = site.cli("resume", "t1")
    assert resumed.returncode == 0, said(resumed)
    assert "resume queued" in said(resumed) and "does not have the task's code" in said(resumed)
    assert site.created_in_cwd() == []
    exits_clean(site.worker("--until-idle", env=env))
    done = site.info("t1")
    assert done.record.status is tt.Status.COMPLETED, (done.record.reason, site.strategies("t1"))
    assert done.snapshot.result["last"] == {"order": "t1.0", "balance": 1000}
    assert site.payments() == []


def test_r14_r26_an_etag_resume_sent_twice_without_the_code_is_applied_once(site: Site) -> None:
    """R14/R26: a person's resume names the view it was made on (``--etag``). Sent twice
    from a command line without the app (a double submit), both are queued; the app's worker
    applies one, the task goes on and pays its refund once. The same view sent again once
    the task moved on is refused at once, and nothing is queued."""
    env = {"SEAMS_MAX_RECOVERY": "1"}
    site.submit("t1", "lookup", "refund")
    killed(site.worker(failpoints="after_resume_point", env=env))
    killed(site.worker(failpoints="after_resume_point", env=env))
    exits_clean(site.worker("--until-idle", env=env))
    parked = site.info("t1")
    assert parked.record.status is tt.Status.NEEDS_HUMAN, parked.record.reason
    for _ in range(2):
        sent = site.cli("resume", "t1", "--etag", parked.etag)
        assert sent.returncode == 0 and "resume queued" in said(sent), said(sent)
    exits_clean(site.worker("--until-idle", env=env))
    done = site.info("t1")
    assert done.record.status is tt.Status.COMPLETED, (done.record.reason, site.strategies("t1"))
    one_refund(site, "t1.1")
    late = site.cli("resume", "t1", "--etag", parked.etag)
    assert late.returncode != 0 and "no longer as it was shown" in said(late), said(late)
    resumes = [e for e in site.run(lambda h: h.store.list_events("t1")) if e.event.type == "resume"]
    assert len(resumes) == 2, resumes
    assert site.created_in_cwd() == []


# ---------------------------------------------------------------------- rollback past a paid attempt


def test_e4_r10_a_rollback_to_a_version_waiting_to_retry_a_call_does_not_pay_it_again(
        site: Site) -> None:
    """E4/R10 (CI, levers under fire on PostgreSQL + Redis: a charge paid twice): the refund
    failed once (nothing paid) and a version was kept with it waiting to run again; the next
    attempt paid and its worker was SIGKILLed before committing. A rollback to the waiting
    version is then applied by the next worker. Idempotency records are not versioned: the
    store says an attempt started after that version, so the call may have run, and it is
    settled as a call in doubt (no reconcile hook: a person is asked), never run again as
    the version had it. One refund."""
    site.submit("t1", "refund")
    site.fail_once("t1.0")
    killed(site.worker(failpoints="after_tool_before_commit"))
    one_refund(site, "t1.0")

    async def roll_back(h: tt.Harness) -> int:
        for version, _, _ in await h.store.list_versions("t1"):
            _, data = await h.store.load_head("t1", version)
            call = tt.Snapshot.loads(data, "t1", version).call
            if call is not None and call.status == "failed" and call.retry_at is not None:
                await h.rollback("t1", version, by="operator")
                return version
        raise AssertionError("no kept version of t1 waits to run the refund again")

    waiting = site.run(roll_back)
    site.wait_lease_gone("t1")
    exits_clean(site.worker("--until-idle"))
    info = site.info("t1")
    assert info.record.status is tt.Status.NEEDS_HUMAN, (info.record.reason,
                                                         site.strategies("t1"))
    assert "outcome unknown" in (info.record.reason or "")
    details = [r.get("detail", "") for r in site.log("t1") if r["resume_strategy"] == "rollback"]
    assert any(f"after version {waiting}" in d and "in doubt" in d for d in details), details
    one_refund(site, "t1.0")
