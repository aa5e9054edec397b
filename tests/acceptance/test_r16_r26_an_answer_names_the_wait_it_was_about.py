"""R16, R26: an answer to a wait is applied only to the wait it was about.

Every wait a task arms has an id of its own (``frame.wait["id"]``), shown by ``tether show``
and put by the console into the approval it sends. An event that names the wait it answers
(``"wait"`` in its payload) and finds the task holding another wait, or none, is not applied
(``stale_answer_ignored``): a person's "yes" to one call never approves the next one, however
late it arrives or however often it is sent. An event that names no wait is applied as
before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tether as tt
from tether.model import EventStatus


def two_approvals(h: tt.Harness) -> None:
    """Asks for two approvals in turn (think: two refunds), then finishes with both answers."""

    @h.agent("twice")
    class Twice(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            answers: list[Any] = t.scratch.setdefault("answers", [])
            if t.last_event is not None and t.scratch.get("asked", 0) > len(answers):
                answers.append(t.last_event["payload"])
            if len(answers) < 2:
                t.scratch["asked"] = len(answers) + 1
                return tt.Wait("approval")
            return tt.Finish(answers)


async def waiting_on(h: tt.Harness, task_id: str) -> str:
    info = await h.get(task_id)
    assert info.record.status is tt.Status.WAITING, info.record.reason
    wait = info.snapshot.frame.wait
    assert wait is not None and isinstance(wait.get("id"), str)
    return str(wait["id"])


async def test_r26_a_repeated_approval_of_one_wait_never_approves_the_next(tmp_path: Path) -> None:
    """R26, R16: the first wait is approved, naming it; the task moves on to a second wait.
    The same approval sent again (a double click, a webhook retried under a new id) names the
    first wait: it is recorded as ignored, the task keeps waiting, nothing reaches the agent.
    Only an answer naming the second wait ends it."""
    async with tt.Harness(f"sqlite:///{tmp_path / 'waits.db'}") as h:
        two_approvals(h)
        task_id = await h.submit("twice")
        await h.run_until_idle(timeout=10)
        first = await waiting_on(h, task_id)
        await h.emit(tt.Event("approval", task_id, {"approved": True, "wait": first}))
        await h.run_until_idle(timeout=10)
        second = await waiting_on(h, task_id)
        assert second != first

        await h.emit(tt.Event("approval", task_id, {"approved": True, "wait": first}))
        await h.run_until_idle(timeout=10)
        assert await waiting_on(h, task_id) == second
        events = await h.store.list_events(task_id)
        assert [e.status for e in events] == [EventStatus.APPLIED, EventStatus.IGNORED]
        log = [r for r in await h.store.list_recovery_log(task_id)
               if r["resume_strategy"] == "stale_answer_ignored"]
        assert len(log) == 1 and first in log[0]["detail"] and second in log[0]["detail"]
        history = await h.history(task_id)
        assert [row["event_id"] for row in history if row.get("type") == "approval"] \
            == [events[0].event.id]

        await h.emit(tt.Event("approval", task_id, {"approved": "the second", "wait": second}))
        await h.run_until_idle(timeout=10)
        info = await h.get(task_id)
        assert info.record.status is tt.Status.COMPLETED, info.record.reason
        assert [a["approved"] for a in info.snapshot.result] == [True, "the second"]


async def test_r16_an_answer_that_names_no_wait_is_applied_to_the_wait_it_finds(
        tmp_path: Path) -> None:
    """R16: approvals without ``"wait"`` (an object without it, a bare ``true``) end the wait
    they find, as before waits had ids: naming the wait is how a sender makes its answer
    safe, and the console always does."""
    async with tt.Harness(f"sqlite:///{tmp_path / 'plain.db'}") as h:
        two_approvals(h)
        task_id = await h.submit("twice")
        await h.run_until_idle(timeout=10)
        first = await waiting_on(h, task_id)
        await h.emit(tt.Event("approval", task_id, {"approved": True}))
        await h.run_until_idle(timeout=10)
        assert await waiting_on(h, task_id) != first
        await h.emit(tt.Event("approval", task_id, True))
        await h.run_until_idle(timeout=10)
        done = await h.get(task_id)
        assert done.record.status is tt.Status.COMPLETED
        assert done.snapshot.result == [{"approved": True}, True]


async def test_r14_r26_a_rollback_or_a_fork_gives_the_restored_wait_a_new_id(
        tmp_path: Path) -> None:
    """R14, R26: rolled back to the version that armed the first wait (already approved
    once), the task waits there again under a new id, so a copy of the old approval is
    ignored; a fork of it waits under an id of its own too, so an answer naming the
    source's wait does not end the fork's."""
    async with tt.Harness(f"sqlite:///{tmp_path / 'rolled.db'}") as h:
        two_approvals(h)
        task_id = await h.submit("twice")
        await h.run_until_idle(timeout=10)
        first = await waiting_on(h, task_id)
        armed = (await h.get(task_id)).version
        await h.emit(tt.Event("approval", task_id, {"approved": True, "wait": first}))
        await h.run_until_idle(timeout=10)
        fork_id = await h.fork(task_id, armed)
        await h.rollback(task_id, armed)
        await h.run_until_idle(timeout=10)
        again, forked = await waiting_on(h, task_id), await waiting_on(h, fork_id)
        assert len({first, again, forked}) == 3
        for target in (task_id, fork_id):
            await h.emit(tt.Event("approval", target, {"approved": True, "wait": first}))
        await h.run_until_idle(timeout=10)
        assert (await waiting_on(h, task_id), await waiting_on(h, fork_id)) == (again, forked)
        assert (await h.store.list_events(fork_id))[-1].status is EventStatus.IGNORED
