"""Turn the figures of one ``compare.py`` run into ``docs/benchmarks.md`` and its plot."""

from __future__ import annotations

import datetime as dt
import platform
import sqlite3
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from throughput import PEERS
from workload import byte_window

LABELS = {
    "bare": "bare loop, no durability",
    "floor-1": "raw SQLite floor, 1 commit/step",
    "floor-2": "raw SQLite floor, 2 commits/step",
    "tether-memory": "tether, in-memory store",
    "tether-sqlite": "tether, SQLite (default)",
    "tether-sqlite-synced": "tether, SQLite fully synced",
    "langgraph-memory": "LangGraph InMemorySaver",
    "langgraph-sqlite": "LangGraph SqliteSaver",
    "dbos-sqlite": "DBOS Transact, SQLite",
    "floor-postgres": "raw PostgreSQL floor, 1 commit/step",
    "tether-postgres": "tether, PostgreSQL",
    "langgraph-postgres": "LangGraph PostgresSaver",
    "dbos-postgres": "DBOS Transact, PostgreSQL",
}
STORES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
PACKAGES = ("tether", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres", "langchain-core", "dbos", "SQLAlchemy", "psycopg",
            "orjson", "matplotlib")


@dataclass
class Context:
    sizes: list[int]
    rounds: int
    postgres_skipped: str | None
    smoke: bool
    date: dt.datetime
    seconds: float
    command: str
    plot: str
    folder: Path
    """Where the report is written: the agent benchmarks of this run wrote their tables there."""


def failed(value: Any) -> bool:
    return isinstance(value, Exception)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def step_stats(results: dict[str, Any]) -> dict[str, dict[int, dict[str, float] | str]]:
    """Median and p99 of each system's step, and both over the bare loop's, in ms."""
    bare = results["steps"]["bare"]
    table: dict[str, dict[int, dict[str, float] | str]] = {}
    for system, by_size in results["steps"].items():
        table[system] = {}
        for size, seconds in by_size.items():
            if failed(seconds) or not seconds or failed(bare[size]):
                table[system][size] = f"did not run: {seconds}" if failed(seconds) else "no data"
                continue
            median, p99 = statistics.median(seconds) * 1e3, percentile(seconds, 0.99) * 1e3
            table[system][size] = {
                "median": median, "p99": p99,
                "over_median": median - statistics.median(bare[size]) * 1e3,
                "over_p99": p99 - percentile(bare[size], 0.99) * 1e3}
    return table


def overhead(stats: dict[str, Any], system: str, size: int) -> float | None:
    cell = stats.get(system, {}).get(size)
    return cell["over_median"] if isinstance(cell, dict) else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def times(value: float | None, digits: int = 2) -> str:
    """A ratio as ``1.23x``, or n/a."""
    return "n/a" if value is None else f"{fmt(value, digits)}x"


# ---------------------------------------------------------------------------- targets


def targets(results: dict[str, Any], stats: dict[str, Any], ctx: Context) -> list[list[str]]:
    """Each target of the issue: what was asked, what this run measured, met or not."""
    big = ctx.sizes[-1]
    rows = []

    def add(name: str, asked: str, value: float | None, shown: str, met: bool | None) -> None:
        verdict = "n/a" if value is None or met is None else ("met" if met else "**missed**")
        rows.append([name, asked, shown, verdict])

    for size in ctx.sizes:
        r = ratio(overhead(stats, "tether-sqlite", size), overhead(stats, "langgraph-sqlite", size))
        add(f"overhead vs SqliteSaver, S={size}", "≤ 0.25x", r, times(r, 3),
            None if r is None else r <= 0.25)
    floors = [("tether-sqlite", "floor-1", size) for size in ctx.sizes]
    floors += [("tether-sqlite-synced", "floor-2", big), ("tether-postgres", "floor-postgres", big)]
    for ours, floor, size in floors:
        r = ratio(overhead(stats, ours, size), overhead(stats, floor, size))
        add(f"{LABELS[ours]} vs {LABELS[floor]}, S={size}", "≤ 1.3x", r, times(r, 2),
            None if r is None else r <= 1.3)
    growth = byte_growth(results["bytes"].get("tether-sqlite"))
    add("tether SQLite bytes/step, last steps vs step 10", "≤ 1.2x", growth, times(growth, 2),
        None if growth is None else growth <= 1.2)
    r = ratio(last_bytes(results["bytes"].get("tether-sqlite")),
              last_bytes(results["bytes"].get("floor-1")))
    add(f"tether SQLite bytes written/step (WAL, checkpoints) vs {LABELS['floor-1']},"
        f" last {byte_window(big)} steps", "≤ 2x", r, times(r, 2),
        None if r is None else r <= 2)
    preempt = results["preempt"]
    p99 = None if failed(preempt) else preempt["p99_ms"]
    add("P0 preemption p99, one process", "< 5 ms", p99, f"{fmt(p99, 2)} ms",
        None if p99 is None else p99 < 5)
    recover = results["recover"]
    took = None if failed(recover) else recover["all_back_in_call_s"]
    add(f"{fmt(None if failed(recover) else recover['tasks'], 0)} interrupted tasks recovered",
        "< 0.5 s", took, f"{fmt(took, 2)} s", None if took is None else took < 0.5)
    resume = results["resume"].get("tether-sqlite")
    ms = None if resume is None or failed(resume) else resume * 1e3
    add(f"one {big}-step task resumed", "< 10 ms", ms, f"{fmt(ms, 1)} ms",
        None if ms is None else ms < 10)
    for store, found in results["preempt_cross"].items():
        p99 = None if failed(found) else found["p99_ms"]
        add(f"P0 preemption p99, from another process, {STORES[store]}", "< 20 ms", p99,
            f"{fmt(p99, 2)} ms", None if p99 is None else p99 < 20)
    return rows


def last_bytes(found: Any) -> float | None:
    """Bytes written per step over the last window of the task."""
    if found is None or failed(found) or not found["bytes_at"]:
        return None
    return float(found["bytes_at"][max(found["bytes_at"], key=int)])


def byte_growth(found: Any) -> float | None:
    if found is None or failed(found) or len(found["bytes_at"]) < 2:
        return None
    marks = sorted(found["bytes_at"], key=int)
    first, last = found["bytes_at"][marks[0]], found["bytes_at"][marks[-1]]
    return last / first if first else None


# ---------------------------------------------------------------------------- markdown


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def versions() -> list[list[str]]:
    rows = [["Python", platform.python_version()], ["SQLite (library)", sqlite3.sqlite_version]]
    for name in PACKAGES:
        try:
            rows.append([name, metadata.version(name)])
        except metadata.PackageNotFoundError:
            rows.append([name, "not installed"])
    return rows


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor() or "unknown CPU")
    cores = sum(1 for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("processor"))
    memory = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    return (f"{cpu}, {cores} cores, {memory / 1024 / 1024:.0f} GiB RAM, Linux"
            f" {platform.release()} ({platform.machine()})")


def step_table(stats: dict[str, Any], ctx: Context) -> str:
    head = ["system"] + [f"S={s}: median / p99 ms per step" for s in ctx.sizes] + [
        f"overhead over bare, S={ctx.sizes[-1]}: median / p99 ms",
        f"x tether SQLite overhead, S={ctx.sizes[-1]}"]
    ours = overhead(stats, "tether-sqlite", ctx.sizes[-1])
    rows = []
    for system, by_size in stats.items():
        cells = [LABELS[system]]
        for size in ctx.sizes:
            cell = by_size.get(size)
            cells.append(f"{cell['median']:.3f} / {cell['p99']:.3f}" if isinstance(cell, dict)
                         else str(cell))
        cell = by_size.get(ctx.sizes[-1])
        cells.append(f"{cell['over_median']:.3f} / {cell['over_p99']:.3f}"
                     if isinstance(cell, dict) else "")
        mine = overhead(stats, system, ctx.sizes[-1])
        cells.append(fmt(ratio(mine, ours), 2) if system != "bare" else "")
        rows.append(cells)
    return table(head, rows)


def bytes_table(results: dict[str, Any], ctx: Context) -> str:
    rows = []
    for system, found in results["bytes"].items():
        if failed(found):
            rows.append([LABELS[system], f"did not run: {found}", "", "", "", ""])
            continue
        marks = sorted(found["bytes_at"], key=int)
        cells = [f"{found['bytes_at'][m]:,.0f}" for m in marks]
        cells += [""] * (3 - len(cells))
        rows.append([LABELS[system], *cells, times(byte_growth(found), 2),
                     f"{found['store_bytes'] / 1e6:,.2f} MB"])
    return table(["system", "from step 10", "from step 100", f"last {byte_window(ctx.sizes[-1])}"
                  f" steps of {ctx.sizes[-1]}",
                  "growth", f"store size after {ctx.sizes[-1]} steps"], rows)


def section(heading: str, found: Any, render: Callable[[Any], str]) -> list[str]:
    """A figure's heading and its text, or why it did not run."""
    return ["", heading, "", f"did not run: {found}" if failed(found) else render(found)]


def figure_lines(results: dict[str, Any], ctx: Context) -> list[str]:
    out = []
    resume = results["resume"]
    out += ["### 3. Recovery after a restart", ""]
    recover = results["recover"]
    if failed(recover):
        out.append(f"Recovering many tasks did not run: {recover}")
    else:
        out.append(
            f"{recover['tasks']:,} tasks, each inside a call, their worker SIGKILLed: a new"
            f" process (64 tasks at a time) had every one of them claimed, loaded and back in"
            f" its call **{recover['all_back_in_call_s']:.2f} s** after it started, and all of"
            f" them finished after {recover['all_finished_s']:.2f} s.")
    out += ["", f"One task of {ctx.sizes[-1]:,} steps, its process SIGKILLed inside the next"
            " call; from the new process opening its store (imports done) until that call runs"
            " again:", ""]
    out.append(table(["system", "resume"], [
        [LABELS[s], f"did not run: {v}" if failed(v) else f"{v * 1e3:,.1f} ms"]
        for s, v in resume.items()]))
    out += section("### 4. P0 preemption latency", results["preempt"], lambda p: (
        f"Over {p['trials']:,} trials, from `emit(user_interrupt)` to the in-flight call"
        f" cancelled and the paused checkpoint committed (SQLite, FULL):"
        f" p50 **{p['p50_ms']:.2f} ms**, p99 **{p['p99_ms']:.2f} ms**, max {p['max_ms']:.2f} ms."))
    out += section("### 5. Event ingestion into one task's inbox", results["ingest"], lambda i: table(
        ["events sent (each durable before the next)", "events/s", "pending after"],
        [[f"{i['events']:,} `{kind}` ({what})", f"{i[key]['events_per_s']:,.0f}",
          f"{i[key]['pending_after']:,}"]
         for key, kind, what in (("coalescing", "progress", "P3, coalescing"),
                                 ("distinct", "user_message", "P1, never coalesced"))]))
    out += section("### 6. Memory per idle waiting task", results["idle"], lambda m: (
        f"{m['tasks']:,} tasks waiting for an approval in one process: RSS"
        f" {m['rss_before_mib']:.1f} → {m['rss_after_mib']:.1f} MiB,"
        f" **{m['rss_bytes_per_task']:,.0f} bytes per task** (SQLite's page cache included);"
        f" Python heap {m['heap_bytes_per_task']:,.0f} bytes per task (tracemalloc)."))
    workers = results["workers"]
    out += ["", "### 7. PostgreSQL: tasks x steps per second by workers", ""]
    if workers is None:
        out.append(f"PostgreSQL was not reachable: {ctx.postgres_skipped}")
    elif failed(workers):
        out.append(f"did not run: {workers}")
    else:
        out.append(table(["`tether worker` processes", "tasks x steps / s"],
                         [[str(n), f"{rate:,.0f}"] for n, rate in workers.items()]))
    out += throughput_lines(results["throughput"], ctx)
    out += ["", "### 9. P0 preemption from another process", "",
            "A `tether worker` process (default settings) holds one task inside an interruptible"
            " call; another process on the same store emits a `user_interrupt` (P0) and watches"
            " the store: from the emit returning (the event is durable) until the task's status"
            " reads `paused` (`bench/cross_process_p0.py`). The worker's CPU is measured per"
            " second of wall time, idle (no task) and while it holds the running task.", ""]
    out.append(table(["store", "trials", "p50 ms", "p99 ms", "max ms", "worker CPU idle, ms/s",
                      "worker CPU holding a task, ms/s"], [
        [STORES[store], f"did not run: {p}", "", "", "", "", ""] if failed(p) else
        [STORES[store], f"{p['trials']:,}", f"{p['p50_ms']:.2f}", f"**{p['p99_ms']:.2f}**",
         f"{p['max_ms']:.2f}", f"{p['idle_cpu_per_s'] * 1e3:.1f}",
         f"{p['busy_cpu_per_s'] * 1e3:.1f}"]
        for store, p in results["preempt_cross"].items()]))
    return out


def throughput_lines(found: dict[str, Any], ctx: Context) -> list[str]:
    """Figure 8: steps per second with many tasks in one worker, and tether over DBOS."""
    rates: dict[str, dict[int, Any]] = found["rates"]
    counts = sorted({n for by_count in rates.values() for n in by_count})

    def median(system: str, n: int) -> float | None:
        cell = rates.get(system, {}).get(n)
        return statistics.median(cell) if isinstance(cell, list) and cell else None

    def cell(system: str, n: int) -> str:
        value = rates[system].get(n)
        if failed(value):
            return f"did not run: {value}"
        if not value:
            return "no data"
        spread = f" ({min(value):,.0f} to {max(value):,.0f})" if len(value) > 1 else ""
        return f"{statistics.median(value):,.0f}{spread}"

    rows = [[LABELS[system], *(cell(system, n) for n in counts)] for system in rates]
    for ours, peer in PEERS.items():
        if ours in rates and peer in rates:
            rows.append([f"**{LABELS[ours]} / {LABELS[peer]}**",
                         *(f"**{times(ratio(median(ours, n), median(peer, n)), 2)}**"
                           for n in counts)])
    return ["", "### 8. Throughput with many tasks in one worker", "",
            f"N tasks of {found['steps']:,} steps each (the workload above), side by side in ONE"
            " worker process: tether submits them and runs `run_until_idle(concurrency=N)`;"
            " DBOS enqueues N workflows on a queue with `worker_concurrency=N`. Steps per"
            " second of all tasks together, timed from the first tool call of any task until"
            " every task is finished (submitting and the wait for the first dequeue left out;"
            f" `bench/throughput.py`); median of {ctx.rounds} interleaved rounds (with more than"
            " one, their range in brackets).", "",
            table(["system", *(f"{n:,} task{'s' if n > 1 else ''}: steps/s" for n in counts)],
                  rows)]


DOCS = Path(__file__).resolve().parents[1] / "docs"
COPIED = (
    ("benchmarks-pydantic-ai.md", "PydanticAI agents: tether beside PydanticAI's DBOS integration",
     "bench/pydantic_ai_durable.py"),
    ("benchmarks-openai-agents.md", "OpenAI Agents SDK agents: tether beside DBOS's integration",
     "bench/openai_agents_durable.py"),
    ("benchmarks-langchain.md", "LangChain agents: tether beside LangGraph's SqliteSaver",
     "bench/langchain_durable.py"),
    ("benchmarks-limits.md", "Shared limits: how exactly they hold, seen by the provider",
     "bench/limits_accuracy.py"),
    ("benchmarks-soak.md", "Soak: 100,000 tasks through one SQLite store with retention on",
     "bench/soak_retention.py"),
    ("benchmarks-schedules.md", "Schedules at scale: 10,000 every-minute schedules due at once",
     "bench/schedules_scale.py"),
)
"""Benchmarks with tables of their own (each needs agents or servers of its own), copied in:
the agent benchmarks as this run wrote them, the others from their last separate run."""
AGENT_LABELS = {"pydantic_ai": ("PydanticAIAgent", "benchmarks-pydantic-ai.md"),
                "openai_agents": ("OpenAIAgentsAgent", "benchmarks-openai-agents.md"),
                "langchain": ("LangChainAgent", "benchmarks-langchain.md")}


def copied_sections(results: dict[str, Any], ctx: Context) -> list[str]:
    """The sections of the benchmarks with tables of their own, where their tables exist."""
    ran = {AGENT_LABELS[name][1] for name, found in results.get("agents", {}).items()
           if not failed(found)}
    lines: list[str] = []
    for name, title, script in COPIED:
        path = ctx.folder / name if name in ran else DOCS / name
        if path.exists():
            source = (f"From this run of `{script}`." if name in ran else
                      f"From a separate run of `{script} --out docs/{name}`, copied here by"
                      " `compare.py`.")
            lines += ["", f"## {title}", "", source, "", path.read_text().strip()]
    return lines


def agent_targets(results: dict[str, Any]) -> list[list[str]]:
    """Issue 27's targets for each agent benchmark this run ran: tether's CPU ms per tool call
    above the plain run, at the sizes asked, and how far it moved across the sizes."""
    rows = []
    for name, found in results.get("agents", {}).items():
        label = AGENT_LABELS[name][0]
        if failed(found):
            rows.append([f"tether {label}: CPU overhead per tool call", "", f"did not run:"
                         f" {found}", "n/a"])
            continue
        medians = {int(n): v for n, v in found["tether_cpu_overhead_ms"].items()}
        for n in found["target_at"]:
            value = medians.get(n)
            rows.append([f"tether {label}: CPU overhead per tool call over plain, N={n}",
                         f"≤ {found['target_ms']:g} ms", f"{fmt(value, 2)} ms",
                         "n/a" if value is None else
                         ("met" if value <= found["target_ms"] else "**missed**")])
        sizes = sorted(medians)
        if len(sizes) > 1 and None not in medians.values():
            moved = medians[sizes[-1]] - medians[sizes[0]]
            rows.append([f"tether {label}: its overhead, N={sizes[0]} to N={sizes[-1]}",
                         f"rises ≤ {found['flat_ms']:g} ms", f"{moved:+.2f} ms",
                         "met" if moved <= found["flat_ms"] else "**missed**"])
    return rows


def markdown(results: dict[str, Any], ctx: Context) -> str:
    stats = step_stats(results)
    lines = [
        "# Benchmarks: tether beside LangGraph and DBOS",
        "",
        f"Generated by `{ctx.command}` on {ctx.date:%Y-%m-%d %H:%M} UTC in"
        f" {ctx.seconds / 60:.1f} min. Do not edit by hand: run it again."
        + (" **Smoke run: tiny sizes, the figures mean nothing.**" if ctx.smoke else ""),
        "",
        f"Machine: {machine()}. Every figure below comes from this one run; the machine is"
        " shared, so read ratios, not absolute times.",
        "",
        "The workload (`bench/workload.py`): an agent of S steps, each a tool call planned by a"
        " fake local model, with a 200-byte argument and a 500-byte result appended to the"
        " dialog. Each system runs it in its own idiom (`bench/systems.py`), each run in its"
        f" own process, {ctx.rounds} interleaved rounds pooled. A step is timed from one tool"
        " call to the next. SQLite stores use WAL and synchronous=FULL (LangGraph's saver and"
        " DBOS as shipped; tether's default); LangGraph checkpoints with `durability=\"sync\"`"
        " (each super-step durable before the next starts, as tether's resume point is).",
        "",
        "## Targets",
        "",
        table(["target", "asked", "this run", ""],
              targets(results, stats, ctx) + agent_targets(results)),
        "",
        "## Figures",
        "",
        "### 1. Durable overhead per step",
        "",
        step_table(stats, ctx),
        "",
        f"![overhead per step against S]({ctx.plot})",
        "",
        "### 2. Bytes written per step",
        "",
        "Bytes every `write()` of the process made (SQLite: WAL frames and checkpoints) or the"
        f" PostgreSQL WAL grew, averaged over {byte_window(ctx.sizes[-1])} steps from each"
        f" point of one task of {ctx.sizes[-1]:,} steps. Flat means the cost of a step does"
        " not grow with the history.",
        "",
        bytes_table(results, ctx),
        "",
        *figure_lines(results, ctx),
        "",
        "## Versions",
        "",
        table(["package", "version"], versions()),
        "",
    ]
    if ctx.postgres_skipped:
        lines += [f"PostgreSQL systems were left out: {ctx.postgres_skipped}", ""]
    lines += copied_sections(results, ctx)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plot


def plot(results: dict[str, Any], ctx: Context, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = step_stats(results)
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    colours = [*plt.get_cmap("tab10").colors, "black", "olive"]
    for n, (system, by_size) in enumerate(stats.items()):
        points = [(s, c["over_median"]) for s, c in sorted(by_size.items())
                  if isinstance(c, dict) and c["over_median"] > 0]
        if system == "bare" or not points:
            continue
        style = "-" if system.startswith("tether") else ("--" if "floor" in system else ":")
        ax.plot(*zip(*points, strict=True), style, marker="os^Dv<>ph*"[n % 10],
                color=colours[n % len(colours)], linewidth=2 if system.startswith("tether") else 1.4,
                label=LABELS[system])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ctx.sizes, [f"{s:,}" for s in ctx.sizes])
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("steps in the task (S)")
    ax.set_ylabel("median overhead per step over the bare loop (ms)")
    ax.set_title(f"Durable overhead per tool-call step ({ctx.date:%Y-%m-%d})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
