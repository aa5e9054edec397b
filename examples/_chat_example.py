"""What the ChatAgent examples share: run one named task to its end, and the command line
(``--fake`` for the scripted server, ``--db`` to carry a task on across runs)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import tether as tt
from tether.testing.fake_openai import FakeOpenAI, Reply, call, reply

Model = dict[str, str]


@contextlib.contextmanager
def scripted_model(script: list[Reply]) -> Iterator[Model]:
    """The fake model server answering *script* in turn, as a ``--fake`` run's model."""
    with FakeOpenAI(script) as server:
        yield {"model": "fake", "base_url": server.url, "api_key": "none"}


REFUND_SCRIPT = [reply(tool_calls=[call("lookup", {"order": "A1"})]),
                 reply(tool_calls=[call("refund", {"order": "A1", "amount": 5})]),
                 reply("Order A1 arrived broken: I refunded 5 EUR.")]
"""What the fake model answers the support examples: look A1 up, refund 5, say so."""


async def run_task(harness: tt.Harness, agent: str, input: Any, task_id: str) -> tt.TaskInfo:
    """Submit *task_id* unless a previous run did, run it to its end, print the outcome."""
    with contextlib.suppress(tt.TaskExists):  # a second run carries the same task on
        await harness.submit(agent, input, task_id=task_id)
    await harness.run_until_idle(timeout=600)
    info = await harness.get(task_id)
    print(f"{info.record.status.value}: {info.snapshot.result}")
    return info


def main(doc: str, flow: Callable[[str, Model], Awaitable[None]],
         fake_model: Callable[[], AbstractContextManager[Model]]) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="use the scripted fake model")
    parser.add_argument("--db", default=":memory:")
    args = parser.parse_args()
    if args.fake:
        with fake_model() as model:
            asyncio.run(flow(args.db, model))
    else:
        asyncio.run(flow(args.db, {}))  # model, key and URL from OPENAI_*
