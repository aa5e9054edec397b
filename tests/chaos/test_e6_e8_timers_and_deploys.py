"""E6 and E8 with real ``tether worker`` processes.

E6: a wait's timeout that falls due while no worker runs at all fires once, when workers
come back; two workers started together do not fire it twice.

E8: a deploy between a crash and the resume. The worker running the old code is killed
with one task waiting for an approval and another inside a refund through a tool that the
new code no longer has. The new code's worker resumes the first from its snapshot (its
changed plan takes over from there) and hands the second to a person, naming the tool,
without stopping; the dialog and the bundle say which code version did what.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _child import ChildProcess
from _workers import Site, app

import tether as tt

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    s = Site.make(tmp_path)
    yield s
    s.kill_all()


def stop(worker: ChildProcess) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr()


def timer_events(site: Site, task_id: str) -> list[tt.StoredEvent]:
    events = site.read(lambda h: h.store.list_events(task_id))
    return [e for e in events if e.event.type == "timer"]


def test_e6_a_timeout_that_fell_due_with_no_worker_alive_fires_once_for_two_new_workers(
        site: Site) -> None:
    site.submit("approver", {"order": "a1", "amount": 5, "timeout": 2}, "t1")
    first = site.wait_ready(site.worker())
    waiting = site.wait_for("t1", tt.Status.WAITING)
    stop(first)
    due = waiting.snapshot.frame.wait["due_at"]  # type: ignore[index]
    time.sleep(max(0.0, due + 3 - time.time()))  # 5 s after the wait began, nobody running
    assert site.info("t1").record.status is tt.Status.WAITING
    assert timer_events(site, "t1") == []
    pair = [site.worker(), site.worker()]  # started together
    info = site.wait_for("t1", tt.Status.COMPLETED)
    for worker in pair:
        stop(site.wait_ready(worker))
    assert info.snapshot.result == {"timed_out": True, "code": "1"}
    assert [(e.status, e.event.payload["for"]) for e in timer_events(site, "t1")] \
        == [("applied", "approval")]
    history = site.read(lambda h: h.history("t1"))
    assert [r["type"] for r in history if r.get("role") == "event"] == ["timer"]
    assert app.refund_counts(site.ledger) == {}


def test_e8_new_code_resumes_from_snapshots_and_parks_a_task_whose_tool_was_removed(
        site: Site) -> None:
    site.submit("approver", {"order": "a1", "amount": 5}, "waits")
    site.submit("refunder", {"calls": [["refund_blind", "b1", 7]]}, "blind")
    old = site.app_child("serve", env={"TETHER_CHAOS_SLOW_TOOL": "refund_blind",
                                       "TETHER_CHAOS_SLOW": "60"})
    old.expect("IN_TOOL b1")
    site.wait_for("waits", tt.Status.WAITING)
    old.kill()
    site.read(lambda h: h.emit(tt.Event("approval", "waits", {"by": "ann"})))

    new = site.app_child("drain", env={"TETHER_CHAOS_CODE": "2"})
    new.expect("READY")
    assert new.wait() == 0, new.stderr()  # it kept serving and settled both tasks

    waits = site.info("waits")
    assert waits.record.status is tt.Status.COMPLETED, waits.record.reason
    assert waits.snapshot.result["code"] == "2"  # the changed plan took over
    assert waits.snapshot.result["refund"] == app.refund_result("a1", 5)
    blind = site.info("blind")
    assert blind.record.status is tt.Status.NEEDS_HUMAN
    assert "'refund_blind'" in (blind.record.reason or "") \
        and "no longer registered" in (blind.record.reason or "")
    assert app.refund_counts(site.ledger) == {"a1": 1, "b1": 1}  # never repeated

    waits_bundle = site.read(lambda h: h.export("waits"))
    blind_bundle = site.read(lambda h: h.export("blind"))
    assert waits_bundle["code_versions"] == {"agents": ["approver@2"],
                                             "tools": ["refund_keyed@1"]}
    assert blind_bundle["code_versions"] == {"agents": ["refunder@1"],
                                             "tools": ["refund_blind@1"]}
