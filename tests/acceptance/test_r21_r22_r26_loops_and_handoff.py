"""R21, R22, R23, R26 (with E8): no ghost recovery, loop breaking, structured recovery records,
and "needs a person" as a normal path."""

from __future__ import annotations

import asyncio
import logging

from _support import fast_settings, strategies

import tether as tt

R23_FIELDS = ("task_id", "checkpoint_version", "event_id", "resume_strategy", "recovery_attempt")


def broken_dependency(h: tt.Harness, state: dict) -> None:
    """A tool that fails the same way every time until a person fixes the dependency."""

    @h.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=0.001))
    async def query_db(ctx: tt.ToolContext, sql: str) -> list:
        state["calls"] = state.get("calls", 0) + 1
        if not state.get("fixed"):
            raise ConnectionRefusedError(f"connection refused by db-{state['calls']}:5432")
        return [{"rows": 1}]

    @h.agent("reporter")
    class Reporter(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("query_db", {"sql": "select 1"})
            return tt.Finish({"rows": task.last_tool_result,
                              "note": task.scratch.get("note"),
                              "dialog_roles": [r["role"] for r in task.history]})


async def parked(h: tt.Harness, state: dict) -> str:
    tid = await h.submit("reporter")
    await h.run_until_idle(timeout=5)
    assert (await h.get(tid)).record.status is tt.Status.NEEDS_HUMAN
    return tid


async def test_r22_same_failure_fingerprint_stops_retrying_and_notifies_with_bundle():
    """R22, R26: the same failure again is not retried again: after one recovery round the task
    goes to needs_human, the reason names the fingerprint, and the notifier gets a full bundle."""
    bundles: list[dict] = []
    h = tt.Harness("memory://", settings=fast_settings(), notifier=bundles.append)
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)

    # one round of the tool's own retries (2), one recovery, one more round (2): then stop
    assert state["calls"] == 4
    info = await h.get(tid)
    assert "fingerprint" in info.record.reason and "query_db:" in info.record.reason
    assert info.snapshot.error == info.record.reason
    assert (await strategies(h, tid)).count("retry_backoff") == 1
    assert len(bundles) == 1
    bundle = bundles[0]
    for key in ("snapshot", "history", "events", "recovery_log", "failure_reasons"):
        assert key in bundle, key
    assert bundle["task"]["status"] == "needs_human"
    assert bundle["reason"] == info.record.reason
    assert any("fingerprint" in reason for reason in bundle["failure_reasons"])
    assert bundle["snapshot"]["call"]["tool"] == "query_db"
    assert [r["resume_strategy"] for r in bundle["recovery_log"]][-1] == "needs_human"
    assert any(r.get("error", "").startswith("ConnectionRefusedError") for r in bundle["history"])
    await h.close()


async def test_r21_duplicate_resume_signals_cause_one_recovery():
    """R21: 100 resume signals for one needs_human task (repeated and distinct source ids, some
    at once) cause exactly one `human_resume`."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)
    state["fixed"] = True

    same_id = [h.resume(tid, source_event_id="ops-click-1") for _ in range(40)]
    distinct = [h.resume(tid, source_event_id=f"ops-click-{i}") for i in range(2, 32)]
    await asyncio.gather(*same_id, *distinct)
    for i in range(30):  # and some arriving one after another, with and without ids
        await h.resume(tid, source_event_id=None if i % 2 else f"late-{i}")
    await h.run_until_idle(timeout=5)

    log = await h.store.list_recovery_log(tid)
    assert [r["resume_strategy"] for r in log].count("human_resume") == 1
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert state["calls"] == 5  # 4 failing attempts before the handoff, one after
    await h.close()


async def test_r26_person_resumes_with_message_and_frame_patch_and_task_completes():
    """R26: a person fixes the cause, amends the task (frame_patch) and resumes it with a message;
    the task completes and the message is in the dialog."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    tid = await parked(h, state)

    state["fixed"] = True
    receipt = await h.resume(tid, message="restarted the database", frame_patch={"note": "db fixed"})
    assert receipt.accepted
    assert (await h.get(tid)).record.status is tt.Status.RUNNING
    await h.run_until_idle(timeout=5)
    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result["rows"] == [{"rows": 1}]
    assert info.snapshot.result["note"] == "db fixed"
    assert info.record.reason is None and info.snapshot.error is None
    history = await h.history(tid)
    assert {"role": "user", "type": "resume", "content": "restarted the database"}.items() <= \
        next(r for r in history if r.get("type") == "resume").items()
    await h.close()


async def test_r26_export_bundle_of_parked_task(harness):
    """R26: `harness.export` returns one bundle with state, failure reasons and context."""
    state: dict = {}
    broken_dependency(harness, state)
    tid = await parked(harness, state)
    bundle = await harness.export(tid)
    assert bundle["task"]["task_id"] == tid and bundle["task"]["status"] == "needs_human"
    assert bundle["snapshot"]["task_id"] == tid
    assert bundle["snapshot_version"] == (await harness.get(tid)).version
    assert bundle["history"] == await harness.history(tid)
    assert bundle["failure_reasons"] and bundle["recovery_log"]
    assert {r["status"] for r in bundle["idempotency"]} == {"failed"}
    assert bundle["versions"] and all("created_at" in v for v in bundle["versions"])


async def test_e8_planned_tool_removed_by_deploy_goes_to_needs_human_naming_it(db_url):
    """E8: code changed between interruption and resume: the recorded step names a tool that no
    longer exists, so the task goes to needs_human with that name, and the worker keeps working."""
    started = asyncio.Event()

    old = tt.Harness(db_url, settings=fast_settings())

    @old.tool(interruptible=True)
    async def legacy_export(ctx: tt.ToolContext, fmt: str) -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    def register_agent(h: tt.Harness) -> None:
        @h.agent("exporter")
        class Exporter(tt.Agent):
            async def plan(self, task):
                if task.last_tool_result is None:
                    return tt.ToolCall("legacy_export", {"fmt": "csv"})
                return tt.Finish(task.last_tool_result)

    register_agent(old)
    tid = await old.submit("exporter")

    async def interrupt() -> None:
        await started.wait()
        await old.emit(tt.Event("user_interrupt", tid, {}))

    await asyncio.gather(old.run_until_idle(timeout=5), interrupt())
    paused = await old.get(tid)
    assert paused.record.status is tt.Status.PAUSED
    assert paused.snapshot.frame.agenda[0]["name"] == "legacy_export"
    await old.close()

    new = tt.Harness(db_url, settings=fast_settings())  # the deploy: the tool is gone
    register_agent(new)

    @new.tool
    async def other(ctx: tt.ToolContext) -> str:
        return "fine"

    @new.agent("healthy")
    class Healthy(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("other", {})
            return tt.Finish(task.last_tool_result)

    ok = await new.submit("healthy")
    await new.resume(tid)
    await new.run_until_idle(timeout=5)
    info = await new.get(tid)
    assert info.record.status is tt.Status.NEEDS_HUMAN
    assert "legacy_export" in info.record.reason
    assert (await new.get(ok)).record.status is tt.Status.COMPLETED
    await new.close()


async def test_r23_every_recovery_record_is_structured_and_logged(caplog):
    """R23: every recovery action writes one record with task_id, checkpoint_version, event_id,
    resume_strategy and recovery_attempt, and the `tether.recovery` logger emits it with
    `extra={"tether": ...}`."""
    h = tt.Harness("memory://", settings=fast_settings())
    state: dict = {}
    broken_dependency(h, state)
    with caplog.at_level(logging.INFO, logger="tether.recovery"):
        tid = await parked(h, state)
        state["fixed"] = True
        await h.resume(tid, message="fixed")
        await h.run_until_idle(timeout=5)

    log = await h.store.list_recovery_log(tid)
    assert {r["resume_strategy"] for r in log} >= {"retry_backoff", "needs_human", "human_resume"}
    for record in log:
        for field in R23_FIELDS:
            assert field in record, (field, record)
        assert record["task_id"] == tid
        assert isinstance(record["checkpoint_version"], int)
    resume = next(r for r in log if r["resume_strategy"] == "human_resume")
    assert isinstance(resume["event_id"], int)
    assert next(r for r in log if r["resume_strategy"] == "retry_backoff")["recovery_attempt"] == 1

    emitted = [r for r in caplog.records if r.name == "tether.recovery"]
    assert len(emitted) == len(log)
    for rec in emitted:
        data = rec.tether
        for field in R23_FIELDS:
            assert field in data, (field, data)
    assert [r.tether["resume_strategy"] for r in emitted] == [r["resume_strategy"] for r in log]
