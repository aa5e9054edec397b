"""A report analysis driven by a real model through ChatAgent, with long-term memory.

    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_MODEL=Qwen2.5-7B-Instruct python examples/chat_report.py
    python examples/chat_report.py --fake

The model pulls metrics and last year's figures with tools, then writes a summary. What
the team agreed earlier lives in memory (SQLite FTS5): it reaches the prompt when
relevant, never the task's snapshot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from _chat_example import main, run_task

import tether as tt
from tether.agents import ChatAgent, SQLiteMemory
from tether.testing.fake_openai import FakeOpenAI, call, reply

METRICS = {"FY25": {"revenue": 12.4, "margin": 0.18}, "FY24": {"revenue": 10.9, "margin": 0.21}}


async def build(db: str, **model: str) -> tt.Harness:
    harness = tt.Harness(f"sqlite:///{db}")
    memory = SQLiteMemory()
    await memory.add("The board wants margin changes explained before revenue growth.")

    @harness.tool(idempotent=True)
    async def metrics(ctx: tt.ToolContext, year: str) -> dict[str, float]:
        """Revenue (millions) and margin for a fiscal year such as FY25."""
        return METRICS[year]

    harness.add_agent("analyst", ChatAgent(
        tools=[metrics], memory=memory,
        system="You analyse a fiscal year's report against the year before.", **model))
    return harness


@contextlib.contextmanager
def fake_model() -> Iterator[dict[str, str]]:
    script = [reply(tool_calls=[call("metrics", {"year": "FY25"}), call("metrics", {"year": "FY24"})]),
              reply("Margin fell from 21% to 18% while revenue grew 14% to 12.4M.")]
    with FakeOpenAI(script) as server:
        yield {"model": "fake", "base_url": server.url, "api_key": "none"}


async def analyse(db: str, model: dict[str, str]) -> None:
    harness = await build(db, **model)
    async with harness:
        await run_task(harness, "analyst", "Analyse the FY25 report against FY24.", "report-FY25")


if __name__ == "__main__":
    main(__doc__ or "", analyse, fake_model)
