"""A LangGraph graph whose checkpoints TetherSaver keeps, its process SIGKILLed inside a node
(R10, R13; issue 28), on SQLite and on PostgreSQL.

The child (``_saver_graph_app.py``) runs a four-node graph (``durability="sync"``: each
super-step's checkpoint is stored before the next starts; LangGraph's default, "async", may
still be writing it when the process dies, with any saver) and blocks inside the node the
test names; the parent kills it there with SIGKILL and starts the graph again from its
thread (``ainvoke(None, ...)``), as LangGraph resumes from any saver. The ledger counts what
ran: the nodes before the kill ran once, the killed node once more (from its first line, as
every LangGraph saver resumes it), the rest once; the state is the uninterrupted run's,
messages stored as what each step added included.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections import Counter
from pathlib import Path

import pytest
from _child import ChildProcess

HERE = Path(__file__).resolve().parent
NODES = ["plan", "fetch", "write", "send"]


def child(tmp_path: Path, url: str, mode: str, block_at: str | None = None) -> ChildProcess:
    env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, str(HERE / "_saver_graph_app.py"), url, str(tmp_path / "ledger.db"),
            mode, *([block_at] if block_at else [])]
    return ChildProcess(argv, env, tmp_path, f"saver-{mode}", 60.0)


def ran(tmp_path: Path) -> Counter[str]:
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        return Counter(what for (what,) in db.execute("SELECT what FROM runs"))


def killed_then_resumed(tmp_path: Path, url: str, block_at: str) -> dict[str, list[str]]:
    first = child(tmp_path, url, "run", block_at)
    first.expect(f"IN {block_at}")
    first.signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    again = child(tmp_path, url, "resume")
    done: dict[str, list[str]] = json.loads(again.expect("DONE ").removeprefix("DONE "))
    again.proc.wait(timeout=30)
    return done


@pytest.mark.parametrize("block_at", ["fetch", "send"])
def test_r10_a_graph_killed_in_a_node_resumes_there_on_sqlite(
        tmp_path: Path, block_at: str) -> None:
    done = killed_then_resumed(tmp_path, f"sqlite:///{tmp_path / 'store.db'}", block_at)
    assert done == {"log": NODES, "messages": NODES}
    assert ran(tmp_path) == Counter({n: 2 if n == block_at else 1 for n in NODES})


def test_r10_a_graph_killed_in_a_node_resumes_there_on_postgres(
        tmp_path: Path, pg_url: str) -> None:
    done = killed_then_resumed(tmp_path, pg_url, "write")
    assert done == {"log": NODES, "messages": NODES}
    assert ran(tmp_path) == Counter({n: 2 if n == "write" else 1 for n in NODES})
