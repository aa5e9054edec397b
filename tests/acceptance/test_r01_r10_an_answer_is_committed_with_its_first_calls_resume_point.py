"""R1, R10 (issue 27, issue 30): a model answer whose first action is a tool call that can
start at once is written in one commit with that call's resume point, so a tool call of a
model agent costs one commit, not two, and the answer is still in the store before anything
of it runs.

Each test counts the commits the runner asks the store for (``Store.commit_reading``, a
commit that also reads the inbox back, wrapped), and what each said: whether it was a
resume point (written only if nothing arrived unread) and whether the store refused it. A
call that may wait for a limit's slot first gets its answer committed on its own (a kill
while it waits must not cost the completion), and a resume point refused because a message
arrived still leaves the answer committed, with the message, before the agent is asked
again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import tether as tt
from tether.engine.worker import run_claimed
from tether.errors import InboxMoved

STOP = "STOP: do NOT refund A1"


class Commits:
    """Every commit the store was asked for: ``resume`` (a resume point), ``refused`` (the
    store refused it: a message had arrived), ``plain``."""

    def __init__(self, h: tt.Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.said: list[str] = []
        real = h.store.commit_reading

        async def commit_reading(claim: Any, checkpoint: Any, *rest: Any) -> Any:
            kind = "plain" if checkpoint.inbox_seen is None else "resume"
            try:
                written = await real(claim, checkpoint, *rest)
            except InboxMoved:
                self.said.append("refused")
                raise
            self.said.append(kind)
            return written

        monkeypatch.setattr(h.store, "commit_reading", commit_reading)


def build(db: Path, plans: list[str], refunds: list[tuple[str, list[str]]],
          commits: list[Commits], *, limited: bool = False, interrupt: bool = False
          ) -> tt.Harness:
    """A model-like agent (``commit_plans``: each plan is paid for) that answers one refund,
    then finishes; the refund notes which commits were made before it ran."""
    h = tt.Harness(f"sqlite:///{db}")
    other = tt.Harness(f"sqlite:///{db}")  # another process's connection: wakes no runner here
    if limited:
        h.limit("provider", concurrency=1)

    @h.tool(side_effect=True, limits=("provider",) if limited else ())
    async def refund(ctx: tt.ToolContext, order: str) -> str:
        refunds.append((order, list(commits[0].said)))
        return f"refunded {order}"

    @h.agent("support")
    class Support(tt.Agent):
        commit_plans = True

        async def plan(self, task: tt.TaskView) -> tt.Action | list[tt.Action]:
            plans.append(f"step {task.step}")
            if any(e.get("type") == "user_message" for e in task.history):
                return tt.Finish(f"stopped after {len(refunds)} refund(s)")
            if interrupt and len(plans) == 1:
                await other.emit(tt.Event("user_message", task.task_id, {"text": STOP}))
            if task.step == 0:
                return [tt.ToolCall("refund", {"order": "A1"})]
            return tt.Finish("done")

    return h


async def run_alone(h: tt.Harness, task_id: str) -> None:
    """The task run without a worker, so no poller reads the inbox before the runner does."""
    claim = await h.store.claim_task(task_id, h.worker_id, time.time(), 30.0)
    assert claim is not None
    await run_claimed(h, claim)


async def test_r01_r10_the_answer_and_its_first_calls_resume_point_are_one_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans: list[str] = []
    refunds: list[tuple[str, list[str]]] = []
    commits: list[Commits] = []
    async with build(tmp_path / "t.db", plans, refunds, commits) as h:
        commits.append(Commits(h, monkeypatch))
        task_id = await h.submit("support", "go")
        await run_alone(h, task_id)
        info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert refunds == [("A1", ["resume"])]  # one commit before the refund ran: both in it
    # then the refund's result, the second answer, and the end it carries out
    assert commits[0].said == ["resume", "plain", "plain", "plain"]
    assert plans == ["step 0", "step 1"]


async def test_r01_r10_a_call_that_may_wait_for_a_slot_gets_its_answer_committed_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans: list[str] = []
    refunds: list[tuple[str, list[str]]] = []
    commits: list[Commits] = []
    async with build(tmp_path / "t.db", plans, refunds, commits, limited=True) as h:
        commits.append(Commits(h, monkeypatch))
        task_id = await h.submit("support", "go")
        await run_alone(h, task_id)
        info = await h.get(task_id)
    assert info.record.status is tt.Status.COMPLETED, info.record.reason
    assert refunds == [("A1", ["plain", "resume"])]  # the answer, then the resume point


async def test_r03_r10_a_refused_resume_point_still_commits_the_answer_before_planning_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plans: list[str] = []
    refunds: list[tuple[str, list[str]]] = []
    commits: list[Commits] = []
    async with build(tmp_path / "t.db", plans, refunds, commits, interrupt=True) as h:
        commits.append(Commits(h, monkeypatch))
        task_id = await h.submit("support", "go")
        seen: list[list[str]] = []
        real_plan = h.agents["support"].plan

        async def plan(task: tt.TaskView) -> Any:
            seen.append(list(commits[0].said))
            return await real_plan(task)

        monkeypatch.setattr(h.agents["support"], "plan", plan)
        await run_alone(h, task_id)
        info = await h.get(task_id)
    assert refunds == []  # set aside by the message: never paid
    assert info.snapshot.result == "stopped after 0 refund(s)"
    # the second plan is asked only once the first answer (set aside) is in the store
    assert seen == [[], ["refused", "plain"]]
    assert plans == ["step 0", "step 0"]  # set aside: the step did not move on
