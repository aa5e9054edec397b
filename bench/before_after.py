"""tether's own step cost before and after a change, side by side in one run.

Checks the older revision out into a temporary git worktree and runs the workload of
``systems.py`` with each tree's ``src`` first on the path, in interleaved rounds,
with the raw SQLite floors in the same rounds; with ``--postgres``, also tether's
PostgreSQL store and the raw PostgreSQL floor (a fresh database each run; bytes per step
are the server's WAL growth, as ``systems.py`` measures them):

    .bench-venv/bin/python bench/before_after.py --before dc72266 --steps 1000 --rounds 5
    .bench-venv/bin/python bench/before_after.py --before dc72266 --postgres
    .bench-venv/bin/python bench/before_after.py --before dc72266 --recovery

With ``--recovery``, the recovery figures instead, each tree in both of its processes: one
task of ``--steps`` steps SIGKILLed inside its last call, the milliseconds until a new
process runs that call again; and 1,000 tasks SIGKILLed in their calls, the seconds until
a new process has every one back in its call.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compare import PG, RunFailed, killed_and_resumed, recover_many, run_system
from workload import byte_marks, byte_window

HERE = Path(__file__).resolve().parent
SYSTEMS = ("tether-memory", "tether-sqlite", "tether-sqlite-synced")
FLOORS = ("bare", "floor-1", "floor-2")
POSTGRES_SYSTEMS = ("tether-postgres",)
POSTGRES_FLOORS = ("floor-postgres",)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true",
                        help="also tether's PostgreSQL store and the raw PostgreSQL floor")
    parser.add_argument("--pg", default=PG)
    parser.add_argument("--recovery", action="store_true",
                        help="the resume and recovery figures instead of the step costs")
    parser.add_argument("--recover-tasks", type=int, default=1000)
    args = parser.parse_args()
    floors = FLOORS + (POSTGRES_FLOORS if args.postgres else ())
    systems = SYSTEMS + (POSTGRES_SYSTEMS if args.postgres else ())
    tree = Path(tempfile.mkdtemp(prefix="tether-before-")) / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), args.before],
                   cwd=HERE, check=True)
    trees = {"before": tree / "src", "after": HERE.parent / "src"}
    if args.recovery:
        try:
            recovery_figures(trees, args.steps, args.recover_tasks, args.rounds)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE,
                           check=False)
            shutil.rmtree(tree.parent, ignore_errors=True)
        return
    seconds: dict[str, list[float]] = {}
    written: dict[str, float] = {}
    marks = byte_marks(args.steps)
    last = str(marks[-1]) if marks else ""

    def run(name: str, label: str | None, round_: int) -> None:
        """One run; in the first round also its bytes per step (the floors' too, for scale)."""
        extra = ("--bytes",) if round_ == 0 and name != "bare" else ()
        src = trees[label] if label else None
        found = run_system(name, args.steps, None, args.pg, *extra, src=src)
        key = f"{name} {label}" if label else name
        seconds.setdefault(key, []).extend(found["step_seconds"])
        if last in found["bytes_at"]:
            written[key] = found["bytes_at"][last]

    try:
        for round_ in range(args.rounds):
            for name in floors:
                run(name, None, round_)
            for system in systems:
                for label in trees:
                    run(system, label, round_)
    except RunFailed as failure:
        sys.exit(f"a run failed: {failure}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE, check=False)
        shutil.rmtree(tree.parent, ignore_errors=True)
    bare = statistics.median(seconds["bare"]) * 1e3
    print(f"{args.steps} steps, {args.rounds} interleaved rounds; ms per step over the bare"
          f" loop ({bare:.3f} ms), median; bytes written per step over the last"
          f" {byte_window(args.steps)} steps (SQLite: the process's writes; PostgreSQL: WAL)")
    for name, values in seconds.items():
        over = statistics.median(values) * 1e3 - bare
        extra = f"  {written[name]:>9,.0f} bytes/step" if name in written else ""
        print(f"  {name:32} {over:7.3f}{extra}")


def recovery_figures(trees: dict[str, Path], steps: int, tasks: int, rounds: int) -> None:
    """Each tree's resume and recovery figures, in interleaved rounds; medians and ranges."""
    resumed: dict[str, list[float]] = {label: [] for label in trees}
    recovered: dict[str, list[float]] = {label: [] for label in trees}
    try:
        for _ in range(rounds):
            for label, src in trees.items():
                resumed[label].append(killed_and_resumed("tether-sqlite", steps, None, src) * 1e3)
                recovered[label].append(recover_many(tasks, None, src)["all_back_in_call_s"])
    except RunFailed as failure:
        sys.exit(f"a run failed: {failure}")
    print(f"{rounds} interleaved rounds; median (range)")
    for label in trees:
        print(f"  {label:7} one {steps}-step task back in its call:"
              f" {_spread(resumed[label], 'ms')};"
              f" {tasks:,} tasks back in their calls: {_spread(recovered[label], 's')}")


def _spread(values: list[float], unit: str) -> str:
    return (f"{statistics.median(values):.3g} {unit} ({min(values):.3g} to"
            f" {max(values):.3g})")


if __name__ == "__main__":
    main()
