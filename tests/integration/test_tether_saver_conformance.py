"""LangGraph's own checkpointer conformance suite over TetherSaver, on SQLite and on a real
PostgreSQL (issue 28: "it must pass LangGraph's own saver tests where the package ships
them"; R13: one store for everything).

``langgraph-checkpoint-conformance`` is LangGraph's suite for third-party savers: put,
put_writes, get_tuple, list, delete_thread (base), delete_for_runs, copy_thread and prune
(extended). Each capability gets a fresh saver on an empty store; every capability must be
detected and pass.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from langgraph.checkpoint.conformance import checkpointer_test, validate

import services
from tether.integrations.tether_saver import TetherSaver
from tether.store import open_store

CAPABILITIES = ("put", "put_writes", "get_tuple", "list", "delete_thread", "delete_for_runs",
                "copy_thread", "prune")


async def _passes_everything(url_of_a_fresh_store: Callable[[], str]) -> None:
    @checkpointer_test(name="TetherSaver")
    async def fresh() -> AsyncIterator[TetherSaver]:
        url = url_of_a_fresh_store()
        store = open_store(url)
        await store.migrate()
        try:
            yield TetherSaver(store)
        finally:
            await store.close()

    report = await validate(fresh)
    failures = {cap: result.failures for cap, result in report.results.items()
                if result.passed is not True}
    assert not failures, failures
    assert sorted(report.results) == sorted(CAPABILITIES)
    assert all(r.detected and r.tests_passed > 0 for r in report.results.values())
    assert report.conformance_level() == "FULL"


async def test_r13_tether_saver_passes_langgraphs_own_suite_on_sqlite(tmp_path: Path) -> None:
    def fresh_file() -> str:
        return f"sqlite:///{tempfile.mkdtemp(dir=tmp_path)}/t.db"

    await _passes_everything(fresh_file)


async def test_r13_tether_saver_passes_langgraphs_own_suite_on_postgres(pg_url: str) -> None:
    made: list[str] = []

    def fresh_database() -> str:
        made.append(services.create_database())
        return made[-1]

    try:
        await _passes_everything(fresh_database)
    finally:
        for url in made:
            services.drop_database(url)
