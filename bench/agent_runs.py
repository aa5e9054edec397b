"""What the durable-agent benchmarks share (``pydantic_ai_durable.py``,
``openai_agents_durable.py``, ``langchain_durable.py``): the child's probe and timed runs, the
parent side, which runs each system in a process of its
own (timed rounds, then a run killed inside tool call N/2 and started again), and the tables.

Each benchmark keeps its agent, its children and its prose; it describes itself to this
module as an :class:`AgentBench` (its own script, which the children run, its systems and
their labels, and the lease its tether child uses, which a restarted child waits out).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from workload import RESULT

WARMUP = 2
"""Tool calls of the warm-up run each timed child makes before the run it times."""
MARKER = "kill-marker"
"""While this file is in a child's folder, the child SIGKILLs itself inside tool call N/2."""
COUNTS = "counts.txt"
"""A child's model requests and tool calls, a line each, kept across a SIGKILL."""
CHILD_TIMEOUT = 600.0
TARGET_MS = 1.0
"""Issue 27's target: tether's CPU ms per tool call above the plain run, at N=10 and N=100."""
TARGET_AT = (10, 100)
FLAT_MS = 1.0
"""... and flat: from the smallest N to the largest, tether's overhead rises by no more. A
fall is no failure: it is the plain run's per-call cost growing faster than tether's (the
Agents SDK's ``Runner`` re-reads its whole input each turn; tether asks the model directly)."""


def kill_at(steps: int) -> int:
    """The 1-based tool call a run is killed in."""
    return max(1, steps // 2)


class RunFailed(Exception):
    """A child did not finish as it should; the table says why instead of a number."""


Timed = dict[str, dict[int, list[dict[str, Any]] | RunFailed]]
"""Per system and N, each round's run (seconds, answer, counts), or why there is none."""
Killed = dict[str, dict[int, dict[str, int] | RunFailed]]
"""Per system and N, the counts of a killed and restarted run, or why there are none."""
Report = Callable[[Timed, Killed, Sequence[int], int, float], str]
"""A benchmark's markdown from its runs, kills, sizes, rounds and seconds."""


# ---------------------------------------------------------------------------- the child side


@dataclasses.dataclass
class Probe:
    """What the model function and the tool report: calls counted in memory and, line by
    line, in a file that outlives a SIGKILL; and the kill hook."""

    folder: Path
    """The process's folder: the kill marker, and a folder per run."""
    armed: bool = False
    """The kill hook fires inside tool call N/2 while the marker file exists."""
    steps: int = WARMUP
    models: int = 0
    tools: int = 0
    fd: int | None = None

    def begin(self, steps: int, folder: Path) -> None:
        """Count a run of *steps* tool calls, in *folder*'s count file."""
        folder.mkdir(parents=True, exist_ok=True)
        if self.fd is not None:
            os.close(self.fd)
        self.steps, self.models, self.tools = steps, 0, 0
        self.fd = os.open(folder / COUNTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def model_called(self) -> None:
        self.models += 1
        if self.fd is not None:
            os.write(self.fd, b"model\n")

    def tool_called(self, n: int) -> str:
        self.tools += 1
        if self.fd is not None:
            os.write(self.fd, b"tool\n")
        if self.armed and n + 1 == kill_at(self.steps) and (self.folder / MARKER).exists():
            os.kill(os.getpid(), signal.SIGKILL)
        return RESULT


Go = Callable[[], Awaitable[str]]
"""One run of the agent, set up and ready: awaiting it runs the agent and gives its answer."""
Session = Callable[[int, Path], AbstractAsyncContextManager[Go]]
"""Sets a system up for one run of N tool calls in a folder of its own (outside the clock)."""


async def run_each(probe: Probe, sizes: Sequence[int], mode: str, session: Session,
                   profiler: Any = None) -> dict[int, dict[str, Any]]:
    """The run of each size, timed, after a warm-up run in ``run`` mode (imports, schema
    building and first-call costs stay out of the clock); a short run is timed
    :func:`repeats` times and its medians kept, so one noisy moment does not decide the
    figure. With *profiler* (anything with ``enable()`` and ``disable()``), profiled too,
    only around the timed runs."""
    if mode == "run":
        probe.begin(WARMUP, probe.folder / "warm-up")
        async with session(WARMUP, probe.folder / "warm-up") as go:
            await go()
    found: dict[int, dict[str, Any]] = {}
    for steps in sizes:
        runs = [await timed_run(probe, steps, probe.folder / f"n{steps}{'' if n == 0 else f'-{n}'}",
                                session, profiler)
                for n in range(repeats(steps) if mode == "run" else 1)]
        found[steps] = {**runs[-1], **{key: statistics.median(run[key] for run in runs)
                                       for key in ("seconds", "cpu_seconds", "stored_bytes")}}
    return found


def timed_as(rounds: int) -> str:
    """How every agent benchmark's runs were timed, as its tables' caption says it (each
    caption goes on with what its own systems share)."""
    return ("Whole run after a warm-up run, divided by N; overhead is that minus the plain run"
            f" of the same round. Median of {rounds} interleaved round{'s' if rounds != 1 else ''}"
            " (with more than one, their range in brackets); each system's round its own"
            " process, running each N in turn (N under 100 several times, about 100 tool calls"
            " in all, their median kept); tether's runs share one store per process, as a"
            " service keeps one")


def repeats(steps: int) -> int:
    """How often a timed run of *steps* tool calls is made: about :data:`REPEATED_CALLS`
    tool calls in all, at least once."""
    return max(1, REPEATED_CALLS // steps)


REPEATED_CALLS = 100


async def timed_run(probe: Probe, steps: int, folder: Path, session: Session,
                    profiler: Any) -> dict[str, Any]:
    """One run of *steps* tool calls in *folder*: its seconds, CPU seconds, answer, counts
    and the bytes its store kept."""
    probe.begin(steps, folder)
    async with session(steps, folder) as go:
        if profiler is not None:
            profiler.enable()
        started, cpu = time.perf_counter(), time.process_time()
        output = await go()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        if profiler is not None:
            profiler.disable()
    return {"seconds": seconds, "cpu_seconds": cpu, "output": output,
            "models": probe.models, "tools": probe.tools, "stored_bytes": stored_bytes(folder)}


@asynccontextmanager
async def tether_sessions(mode: str, lease: float, prompt: str, agent: Callable[[], Any],
                          folder: Path, most_steps: int) -> AsyncIterator[Session]:
    """tether's runs of the agent *agent* makes, with default settings (a *lease* this short
    where a process is killed, so the restarted one waits out only that). *agent* wraps a
    framework agent built once per process, as the plain run and the peers build theirs: a
    fresh one per run would charge tether with the framework's own first-run costs.

    Timed runs share one harness and one store file in the process's *folder*, opened before
    the warm-up run, as the peers keep one system database per process and a service keeps
    its harness: a store opened for each run would charge tether with a new file's first
    pages and statements. What a run keeps on disk is the file's growth over it (its WAL
    folded in before and after), written for :func:`stored_bytes`. A killed run and its
    restart have a store of their own in the run's folder, which the restarted process
    finds. *most_steps*: the longest run's tool calls. The clock runs from submit until the
    task's result is read."""
    import tether as tt

    def harness(path: Path, steps: int) -> tt.Harness:
        settings = tt.Settings()
        if mode != "run":
            settings = dataclasses.replace(settings, lease_seconds=lease)
        if steps + 1 > settings.max_completions:  # only for --steps of 1000 and more
            settings = dataclasses.replace(settings, max_completions=steps + 1)
        made = tt.Harness(f"sqlite:///{path}", settings=settings)
        made.add_agent("bench", agent())
        return made

    def go_with(made: tt.Harness, task_file: Path) -> Go:
        async def go() -> str:
            if mode == "resume":  # the task the killed process left
                task = task_file.read_text()
            else:
                task = await made.submit("bench", prompt)
                task_file.write_text(task)
            await made.run_until_idle(concurrency=1)
            info = await made.get(task)
            if info.record.status is not tt.Status.COMPLETED:
                raise RuntimeError(f"tether task ended {info.record.status}: {info.record.reason}")
            return str(info.snapshot.result)
        return go

    if mode != "run":
        @asynccontextmanager
        async def own_store(steps: int, run_folder: Path) -> AsyncIterator[Go]:
            async with harness(run_folder / "tether.db", steps) as made:
                yield go_with(made, run_folder / "task")
        yield own_store
        return

    shared_file = folder / "tether.db"
    async with harness(shared_file, most_steps) as shared:
        store = shared.store
        assert store is not None  # opened (file and schema) outside the clock

        def settled_size() -> int:
            store.pragma("wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
            return shared_file.stat().st_size

        @asynccontextmanager
        async def shared_store(steps: int, run_folder: Path) -> AsyncIterator[Go]:
            before = settled_size()
            yield go_with(shared, run_folder / "task")
            (run_folder / KEPT_BYTES).write_text(str(settled_size() - before))

        yield shared_store


KEPT_BYTES = "kept-bytes"
"""A run's file in which a store shared by the process's runs notes what the run added."""


def stored_bytes(folder: Path) -> int:
    """What a run's store holds on disk once closed: its SQLite files and their WAL, or what
    the run added to a store shared by the process's runs (:data:`KEPT_BYTES`); 0 for a
    store kept elsewhere (a server's, or a peer's system database)."""
    if (folder / KEPT_BYTES).exists():
        return int((folder / KEPT_BYTES).read_text())
    return sum(f.stat().st_size for f in folder.iterdir()
               if f.is_file() and f.name.endswith((".db", ".sqlite", "-wal")))


Runner = Callable[[Probe, Sequence[int], str], Awaitable[dict[int, dict[str, Any]]]]
"""One system's runs in a child: each size in turn, in a ``mode`` (see :func:`child`)."""


def child(runners: Mapping[str, Runner], system: str, sizes: Sequence[int], folder: Path,
          mode: str) -> None:
    """Run *system* at each size in turn and print one JSON line: per size, the seconds,
    the answer and this process's counts.

    *mode* ``run``: timed, after a warm-up run; ``cold``: no warm-up, the kill hook armed (it
    fires only while the marker file exists); ``resume``: finish the run a killed ``cold``
    process left."""
    probe = Probe(folder, armed=mode == "cold")
    found = asyncio.run(runners[system](probe, sizes, mode))
    for steps, run in found.items():
        if run["output"] != f"done {steps}":
            sys.exit(f"{system}: the run answered {run['output']!r}, expected 'done {steps}'")
    print(json.dumps({str(steps): run for steps, run in found.items()}))


@dataclass(frozen=True)
class AgentBench:
    """One benchmark, as the parent side needs it."""

    script: Path
    """The benchmark's own file: each child is ``script --child SYSTEM STEPS FOLDER``."""
    systems: tuple[str, ...]
    labels: Mapping[str, str]
    lease: float
    """tether's lease in a killed child: the restarted one waits it out."""
    peer: str = "dbos"
    """The durable peer among *systems*, whose overhead is shown beside tether's."""
    peer_name: str = "DBOS"

    def spawn(self, system: str, sizes: Sequence[int], folder: Path, mode: str
              ) -> subprocess.CompletedProcess[str]:
        """Run one child: *system* at each of *sizes* in turn, in *folder*."""
        return subprocess.run([sys.executable, str(self.script), "--child", system,
                               ",".join(map(str, sizes)), str(folder), "--mode", mode],
                              cwd=self.script.parent, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT, check=False)

    def timed(self, sizes: Sequence[int], rounds: int, work: Path,
              say: Callable[[str], None]) -> Timed:
        """Every system at every N, *rounds* interleaved rounds (the order of the systems
        rotated each round). One process per system and round runs each N in turn, each in a
        fresh store or workflow: on a loaded machine the imports alone take seconds, so a
        process per run would make this take many minutes for no better figure."""
        systems = self.systems
        found: Timed = {s: {n: [] for n in sizes} for s in systems}
        for round_ in range(rounds):
            order = systems[round_ % len(systems):] + systems[:round_ % len(systems)]
            for system in order:
                say(f"round {round_ + 1}/{rounds}: {system}, N={','.join(map(str, sizes))}")
                folder = Path(tempfile.mkdtemp(prefix=f"{system}-", dir=work))
                try:
                    runs = result_of(self.spawn(system, sizes, folder, "run"))
                    for steps in sizes:
                        slot = found[system][steps]
                        if isinstance(slot, list):
                            slot.append(runs[str(steps)] | {"counted": counts(folder / f"n{steps}")})
                except (RunFailed, subprocess.TimeoutExpired) as failure:
                    for steps in sizes:
                        found[system][steps] = RunFailed(str(failure))
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
        return found

    def killed(self, system: str, steps: int, work: Path) -> dict[str, int]:
        """One run SIGKILLed inside its k-th tool call, then the same program started again
        to finish it; the model requests and tool calls of both processes together."""
        folder = Path(tempfile.mkdtemp(prefix=f"kill-{system}-", dir=work))
        try:
            (folder / MARKER).touch()
            first = self.spawn(system, [steps], folder, "cold")
            if first.returncode != -signal.SIGKILL:
                raise RunFailed(f"the run was not killed (exit {first.returncode}):"
                                f" {(first.stderr or first.stdout)[-300:]}")
            (folder / MARKER).unlink()
            if system == "tether":
                time.sleep(self.lease + 0.2)  # the dead worker's lease runs out
            result_of(self.spawn(system, [steps], folder,
                                 "resume" if system != "plain" else "cold"))
            return counts(folder / f"n{steps}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def kills(self, sizes: Sequence[int], work: Path, say: Callable[[str], None]) -> Killed:
        found: Killed = {s: {} for s in self.systems}
        for steps in sizes:
            for system in self.systems:
                say(f"killed in call {kill_at(steps)}: {system}, N={steps}")
                try:
                    found[system][steps] = self.killed(system, steps, work)
                except (RunFailed, subprocess.TimeoutExpired) as failure:
                    found[system][steps] = RunFailed(str(failure))
        return found

    def overhead_table(self, runs: Timed, sizes: Sequence[int], clock: str) -> str:
        """Per system: ms per tool call, and above the plain run, on *clock*; then the ratio
        (where the peer ran)."""
        what = "ms" if clock == "seconds" else "CPU ms"
        head = ["system", *(f"N={n}: {what} per tool call" for n in sizes),
                *(f"N={n}: overhead over plain, {what} per tool call" for n in sizes)]
        rows = []
        for system in self.systems:
            cells = [self.labels[system]]
            for steps in sizes:
                found = runs[system].get(steps)
                cells.append(f"did not run: {found}" if isinstance(found, RunFailed) else
                             spread([r[clock] * 1000 / steps for r in found or []], 3))
            for steps in sizes:
                over = overheads(runs, system, steps, clock)
                cells.append("" if system == "plain" or over is None else spread(over, 3))
            rows.append(cells)
        if self.peer in self.systems:
            rows.append([f"**{self.peer_name} overhead / tether overhead**", *([""] * len(sizes)),
                         *(overhead_ratio(runs, n, clock, self.peer) for n in sizes)])
        return table(head, rows)

    def bytes_table(self, runs: Timed, sizes: Sequence[int]) -> str:
        """Per system whose store is the run's own: bytes kept per tool call at each N."""
        head = ["system", *(f"N={n}: bytes kept per tool call" for n in sizes)]
        rows = []
        for system in self.systems:
            cells = [self.labels[system]]
            for steps in sizes:
                found = runs[system].get(steps)
                kept = [r.get("stored_bytes", 0) / steps for r in found or []] \
                    if isinstance(found, list) else []
                cells.append(spread(kept, 0) if kept and min(kept) > 0 else "-")
            if any(cell != "-" for cell in cells[1:]):
                rows.append(cells)
        return table(head, rows)

    def kill_table(self, runs: Timed, found: Killed, sizes: Sequence[int]) -> str:
        """Model requests and tool calls of a killed and restarted run beside an uninterrupted
        one (the first timed round's, counted the same way)."""
        head = ["system", "N", "killed in tool call", "model requests: uninterrupted",
                "model requests: killed + restarted", "extra model requests",
                "tool calls: uninterrupted", "tool calls: killed + restarted"]
        rows = []
        for steps in sizes:
            for system in self.systems:
                cells = [self.labels[system], str(steps), str(kill_at(steps))]
                whole, cut = runs[system].get(steps), found[system].get(steps)
                if not isinstance(whole, list) or not whole:
                    rows.append([*cells, f"did not run: {whole}", "", "", "", ""])
                elif not isinstance(cut, dict):
                    rows.append([*cells, f"did not run: {cut}", "", "", "", ""])
                else:
                    once = whole[0]["counted"]
                    rows.append([*cells, str(once["models"]), str(cut["models"]),
                                 f"{cut['models'] - once['models']:+d}", str(once["tools"]),
                                 str(cut["tools"])])
        return table(head, rows)

    def tables(self, runs: Timed, found: Killed, sizes: Sequence[int], target: str,
               packages: Sequence[str], seconds: float) -> list[str]:
        """Every benchmark's tables after its introduction: overheads on both clocks, the
        *target* (its title) met or not, the kill counts, and the versions line."""
        return [
            self.overhead_table(runs, sizes, "seconds"), "",
            "The same runs on the CPU clock (every thread of the process): less shaken by other"
            " work on a shared machine, blind to waiting on the disk.", "",
            self.overhead_table(runs, sizes, "cpu_seconds"), "",
            f"{target}, on the CPU clock (medians of the table above):", "",
            self.target_table(runs, sizes), "",
            "What each run keeps on disk (the growth of tether's store file over the run, its WAL"
            " folded in before and after), per tool call: flat as N grows when a step stores"
            " only what it added (\"-\": a store that is not the run's own).", "",
            self.bytes_table(runs, sizes), "",
            "Each system's process SIGKILLed inside tool call k = N/2 (after the call's work,"
            " before its result is returned), then the same program started again to finish"
            " the run; model requests and tool calls counted across both processes. The plain"
            " run can only start over.", "",
            self.kill_table(runs, found, sizes), "",
            f"{versions(packages)}. Ran in {seconds:,.0f} s.",
        ]

    def parser(self, description: str, out: str) -> argparse.ArgumentParser:
        """The command line every benchmark takes (*out*: its file in ``docs/``)."""
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--steps", default="10,100,300",
                            help="tool calls per run, comma-separated")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--out", type=Path, default=None,
                            help=f"also write the tables there (docs/{out}, which compare.py"
                                 " copies into docs/benchmarks.md)")
        parser.add_argument("--work", type=Path, default=None,
                            help="folder for the runs' stores")
        parser.add_argument("--child", nargs=3, metavar=("SYSTEM", "STEPS", "FOLDER"),
                            help=argparse.SUPPRESS)
        parser.add_argument("--mode", choices=("run", "cold", "resume"), default="run",
                            help=argparse.SUPPRESS)
        return parser

    def main(self, parser: argparse.ArgumentParser, args: argparse.Namespace,
             runners: Mapping[str, Runner], report: Report) -> None:
        """A child's runs (``--child``), or the whole benchmark: every system's timed rounds
        and kills, then *report*'s tables printed and written (see :func:`finish`)."""
        if args.child:
            system, sizes, folder = args.child
            if system not in self.systems:
                parser.error(f"no system {system}")
            child(runners, system, [int(n) for n in sizes.split(",")], Path(folder), args.mode)
            return
        sizes = [int(n) for n in args.steps.split(",")]
        if min(sizes) < 2 or args.rounds < 1:
            parser.error("--steps must be at least 2 and --rounds at least 1")
        started = time.perf_counter()
        work = Path(tempfile.mkdtemp(prefix=f"{self.script.stem}-", dir=args.work))

        def say(line: str) -> None:
            print(f"[{time.perf_counter() - started:6.1f}s] {line}", file=sys.stderr, flush=True)

        try:
            runs = self.timed(sizes, args.rounds, work, say)
            found = self.kills(sizes, work, say)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        finish(report(runs, found, sizes, args.rounds, time.perf_counter() - started), runs,
               found, sizes, args.out)

    def target_table(self, runs: Timed, sizes: Sequence[int]) -> str:
        """Issue 27's target on the CPU clock, met or not: per N the plain run's CPU ms per tool
        call, tether's and the peer's medians above it, then whether tether's is flat across N."""
        def median(system: str, steps: int) -> float | None:
            found = overheads(runs, system, steps, "cpu_seconds") if system in runs else None
            return statistics.median(found) if found else None

        def cell(value: float | None) -> str:
            return "n/a" if value is None else f"{value:+.3f}"

        rows = []
        for steps in sizes:
            plain = runs["plain"].get(steps)
            ours = median("tether", steps)
            verdict = "-" if steps not in TARGET_AT or ours is None else (
                "**met**" if ours <= TARGET_MS else f"**not met** ({ours - TARGET_MS:+.3f})")
            rows.append([str(steps), spread([r["cpu_seconds"] * 1000 / steps for r in plain], 3)
                         if isinstance(plain, list) and plain else "n/a",
                         cell(ours), cell(median(self.peer, steps)), verdict])
        ours_all = [m for m in (median("tether", n) for n in sizes) if m is not None]
        if len(ours_all) == len(sizes) > 1:
            moved = ours_all[-1] - ours_all[0]
            rows.append([f"flat, N={sizes[0]} to N={sizes[-1]}", "", f"moved {moved:+.3f}", "",
                         "**met**" if moved <= FLAT_MS else "**not met**"])
        return table(["N", "plain: CPU ms per tool call", "tether: CPU ms overhead per tool call",
                      f"{self.peer_name}: CPU ms overhead per tool call",
                      f"target: tether <= {TARGET_MS:g} ms at N={' and N='.join(map(str, TARGET_AT))},"
                      f" rising by at most {FLAT_MS:g} ms from the smallest N to the largest"], rows)


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RunFailed(f"exit {done.returncode}: {' | '.join(tail)[-400:]}")
    found: dict[str, Any] = json.loads(lines[-1])
    return found


def counts(folder: Path) -> dict[str, int]:
    """Model requests and tool calls in a run's count file, over every process it had."""
    lines = (folder / COUNTS).read_text().split()
    return {"models": lines.count("model"), "tools": lines.count("tool")}


def failed(runs: Timed, found: Killed) -> bool:
    """Whether any run or kill did not give its figure (the benchmark then exits 1)."""
    cells = [*(c for by_size in runs.values() for c in by_size.values()),
             *(c for by_size in found.values() for c in by_size.values())]
    return any(isinstance(cell, RunFailed) for cell in cells)


def versions(names: Sequence[str]) -> str:
    """Python's version and each package's, for the line under a benchmark's tables."""
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} not installed")
    return f"Python {sys.version.split()[0]}, " + ", ".join(found)


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def spread(values: list[float], digits: int = 2) -> str:
    """The median, and with more than one value their range in brackets."""
    middle = f"{statistics.median(values):,.{digits}f}"
    if len(values) < 2:
        return middle
    return f"{middle} ({min(values):,.{digits}f} to {max(values):,.{digits}f})"


def overheads(runs: Timed, system: str, steps: int, clock: str) -> list[float] | None:
    """ms per tool call above the plain run of the same round, one value per round; *clock*
    is ``seconds`` (wall) or ``cpu_seconds`` (every thread of the process)."""
    mine, base = runs[system].get(steps), runs["plain"].get(steps)
    if not isinstance(mine, list) or not isinstance(base, list) or not mine:
        return None
    return [(m[clock] - b[clock]) * 1000 / steps for m, b in zip(mine, base, strict=True)]


def overhead_ratio(runs: Timed, steps: int, clock: str, peer: str) -> str:
    """The peer's median overhead over tether's, as compare.py shows a ratio."""
    ours = overheads(runs, "tether", steps, clock)
    theirs = overheads(runs, peer, steps, clock) if peer in runs else None
    if not ours or not theirs:
        return "n/a"
    if statistics.median(ours) <= 0:
        return "n/a: tether's is below plain"
    return f"**{statistics.median(theirs) / statistics.median(ours):.2f}x**"


def tether_medians(runs: Timed, sizes: Sequence[int]) -> dict[str, float | None]:
    """tether's median CPU ms overhead per tool call at each N (None where it did not run):
    what compare.py puts in its targets table, read from the JSON line :func:`finish` prints."""
    found = {n: overheads(runs, "tether", n, "cpu_seconds") for n in sizes}
    return {str(n): statistics.median(v) if v else None for n, v in found.items()}


def finish(tables: str, runs: Timed, found: Killed, sizes: Sequence[int],
           out: Path | None) -> None:
    """Print the tables, then one JSON line of tether's overheads (for compare.py); write the
    tables to *out*; exit 1 if a run failed."""
    print(tables)
    print(json.dumps({"tether_cpu_overhead_ms": tether_medians(runs, sizes),
                      "target_ms": TARGET_MS, "target_at": list(TARGET_AT), "flat_ms": FLAT_MS}))
    if out is not None:
        out.write_text(tables + "\n")
    sys.exit(1 if failed(runs, found) else 0)


