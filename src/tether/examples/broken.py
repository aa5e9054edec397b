"""A deliberately broken agent, for ``tether torture`` to catch.

It keeps its progress in the agent object (process memory) instead of
``task.scratch``. Uninterrupted it works; after a worker is killed, the new
process starts counting from zero and charges the first customers again.
tether cannot save an agent from state it never sees: this is what
``tether torture`` is for.

    tether torture tether.examples.broken:harness charges --input '{"customers": ["a", "b", "c"]}'

Since tether holds a side-effecting call identical to one that already succeeded for a
person (``max_identical_side_effects``, 1 by default), such a charge no longer goes through
by default: the task goes to a person instead. This example raises the bound so that
``tether torture`` shows what the broken agent itself does.

``reader`` makes the same mistake with a tool that has no side effect: nothing is paid twice,
but after a restart it reads every page again, under new keys (``tether torture`` reports it
as "re-planned work it had done").
"""

from __future__ import annotations

from typing import Any

import tether as tt

harness = tt.Harness(settings=tt.Settings(max_identical_side_effects=100))  # see the module's doc


@harness.tool(side_effect=True)
async def charge(ctx: tt.ToolContext, customer: str) -> dict[str, Any]:
    return {"customer": customer, "charged": True}


@harness.agent("charges")
class ForgetfulCharges(tt.Agent):
    """BROKEN: progress lives in ``self.done``, which a restart forgets."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    async def plan(self, task: tt.TaskView) -> tt.Action:
        customers: list[str] = task.input["customers"]
        done = self.done.get(task.task_id, 0)
        if done == len(customers):
            return tt.Finish({"charged": done})
        self.done[task.task_id] = done + 1
        return tt.ToolCall("charge", {"customer": customers[done]})


PAGES_READ: dict[str, int] = {}
"""BROKEN: the reader's progress, in a module global that a restart forgets."""


@harness.tool(idempotent=True)
async def fetch(ctx: tt.ToolContext, page: int) -> str:
    return f"page {page}"


@harness.agent("reader")
class ForgetfulReader(tt.Agent):
    """BROKEN: progress lives in :data:`PAGES_READ`, not in ``task.scratch``."""

    async def plan(self, task: tt.TaskView) -> tt.Action:
        pages: int = task.input["pages"]
        done = PAGES_READ.get(task.task_id, 0)
        if done == pages:
            return tt.Finish({"read": done})
        PAGES_READ[task.task_id] = done + 1
        return tt.ToolCall("fetch", {"page": done})
