"""The README's CrewAI program works verbatim, run here, in CrewAI's own environment, by the
same test as every other README program (tests/integration/test_readme_snippets.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

_spec = importlib.util.spec_from_file_location(
    "tether_readme_snippets",
    Path(__file__).resolve().parents[1] / "integration" / "test_readme_snippets.py")
assert _spec is not None and _spec.loader is not None
snippets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(snippets)

CREWAI_PROGRAMS = [name for name, text in snippets.programs().items() if "CrewAIAgent(" in text]


def test_the_readme_has_a_crewai_program() -> None:
    assert CREWAI_PROGRAMS


@pytest.mark.parametrize("name", CREWAI_PROGRAMS)
def test_the_readme_crewai_program_runs_as_written(name: str, tmp_path: Path) -> None:
    snippets.test_a_readme_program_runs_as_written(name, tmp_path)
