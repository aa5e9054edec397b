"""Random sequences of submit / emit / run / crash / rollback / resume against a simple model
(hypothesis stateful testing; R6, R10, R14, R19, R21).

"Crash" abandons a worker in the middle of its work without releasing anything (its leases
must expire) and opens a new harness on the same SQLite file, as a restarted process would.

How far a timed run gets depends on the machine's load, so no draw may depend on it: hypothesis
replays a sequence by its draws, and a draw whose range came from what a run left (the kept
versions, say) replays differently under load (FlakyStrategyDefinition). Every draw here is
made from ranges fixed by the rules alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import tether as tt
from tether.model import Snapshot

LEASE = 0.05
FINISHED = {tt.Status.COMPLETED, tt.Status.CANCELLED, tt.Status.FAILED}


class Gate:
    """Holds one charge call just after its side effect until its worker is abandoned: a crash
    at the most dangerous instant, reached by the order of the program, not by timing."""

    def __init__(self) -> None:
        self.armed = False
        self.reached = asyncio.Event()

    async def hold(self) -> None:
        if self.armed:
            self.armed = False
            self.reached.set()
            await asyncio.Event().wait()  # never set: the crash cancels the worker here


def _harness(path: Path, charges: Counter[str], gate: Gate) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{path}", settings=tt.Settings(
        lease_seconds=LEASE, poll_interval=0.005, recovery_backoff=0.001, drain_timeout=0.001,
        max_recovery_attempts=50))

    @h.tool(side_effect=True)
    async def charge(ctx: tt.ToolContext, n: int) -> int:
        charges[ctx.idempotency_key] += 1
        await gate.hold()
        await asyncio.sleep(0.002)
        return n

    @charge.reconcile
    async def _(ctx: tt.ToolContext, n: int) -> int | None:
        return n if charges[ctx.idempotency_key] else None

    @h.tool(idempotent=True)
    async def lookup(ctx: tt.ToolContext, n: int) -> int:
        return n * 2

    @h.agent("job")
    class Job(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            i = t.scratch.get("i", 0)
            if i >= t.input["steps"]:
                return tt.Finish(i)
            t.scratch["i"] = i + 1
            return tt.ToolCall("lookup" if i % 2 else "charge", {"n": i})  # a charge first

    return h


class Machine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.folder = Path(tempfile.mkdtemp(prefix="tether-prop-"))
        self.path = self.folder / "t.db"
        self.charges: Counter[str] = Counter()
        self.gate = Gate()
        self.harness = _harness(self.path, self.charges, self.gate)
        self.tasks: list[str] = []
        self.cancelled: dict[str, int] = {}
        self.seen_sources: set[tuple[str, str]] = set()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.harness.close())
        self.loop.close()

    @rule(steps=st.integers(1, 4))
    def submit(self, steps: int) -> None:
        self.tasks.append(self.run(self.harness.submit("job", {"steps": steps})))

    @precondition(lambda self: bool(self.tasks))  # self.tasks grows only by submit
    @rule(data=st.data(), kind=st.sampled_from(
        ["user_message", "progress", "heartbeat", "user_interrupt", "resume", "cancel"]),
        source=st.sampled_from([None, "a", "b"]))
    def emit(self, data: st.DataObject, kind: str, source: str | None) -> None:
        """An event, or a person's lever (resume and cancel have methods of their own: a
        plain event of those types is refused); a repeated source id is stored once (R6)."""
        task_id = data.draw(st.sampled_from(self.tasks))
        if kind == "cancel":
            with contextlib.suppress(tt.TaskClosed):
                self.run(self.harness.cancel(task_id, by="model"))
            return
        try:
            if kind == "resume":
                receipt = self.run(self.harness.resume(task_id, "x", source_event_id=source,
                                                       by="model"))
            else:
                receipt = self.run(self.harness.emit(tt.Event(kind, task_id, "x",
                                                              source_event_id=source)))
        except (tt.TaskClosed, tt.InDoubtCall):
            return
        if source is not None:
            assert receipt.accepted == ((task_id, source) not in self.seen_sources)
            self.seen_sources.add((task_id, source))

    @rule(timeout=st.none() | st.floats(0.01, 0.3))
    def run_for_a_while(self, timeout: float | None) -> None:
        """Run for a while, or (None) until no task has work left."""
        with contextlib.suppress(TimeoutError):
            self.run(self.harness.run_until_idle(timeout=timeout or 20))

    @precondition(lambda self: bool(self.tasks))  # self.tasks grows only by submit
    @rule(timed=st.booleans(), after=st.floats(0.0, 0.03))
    def crash(self, timed: bool, after: float) -> None:
        """A worker dies mid-work: nothing released, nothing flushed. Inside a charge call
        whose side effect just happened (if one runs before the worker runs out of work), or,
        if *timed*, after *after* seconds, wherever that is. The first is hypothesis's simplest
        choice, so the most dangerous instant is reached whatever the load."""
        async def die() -> None:
            worker = asyncio.ensure_future(self.harness.run_until_idle(timeout=5))
            if not timed:
                self.gate.armed = True
                self.gate.reached.clear()
                reached = asyncio.ensure_future(self.gate.reached.wait())
                await asyncio.wait({worker, reached}, return_when=asyncio.FIRST_COMPLETED)
                self.gate.armed = False
                reached.cancel()
            else:
                await asyncio.sleep(after)
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        self.run(die())
        self.run(self.harness.close())
        self.harness = _harness(self.path, self.charges, self.gate)
        self.run(asyncio.sleep(LEASE * 1.5))

    @precondition(lambda self: bool(self.tasks))  # self.tasks grows only by submit
    @rule(data=st.data(), ordinal=st.integers(0, 63))
    def rollback(self, data: st.DataObject, ordinal: int) -> None:
        """Roll a task back to one of its kept versions. Which versions are kept depends on how
        far the timed runs got, so the draw must not: *ordinal* is drawn whatever the run left
        and picks a kept version modulo their number (a draw from the kept list itself made
        hypothesis replay a different choice sequence: FlakyStrategyDefinition under load)."""
        task_id = data.draw(st.sampled_from(self.tasks))
        kept = [v for v, _, _ in self.run(self.harness.store.list_versions(task_id))]
        with contextlib.suppress(tt.TaskClosed, tt.VersionNotFound):
            self.run(self.harness.rollback(task_id, kept[ordinal % len(kept)]))

    @invariant()
    def no_side_effect_repeated(self) -> None:
        if hasattr(self, "charges"):
            assert all(n == 1 for n in self.charges.values()), self.charges

    @invariant()
    def state_is_whole(self) -> None:
        for task_id in getattr(self, "tasks", []):
            record = self.run(self.harness.store.get_task(task_id))
            for version, _, _ in self.run(self.harness.store.list_versions(task_id)):
                _, head = self.run(self.harness.store.load_head(task_id, version))
                Snapshot.loads(head, task_id, version)
            info = self.run(self.harness.get(task_id))
            assert len(self.run(self.harness.history(task_id))) == info.snapshot.history_len
            if record.status is tt.Status.CANCELLED:
                steps = self.cancelled.setdefault(task_id, info.snapshot.step)
                assert info.snapshot.step == steps, "a cancelled task ran again"
            if record.status in (tt.Status.COMPLETED, tt.Status.CANCELLED):
                pending = [e for e in self.run(self.harness.store.pending_events(task_id))
                           if e.event.type not in ("rollback", "resume", "cancel")]
                assert pending == [], pending


Machine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=12, deadline=None, derandomize=True,
    database=None, suppress_health_check=list(HealthCheck))
TestStateful = Machine.TestCase


def test_the_model_catches_a_harness_without_its_idempotency_guard(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: with in-doubt calls re-run blindly, the same random sequences find a
    side effect repeated. A property test that cannot fail proves nothing.

    The repeat is seen where the model sees it (its invariant), not in what hypothesis raises
    afterwards: hypothesis replays a failing sequence to report it, and a replay whose timed
    crash lands elsewhere is reported as flaky instead of as the repeat the first run found."""
    import tether.engine.recovery

    async def rerun_blindly(runner: Any) -> None:
        runner.snap.call.status = "planned"

    repeats: list[str] = []

    class Watched(Machine):
        @invariant()
        def no_side_effect_repeated(self) -> None:
            try:
                super().no_side_effect_repeated()
            except AssertionError as repeat:
                repeats.append(str(repeat))
                raise

    monkeypatch.setattr(tether.engine.calls, "resolve_in_doubt", rerun_blindly)
    generate_only = settings(Machine.TestCase.settings, phases=[Phase.generate],
                             report_multiple_bugs=False)
    with pytest.raises(Exception):  # noqa: B017 (the repeat itself is checked below)
        run_state_machine_as_test(Watched, settings=generate_only)
    assert repeats and all("Counter" in repeat for repeat in repeats), repeats
