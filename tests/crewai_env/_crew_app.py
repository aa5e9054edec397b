"""A crew of five tasks under tether, in a process the tests SIGKILL (R9, R10; issue 31).

``python _crew_app.py DB`` submits one task (printing ``TASK <id>``) and works on it until it
settles; with ``CREW_BLOCK=N`` the crew's tool blocks inside its call of crew task N (printing
``IN work N``) for the parent's SIGKILL. The parent then finishes the task with a harness of
its own on the same store, built by :func:`harness` from this module, as a restarted service
would. Every model request and every run of the tool is a row of the ledger
(``CREW_LEDGER``), committed before anything blocks, so the parent counts what ran again.

The model is deterministic and needs no server: in crew task N it asks for ``work(step=N)``,
then, once the conversation holds that call's result, answers ``step N done``. With
``CREW_TEXT=1`` it cannot call functions natively and writes CrewAI's ReAct text instead,
which CrewAI parses.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
import time
from typing import Any

from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool

import tether as tt
from tether.integrations.crewai import CrewAIAgent

SETTINGS = tt.Settings(lease_seconds=1.0, poll_interval=0.02, recovery_backoff=0.01)
STEPS = 5


def ledger() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["CREW_LEDGER"], isolation_level=None)
    db.execute("create table if not exists runs (what text, step int, key text)")
    return db


def mark(what: str, step: int, key: str = "") -> None:
    with ledger() as db:
        db.execute("insert into runs values (?, ?, ?)", (what, step, key))


def runs() -> list[tuple[str, int, str]]:
    with ledger() as db:
        return list(db.execute("select what, step, key from runs"))


class Scripted(BaseLLM):
    """The crew's model (see the module docstring)."""

    native: bool = True

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None,
             available_functions: Any = None, from_task: Any = None, from_agent: Any = None,
             response_model: Any = None) -> Any:
        return self.answer(messages)

    async def acall(self, messages: Any, tools: Any = None, callbacks: Any = None,
                    available_functions: Any = None, from_task: Any = None,
                    from_agent: Any = None, response_model: Any = None) -> Any:
        return self.answer(messages)

    def supports_function_calling(self) -> bool:
        return self.native

    def answer(self, messages: list[dict[str, Any]]) -> Any:
        said = "\n".join(str(m.get("content") or "") for m in messages)
        step = int(re.findall(r"Step (\d+) of the work", said)[-1])
        mark("model", step)
        if f"worked step {step}" in said:
            return f"step {step} done" if self.native else (
                f"Thought: I now know the final answer\nFinal Answer: step {step} done")
        if self.native:
            return [{"id": f"call_{step}", "type": "function", "function": {
                "name": "work", "arguments": json.dumps({"step": step})}}]
        return (f"Thought: I do step {step}.\nAction: work\n"
                f"Action Input: {json.dumps({'step': step})}")


@tool("work")
def work(step: int) -> str:
    """Do one step of the work."""
    key = tt.current_call().idempotency_key
    mark("work", step, key)
    if os.environ.get("CREW_CHILD") == "1" and os.environ.get("CREW_BLOCK") == str(step):
        print(f"IN work {step}", flush=True)
        time.sleep(600)
    return f"worked step {step}"


def crew(native: bool = True, first_role: str = "worker") -> Crew:
    model = Scripted(model="scripted", native=native)
    worker = Agent(role=first_role, goal="Do the work.", backstory="You work.", tools=[work],
                   llm=model)
    tasks = [Task(description=f"Step {n} of the work: {{input}}", agent=worker,
                  expected_output=f"step {n} done") for n in range(1, STEPS + 1)]
    return Crew(agents=[worker], tasks=tasks)


def harness(db: str, native: bool = True, **settings: Any) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=SETTINGS.replace(**settings))
    h.add_agent("crew", CrewAIAgent(crew(native), tools={"work": tt.ToolPolicy(idempotent=True)}))
    return h


async def main(db: str) -> None:
    h = harness(db, native=os.environ.get("CREW_TEXT") != "1")
    task = await h.submit("crew", "the list")
    print(f"TASK {task}", flush=True)
    await h.run_until_idle(timeout=60)
    await h.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
