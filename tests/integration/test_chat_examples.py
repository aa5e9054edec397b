"""The ChatAgent and framework examples run end to end against the fake OpenAI-compatible
server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("script", "expected"), [
    ("chat_contracts.py", "Reviewed 3 contracts: C-1 high, C-2 low, C-3 medium."),
    ("chat_report.py", "Margin fell from 21% to 18%"),
    ("pydantic_ai_support.py", "Order A1 arrived broken: I refunded 5 EUR."),
    ("openai_agents_support.py", "Order A1 arrived broken: I refunded 5 EUR."),
    ("langchain_support.py", "Order A1 arrived broken: I refunded 5 EUR."),
    ("adk_support.py", "Order A1 arrived broken: I refunded 5 EUR."),
])
def test_chat_example_completes_under_the_fake_model(tmp_path: Path, script: str,
                                                     expected: str) -> None:
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--fake", "--db",
                          str(tmp_path / "x.db")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("completed: ") and expected in run.stdout


def test_the_langgraph_example_waits_for_a_person_then_completes(tmp_path: Path) -> None:
    """The hand-built graph example needs no model: it charges once, waits, ships."""
    run = subprocess.run([sys.executable, str(EXAMPLES / "langgraph_orders.py"), "--db",
                          str(tmp_path / "x.db")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "waiting: a person is asked",
        "completed: checked A1; charged 40 EUR (R-A1); approved by ops; shipped A1"]
