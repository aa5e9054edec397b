"""tether's own step cost before and after a change, side by side in one run.

Checks the older revision out into a temporary git worktree and runs the workload of
``systems.py`` with each tree's ``src`` first on the path, in interleaved rounds,
with the raw SQLite floors in the same rounds:

    .bench-venv/bin/python bench/before_after.py --before dc72266 --steps 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compare import PG, RunFailed, run_system
from workload import byte_marks

HERE = Path(__file__).resolve().parent
SYSTEMS = ("tether-memory", "tether-sqlite", "tether-sqlite-synced")
FLOORS = ("bare", "floor-1", "floor-2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tree = Path(tempfile.mkdtemp(prefix="tether-before-")) / "tree"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), args.before],
                   cwd=HERE, check=True)
    trees = {"before": tree / "src", "after": HERE.parent / "src"}
    seconds: dict[str, list[float]] = {}
    written: dict[str, float] = {}
    try:
        for round_ in range(args.rounds):
            for name in FLOORS:
                seconds.setdefault(name, []).extend(
                    run_system(name, args.steps)["step_seconds"])
            for system in SYSTEMS:
                for label, src in trees.items():
                    extra = ("--bytes",) if round_ == 0 else ()
                    found = run_system(system, args.steps, None, PG, *extra, src=src)
                    seconds.setdefault(f"{system} {label}", []).extend(found["step_seconds"])
                    if found["bytes_at"]:
                        last = str(byte_marks(args.steps)[-1])
                        written[f"{system} {label}"] = found["bytes_at"][last]
    except RunFailed as failure:
        sys.exit(f"a run failed: {failure}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=HERE, check=False)
    bare = statistics.median(seconds["bare"]) * 1e3
    print(f"{args.steps} steps, {args.rounds} interleaved rounds; ms per step over the bare"
          f" loop ({bare:.3f} ms), median")
    for name, values in seconds.items():
        over = statistics.median(values) * 1e3 - bare
        extra = f"  {written[name]:>9,.0f} bytes/step" if name in written else ""
        print(f"  {name:32} {over:7.3f}{extra}")


if __name__ == "__main__":
    main()
