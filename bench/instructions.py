"""Instructions a LangChain tool call costs, plain and under tether, counted by callgrind.

Timings on a shared machine move by a third within minutes; callgrind
(``valgrind --tool=callgrind``) counts the instructions the process runs, the same for the
same code whatever else the machine does. Each figure is the difference between a process
running ``--more`` tasks and one running ``--fewer`` (imports and warm-up cancel out),
divided by the tasks between them: instructions per task of N tool calls, for the agent of
``langchain_durable.py`` run plain and under tether's ``LangChainAgent`` (SQLite store).

Under valgrind a call takes about fifty times longer, so every timer of the harness is set
out of reach (lease, polling, ``defer_results_under``, and the running worker's look for
other processes' events every 10 ms): otherwise they fire in some runs and not in others,
and the counts differ by a few percent from run to run. Kernel work (the
commit's write and fsync) is not counted; user-space only.

    .bench-venv/bin/python bench/instructions.py [--before REV] [--steps 10]

With ``--before``, that revision's tether (a temporary git worktree) is counted too, beside
the working tree's. Takes about five minutes per system on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = "Work through the list."


def child(system: str, tasks: int, steps: int) -> None:
    """Run *tasks* tasks (after three warm-up ones) of *steps* tool calls each."""
    sys.path.insert(0, str(HERE))
    from agent_runs import Probe
    from langchain_durable import build_agent, limits

    import tether as tt
    from tether.engine import worker
    from tether.integrations.langchain import LangChainAgent

    worker.QUICK_LOOK = 3600.0  # the watcher's look for other processes' events, every 10 ms

    folder = Path(tempfile.mkdtemp(prefix="tether-instructions-"))
    probe = Probe(folder)
    agent = build_agent(probe)
    probe.steps = steps
    settings = tt.Settings(lease_seconds=3600, poll_interval=30, defer_results_under=10)

    async def main() -> None:
        async with tt.Harness(f"sqlite:///{folder / 'tether.db'}", settings=settings) as h:
            h.add_agent("bench", LangChainAgent(agent, tools={"work": tt.ToolPolicy(
                idempotent=True)}))
            answer, task = "", ""
            for run in range(3 + tasks):
                probe.tools = 0
                if system == "plain" and run >= 3:
                    state = await agent.ainvoke({"messages": [("user", PROMPT)]}, limits())
                    answer = str(state["messages"][-1].text)
                else:
                    task = await h.submit("bench", PROMPT)
                    await h.run_until_idle(concurrency=1)
            if system != "plain":  # read once, after the counted runs: the same in every count
                answer = str((await h.get(task)).snapshot.result)
            if answer != f"done {steps}" or probe.tools != steps:
                raise SystemExit(f"{system}: the last run did not make its {steps} calls"
                                 f" ({probe.tools} made, answer {answer!r})")

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def counted(system: str, tasks: int, steps: int, src: Path | None) -> int:
    """Instructions a process running *tasks* tasks ran (with *src*, that tree's tether)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, __file__, "--child", system, str(tasks), str(steps)],
                         env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count: {run.stderr[-400:]}")
    return int(found.group(1))


def per_task(system: str, steps: int, fewer: int, more: int, src: Path | None) -> float:
    return (counted(system, more, steps, src) - counted(system, fewer, steps, src)) / (more - fewer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="tool calls per task")
    parser.add_argument("--fewer", type=int, default=2)
    parser.add_argument("--more", type=int, default=22)
    parser.add_argument("--before", help="a git revision whose tether is counted too")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt install valgrind)")
    trees: dict[str, Path | None] = {"tether": None}
    with tempfile.TemporaryDirectory() as scratch:
        if args.before:
            worktree = Path(scratch) / "before"
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree),
                            args.before], cwd=HERE, check=True)
            trees[f"tether at {args.before}"] = worktree / "src"
        try:
            plain = per_task("plain", args.steps, args.fewer, args.more, None)
            print(f"| system | instructions per task of {args.steps} tool calls |"
                  " over plain, per tool call |\n|---|---|---|")
            print(f"| LangChain create_agent, plain | {plain / 1e6:.2f}M | |")
            for label, src in trees.items():
                mine = per_task("tether", args.steps, args.fewer, args.more, src)
                print(f"| {label} | {mine / 1e6:.2f}M | {(mine - plain) / args.steps / 1e6:.3f}M |")
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(worktree)],
                               cwd=HERE, check=False)


if __name__ == "__main__":
    main()
