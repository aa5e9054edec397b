"""OpenTelemetry traces, when asked for (the ``otel`` extra; R23).

Pass a tracer provider to the harness (``Harness(tracer_provider=provider)``); tether
never touches the global one. Each run of a task by a worker is one trace:

- ``tether.task`` (task id, version loaded, worker, crashed claim or not), linked to the
  span of the task's previous run, even one in another process: the previous run's
  span context travels in the snapshot (``Snapshot.trace``);
- ``tether.step`` for each step, with ``tether.plan`` (the model call) and ``tether.tool``
  (tool, idempotency key, attempt) inside;
- ``tether.event`` for each event applied (id, type, priority);
- ``tether.recovery`` for every recovery record (strategy, attempt, event id).

Without a provider every call here is a no-op costing one attribute check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tether.model import Snapshot


class Telemetry:
    """The harness's tracer, or nothing."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = tracer_provider.get_tracer("tether") if tracer_provider is not None else None

    def span(self, name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
        """A span; without a tracer, one shared do-nothing context (this is on the step path)."""
        if self.tracer is None:
            return _NO_SPAN
        return self.tracer.start_as_current_span(  # type: ignore[no-any-return]
            name, attributes=_clean(attributes))

    @contextlib.contextmanager
    def task_run(self, snap: Snapshot, **attributes: Any) -> Iterator[None]:
        """The root span of one run, linked to the previous run's; remembered in *snap*."""
        if self.tracer is None:
            yield
            return
        from opentelemetry import trace

        links = []
        previous = snap.trace or {}
        if previous.get("trace_id") and previous.get("span_id"):
            links.append(trace.Link(trace.SpanContext(
                int(previous["trace_id"], 16), int(previous["span_id"], 16), is_remote=True,
                trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))))
        with self.tracer.start_as_current_span("tether.task", links=links,
                                               attributes=_clean(attributes)) as span:
            context = span.get_span_context()
            snap.trace = {"trace_id": f"{context.trace_id:032x}",
                          "span_id": f"{context.span_id:016x}"}
            yield

    def recovery(self, record: dict[str, Any]) -> None:
        """One recovery action: a span of its own, inside the step or event that took it."""
        if self.tracer is None:
            return
        with self.tracer.start_as_current_span("tether.recovery", attributes=_clean({
                "tether.task_id": record.get("task_id"),
                "tether.version": record.get("checkpoint_version"),
                "tether.strategy": record.get("resume_strategy"),
                "tether.attempt": record.get("recovery_attempt"),
                "tether.event_id": record.get("event_id")})):
            pass


_NO_SPAN = contextlib.nullcontext()


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int and float attributes, never None."""
    return {key: value for key, value in attributes.items()
            if isinstance(value, str | bool | int | float)}
