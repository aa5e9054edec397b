"""Does a store that runs for ever stay the size of its work? A soak, not a timed test.

100,000 short tasks (one tool call, then a result) go through one SQLite store, submitted
in batches while a worker runs them, with retention on: a completed task is deleted
``--retain`` seconds after it finished, by the worker's own housekeeping. After every
``--every`` tasks the store's size on disk (the database file and its WAL) and the tasks
it holds are recorded. With retention the size should level off once the first tasks are
past their retention; the table shows whether it does.

    .bench-venv/bin/python bench/soak_retention.py [--tasks 100000]
        [--out docs/benchmarks-soak.md] [--plot docs/img/soak.png]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import tether as tt

DOCS = Path(__file__).resolve().parents[1] / "docs"


def build(db: Path, retain: float) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(
        retain_completed=retain, housekeeping_interval=1.0, poll_interval=0.05))

    @h.tool()
    async def lookup(ctx: tt.ToolContext, n: int) -> dict[str, object]:
        return {"n": n, "note": "a short answer of about a hundred bytes, like a lookup's"}

    @h.agent("short")
    class Short(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_tool_result is None:
                return tt.ToolCall("lookup", {"n": t.input})
            return tt.Finish(t.last_tool_result["n"])

    return h


def size_on_disk(db: Path) -> int:
    return sum(path.stat().st_size for path in db.parent.glob(db.name + "*"))


async def soak(tasks: int, every: int, retain: float) -> list[tuple[int, float, int, int]]:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "soak.db"
        h = build(db, retain)
        stop = asyncio.Event()
        worker = asyncio.create_task(h.serve(concurrency=32, stop=stop))
        start = time.monotonic()
        points = []
        submitted = 0
        while submitted < tasks:
            batch = min(every, tasks - submitted)
            for n in range(submitted, submitted + batch):
                await h.submit("short", n)
            submitted += batch
            while (await h.reads.counts()).get("pending", 0) + (
                    await h.reads.counts()).get("running", 0) > 0:
                await asyncio.sleep(0.05)
            held = sum((await h.reads.counts()).values())
            points.append((submitted, time.monotonic() - start, size_on_disk(db), held))
        stop.set()
        await worker
        await h.close()
    return points


def table(points: list[tuple[int, float, int, int]], retain: float) -> list[str]:
    lines = [f"### Store size over {points[-1][0]:,} tasks (SQLite, completed tasks kept"
             f" {retain:g} s)", "",
             "| tasks done | seconds | store on disk | tasks in the store |", "|---|---|---|---|"]
    lines += [f"| {done:,} | {secs:.0f} | {size / 1e6:.1f} MB | {held:,} |"
              for done, secs, size, held in points]
    half = points[len(points) // 2]
    lines += ["", f"From {half[0]:,} to {points[-1][0]:,} tasks the store went from"
              f" {half[2] / 1e6:.1f} MB to {points[-1][2] / 1e6:.1f} MB"
              f" ({points[-1][0] / points[-1][1]:.0f} tasks/s through one worker)."]
    return lines


def plot(points: list[tuple[int, float, int, int]], path: Path) -> None:
    """The store's size and the tasks it holds against the tasks done (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    done = [p[0] for p in points]
    fig, size = pyplot.subplots(figsize=(7, 3.2), dpi=120)
    size.plot(done, [p[2] / 1e6 for p in points], marker="o", color="#2f5bea", label="store on disk (MB)")
    size.set_xlabel("tasks done")
    size.set_ylabel("MB on disk")
    size.set_ylim(bottom=0)
    held = size.twinx()
    held.plot(done, [p[3] for p in points], color="#b54708", linestyle="--",
              label="tasks in the store")
    held.set_ylabel("tasks in the store")
    held.set_ylim(bottom=0)
    fig.legend(loc="center right", bbox_to_anchor=(0.86, 0.45), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=5_000)
    parser.add_argument("--retain", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="also draw the curve (needs matplotlib)")
    args = parser.parse_args()
    points = asyncio.run(soak(args.tasks, args.every, args.retain))
    lines = table(points, args.retain)
    if args.plot:
        plot(points, args.plot)
        where = args.plot.resolve()
        shown = where.relative_to(DOCS) if where.is_relative_to(DOCS) else where
        lines += ["", f"![store size and tasks held against tasks done]({shown})"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
