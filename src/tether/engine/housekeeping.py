"""What a worker does besides running tasks: deleting finished tasks past their retention
(``Settings.retain_completed`` and friends) and collecting the large values (R20) that no
kept version refers to any more, so a store that runs for ever stays the size of its work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tether.errors import StoreUnavailable
from tether.settings import Settings
from tether.store.base import WorkerStore

BATCH = 500
"""Tasks deleted per transaction (a long purge never holds the store for long)."""
BATCHES = 20
"""Batches one round deletes at most; the rest waits for the next round."""
COLLECT_EVERY = 10
"""Blobs are collected every this many rounds (reading every head is not free)."""


@dataclass(frozen=True)
class Swept:
    """What one round removed."""

    tasks: list[str]
    blobs: int


async def sweep(store: WorkerStore, settings: Settings, log: logging.Logger,
                collect: bool = True) -> Swept:
    """One round: finished tasks past retention, then (with *collect*) unused blobs."""
    now = time.time()
    cutoffs = {status: now - keep for status, keep in settings.retention().items()
               if keep is not None}
    deleted: list[str] = []
    for _ in range(BATCHES if cutoffs else 0):
        batch = await store.purge_finished(cutoffs, time.time(), BATCH)
        deleted += batch
        if len(batch) < BATCH:
            break
    collected = await store.collect_blobs(time.time()) if collect else 0
    if deleted or collected:
        log.info("housekeeping: deleted %d finished task(s) past their retention and %d large"
                 " value(s) nothing refers to", len(deleted), collected)
    return Swept(deleted, collected)


async def keep_house(store: WorkerStore, settings: Settings, log: logging.Logger) -> None:
    """A worker's housekeeping, every ``housekeeping_interval`` until cancelled; an outage
    or a failure waits for the next round."""
    rounds = 0
    while True:
        await asyncio.sleep(settings.housekeeping_interval)
        rounds += 1
        try:
            await sweep(store, settings, log, collect=rounds % COLLECT_EVERY == 0)
        except StoreUnavailable:
            continue
        except Exception:  # housekeeping must never stop the worker
            log.exception("housekeeping failed; trying again in %.0fs",
                          settings.housekeeping_interval)
