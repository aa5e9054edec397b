"""R13: a lease's bookkeeping commits without an fsync on SQLite (the store's ``Synced``), and
a SIGKILL right after it loses nothing: the process's WAL frames are in the operating
system's cache, which outlives the process. A child creates two tasks, claims both, renews
one and releases the other, then kills itself with SIGKILL before anything else is written;
a new process reads the file and finds each write.

Child usage: ``python test_r13_an_unsynced_claim_survives_a_kill.py DB``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from _child import killed_itself

from tether.store import SQLiteStore
from tether.store.conformance.helpers import LEASE, make_task

pytestmark = pytest.mark.timeout(60)
WORKER = "killed-worker"
RENEWED = 600.0


async def claim_then_die(db: str) -> None:
    store = SQLiteStore(db)
    for name in ("held", "let-go"):
        await make_task(store, name)
    held, let_go = await store.claim_many(WORKER, time.time(), LEASE, 2)
    await store.renew(held, time.time() + RENEWED)
    await store.release(let_go)
    os.kill(os.getpid(), signal.SIGKILL)


def test_r13_a_claim_a_renewal_and_a_release_survive_a_sigkill_right_after(
        tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    killed_itself(__file__, db)

    async def read() -> None:
        store = SQLiteStore(db)
        held, let_go = await store.get_task("held"), await store.get_task("let-go")
        assert held.lease_owner == WORKER
        assert (held.lease_until or 0) > time.time() + RENEWED / 2  # the renewal, not the claim
        assert let_go.lease_owner is None and let_go.lease_until is None
        claims = await store.claim_many("next", time.time(), LEASE, 2)
        assert [c.task_id for c in claims] == ["let-go"]  # released: free; held: still leased
        await store.close()

    asyncio.run(read())


if __name__ == "__main__":
    asyncio.run(claim_then_die(sys.argv[1]))
