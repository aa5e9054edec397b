"""One OpenAI Agents SDK agent made durable two ways: by tether, and by DBOS's own integration.

The same shape as ``pydantic_ai_durable.py``, for the OpenAI Agents SDK: the agent is the same
``agents.Agent`` in every run, and only what makes it durable changes:

* **plain**: ``agents.Runner.run(agent, ...)``, no durability: the baseline every overhead is
  taken from;
* **tether**: the agent under :class:`tether.integrations.openai_agents.OpenAIAgentsAgent`,
  on the embedded SQLite store with default settings (``stream=False``, because the model
  below does not stream; the tool marked ``idempotent``);
* **dbos**: DBOS's integration for the Agents SDK (the ``dbos-openai-agents`` package,
  ``DBOSRunner.run`` inside a ``@DBOS.workflow``; each model call a DBOS step, the tool a
  ``@DBOS.step`` as its README says), DBOS's system database on a SQLite file. It is a
  column only where that package is installed (``bench/requirements.txt`` does not list it
  yet: ``.bench-venv/bin/pip install 'dbos-openai-agents==0.3.0'``, and tether's extra
  ``openai-agents``); without it the report says so and shows the other two.

Temporal's integration (``temporalio.contrib.openai_agents``) needs a Temporal server, which
its test environment downloads at run time; it is not measured here.

The agent: a deterministic ``agents.models.interface.Model`` that asks for the tool until the
input holds N tool results, then answers ``done N`` (it counts the ``function_call_output``
items it is given, so a restarted run continues where its history is, as PydanticAI's
``FunctionModel`` does in the other bench); one idempotent ``@function_tool`` with a
~200-byte argument and a ~500-byte result (the sizes of ``workload.py``) that does no work.
Tracing is off in every run (``RunConfig(tracing_disabled=True)``). Any time above the plain
run is therefore the durable runner's own cost.

The figures are those of ``pydantic_ai_durable.py`` (see its docstring): overhead per tool
call (whole run after a 2-call warm-up, minus the plain run of the same round, over N;
rounds interleaved, medians, wall and CPU clock), and completions after a SIGKILL inside tool
call N/2.

    .bench-venv/bin/python bench/openai_agents_durable.py [--steps 10,100,300] [--rounds 3]
        [--out docs/benchmarks-openai-agents.md]

prints markdown tables and exits 0 (1 if a run failed).

    .bench-venv/bin/python bench/openai_agents_durable.py --profile 100 [--adapter pydantic-ai]

instead profiles tether's (with ``--system plain`` the plain run's) timed run of N tool calls
(pyinstrument where installed, else cProfile; after the warm-up run, in this one process) for
this bench's agent or, with ``--adapter pydantic-ai``, for ``pydantic_ai_durable.py``'s, and
prints the top functions with their ms per tool call.
"""

from __future__ import annotations

import asyncio
import cProfile
import importlib.util
import io
import pstats
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agent_runs import AgentBench, Go, Killed, Probe, Session, Timed, run_each, tether_sessions, timed_as
from workload import ARG

HAS_DBOS = (importlib.util.find_spec("dbos") is not None
            and importlib.util.find_spec("dbos_openai_agents") is not None)
SYSTEMS: tuple[str, ...] = ("plain", "tether", "dbos") if HAS_DBOS else ("plain", "tether")
LABELS = {
    "plain": "Agents SDK Runner.run, no durability",
    "tether": "tether OpenAIAgentsAgent, SQLite (default)",
    "dbos": "DBOS DBOSRunner (dbos-openai-agents), DBOS SQLite",
}
PROMPT = "Work through the list."
PACKAGES = ("openai-agents", "dbos", "dbos-openai-agents", "tether")
"""Whose versions the tables name."""
WORKFLOW_ID = "oa-bench"
LEASE = 1.0
"""tether's lease in the kill figure only: the restarted process waits this out (the default,
15 s, would only make the figure slow; the counts do not depend on it)."""
PROFILER: cProfile.Profile | None = None
"""Set in a ``--profile`` child: on only while the timed run runs."""


# ---------------------------------------------------------------------------- the child


def run_config() -> Any:
    """Every system's run config: tracing off (no exporter, no API key)."""
    from agents import RunConfig

    return RunConfig(tracing_disabled=True)


def max_turns(steps: int) -> int:
    """The SDK's Runner stops a run at 10 turns by default; a run of N calls needs N+1."""
    return steps + 10


def build_agent(probe: Probe, system: str) -> Any:
    """The agent every system runs; only *system* ``dbos`` makes the tool a DBOS step."""
    from agents import Agent, ModelResponse, Usage, function_tool
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call

    class Scripted(Model):
        """Ask for the next tool call until the input holds N tool results, then answer."""

        async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                               **kwargs: Any) -> ModelResponse:
            probe.model_called()
            items = [] if isinstance(input, str) else input
            done = sum((item.get("type") if isinstance(item, dict) else
                        getattr(item, "type", None)) == "function_call_output" for item in items)
            output = ([assistant_message(f"done {done}")] if done >= probe.steps else
                      [function_call("work", {"payload": ARG, "n": done}, call_id=f"call_{done}")])
            return ModelResponse(output=output, response_id=None,
                                 usage=Usage(requests=1, input_tokens=20, output_tokens=9))

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("this bench's model does not stream")

    async def work(payload: str, n: int) -> str:
        """One step of the agent's work (trivial, idempotent)."""
        return probe.tool_called(n)

    if system == "dbos":
        from dbos import DBOS

        work = DBOS.step(name="work")(work)
    return Agent(name="bench", instructions="Work.", model=Scripted(),
                 tools=[function_tool(work)])


async def profiled(probe: Probe, sizes: Sequence[int], mode: str,
                   session: Session) -> dict[int, dict[str, Any]]:
    """:func:`agent_runs.run_each`, under this process's profiler when it has one."""
    return await run_each(probe, sizes, mode, session, PROFILER)


async def run_plain(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    """``Runner.run`` and nothing else; a killed run can only start over."""
    from agents import Runner

    agent = build_agent(probe, "plain")

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        async def go() -> str:
            ran = await Runner.run(agent, PROMPT, max_turns=max_turns(steps),
                                   run_config=run_config())
            return str(ran.final_output)

        yield go

    return await profiled(probe, sizes, mode, session)


async def run_tether(probe: Probe, sizes: Sequence[int], mode: str
                     ) -> dict[int, dict[str, Any]]:
    """The agent under tether's ``OpenAIAgentsAgent`` (:func:`agent_runs.tether_sessions`)."""
    import tether as tt
    from tether.integrations.openai_agents import OpenAIAgentsAgent

    framework = build_agent(probe, "tether")  # once per process, as the plain run does

    def agent() -> OpenAIAgentsAgent:
        return OpenAIAgentsAgent(framework, stream=False, run_config=run_config(),
                                 tools={"work": tt.ToolPolicy(idempotent=True)})

    async with tether_sessions(mode, LEASE, PROMPT, agent, probe.folder,
                               max(sizes)) as session:
        return await profiled(probe, sizes, mode, session)


async def run_dbos(probe: Probe, sizes: Sequence[int], mode: str) -> dict[int, dict[str, Any]]:
    """One DBOS system database for the process, a workflow per run. With *mode*
    ``resume``, DBOS's own recovery at launch re-runs the workflow the killed process left
    pending (its recorded steps answer from the step table) and the clock waits for it."""
    from dbos import DBOS, SetWorkflowID
    from dbos_openai_agents import DBOSRunner

    DBOS(config={"name": "oa-bench", "log_level": "WARNING",
                 "system_database_url": f"sqlite:///{probe.folder / 'dbos.sqlite'}"})
    agent = build_agent(probe, "dbos")

    @DBOS.workflow(name="oa_bench_run")
    async def run_workflow(prompt: str, steps: int) -> str:
        ran = await DBOSRunner.run(agent, prompt, max_turns=max_turns(steps),
                                   run_config=run_config())
        return str(ran.final_output)

    @asynccontextmanager
    async def session(steps: int, folder: Path) -> AsyncIterator[Go]:
        workflow_id = f"{WORKFLOW_ID}-{folder.name}"

        async def go() -> str:
            if mode == "resume":
                handle = await DBOS.retrieve_workflow_async(workflow_id)
                return str(await handle.get_result(polling_interval_sec=0.01))
            with SetWorkflowID(workflow_id):
                return str(await run_workflow(PROMPT, steps))

        yield go

    DBOS.launch()
    try:
        return await profiled(probe, sizes, mode, session)
    finally:
        DBOS.destroy()


RUNNERS = {"plain": run_plain, "tether": run_tether, "dbos": run_dbos}
BENCH = AgentBench(Path(__file__).resolve(), SYSTEMS, LABELS, LEASE)


# ---------------------------------------------------------------------------- the profile


class Sampler:
    """pyinstrument's sampling profiler behind cProfile's ``enable``/``disable`` (it shakes the
    figures less than cProfile, whose cost grows with every Python call)."""

    def __init__(self) -> None:
        from pyinstrument import Profiler

        self.profiler = Profiler(interval=0.0002, async_mode="disabled")

    def enable(self) -> None:
        self.profiler.start()

    def disable(self) -> None:
        self.profiler.stop()

    def functions(self) -> list[tuple[str, float, float]]:
        """Per function (file:line:name): its own seconds and its inclusive seconds (a
        recursive function counted once per stack)."""
        own: dict[str, float] = {}
        total: dict[str, float] = {}

        def walk(frame: Any, above: frozenset[str]) -> None:
            name = _where((frame.file_path or "", frame.line_no or 0, frame.function or "?"))
            if name not in above:
                total[name] = total.get(name, 0.0) + frame.time
            for kid in frame.children:
                if kid.is_synthetic:  # [self], [await]: time spent in this function itself
                    own[name] = own.get(name, 0.0) + kid.time
                else:
                    walk(kid, above | {name})

        root = self.profiler.last_session.root_frame() if self.profiler.last_session else None
        if root is not None:
            walk(root, frozenset())
        return [(name, own.get(name, 0.0), total[name]) for name in total]


TIMED = {
    "openai-agents": (
        "tether.integrations.openai_agents:OpenAIAgentsAgent.plan",
        "tether.integrations.openai_agents:items_of",
        "tether.integrations.openai_agents:OpenAIAgentsAgent._turn",
        "tether.integrations.openai_agents:OpenAIAgentsAgent._request",
        "tether.integrations.openai_agents:_record",
        "tether.integrations.openai_agents:OpenAIAgentsAgent._run_tool",
        "agents.tool:invoke_function_tool",
    ),
    "pydantic-ai": (
        "tether.integrations.pydantic_ai:PydanticAIAgent.plan",
        "tether.agents.base:ModelAgent.kept",
        "tether.integrations.pydantic_ai:Dialog.messages",
        "tether.integrations.pydantic_ai:PydanticAIAgent._request",
        "tether.integrations.pydantic_ai:PydanticAIAgent._one_request",
        "tether.integrations.pydantic_ai:PydanticAIAgent._settle",
        "tether.integrations.pydantic_ai:PydanticAIAgent._run_tool",
        "tether.integrations.pydantic_ai:_run_planned",
        "tether.integrations.pydantic_ai:PydanticAIAgent._run_from_history",
        "tether.integrations.pydantic_ai:_dump",
    ),
    "engine": (
        "tether.harness:Harness.submit",
        "tether.harness:Harness.run_until_idle",
        "tether.engine.worker:Worker._fill",
        "tether.engine.runner:Runner.plan",
        "tether.engine.runner:Runner.call_tool",
        "tether.engine.runner:Runner.invoke",
        "tether.engine.runner:Runner.commit",
        "tether.store.sqlite:SQLiteStore.commit",
        "tether.store.sqlite:SQLiteStore._checkpoint",
        "tether.store.sqlite_group_commit:GroupCommit._commit",
    ),
}
"""The functions ``--profiler timers`` times (module:qualified name), per adapter and the
engine's own, each inclusive of what it calls."""


class Timers:
    """Wall and CPU seconds and calls of the functions of :data:`TIMED`, each wrapped in place
    (its module's or class's attribute), counted only while enabled: no profiler's cost, so
    the figures are the run's own (an async function's time includes its awaits)."""

    def __init__(self, names: Sequence[str]) -> None:
        import functools
        import importlib
        import inspect

        self.on = False
        self.found: dict[str, list[float]] = {name: [0.0, 0.0, 0] for name in names}
        for name in names:
            module, _, qual = name.partition(":")
            owner: Any = importlib.import_module(module)
            *path, attr = qual.split(".")
            for part in path:
                owner = getattr(owner, part)
            fn = getattr(owner, attr)
            slot = self.found[name]

            def wrap(fn: Any, slot: list[float]) -> Any:
                if inspect.iscoroutinefunction(fn):
                    @functools.wraps(fn)
                    async def timed_async(*args: Any, **kwargs: Any) -> Any:
                        if not self.on:
                            return await fn(*args, **kwargs)
                        wall, cpu = time.perf_counter(), time.process_time()
                        try:
                            return await fn(*args, **kwargs)
                        finally:
                            slot[0] += time.perf_counter() - wall
                            slot[1] += time.process_time() - cpu
                            slot[2] += 1
                    return timed_async

                @functools.wraps(fn)
                def timed(*args: Any, **kwargs: Any) -> Any:
                    if not self.on:
                        return fn(*args, **kwargs)
                    wall, cpu = time.perf_counter(), time.process_time()
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        slot[0] += time.perf_counter() - wall
                        slot[1] += time.process_time() - cpu
                        slot[2] += 1
                return timed

            setattr(owner, attr, wrap(fn, slot))

    def enable(self) -> None:
        self.on = True

    def disable(self) -> None:
        self.on = False


def profile_child(adapter: str, system: str, steps: int, folder: Path, top: int,
                  clock: str, tool: str, save: Path | None) -> None:
    """*system*'s (tether's or the plain run's) timed run of *steps* tool calls, profiled by
    *tool* (the warm-up run outside it), with *adapter*'s agent: this bench's, or
    ``pydantic_ai_durable.py``'s (its ``run_each`` replaced by :func:`profiled`, which turns
    the profiler on). Prints the run's times and the top functions by own and by inclusive
    time, in ms per tool call."""
    global PROFILER
    if adapter == "pydantic-ai":
        import pydantic_ai_durable as bench

        bench.run_each = profiled  # type: ignore[assignment]
        probe: Any = bench.Probe(folder)
        runner: Any = bench.RUNNERS[system]
    else:
        probe, runner = Probe(folder), RUNNERS[system]
    if tool == "timers":
        names = [*TIMED[adapter], *TIMED["engine"]] if system == "tether" else []
        timers = Timers(names)
        PROFILER = timers  # type: ignore[assignment]
    elif tool == "pyinstrument":
        sampler = Sampler()
        PROFILER = sampler  # type: ignore[assignment]
    else:
        PROFILER = cProfile.Profile(time.process_time) if clock == "cpu" else cProfile.Profile()
    found = asyncio.run(runner(probe, [steps], "run"))[steps]
    if found["output"] != f"done {steps}":
        sys.exit(f"the run answered {found['output']!r}")
    how = {"pyinstrument": "pyinstrument, wall clock", "timers": "timers on the functions of"
           " TIMED"}.get(tool, f"cProfile, {clock} clock")
    print(f"{adapter}: {system}, N={steps}, under {how}:"
          f" {found['seconds'] * 1000 / steps:.3f} ms per tool call"
          f" ({found['cpu_seconds'] * 1000 / steps:.3f} CPU ms)")
    if tool == "timers":
        print("\nms per tool call, wall and CPU (inclusive), and calls per tool call")
        for name, (wall, cpu, calls) in timers.found.items():
            print(f"{wall * 1000 / steps:8.3f} {cpu * 1000 / steps:8.3f} {calls / steps:6.2f}"
                  f"  {name}")
        return
    if tool == "pyinstrument":
        rows = [(name, own, cum, None) for name, own, cum in sampler.functions()]
    else:
        assert isinstance(PROFILER, cProfile.Profile)
        if save is not None:
            PROFILER.dump_stats(save)
        stats: Any = pstats.Stats(PROFILER, stream=io.StringIO())
        rows = [(_where(f), own, cum, calls) for f, (calls, _, own, cum, _) in stats.stats.items()]
    for order, column in (("own", 1), ("inclusive", 2)):
        print(f"\ntop {top} by {order} time (ms per tool call: own, inclusive"
              f"{'' if tool == 'pyinstrument' else '; calls per tool call'})")
        for name, own, cum, calls in sorted(rows, key=lambda r: -r[column])[:top]:
            count = "" if calls is None else f" {calls / steps:7.1f}"
            print(f"{own * 1000 / steps:8.3f} {cum * 1000 / steps:8.3f}{count}  {name}")


def _where(func: tuple[str, int, str]) -> str:
    """file:function, the file shortened to its package path."""
    path, line, name = func
    for cut in ("site-packages/", "/src/", "/lib/python3"):
        if cut in path:
            path = path.split(cut, 1)[1]
            break
    return f"{path}:{line}:{name}" if line else name


# ---------------------------------------------------------------------------- the parent


def markdown(runs: Timed, found: Killed, sizes: Sequence[int], rounds: int, seconds: float) -> str:
    dbos = (" and with DBOS's `DBOSRunner.run` (the `dbos-openai-agents` package) inside a DBOS"
            " workflow (DBOS SQLite; each model call a DBOS step, the tool a `@DBOS.step`)"
            if HAS_DBOS else "")
    missing = ([] if HAS_DBOS else [
        "**No DBOS column**: `dbos` and `dbos-openai-agents` (DBOS's documented integration"
        " for the Agents SDK) are not installed in the environment this ran in; install them"
        " to measure it.", ""])
    return "\n".join([
        "### OpenAI Agents SDK agents: tether against DBOS's integration", "",
        "One Agents SDK agent (a deterministic `Model` asking for one idempotent, trivial"
        " `@function_tool` N times, then answering; tracing off), run by `Runner.run`, under"
        f" tether's `OpenAIAgentsAgent` (SQLite store, default settings, `stream=False`){dbos}."
        f" {timed_as(rounds)} and DBOS one system database,"
        " the agent built once per process"
        " (`bench/openai_agents_durable.py`)."
        " Temporal's integration for the SDK is not measured: it needs a Temporal server.",
        "", *missing,
        *BENCH.tables(runs, found, sizes, "Issue 27's target", PACKAGES, seconds),
    ])


def main() -> None:
    parser = BENCH.parser(__doc__.splitlines()[0], "benchmarks-openai-agents.md")
    parser.add_argument("--profile", type=int, default=None, metavar="N",
                        help="instead profile tether's run of N tool calls (cProfile)")
    parser.add_argument("--adapter", choices=("openai-agents", "pydantic-ai"),
                        default="openai-agents", help="with --profile: whose agent")
    parser.add_argument("--system", choices=("tether", "plain"), default="tether",
                        help="with --profile: whose run")
    parser.add_argument("--profiler", choices=("pyinstrument", "cprofile", "timers"),
                        default="pyinstrument" if importlib.util.find_spec("pyinstrument")
                        else "cprofile", help="with --profile: which profiler")
    parser.add_argument("--save", type=Path, default=None,
                        help="with --profile and cProfile: also write the pstats file there")
    parser.add_argument("--top", type=int, default=40, help="with --profile: functions shown")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="with --profile and cProfile: its clock (CPU: less shaken by a"
                             " loaded machine, blind to waiting on the disk)")
    args = parser.parse_args()
    if args.profile is not None and not args.child:
        folder = Path(tempfile.mkdtemp(prefix="oa-profile-", dir=args.work))
        try:
            profile_child(args.adapter, args.system, args.profile, folder, args.top,
                          args.clock, args.profiler, args.save)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    BENCH.main(parser, args, RUNNERS, markdown)


if __name__ == "__main__":
    main()
