"""A contract batch reviewed by a real model through ChatAgent, interruptible at any point.

    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.1 python examples/chat_contracts.py
    python examples/chat_contracts.py --fake          # the same flow against the scripted server

The agent reads each contract with a tool and records a risk flag with another (a side
effect, keyed, so a crash never flags twice). Kill the process at any moment and run it
again with the same --db: it carries on from its last step without repeating a paid call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from _chat_example import main, run_task

import tether as tt
from tether.agents import ChatAgent
from tether.testing.fake_openai import FakeOpenAI, call, reply

CONTRACTS = {
    "C-1": "Supplier may terminate at any time without notice. Liability capped at 10 EUR.",
    "C-2": "Standard 30-day termination. Liability capped at contract value.",
    "C-3": "Auto-renews for 5 years unless cancelled 364 days in advance.",
}
flags: dict[str, str] = {}


def build(db: str, **model: str) -> tt.Harness:
    harness = tt.Harness(f"sqlite:///{db}")

    @harness.tool(idempotent=True)
    async def read_contract(ctx: tt.ToolContext, contract_id: str) -> str:
        """Return the full text of one contract."""
        return CONTRACTS[contract_id]

    @harness.tool(side_effect=True)
    async def flag_risk(ctx: tt.ToolContext, contract_id: str, risk: str, reason: str) -> str:
        """Record a risk rating (low, medium or high) for a contract, with the reason."""
        flags[contract_id] = risk
        return f"{contract_id} flagged {risk}"

    harness.add_agent("reviewer", ChatAgent(
        tools=[read_contract, flag_risk],
        system="You review contracts one by one: read each, then flag its risk.", **model))
    return harness


@contextlib.contextmanager
def fake_model() -> Iterator[dict[str, str]]:
    script = []
    for cid, risk in (("C-1", "high"), ("C-2", "low"), ("C-3", "medium")):
        script += [reply(tool_calls=[call("read_contract", {"contract_id": cid})]),
                   reply(tool_calls=[call("flag_risk", {"contract_id": cid, "risk": risk,
                                                        "reason": "see clause"})])]
    script.append(reply("Reviewed 3 contracts: C-1 high, C-2 low, C-3 medium."))
    with FakeOpenAI(script) as server:
        yield {"model": "fake", "base_url": server.url, "api_key": "none"}


async def review(db: str, model: dict[str, str]) -> None:
    async with build(db, **model) as harness:
        await run_task(harness, "reviewer", f"Review contracts {sorted(CONTRACTS)}",
                       "contract-batch")
        print(f"flags: {flags}")


if __name__ == "__main__":
    main(__doc__ or "", review, fake_model)
