"""Snapshot size of a 200-turn ChatAgent conversation, with and without long-term memory.

Each turn is one completion answering with a tool call (a ~200-byte argument, a ~500-byte
result), against the scripted fake server. Memory holds 1,000 facts, searched for every
prompt. Reported: the newest snapshot head, and every kept version's head, in bytes.

    python bench/chat_snapshot.py --turns 200
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import tether as tt
from tether.agents import ChatAgent, SQLiteMemory
from tether.testing.fake_openai import FakeOpenAI, call, reply


async def conversation(db: Path, turns: int, with_memory: bool) -> tuple[int, int, int]:
    script = [reply(tool_calls=[call("note", {"text": f"turn {n} " + "a" * 200})])
              for n in range(turns - 1)] + [reply("done")]
    memory = None
    if with_memory:
        memory = SQLiteMemory()
        for n in range(1000):
            await memory.add(f"fact {n}: customer {n % 37} prefers option {n % 5} " + "m" * 300)
    with FakeOpenAI(script) as fake:
        h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(sqlite_synchronous="NORMAL"))

        @h.tool(idempotent=True)
        async def note(ctx: tt.ToolContext, text: str) -> str:
            """Write a note down."""
            return "r" * 500

        h.add_agent("chat", ChatAgent("fake", base_url=fake.url, api_key="none", tools=[note],
                                      memory=memory, stream=False))
        tid = await h.submit("chat", "customer 3 asks about option 2")
        await h.run_until_idle(timeout=600)
        info = await h.get(tid)
        assert info.record.status is tt.Status.COMPLETED, info.record.reason
        versions = await h.store.list_versions(tid)
        prompt = len(str(fake.requests[-1]["messages"]))
        await h.close()
    return versions[-1][2], sum(size for _, _, size in versions), prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for with_memory in (False, True):
            head, kept, prompt = asyncio.run(
                conversation(Path(d) / f"m{with_memory}.db", args.turns, with_memory))
            print(f"{args.turns} turns, memory {'on (1,000 facts)' if with_memory else 'off'}:"
                  f" newest head {head} B, all kept heads {kept} B; last prompt {prompt} chars")


if __name__ == "__main__":
    main()
