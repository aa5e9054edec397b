"""The README's CrewAI example runs to its end under the fake model (issue 31)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("crewai", reason="CrewAI runs in its own environment: .ci/crewai-venv")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_crewai_example_completes_under_the_fake_model(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(EXAMPLES / "crewai_support.py"), "--fake", "--db",
                          str(tmp_path / "x.db")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == (
        "completed: Order A1 arrived broken: I refunded 5 EUR.")
