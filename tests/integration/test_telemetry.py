"""R23: OpenTelemetry spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

import tether as tt

otel = pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


def traced(db: Path) -> tuple[tt.Harness, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(poll_interval=0.01),
                   tracer_provider=provider)

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, q: str) -> str:
        return q.upper()

    @h.agent("asker")
    class Asker(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.step == 0:
                return tt.ToolCall("lookup", {"q": "a"})
            if t.last_event is None:
                return tt.Wait("approval")
            return tt.Finish(t.last_tool_result)

    return h, exporter


async def test_r23_a_run_is_a_trace_of_steps_plans_tools_and_events_linked_across_processes(
        tmp_path: Path) -> None:
    first, spans_1 = traced(tmp_path / "t.db")
    tid = await first.submit("asker")
    await first.run_until_idle(timeout=5)
    await first.close()
    run_1 = [s for s in spans_1.get_finished_spans() if s.name == "tether.task"]
    assert len(run_1) == 1 and run_1[0].attributes["tether.task_id"] == tid
    names = {s.name for s in spans_1.get_finished_spans()}
    assert {"tether.task", "tether.step", "tether.plan", "tether.tool"} <= names
    tool = next(s for s in spans_1.get_finished_spans() if s.name == "tether.tool")
    assert tool.attributes["tether.tool"] == "lookup" and tool.attributes["tether.attempt"] == 1
    assert tool.context.trace_id == run_1[0].context.trace_id  # one trace per run

    second, spans_2 = traced(tmp_path / "t.db")  # another process, after the approval
    await second.emit(tt.Event("approval", tid, "ok"))
    await second.run_until_idle(timeout=5)
    run_2 = [s for s in spans_2.get_finished_spans() if s.name == "tether.task"]
    assert len(run_2) == 1
    assert [link.context.span_id for link in run_2[0].links] == [run_1[0].context.span_id]
    event = next(s for s in spans_2.get_finished_spans() if s.name == "tether.event")
    assert event.attributes["tether.event_type"] == "approval" and event.attributes["tether.priority"] == 1
    await second.close()


async def test_r23_recoveries_are_spans_with_their_strategy(tmp_path: Path) -> None:
    h, spans = traced(tmp_path / "t.db")
    tid = await h.submit("asker")
    await h.run_until_idle(timeout=5)
    versions = await h.store.list_versions(tid)
    await h.rollback(tid, versions[0][0])
    recoveries = [s for s in spans.get_finished_spans() if s.name == "tether.recovery"]
    assert "rollback" in [s.attributes["tether.strategy"] for s in recoveries]
    rollback = next(s for s in recoveries if s.attributes["tether.strategy"] == "rollback")
    assert rollback.attributes["tether.task_id"] == tid and "tether.event_id" in rollback.attributes
    await h.close()
