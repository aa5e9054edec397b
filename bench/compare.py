"""tether against the tools users would pick instead, side by side in one run (issue 7).

Runs the workload of ``workload.py`` on every system of ``systems.py`` (each run its
own process, rounds interleaved so that a noisy moment hits every system alike), the
same workload with many tasks in one worker beside DBOS (``throughput.py``, issue 15),
then tether's own figures (``tether_figures.py``, ``cross_process_p0.py``,
``postgres_workers.py``), and writes ``docs/benchmarks.md`` with a plot of overhead per
step against S.

    python3 -m venv .bench-venv
    .bench-venv/bin/pip install -e '.[postgres]' -r bench/requirements.txt
    .bench-venv/bin/python bench/compare.py

``--smoke`` runs everything tiny (the test suite does, to keep this script working).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import report
import throughput

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs"
PG = "postgresql://postgres@127.0.0.1:5432/test"
SQLITE_SYSTEMS = ("bare", "floor-1", "floor-2", "tether-memory", "tether-sqlite",
                  "tether-sqlite-synced", "langgraph-memory", "langgraph-sqlite", "dbos-sqlite")
POSTGRES_SYSTEMS = ("floor-postgres", "tether-postgres", "langgraph-postgres", "dbos-postgres")
RESUMABLE = ("tether-sqlite", "langgraph-sqlite", "dbos-sqlite")
DURABLE = ("floor-1", "floor-2", "tether-sqlite", "tether-sqlite-synced", "langgraph-sqlite",
           "dbos-sqlite", *POSTGRES_SYSTEMS)


class RunFailed(Exception):
    """A system's run did not produce figures; the report says why instead of a number."""


def python_json(args: list[str], timeout: float = 1800,
                src: Path | None = None) -> dict[str, Any]:
    """Run one bench script in its own process and read the JSON line it prints; with *src*,
    that tree's tether is imported instead of the installed one."""
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    done = subprocess.run([sys.executable, *args], cwd=HERE, capture_output=True, text=True,
                          timeout=timeout, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RunFailed(f"exit {done.returncode}: {' | '.join(tail)[-400:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@contextmanager
def scratch(prefix: str, work: Path | None = None) -> Iterator[Path]:
    """A folder of its own for one run, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir=work))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_system(system: str, steps: int, work: Path | None = None, pg: str = PG, *extra: str,
               src: Path | None = None) -> dict[str, Any]:
    with scratch(system, work) as folder:
        return python_json(["systems.py", system, str(steps), str(folder), "--pg", pg, *extra],
                           src=src)


def step_costs(systems: list[str], sizes: list[int], rounds: int, work: Path, pg: str,
               say: Callable[[str], None]) -> dict[str, dict[int, Any]]:
    """Seconds of every step, per system and S, pooled over *rounds* interleaved rounds."""
    pooled: dict[str, dict[int, Any]] = {s: {} for s in systems}
    for round_ in range(1, rounds + 1):
        for steps in sizes:
            for system in systems:
                say(f"round {round_}/{rounds}: {system}, S={steps}")
                slot = pooled[system].setdefault(steps, [])
                if isinstance(slot, RunFailed):
                    continue
                try:
                    slot.extend(run_system(system, steps, work, pg)["step_seconds"])
                except RunFailed as failure:
                    pooled[system][steps] = failure
    return pooled


def bytes_written(systems: list[str], steps: int, work: Path, pg: str,
                  say: Callable[[str], None]) -> dict[str, Any]:
    """Bytes written per step around steps 10, 100 and S, and the store's size after S."""
    found: dict[str, Any] = {}
    for system in systems:
        say(f"bytes written: {system}, S={steps}")
        try:
            found[system] = run_system(system, steps, work, pg, "--bytes")
        except RunFailed as failure:
            found[system] = failure
    return found


def killed_and_resumed(system: str, steps: int, work: Path | None,
                       src: Path | None = None) -> float:
    """One task of *steps* steps, its process SIGKILLed inside the last call; seconds from
    the new process opening its store until that call runs again (with *src*, that tree's
    tether in both processes)."""
    with scratch(f"resume-{system}", work) as folder:
        args = ["systems.py", system, str(steps + 1), str(folder)]
        found = kill_when_ready_then([*args, "--mode", "hang"], [*args, "--mode", "resume"],
                                     src)
        return float(found["resume_to_call_s"])


def kill_when_ready_then(child_args: list[str], recover_args: list[str],
                         src: Path | None = None) -> dict[str, Any]:
    """Start a child, SIGKILL it once it says READY, let its 1 s leases run out, then run
    the recovering process and return what it measured."""
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    child = subprocess.Popen([sys.executable, *child_args], cwd=HERE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    line = child.stdout.readline()
    child.kill()
    child.wait()
    if line.strip() != "READY":
        why = child.stderr.read()[-400:] if child.stderr else ""
        raise RunFailed(f"the child never got ready: {line} {why}")
    time.sleep(1.2)
    return python_json(recover_args, src=src)


def recover_many(tasks: int, work: Path | None, src: Path | None = None) -> dict[str, Any]:
    """*tasks* tasks in flight in one worker, SIGKILLed; a new process recovers them all."""
    with scratch("recover", work) as folder:
        return kill_when_ready_then(
            ["tether_figures.py", "interrupt", str(folder), str(tasks)],
            ["tether_figures.py", "recover", str(folder), str(tasks)], src)


def tether_figure(name: str, n: int, work: Path) -> dict[str, Any]:
    with scratch(name, work) as folder:
        return python_json(["tether_figures.py", name, str(folder), str(n)])


def run_throughput(system: str, tasks: int, steps: int, work: Path, pg: str) -> dict[str, Any]:
    """One (system, N) of ``throughput.py`` in a process of its own."""
    with scratch(f"throughput-{system}", work) as folder:
        return python_json(["throughput.py", system, str(tasks), str(steps), str(folder),
                            "--pg", pg])


def cross_process_p0(store: str, pg: str, trials: int, cpu_seconds: float) -> dict[str, Any]:
    """A P0 emitted from another process than the worker's, until the pause is committed."""
    return python_json(["cross_process_p0.py", "--store", store, "--pg", pg, "--trials",
                        str(trials), "--cpu-seconds", str(cpu_seconds), "--json"])


def postgres_throughput(pg: str, workers: list[int], tasks: int, steps: int) -> dict[int, float]:
    sys.path.insert(0, str(HERE))
    import postgres_workers

    return {n: postgres_workers.throughput(pg, n, tasks, steps) for n in workers}


AGENT_BENCHES = {"pydantic_ai": ("pydantic_ai_durable.py", "benchmarks-pydantic-ai.md"),
                 "openai_agents": ("openai_agents_durable.py", "benchmarks-openai-agents.md"),
                 "langchain": ("langchain_durable.py", "benchmarks-langchain.md")}
"""The durable-agent benchmarks this run also runs: their tables are written beside the report
(and copied into it), their tether overheads go into its targets."""


def agent_bench(name: str, folder: Path, work: Path) -> dict[str, Any]:
    """One durable-agent benchmark at its default sizes, its tables written to *folder*."""
    script, out = AGENT_BENCHES[name]
    return python_json([script, "--out", str(folder / out), "--work", str(work)], timeout=3600)


def postgres_reachable(pg: str) -> str | None:
    """None if PostgreSQL answers at *pg*, else why not."""
    try:
        import psycopg

        with psycopg.connect(pg, connect_timeout=3):
            return None
    except Exception as error:  # any failure means: leave PostgreSQL out, and say why
        return f"{type(error).__name__}: {error}"


def attempt(what: str, run: Callable[[], Any], say: Callable[[str], None]) -> Any:
    say(what)
    try:
        return run()
    except Exception as failure:  # one figure that cannot run must not lose the others
        return RunFailed(f"{type(failure).__name__}: {failure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10,100,1000", help="the S values, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg", default=PG)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--recover-tasks", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=1000, help="P0 preemption trials")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--idle-tasks", type=int, default=10_000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--throughput-tasks", default="1,16,256",
                        help="tasks side by side in one worker, comma-separated")
    parser.add_argument("--throughput-steps", type=int, default=20, help="steps of each task")
    parser.add_argument("--p0-trials", type=int, default=200, help="cross-process P0 trials")
    parser.add_argument("--p0-cpu-seconds", type=float, default=3.0,
                        help="seconds the worker's CPU is measured, idle and busy")
    parser.add_argument("--no-agents", action="store_true",
                        help="leave out the durable-agent benchmarks (their last tables are"
                             " copied in, with the date they ran)")
    parser.add_argument("--smoke", action="store_true",
                        help="everything tiny, agent benchmarks left out: checks the script")
    parser.add_argument("--out", type=Path, default=DOCS / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=DOCS / "img" / "benchmarks-overhead.png")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rounds, args.recover_tasks, args.trials = "5,12", 1, 20, 20
        args.events, args.idle_tasks, args.workers = 50, 50, "1"
        args.throughput_tasks, args.throughput_steps = "1,4", 3
        args.p0_trials, args.p0_cpu_seconds, args.no_agents = 5, 0.3, True
    sizes = sorted(int(s) for s in args.steps.split(","))
    started = time.time()

    def say(line: str) -> None:
        print(f"[{time.time() - started:6.0f}s] {line}", file=sys.stderr, flush=True)

    no_pg = "--no-postgres given" if args.no_postgres else postgres_reachable(args.pg)
    systems = list(SQLITE_SYSTEMS) + ([] if no_pg else list(POSTGRES_SYSTEMS))
    many = [s for s in throughput.SYSTEMS if not (no_pg and s.endswith("postgres"))]
    task_counts = sorted(int(n) for n in args.throughput_tasks.split(","))
    stores = ["sqlite"] + ([] if no_pg else ["postgres"])
    with scratch("tether-compare") as work:
        results: dict[str, Any] = {
            "steps": step_costs(systems, sizes, args.rounds, work, args.pg, say),
            "bytes": bytes_written([s for s in systems if s in DURABLE], sizes[-1], work,
                                   args.pg, say),
            "resume": {s: attempt(f"resume: {s}", lambda s=s: killed_and_resumed(
                s, sizes[-1], work), say) for s in RESUMABLE},
            "recover": attempt("recover many", lambda: recover_many(args.recover_tasks, work),
                               say),
            "preempt": attempt("preempt", lambda: tether_figure("preempt", args.trials, work),
                               say),
            "preempt_cross": {store: attempt(f"P0 from another process: {store}",
                                             lambda store=store: cross_process_p0(
                                                 store, args.pg, args.p0_trials,
                                                 args.p0_cpu_seconds), say)
                              for store in stores},
            "throughput": {"steps": args.throughput_steps, "rates": throughput.interleaved(
                lambda system, tasks: run_throughput(system, tasks, args.throughput_steps,
                                                     work, args.pg),
                many, task_counts, args.rounds, say)},
            "ingest": attempt("ingest", lambda: tether_figure("ingest", args.events, work), say),
            "idle": attempt("idle", lambda: tether_figure("idle", args.idle_tasks, work), say),
            "agents": {} if args.no_agents else {
                name: attempt(f"agents: {name}", lambda name=name: agent_bench(
                    name, args.out.parent, work), say) for name in AGENT_BENCHES},
            "workers": None if no_pg else attempt("postgres workers", lambda: postgres_throughput(
                args.pg, [int(w) for w in args.workers.split(",")], 50 if args.smoke else 200,
                10), say),
        }
    context = report.Context(
        sizes=sizes, rounds=args.rounds, postgres_skipped=no_pg, smoke=args.smoke,
        date=dt.datetime.now(dt.UTC), seconds=time.time() - started,
        command=" ".join(["bench/compare.py", *sys.argv[1:]]),
        plot=os.path.relpath(args.plot, args.out.parent), folder=args.out.parent)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    report.plot(results, context, args.plot)
    args.out.write_text(report.markdown(results, context))
    say(f"wrote {args.out} and {args.plot}")


if __name__ == "__main__":
    main()
