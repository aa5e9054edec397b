"""R5, R8-R10 (with E3, R13, R14): the snapshot, the task stack, resume points and
idempotency, and what an agent is handed (copies) and may change (its scratch)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from _support import fast_settings, run_alongside, strategies, wait_until

import tether as tt
from tether.model import IdempotencyRecord, Snapshot, Status
from tether.store import Checkpoint
from tether.tools import args_hash


async def test_r08_snapshot_keeps_the_full_dialog(harness):
    """R8: the dialog holds user, assistant tool_call and tool result rows, never only the last N."""
    n_calls = 30

    @harness.tool
    async def echo(ctx: tt.ToolContext, i: int) -> dict:
        return {"i": i}

    @harness.agent("talker")
    class Talker(tt.Agent):
        async def plan(self, task):
            i = task.scratch.get("i", 0)
            if i == n_calls:
                return tt.Finish(len(task.history))
            task.scratch["i"] = i + 1
            return tt.ToolCall("echo", {"i": i})

    tid = await harness.submit("talker")
    await harness.emit(tt.Event("user_message", tid, {"text": "please echo"}))
    await harness.run_until_idle(timeout=10)

    info = await harness.get(tid)
    history = await harness.history(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(history) == info.snapshot.history_len
    assert history[0]["role"] == "user" and history[0]["content"] == {"text": "please echo"}
    tool_calls = [r["tool_call"] for r in history if r["role"] == "assistant" and "tool_call" in r]
    results = [r["content"] for r in history if r["role"] == "tool"]
    assert [c["args"] for c in tool_calls] == [{"i": i} for i in range(n_calls)]
    assert results == [{"i": i} for i in range(n_calls)]
    # the agent saw the whole dialog (user row + a call and a result per tool call) at the end
    assert info.snapshot.result == 1 + 2 * n_calls
    # meta and runtime sections of the snapshot
    snap = info.snapshot
    assert (snap.task_id, snap.agent, snap.status) == (tid, "talker", tt.Status.COMPLETED)
    assert snap.created_at <= time.time() and snap.step == n_calls + 1


async def test_r08_non_serialisable_tool_result_is_refused_not_snapshotted(harness):
    """R8: an object that does not serialise never enters a snapshot; the task goes to a person."""

    class SdkResponse:  # stands in for an SDK object with no JSON form
        pass

    @harness.tool
    async def call_sdk(ctx: tt.ToolContext) -> object:
        return SdkResponse()

    @harness.agent("sdk")
    class Sdk(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("call_sdk", {})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("sdk")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is not tt.Status.COMPLETED
    assert "serialisable" in (info.record.reason or "")


async def test_r09_nested_spawn_pushes_and_pops_frames_with_child_results(harness):
    """R9: Spawn pushes a frame, Finish pops back with the child's result; two levels deep, and the
    snapshot holds the whole stack while the innermost frame runs."""
    gate = asyncio.Event()
    in_leaf = asyncio.Event()
    depths: list[tuple[int, tuple[str, ...]]] = []

    @harness.tool
    async def measure(ctx: tt.ToolContext, x: int) -> int:
        in_leaf.set()
        await gate.wait()
        return x * 10

    @harness.agent("root")
    class Root(tt.Agent):
        async def plan(self, task):
            depths.append((task.depth, task.stack))
            if task.child_result is None:
                return tt.Spawn("middle", {"x": 4})
            return tt.Finish({"root_got": task.child_result})

    @harness.agent("middle")
    class Middle(tt.Agent):
        async def plan(self, task):
            depths.append((task.depth, task.stack))
            if task.child_result is None:
                return tt.Spawn("leaf", {"x": task.input["x"] + 1})
            return tt.Finish(task.child_result + 1)

    @harness.agent("leaf")
    class Leaf(tt.Agent):
        async def plan(self, task):
            depths.append((task.depth, task.stack))
            if task.last_tool_result is None:
                return tt.ToolCall("measure", {"x": task.input["x"]})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("root")
    seen = {}

    async def look() -> None:
        await in_leaf.wait()
        seen["snap"] = (await harness.get(tid)).snapshot
        gate.set()

    await run_alongside(harness, look(), timeout=5)
    stack = seen["snap"].stack
    assert [f.agent for f in stack] == ["root", "middle", "leaf"]
    assert [f.input for f in stack] == [None, {"x": 4}, {"x": 5}]
    assert seen["snap"].call.tool == "measure"
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == {"root_got": 51}
    assert len(info.snapshot.stack) == 1
    assert (2, ("root", "middle", "leaf")) in depths
    assert depths[-1] == (0, ("root",))


async def _seed_idempotency(h: tt.Harness, tid: str, tool: str, args: dict, result) -> str:
    """Write, through the store protocol, the record an earlier run left for the task's first call."""
    version, head = await h.store.load_head(tid)
    snap = Snapshot.loads(head, tid, version)
    key = f"{tid}:{snap.frame.frame_id}:0"
    claim = await h.store.claim_task(tid, "earlier-worker", time.time(), 5)
    assert claim is not None
    record = IdempotencyRecord(key, tid, tool, args_hash(tool, args), "succeeded", result, None, 1)
    await h.store.commit(claim, Checkpoint(head=head, status=Status.PENDING, idempotency=[record]),
                         10, time.time() + 5)
    await h.store.release(claim)
    return key


def refund_harness(h: tt.Harness, runs: list[dict]) -> None:
    @h.tool(side_effect=True)
    async def refund(ctx: tt.ToolContext, order: str, amount: int) -> dict:
        runs.append({"order": order, "amount": amount})
        return {"refunded": amount, "fresh": True}

    @h.agent("refunder")
    class Refunder(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("refund", task.input)
            return tt.Finish(task.last_tool_result)


async def test_r10_succeeded_key_returns_stored_result_without_running(harness):
    """R10, R15: a call whose idempotency key already succeeded returns the stored result; the
    side-effecting tool does not run (the customer is not refunded twice)."""
    runs: list[dict] = []
    refund_harness(harness, runs)
    args = {"order": "A1", "amount": 30}
    tid = await harness.submit("refunder", args)
    key = await _seed_idempotency(harness, tid, "refund", args, {"refunded": 30, "fresh": False})

    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert runs == []
    assert info.record.status is tt.Status.COMPLETED
    assert info.snapshot.result == {"refunded": 30, "fresh": False}
    assert "reuse_result" in await strategies(harness, tid)
    assert (await harness.store.get_idempotency(key)).status == "succeeded"


async def test_e3_same_key_other_args_is_not_answered_from_cache(harness):
    """E3: a record under the same key but for other arguments is a different call: the tool runs
    under its own key, and the mismatch is logged."""
    runs: list[dict] = []
    refund_harness(harness, runs)
    tid = await harness.submit("refunder", {"order": "A1", "amount": 99})
    key = await _seed_idempotency(harness, tid, "refund", {"order": "A1", "amount": 30},
                                  {"refunded": 30, "fresh": False})

    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert runs == [{"order": "A1", "amount": 99}]
    assert info.snapshot.result == {"refunded": 99, "fresh": True}
    assert "idempotency_mismatch" in await strategies(harness, tid)
    keys = {r.key: r for r in await harness.store.list_idempotency(tid)}
    assert keys[key].result == {"refunded": 30, "fresh": False}  # the old record is untouched
    (new_key,) = [k for k in keys if k != key]
    assert new_key.startswith(key + ":") and keys[new_key].status == "succeeded"


async def test_r08_temp_file_resource_is_cleaned_up_when_task_completes(harness, tmp_path: Path):
    """R8: resources a tool registers (`ctx.add_resource("temp_file", path)`) are in the snapshot
    with their cleanup policy and are deleted when the task completes; `keep` ones stay."""
    scratch_file = tmp_path / "scratch.txt"
    kept_file = tmp_path / "report.txt"
    existed: list[bool] = []

    @harness.tool
    async def write_files(ctx: tt.ToolContext) -> str:
        scratch_file.write_text("tmp")
        kept_file.write_text("report")
        ctx.add_resource("temp_file", str(scratch_file))
        ctx.add_resource("temp_file", str(kept_file), cleanup="keep")
        return "written"

    @harness.agent("writer")
    class Writer(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("write_files", {})
            existed.append(scratch_file.exists())
            return tt.Finish("ok")

    tid = await harness.submit("writer")
    await harness.run_until_idle(timeout=5)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert existed == [True]
    assert [(r.kind, r.ref, r.cleanup) for r in info.snapshot.resources] == [
        ("temp_file", str(scratch_file), "on_finish"), ("temp_file", str(kept_file), "keep")]
    assert not scratch_file.exists()
    assert kept_file.exists()


async def test_r13_r14_head_size_does_not_grow_with_the_dialog(harness):
    """R13/R14 design (design.md "How a step is stored"): the head stays small; the dialog lives in
    history rows, so the head at step 10 and at step 200 are about the same size."""
    sizes: dict[int, int] = {}
    total = 200

    @harness.tool
    async def tick(ctx: tt.ToolContext, i: int) -> dict:
        return {"i": i, "text": "x" * 50}

    @harness.agent("long")
    class Long(tt.Agent):
        async def plan(self, task):
            if task.step in (10, total):
                _, head = await harness.store.load_head(task.task_id)
                sizes[task.step] = len(head)
            if task.step == total:
                return tt.Finish(task.step)
            return tt.ToolCall("tick", {"i": task.step})

    tid = await harness.submit("long")
    await harness.run_until_idle(timeout=30)
    info = await harness.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(await harness.history(tid)) == 2 * total + 1  # + the finish row
    assert set(sizes) == {10, total}
    assert sizes[total] <= sizes[10] * 1.1, sizes
    versions = await harness.store.list_versions(tid)
    assert len(versions) == harness.settings.keep_versions
    assert max(size for _, _, size in versions) < 2 * sizes[10]


async def test_r10_resume_point_is_committed_before_the_tool_runs(harness):
    """R10: before a tool runs, a checkpoint records its inputs and key (status "started")."""
    seen: dict = {}

    @harness.tool(side_effect=True)
    async def pay(ctx: tt.ToolContext, amount: int) -> str:
        _, head = await harness.store.load_head(ctx.task_id)
        seen["snap"] = Snapshot.loads(head, ctx.task_id, 0)
        seen["record"] = await harness.store.get_idempotency(ctx.idempotency_key)
        seen["key"] = ctx.idempotency_key
        return "paid"

    @harness.agent("payer")
    class Payer(tt.Agent):
        async def plan(self, task):
            if task.last_tool_result is None:
                return tt.ToolCall("pay", {"amount": 5})
            return tt.Finish(task.last_tool_result)

    tid = await harness.submit("payer")
    await harness.run_until_idle(timeout=5)
    call = seen["snap"].call
    assert call is not None and call.status == "started"
    assert (call.tool, call.args, call.key) == ("pay", {"amount": 5}, seen["key"])
    assert seen["record"].status == "started" and seen["record"].args_hash == call.args_hash
    assert (await harness.get(tid)).record.status is tt.Status.COMPLETED


async def test_r9_interrupt_unhandled_by_child_is_handled_by_the_batch_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """R9 (r8): in the contract batch, a second "reparse" interrupt arrives while the first
    re-parse subtask is on top of the stack. The child agent does not handle it; it is offered
    to the parent batch agent, which does: both files are re-parsed and the task completes
    (before the fix it went unhandled at the top and the task paused)."""
    from tether.examples import build_harness, contract_files

    monkeypatch.setenv("TETHER_DEMO_PARSE_SECONDS", "0.05")
    h = build_harness("memory://", ledger_path=str(tmp_path / "ledger.db"))
    tid = await h.submit("contracts", {"files": contract_files(6)})

    def top_agent() -> str | None:
        runner = h.runners.get(tid)
        return runner.snap.stack[-1].agent if runner is not None else None

    def step() -> int:
        runner = h.runners.get(tid)
        return runner.snap.step if runner is not None else 0

    async def user() -> list[str]:
        await wait_until(lambda: step() >= 2, what="the batch to be under way")
        await h.emit(tt.Event("user_interrupt", tid, {"reparse": "contract-05.pdf"}))
        await wait_until(lambda: top_agent() == "reparse_contract", what="the re-parse child")
        stack = [f.agent for f in h.runners[tid].snap.stack]
        await h.emit(tt.Event("user_interrupt", tid, {"reparse": "contract-02.pdf"}))
        return stack

    [stack] = await run_alongside(h, user())
    assert stack == ["contracts", "reparse_contract"]

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, (
        f"{info.record.status.value}: {await strategies(h, tid)}")
    assert info.snapshot.stack[0].scratch["reparsed"] == ["contract-05.pdf", "contract-02.pdf"]
    assert info.snapshot.result["parsed"] == 6
    careful = [r["tool_call"]["args"]["file"] for r in await h.history(tid)
               if "tool_call" in r and r["tool_call"]["args"].get("careful")]
    assert sorted(careful) == ["contract-02.pdf", "contract-05.pdf"]
    assert "pause" not in await strategies(h, tid)
    await h.close()


async def test_r5_on_event_scratch_changes_are_kept_when_it_returns_none():
    """R5 (r3): on_event may change task.scratch and still return None (take the default);
    those changes are saved, top-level and nested alike (it works on a deep copy that is
    stored afterwards, not a shallow copy that is thrown away)."""
    h = tt.Harness("memory://", settings=fast_settings())

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            t.scratch.setdefault("seen", [])
            t.scratch.setdefault("count", 0)
            return tt.Wait("approval")

        async def on_event(self, t, e):
            t.scratch["count"] += 1  # top-level change
            t.scratch["seen"].append(e.type)  # nested change
            return None

    tid = await h.submit("a")
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("user_message", tid, "hi"))
    await h.run_until_idle(timeout=5)
    await h.emit(tt.Event("follow_up", tid, "still there?"))
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.snapshot.frame.scratch == {"seen": ["user_message", "follow_up"], "count": 2}
    assert info.record.status is tt.Status.WAITING
    await h.close()


async def test_r8_taskview_hands_out_copies_and_read_only_history():
    """R8 (r12): TaskView.input, last_tool_result and child_result are copies, and history
    entries are read-only mappings: an agent mutating them in plan() cannot change the
    stored frame input, tool result, child result or dialog."""
    h = tt.Harness("memory://", settings=fast_settings())
    seen: list[str] = []

    @h.tool()
    async def t1(ctx: tt.ToolContext) -> dict[str, Any]:
        return {"rows": [1, 2]}

    @h.agent("kid")
    class Kid(tt.Agent):
        async def plan(self, t):
            return tt.Finish({"k": [1]})

    @h.agent("a")
    class A(tt.Agent):
        async def plan(self, t):
            if not t.scratch.get("spawned"):
                t.scratch["spawned"] = True
                return tt.Spawn("kid", {})
            if t.last_tool_result is None:
                return tt.ToolCall("t1", {})
            t.input["files"].append("injected.pdf")
            t.last_tool_result["rows"].append(99)
            t.child_result["k"].append(2)
            last = t.history[-1]
            seen.append("mapping" if isinstance(last, Mapping) else "other")
            try:
                last["content"] = "rewritten"  # type: ignore[index]
                seen.append("history writable")
            except TypeError:
                seen.append("history read-only")
            return tt.Finish("done")

    tid = await h.submit("a", {"files": ["a.pdf"]})
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED, info.snapshot.error
    frame = info.snapshot.frame
    assert frame.input == {"files": ["a.pdf"]}
    assert info.snapshot.input == {"files": ["a.pdf"]}
    assert frame.last_tool_result == {"rows": [1, 2]}
    assert frame.child_result == {"k": [1]}
    assert seen == ["mapping", "history read-only"]
    assert [r["content"] for r in await h.history(tid) if r.get("role") == "tool"] == \
        [{"rows": [1, 2]}]
    await h.close()


async def test_r8_resources_from_failed_attempts_are_recorded_and_cleaned_up(tmp_path: Path):
    """R8 (r3): a tool attempt that registers a temp file and then fails still leaves that
    resource in the snapshot, so it is cleaned up with the others when the task ends."""
    h = tt.Harness("memory://", settings=fast_settings())
    made: list[Path] = []

    @h.tool(retry=tt.RetryPolicy(max_attempts=2, backoff=0.001))
    async def convert(ctx: tt.ToolContext) -> str:
        path = tmp_path / f"part-{len(made)}.tmp"
        path.write_text("x")
        made.append(path)
        ctx.add_resource("temp_file", str(path))
        if len(made) < 2:
            raise ConnectionError("upstream 503")
        return "ok"

    @h.agent("b")
    class B(tt.Agent):
        async def plan(self, t):
            return tt.ToolCall("convert", {}) if t.last_tool_result is None else tt.Finish(1)

    tid = await h.submit("b")
    await h.run_until_idle(timeout=5)

    info = await h.get(tid)
    assert info.record.status is tt.Status.COMPLETED
    assert len(made) == 2
    assert [r.ref for r in info.snapshot.resources] == [str(p) for p in made]
    assert [p for p in made if p.exists()] == [], "a temp file of a failed attempt was left behind"
    await h.close()
