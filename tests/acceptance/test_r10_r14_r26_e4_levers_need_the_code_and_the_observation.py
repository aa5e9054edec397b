"""R10, R14, R26, E4 (issue 26): a lever needs the task's code, a decision its observation, and
a fork keys of its own, in process.

- **A decision is about one observation** (defect 2): a decision made about attempt 1 of a
  call in doubt, or about the dialog branch before a rollback, that reaches the store only
  after the call was attempted again (or the task rolled back) is dropped as stale, recorded
  as ``decide_failed`` "not applied", and never applied.
- **Copies have their own identity** (defect 5): a fork of a version whose call waits out a
  retry runs that call under a key of its own; source and fork each pay once, no key twice,
  and after the source is deleted a rollback of the fork to its first version pays nothing.
- **Only the code judges** (also seen): cancel, resume and rollback on a waiting task from a
  process without the task's agent leave the task waiting (no UnknownAgent, no needs_human,
  no notifier call); a worker with the code applies them.

The payments go to a ledger outside tether: a file the tool appends its idempotency key to
before it returns.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, strategies

import tether as tt

SETTINGS = fast_settings(lease_seconds=2.0, keep_versions=1000)


def paid(ledger: Path) -> list[str]:
    """The idempotency keys the provider paid under, in order."""
    return ledger.read_text().split() if ledger.exists() else []


def twice(ledger: Path) -> list[str]:
    return sorted(key for key, n in Counter(paid(ledger)).items() if n > 1)


def pay_to(ledger: Path, ctx: tt.ToolContext) -> None:
    with ledger.open("a") as out:
        out.write(ctx.idempotency_key + "\n")


def blind_refunds(url: str, ledger: Path) -> tt.Harness:
    """A refund that pays, then loses its answer (the provider took it; no reply came): in
    doubt with no reconcile hook, so only a person may settle it."""
    h = tt.Harness(url, settings=SETTINGS)

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=1))
    async def refund(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        pay_to(ledger, ctx)
        raise tt.OutcomeUnknown("the provider took the request; no answer came")

    @h.agent("refunder")
    class Refunder(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if not task.scratch.get("asked"):
                task.scratch["asked"] = True
                return tt.ToolCall("refund", {"order": "A1"})
            return tt.Finish(task.last_tool_result)

    return h


async def parked(h: tt.Harness, ledger: Path) -> tuple[str, tt.TaskInfo]:
    tid = await h.submit("refunder")
    await h.run_until_idle(timeout=10)
    info = await h.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN, info.record.reason
    assert info.snapshot.call is not None and info.snapshot.call.status == "started"
    assert info.snapshot.call.attempt == 1 and len(paid(ledger)) == 1
    return tid, info


def delayed_decisions(h: tt.Harness, monkeypatch: pytest.MonkeyPatch, meanwhile: Any) -> None:
    """Hold *h*'s decide events on their way to the store until *meanwhile* has run: the
    person looked at the task, and their answer lands after it moved on."""
    add_event = h.store.add_event

    async def late(event: tt.Event, *args: Any, **kwargs: Any) -> Any:
        if event.type == "decide":
            await meanwhile()
        return await add_event(event, *args, **kwargs)

    monkeypatch.setattr(h.store, "add_event", late)


async def stale_record(h: tt.Harness, tid: str) -> dict[str, Any]:
    failed = [r for r in await h.store.list_recovery_log(tid)
              if r["resume_strategy"] == "decide_failed"]
    assert len(failed) == 1, await strategies(h, tid)
    assert "not applied" in failed[0]["detail"]
    return failed[0]


async def decided_by(h: tt.Harness, tid: str) -> list[tuple[str, str]]:
    return [(row["content"]["by"], row["content"]["outcome"]) for row in await h.history(tid)
            if row.get("type") == "decide"]


async def test_r10_r26_a_decision_about_attempt_1_is_dropped_once_the_call_was_attempted_again(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R10/R26 (defect 2): bob decides ``not_happened`` about attempt 1 of the refund in doubt.
    Before his decision is stored, alice says ``not_happened`` too: the refund runs again
    (attempt 2, as she asked) and is in doubt again. Bob's decision is about an attempt that is
    gone: it is dropped as stale ("not applied", naming attempt 1), never applied: the refund
    is not paid a third time, and the task waits for a decision about attempt 2."""
    ledger = tmp_path / "ledger.txt"
    alice, bob = blind_refunds(db_url, ledger), blind_refunds(db_url, ledger)
    try:
        tid, _ = await parked(alice, ledger)

        async def alice_decides() -> None:
            await alice.decide(tid, "not_happened", by="alice")
            await alice.run_until_idle(timeout=10)
            again = await alice.get(tid)
            assert again.record.status is tt.Status.NEEDS_HUMAN
            assert again.snapshot.call is not None and again.snapshot.call.attempt == 2
            assert len(paid(ledger)) == 2

        delayed_decisions(bob, monkeypatch, alice_decides)
        await bob.decide(tid, "not_happened", by="bob")
        await alice.run_until_idle(timeout=10)
        assert len(paid(ledger)) == 2 and twice(ledger) == [paid(ledger)[0]]  # alice's rerun
        record = await stale_record(alice, tid)
        assert "attempt 1" in record["detail"] and "bob" in record["detail"]
        info = await alice.get(tid)
        assert info.record.status is tt.Status.NEEDS_HUMAN
        assert info.snapshot.call is not None and info.snapshot.call.attempt == 2
        assert await decided_by(alice, tid) == [("alice", "not_happened")]
        await alice.decide(tid, "happened", result={"refunded": "A1"}, by="carol")
        await alice.run_until_idle(timeout=10)
        assert (await alice.get(tid)).snapshot.result == {"refunded": "A1"}
        assert len(paid(ledger)) == 2
    finally:
        await alice.close()
        await bob.close()


async def test_r10_r14_r26_a_decision_made_before_a_rollback_is_dropped_once_it_lands_after(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R10/R14/R26 (defect 2): bob decides ``not_happened`` about the refund in doubt; before
    his decision is stored, alice rolls the task back to the version parked on that very call
    (same key, same attempt, in doubt again on a new dialog branch). Bob's decision is about
    the branch that was rolled away: dropped as stale, never applied; the refund is paid once."""
    ledger = tmp_path / "ledger.txt"
    alice, bob = blind_refunds(db_url, ledger), blind_refunds(db_url, ledger)
    try:
        tid, at = await parked(alice, ledger)

        async def alice_rolls_back() -> None:
            await alice.rollback(tid, at.version, by="alice")
            back = await alice.get(tid)
            assert back.record.status is tt.Status.NEEDS_HUMAN
            assert back.snapshot.call is not None and back.snapshot.call.key == at.snapshot.call.key  # type: ignore[union-attr]
            assert back.snapshot.history_segments != at.snapshot.history_segments

        delayed_decisions(bob, monkeypatch, alice_rolls_back)
        await bob.decide(tid, "not_happened", by="bob")
        await alice.run_until_idle(timeout=10)
        record = await stale_record(alice, tid)
        assert "rolled back" in record["detail"]
        assert (await alice.get(tid)).record.status is tt.Status.NEEDS_HUMAN
        assert await decided_by(alice, tid) == []
        assert len(paid(ledger)) == 1
    finally:
        await alice.close()
        await bob.close()


def retrying_transfers(url: str, ledger: Path) -> tt.Harness:
    """A transfer whose first attempt fails before paying; the retry waits a long backoff
    (brought forward by a ``retry`` event), so the task waits out a retry with the call open."""
    h = tt.Harness(url, settings=SETTINGS)

    @h.tool(side_effect=True, retry=tt.RetryPolicy(max_attempts=3, backoff=60.0, jitter=0.0))
    async def transfer(ctx: tt.ToolContext, order: str) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise RuntimeError("bank busy, try again")  # known to have failed: nothing paid
        pay_to(ledger, ctx)
        return {"transferred": order, "key": ctx.idempotency_key}

    @h.agent("mover")
    class Mover(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if not task.scratch.get("asked"):
                task.scratch["asked"] = True
                return tt.ToolCall("transfer", {"order": "T1"})
            return tt.Finish(task.last_tool_result)

    return h


async def test_e4_r10_a_fork_of_a_call_waiting_out_a_retry_runs_it_under_a_key_of_its_own(
        db_url: str, tmp_path: Path) -> None:
    """E4/R10 (defect 5): the source's transfer failed once and waits out its backoff (the call
    open, its record failed). A fork of that version makes the call under its own key: source
    and fork each pay once, under different keys. The source is deleted; the fork is rolled
    back to its first version and resumed: it answers from its own record, nothing is paid
    again, and no key is ever paid twice."""
    ledger = tmp_path / "ledger.txt"
    h = retrying_transfers(db_url, ledger)
    try:
        source = await h.submit("mover")
        await h.run_until_idle(timeout=10)
        waiting = await h.get(source)
        call = waiting.snapshot.call
        assert call is not None and call.status == "failed" and call.retry_at is not None
        assert paid(ledger) == []
        fork = await h.fork(source, waiting.version, new_task_id="fork1")
        for tid in (source, fork):  # the fork waits out the same backoff: bring both forward
            await h.emit(tt.Event("retry", tid, {"why": "the bank is back"}))
        await h.run_until_idle(timeout=10)
        for tid in (source, fork):
            assert (await h.get(tid)).record.status is tt.Status.COMPLETED, tid
        keys = paid(ledger)
        assert len(keys) == 2 and twice(ledger) == [], keys
        assert keys.count(call.key) == 1  # the source's, under its own key
        fork_result = (await h.get(fork)).snapshot.result
        assert fork_result["key"] != call.key and fork_result["key"] in keys

        await h.delete(source)
        first = min(v for v, _, _ in await h.store.list_versions(fork))
        await h.rollback(fork, first, by="operator")
        await h.resume(fork, by="operator")
        await h.run_until_idle(timeout=10)
        again = await h.get(fork)
        assert again.record.status is tt.Status.COMPLETED, (again.record.reason,
                                                            await strategies(h, fork))
        assert again.snapshot.result == fork_result
        assert paid(ledger) == keys and twice(ledger) == []
    finally:
        await h.close()


def approver(url: str, notified: list[str]) -> tt.Harness:
    """Waits for an approval (nothing outside says it came), then finishes."""
    h = tt.Harness(url, settings=SETTINGS, notifier=lambda bundle: notified.append(
        bundle["task"]["task_id"]))

    @h.agent("approver")
    class Approver(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            if task.last_event is None:
                return tt.Wait("approval")
            return tt.Finish({"approved": True})

        async def check_wait(self, task: tt.TaskView, wait: Any) -> Any:
            return None

    return h


@pytest.mark.parametrize("lever", ["cancel", "resume", "rollback"])
async def test_r10_r21_r26_a_lever_on_a_waiting_task_from_a_process_without_its_agent_leaves_it_waiting(
        db_url: str, lever: str) -> None:
    """R10/R21/R26 (issue 26, also seen): a process with no code (a CLI or server without
    --app) pulls a lever on a waiting task. It re-checks no wait with an agent it lacks: the
    task stays waiting, no UnknownAgent, no needs_human, its notifier is never called, and
    the lever waits in the inbox; the app's worker then applies it (a resume ends the wait,
    as a person's resume does)."""
    notified: list[str] = []
    app = approver(db_url, notified)
    codeless = tt.Harness(db_url, settings=SETTINGS,
                          notifier=lambda bundle: notified.append(bundle["task"]["task_id"]))
    try:
        tid = await app.submit("approver")
        await app.run_until_idle(timeout=10)
        before = await app.get(tid)
        assert before.record.status is tt.Status.WAITING
        if lever == "cancel":
            receipt = await codeless.cancel(tid, by="operator")
        elif lever == "resume":
            receipt = await codeless.resume(tid, by="operator")
        else:
            receipt = await codeless.rollback(tid, before.version, by="operator")
        after = await app.get(tid)
        assert (after.record.status, after.record.reason, notified) == (
            tt.Status.WAITING, None, [])
        assert after.version == before.version
        stored = [e for e in await app.reads.events(tid) if e.event.id == receipt.event_id]
        assert [e.status for e in stored] == ["pending"]
        await app.run_until_idle(timeout=10)
        stored = [e for e in await app.reads.events(tid) if e.event.id == receipt.event_id]
        assert [e.status for e in stored] == ["applied"], await strategies(app, tid)
        done = await app.get(tid)
        assert done.record.status is {"cancel": tt.Status.CANCELLED,  # a person ends the wait
                                      "resume": tt.Status.COMPLETED,
                                      "rollback": tt.Status.WAITING}[lever]
        assert notified == [] and "needs_human" not in await strategies(app, tid)
    finally:
        await app.close()
        await codeless.close()


async def test_r10_r26_a_parked_call_leased_for_a_moment_is_still_in_doubt(
        db_url: str, tmp_path: Path) -> None:
    """R10/R26 (seen in the levers-under-fire run): a task parked for a person is leased for a
    moment by the worker leaving it, or by one claiming it to apply a lever. Its call is not
    running then: a plain resume is still refused as in doubt (not queued for that worker), and
    a decision is taken (not refused as "running now"); once the lease is given back, a worker
    applies the decision and nothing is paid again."""
    ledger = tmp_path / "ledger.txt"
    h = blind_refunds(db_url, ledger)
    try:
        tid, _ = await parked(h, ledger)
        claim = await h.store.claim_task(tid, "another-worker", time.time(), 60.0)
        assert claim is not None
        leased = await h.get(tid)
        assert leased.record.holder() == "another-worker" and leased.record.runner() is None
        with pytest.raises(tt.InDoubtCall):
            await h.resume(tid)
        await h.decide(tid, "happened", result={"refunded": "A1"}, by="carol")
        await h.store.release(claim)
        await h.run_until_idle(timeout=10)
        done = await h.get(tid)
        assert done.record.status is tt.Status.COMPLETED, done.record.reason
        assert done.snapshot.result == {"refunded": "A1"} and len(paid(ledger)) == 1
        assert await decided_by(h, tid) == [("carol", "happened")]
    finally:
        await h.close()
