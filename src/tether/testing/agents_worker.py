"""A kill test's worker process: one case's harness on a store file, run until idle.

Started by :mod:`tether.testing.agents_forkserver` with ``TETHER_FAILPOINTS`` already in its
environment (so a failpoint SIGKILLs it), as ``main([build, shop, store, url, can_stream,
timeout])``: *build* is the case's ``module:function``, *shop* the :class:`Shop` as JSON.
"""

from __future__ import annotations

import asyncio
import importlib

import tether as tt
from tether.testing.agents_world import AGENT, Build, Endpoint, Shop

KILL_SETTINGS = tt.Settings(lease_seconds=0.5, poll_interval=0.02, recovery_backoff=0.01,
                            defer_results_under=0.0)
"""A short lease, so a rescuer takes a dead worker's task over soon; every result committed
on its own (``defer_results_under=0``: a quick lookup's result is not left to ride with the
next commit), so the n-th checkpoint of a task is the same one in every run."""


def resolve(ref: str) -> Build:
    module, _, name = ref.partition(":")
    build: Build = getattr(importlib.import_module(module), name)
    return build


def main(argv: list[str]) -> int:
    ref, shop, store, url, can_stream, timeout = argv

    async def run() -> None:
        h = tt.Harness(store, settings=KILL_SETTINGS)
        resolve(ref)(h, Shop.from_json(shop), Endpoint(url, can_stream=can_stream == "1"))
        assert AGENT in h.agents
        async with h:
            await h.run_until_idle(timeout=float(timeout))

    asyncio.run(run())
    return 0
