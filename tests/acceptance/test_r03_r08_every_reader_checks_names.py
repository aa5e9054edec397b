"""R3, R8 (issue 26): every way in that names a task or a schedule checks the name first.

``harness.reads`` (the API's, the console's and the CLI's reads) passed a task id straight to
the store, and the schedule levers a schedule name: a NUL there was a 500 on PostgreSQL (the
store's own error) and a line break reached logs. Each is refused by name now, before the
store, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tether as tt

BAD = ["nul\x00inside", "two\nlines", "../up"]
UNSTORABLE = ["nul\x00inside", "\x00", ""]


@pytest.fixture(params=["sqlite", "postgres"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    url = request.getfixturevalue("pg_url") if request.param == "postgres" \
        else f"sqlite:///{tmp_path / 'names.db'}"
    h = tt.Harness(url)
    yield h
    await h.close()


@pytest.mark.parametrize("name", UNSTORABLE)
async def test_r08_every_read_of_one_task_checks_its_id(harness: tt.Harness, name: str) -> None:
    """R8: each reader refuses a task id no store can hold (a NUL, nothing) with InvalidInput
    naming it; ids the alphabet refuses today but an older store may hold are still read."""
    reads = harness.reads
    for attempt in (reads.task(name), reads.versions(name), reads.head(name),
                    reads.whole(name, 1, b"{}"), reads.history(name, [[0, -1]]),
                    reads.events(name), reads.calls(name), reads.recovery_log(name)):
        with pytest.raises(tt.InvalidInput, match="task id"):
            await attempt


@pytest.mark.parametrize("name", BAD)
async def test_r03_every_schedule_lever_checks_the_name(harness: tt.Harness, name: str) -> None:
    """R3: looking up, pausing, running or deleting a schedule refuses a bad name by name."""
    for attempt in (harness.schedule_named(name), harness.pause_schedule(name),
                    harness.run_schedule_now(name), harness.delete_schedule(name)):
        with pytest.raises(tt.InvalidInput, match="schedule name"):
            await attempt
