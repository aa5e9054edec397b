"""R10, R13 on PostgreSQL (issue 30): a task's idempotency records are found by the range of
keys that begin with its id and a colon. That range compares bytes, which a database whose
default collation is a language's (ICU's root here) does not: there ``'t1:f1:0' < 't1;'`` is
false, and the task's records would not be found. Migration 11 gives the key column the
``C`` collation, so loading, listing and deleting a task's records work whatever the
database's collation."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

import services
from tether.model import IdempotencyRecord, OutcomeStatus, Status
from tether.store.conformance.helpers import LEASE, claim, commit, make_task
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
def icu_url() -> Iterator[str]:
    """A fresh database whose default collation is ICU's root locale."""
    try:
        url = services.create_database("TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und'"
                                        " LOCALE 'C.UTF-8'")
    except psycopg.errors.FeatureNotSupported as exc:
        pytest.skip(f"this PostgreSQL server has no ICU collations: {exc}")
    yield url
    services.drop_database(url)


async def test_a_tasks_records_are_found_in_a_database_that_does_not_sort_by_bytes(
        icu_url: str) -> None:
    with psycopg.connect(icu_url) as conn:  # the hazard is real in this database
        assert conn.execute("SELECT 't1:f1:0' < 't1;'").fetchone() == (False,)
    store = PostgresStore(icu_url)
    await store.migrate()
    now = time.time()
    for task_id in ("t1", "t1:f1"):
        await make_task(store, task_id)
        lease = await claim(store, task_id, now)
        records = [IdempotencyRecord(f"{task_id}:f1:{n}", task_id, "refund", "h",
                                     OutcomeStatus.SUCCEEDED, n) for n in range(3)]
        await commit(store, lease, Status.COMPLETED, now, idempotency=records)
        await store.release(lease)
    assert await store.idempotency_keys("t1") == {"t1:f1:0", "t1:f1:1", "t1:f1:2"}
    assert len(await store.list_idempotency("t1:f1")) == 3
    await store.delete_task("t1", now + 2 * LEASE)
    assert await store.idempotency_keys("t1") == set()
    assert await store.idempotency_keys("t1:f1") == {"t1:f1:f1:0", "t1:f1:f1:1", "t1:f1:f1:2"}
    await store.close()
    with psycopg.connect(icu_url) as conn:
        assert conn.execute("SELECT collation_name FROM information_schema.columns WHERE"
                            " table_name = 'idempotency' AND column_name = 'key'"
                            ).fetchone() == ("C",)
