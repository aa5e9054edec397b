"""The workload of :mod:`workload`, written once for each system compared (issue 7).

Each run is its own process, so one system's imports, threads and garbage never
weigh on another's figures:

    python bench/systems.py SYSTEM STEPS FOLDER [--pg URL] [--bytes]

prints one JSON line: the seconds of every step, and with ``--bytes`` the bytes
written around steps 10, 100 and S-1 and the store's size after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from workload import Meter, fake_model, process_bytes_written

import tether as tt

LEASE = 1.0
"""Seconds a killed process's lease lasts in the resume figure: the parent waits it out."""
WORKFLOW_ID = "bench"

# ---------------------------------------------------------------------------- baselines


def run_bare(meter: Meter, steps: int) -> None:
    """No durability at all: the agent logic and nothing else."""
    dialog: list[Any] = []
    while (call := fake_model(len(dialog) // 2, steps)) is not None:
        dialog.append(call)
        dialog.append(meter.tool_called(**call["args"]))


def raw_sqlite(path: Path) -> sqlite3.Connection:
    """SQLite as tether's file store opens it: WAL, synchronous=FULL, autocommit."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("CREATE TABLE steps (task TEXT, n INTEGER, kind TEXT, body TEXT)")
    return db


def commit_row(db: sqlite3.Connection, n: int, kind: str, body: Any) -> None:
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO steps VALUES ('t', ?, ?, ?)", (n, kind, json.dumps(body)))
    db.execute("COMMIT")


def run_floor(meter: Meter, steps: int, folder: Path, commits: int) -> None:
    """The physical floor: the bare loop plus the raw SQLite commits a durable step needs.

    One commit per step (the call and its result, as tether does for a quick idempotent
    tool), or two (the resume point before the call, the result after it).
    """
    db = raw_sqlite(folder / f"floor{commits}.db")
    dialog: list[Any] = []
    while (call := fake_model(len(dialog) // 2, steps)) is not None:
        n = call["args"]["n"]
        if commits == 2:
            commit_row(db, n, "call", call)
        result = meter.tool_called(**call["args"])
        commit_row(db, n, "result", result if commits == 2 else {"call": call, "result": result})
        dialog += [call, result]
    db.close()


def run_postgres_floor(meter: Meter, steps: int, url: str) -> None:
    """PostgreSQL's physical floor: the bare loop plus one small row committed per step
    (the call and its result), each in its own transaction, from one connection."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE steps (task TEXT, n INTEGER, kind TEXT, body TEXT)")
        dialog: list[Any] = []
        while (call := fake_model(len(dialog) // 2, steps)) is not None:
            result = meter.tool_called(**call["args"])
            conn.execute("INSERT INTO steps VALUES ('t', %s, 'result', %s)",
                         (call["args"]["n"], json.dumps({"call": call, "result": result})))
            dialog += [call, result]


# ---------------------------------------------------------------------------- tether


def bench_harness(meter: Meter, steps: int, url: str,
                  settings: tt.Settings | None = None) -> tt.Harness:
    """tether with the workload's tool and agent registered (also used by throughput.py)."""
    harness = tt.Harness(url, settings=settings)

    @harness.tool()
    async def work(ctx: tt.ToolContext, payload: str, n: int) -> str:
        return meter.tool_called(n)

    @harness.agent("bench")
    class Bench(tt.Agent):
        async def plan(self, task: tt.TaskView) -> tt.Action:
            call = fake_model(task.step, steps)
            return tt.Finish(task.step) if call is None else tt.ToolCall("work", call["args"])

    return harness


def run_tether(meter: Meter, steps: int, url: str, settings: tt.Settings | None = None,
               resume: bool = False) -> None:
    """With *resume*, the task a killed process left behind is picked up (its lease is short)."""
    settings = settings or tt.Settings()
    if resume or meter.hang_at is not None:
        settings = dataclasses.replace(settings, lease_seconds=LEASE)

    async def main() -> None:
        async with bench_harness(meter, steps, url, settings) as harness:
            if not resume:
                await harness.submit("bench")
            await harness.run_until_idle(concurrency=1)

    asyncio.run(main())


# ---------------------------------------------------------------------------- LangGraph


def run_langgraph(meter: Meter, steps: int, checkpointer: Any, resume: bool = False) -> None:
    """The usual model-node / tool-node loop over ``MessagesState``, checkpointed every
    super-step before the next one starts (``durability="sync"``, tether's guarantee)."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def work(payload: str, n: int) -> str:
        """One step of the agent's work."""
        return meter.tool_called(n)

    def model(state: MessagesState) -> dict[str, Any]:
        results = (len(state["messages"]) - 1) // 2
        call = fake_model(results, steps)
        if call is None:
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[
            {"name": call["name"], "args": call["args"], "id": f"call_{results}"}])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([work]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    app = graph.compile(checkpointer=checkpointer)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10}
    start = None if resume else {"messages": [HumanMessage("go")]}
    app.invoke(start, config, durability="sync")


def run_langgraph_memory(meter: Meter, steps: int) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    run_langgraph(meter, steps, InMemorySaver())


def run_langgraph_sqlite(meter: Meter, steps: int, folder: Path, resume: bool) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(folder / "langgraph.db", check_same_thread=False)
    run_langgraph(meter, steps, SqliteSaver(conn), resume)
    conn.close()


def run_langgraph_postgres(meter: Meter, steps: int, url: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        run_langgraph(meter, steps, saver)


# ---------------------------------------------------------------------------- DBOS


def dbos_agent(meter: Meter, steps: int, url: str) -> Callable[[], int]:
    """DBOS configured on *url*, and the workload as a DBOS workflow whose model turns and
    tool calls are steps, each one recorded (also used by throughput.py)."""
    from dbos import DBOS

    DBOS(config={"name": "tether-bench", "system_database_url": url,
                 "log_level": "WARNING"})

    @DBOS.step()
    def model_turn(results: int) -> dict[str, Any] | None:
        return fake_model(results, steps)

    @DBOS.step()
    def work(payload: str, n: int) -> str:
        return meter.tool_called(n)

    @DBOS.workflow()
    def agent() -> int:
        dialog: list[Any] = []
        while (call := model_turn(len(dialog) // 2)) is not None:
            dialog += [call, work(**call["args"])]
        return len(dialog) // 2

    return agent


def run_dbos(meter: Meter, steps: int, url: str, resume: bool = False) -> None:
    """One DBOS workflow of the workload. With *resume*, DBOS's own recovery at launch re-runs
    the workflow a killed process left pending, answering the steps already recorded from
    its step table."""
    from dbos import DBOS, SetWorkflowID

    agent = dbos_agent(meter, steps, url)
    DBOS.launch()
    if resume:
        DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
    else:
        with SetWorkflowID(WORKFLOW_ID):
            agent()
    DBOS.destroy()


# ---------------------------------------------------------------------------- running one


@contextmanager
def fresh_database(admin: str) -> Iterator[str]:
    """A PostgreSQL database of its own for one run, dropped afterwards."""
    import psycopg

    name = f"tether_cmp_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{admin.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_meters(url: str) -> tuple[Callable[[], int], Callable[[], int]]:
    """WAL bytes the server has written so far, and the database's size on disk."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True)

    def wal() -> int:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").fetchone()
        return int(row[0]) if row else 0

    def size() -> int:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        return int(row[0]) if row else 0

    return wal, size


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


SQLITE_SYSTEMS: dict[str, Callable[[Meter, int, Path, bool], None]] = {
    "bare": lambda m, s, f, r: run_bare(m, s),
    "floor-1": lambda m, s, f, r: run_floor(m, s, f, 1),
    "floor-2": lambda m, s, f, r: run_floor(m, s, f, 2),
    "tether-memory": lambda m, s, f, r: run_tether(m, s, "memory://"),
    "tether-sqlite": lambda m, s, f, r: run_tether(m, s, f"sqlite:///{f / 'tether.db'}",
                                                   resume=r),
    "tether-sqlite-synced": lambda m, s, f, r: run_tether(
        m, s, f"sqlite:///{f / 'tether.db'}", tt.Settings(defer_results_under=0), r),
    "langgraph-memory": lambda m, s, f, r: run_langgraph_memory(m, s),
    "langgraph-sqlite": run_langgraph_sqlite,
    "dbos-sqlite": lambda m, s, f, r: run_dbos(m, s, f"sqlite:///{f / 'dbos.sqlite'}", r),
}
RESUMABLE = ("tether-sqlite", "langgraph-sqlite", "dbos-sqlite")
"""Systems whose one long task is also killed and resumed (figure 3)."""
POSTGRES_SYSTEMS: dict[str, Callable[[Meter, int, str], None]] = {
    "floor-postgres": run_postgres_floor,
    "tether-postgres": run_tether,
    "langgraph-postgres": run_langgraph_postgres,
    "dbos-postgres": run_dbos,
}


PRELOAD = {
    "langgraph": ("langchain_core.messages", "langchain_core.tools", "langgraph.graph",
                  "langgraph.prebuilt", "langgraph.checkpoint.memory",
                  "langgraph.checkpoint.sqlite", "langgraph.checkpoint.postgres"),
    "dbos": ("dbos",),
}
"""Imported before the clock starts, so that a resume is not charged for them."""


def run(system: str, steps: int, folder: Path, pg: str, count_bytes: bool,
        mode: str) -> dict[str, Any]:
    """Run the workload once; in mode ``hang`` its last call never returns (the parent kills
    the process), in mode ``resume`` the task the killed process left is picked up."""
    for module in PRELOAD.get(system.partition("-")[0], ()):
        importlib.import_module(module)
    if system in POSTGRES_SYSTEMS:
        with fresh_database(pg) as url:
            wal, size = postgres_meters(url)
            meter = Meter(steps, wal if count_bytes else None)
            before = size()
            POSTGRES_SYSTEMS[system](meter, steps, url)
            return meter.report() | {"store_bytes": size() - before}
    meter = Meter(steps, process_bytes_written if count_bytes else None,
                  hang_at=steps - 1 if mode == "hang" else None)
    SQLITE_SYSTEMS[system](meter, steps, folder, mode == "resume")
    return meter.report() | {"store_bytes": folder_size(folder)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=[*SQLITE_SYSTEMS, *POSTGRES_SYSTEMS])
    parser.add_argument("steps", type=int)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--bytes", action="store_true", help="count bytes written per step")
    parser.add_argument("--mode", choices=("run", "hang", "resume"), default="run")
    args = parser.parse_args()
    if args.mode != "run" and args.system not in RESUMABLE:
        parser.error(f"--mode {args.mode} is for {', '.join(RESUMABLE)}")
    args.folder.mkdir(parents=True, exist_ok=True)
    result = run(args.system, args.steps, args.folder, args.pg, args.bytes, args.mode)
    if args.mode == "resume":
        print(json.dumps({"resume_to_call_s": result["first_call_s"], "calls": result["calls"]}))
        return
    if result["calls"] != args.steps:
        sys.exit(f"{args.system}: {result['calls']} tool calls ran, expected {args.steps}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
