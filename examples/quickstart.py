"""The smallest useful tether program: a plain-Python agent, a tool, an interrupt.

    python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
from typing import Any

import tether as tt

harness = tt.Harness("memory://")


@harness.tool(idempotent=True)
async def shout(ctx: tt.ToolContext, word: str) -> str:
    await asyncio.sleep(0.05)
    return word.upper()


@harness.agent("shouter")
class Shouter(tt.Agent):
    async def plan(self, task: tt.TaskView) -> tt.Action:
        words: list[str] = task.input["words"]
        i = task.scratch.get("i", 0)
        if i == len(words):
            return tt.Finish([e["content"] for e in task.history if e.get("role") == "tool"])
        task.scratch["i"] = i + 1
        return tt.ToolCall("shout", {"word": words[i]})

    async def on_event(self, task: tt.TaskView, event: tt.Event) -> tt.Action | None:
        if event.type == "user_message":
            return tt.Reply(f"noted: {event.payload}")
        return None


async def main() -> Any:
    task_id = await harness.submit("shouter", {"words": ["never", "repeat", "a", "refund"]})

    async def chime_in() -> None:
        await asyncio.sleep(0.08)
        await harness.emit(tt.Event("user_message", task_id, "keep going"))

    await asyncio.gather(harness.run_until_idle(), chime_in())
    info = await harness.get(task_id)
    print(info.record.status.value, info.snapshot.result)
    for row in await harness.history(task_id):
        print(" ", row.get("role"), row.get("content", row.get("tool_call")))


if __name__ == "__main__":
    asyncio.run(main())
