"""R14, E4, R10: fork, a new task from any kept version of another. It has its own id and
idempotency keys and the source's dialog up to that version; the source is untouched; a call
the source already made is not made again by the fork unless asked."""

from __future__ import annotations

import pytest
from _support import fast_settings

import tether as tt
from tether.model import CallStatus, Snapshot


def charger(h: tt.Harness, runs: list[tuple[int, str]], count: int = 4) -> None:
    """Charges *count* items (a side effect), then finishes."""

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, item: int) -> dict:
        runs.append((item, ctx.idempotency_key))
        return {"item": item}

    @h.agent("charger")
    class Charger(tt.Agent):
        async def plan(self, task):
            i = task.scratch.get("i", 0)
            if i < count:
                task.scratch["i"] = i + 1
                return tt.ToolCall("charge", {"item": i + 1})
            return tt.Finish({"charged": i})


async def versions(h: tt.Harness, task_id: str) -> list[tuple[int, Snapshot]]:
    found = []
    for version, _, _ in await h.store.list_versions(task_id):
        _, data = await h.store.load_head(task_id, version)
        found.append((version, Snapshot.loads(data, task_id, version)))
    return found


async def at_a_resume_point(h: tt.Harness, task_id: str) -> tuple[int, Snapshot]:
    """The first kept version whose charge is started and not yet answered."""
    return next((v, s) for v, s in await versions(h, task_id)
                if s.call is not None and s.call.status == CallStatus.STARTED)


@pytest.fixture
async def charged() -> tuple[tt.Harness, list[tuple[int, str]], str]:
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=50))
    runs: list[tuple[int, str]] = []
    charger(h, runs)
    task_id = await h.submit("charger", task_id="source")
    await h.run_until_idle(timeout=20)
    assert [item for item, _ in runs] == [1, 2, 3, 4]
    return h, runs, task_id


async def test_r14_a_fork_goes_on_from_its_version_and_leaves_the_source_alone(charged) -> None:
    h, runs, source = charged
    before = await h.get(source)
    source_rows = await h.history(source)
    version, snap = next((v, s) for v, s in await versions(h, source)
                         if s.call is None and s.frame.scratch.get("i") == 2)
    fork_id = await h.fork(source, version, new_task_id="explore", by="ops")
    assert fork_id == "explore"
    forked = await h.history(fork_id)
    assert forked == source_rows[: snap.history_len]  # what already happened is its history
    await h.run_until_idle(timeout=20)
    done = await h.get(fork_id)
    assert done.record.status is tt.Status.COMPLETED and done.snapshot.result == {"charged": 4}
    fork_runs = runs[4:]
    assert [item for item, _ in fork_runs] == [3, 4]  # its own new calls, not items 1 and 2
    assert all(key.startswith("explore:") for _, key in fork_runs)  # keys of its own
    log = await h.store.list_recovery_log(fork_id)
    assert log[0]["resume_strategy"] == "fork"
    assert log[0]["forked_from"] == {"task_id": source, "version": version}
    after = await h.get(source)
    assert (after.version, after.record.status) == (before.version, before.record.status)
    assert await h.history(source) == source_rows
    await h.close()


async def test_e4_a_call_the_source_made_is_answered_from_its_record_not_made_again(
        charged) -> None:
    h, runs, source = charged
    version, snap = await at_a_resume_point(h, source)
    fork_id = await h.fork(source, version)
    await h.run_until_idle(timeout=20)
    assert (await h.get(fork_id)).record.status is tt.Status.COMPLETED
    assert snap.call is not None
    made_again = [item for item, _ in runs[4:]]
    assert snap.call.args["item"] not in made_again  # answered from the source's record
    assert "reuse_result" in [r["resume_strategy"]
                              for r in await h.store.list_recovery_log(fork_id)]
    await h.close()


async def test_e4_asked_to_redo_side_effects_the_fork_makes_the_open_call_again(
        charged) -> None:
    h, runs, source = charged
    version, snap = await at_a_resume_point(h, source)
    assert snap.call is not None
    fork_id = await h.fork(source, version, redo_side_effects=True)
    await h.run_until_idle(timeout=20)
    redone = [(item, key) for item, key in runs[4:] if item == snap.call.args["item"]]
    assert len(redone) == 1 and redone[0][1].startswith(f"{fork_id}:")
    await h.close()


async def test_r14_a_fork_of_a_finished_version_waits_for_a_person(charged) -> None:
    h, _, source = charged
    fork_id = await h.fork(source)  # the newest version: completed
    info = await h.get(fork_id)
    assert info.record.status is tt.Status.PAUSED
    assert info.record.reason is None
    await h.close()


async def test_r14_a_fork_is_refused_by_name_and_stores_nothing(charged) -> None:
    h, _, source = charged
    with pytest.raises(tt.TaskNotFound):
        await h.fork("nope")
    with pytest.raises(tt.VersionNotFound):
        await h.fork(source, 9999)
    with pytest.raises(tt.TaskExists):
        await h.fork(source, new_task_id=source)
    with pytest.raises(tt.InvalidInput):
        await h.fork(source, new_task_id="bad id\n")
    assert [r.task_id for r in await h.store.list_tasks()] == [source]
    await h.close()


async def test_e4_a_fork_of_a_parked_call_a_person_since_settled_uses_their_answer() -> None:
    """The source parked with a call in doubt; a person then said it happened. A fork of the
    parked version knows that from the source's record: it carries on without a person and
    without making the call again."""
    h = tt.Harness("memory://", settings=fast_settings(keep_versions=50))
    sent: list[str] = []

    @h.tool(side_effect=True)
    async def send_invoice(ctx: tt.ToolContext, customer: str) -> str:
        sent.append(customer)
        raise tt.OutcomeUnknown("the mail gateway timed out after accepting the request")

    @h.agent("biller")
    class Biller(tt.Agent):
        async def plan(self, t):
            if t.step == 0:
                return tt.ToolCall("send_invoice", {"customer": "ACME"})
            return tt.Finish(t.last_tool_result)

    source = await h.submit("biller")
    await h.run_until_idle(timeout=20)
    assert (await h.get(source)).record.status is tt.Status.NEEDS_HUMAN
    parked = (await h.get(source)).version
    await h.decide(source, "happened", "invoice 42", by="ops")
    await h.run_until_idle(timeout=20)
    assert (await h.get(source)).snapshot.result == "invoice 42"
    fork_id = await h.fork(source, parked)
    await h.run_until_idle(timeout=20)
    fork = await h.get(fork_id)
    assert fork.record.status is tt.Status.COMPLETED and fork.snapshot.result == "invoice 42"
    assert sent == ["ACME"]  # once, by the source, never by the fork
    await h.close()
