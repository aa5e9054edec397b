"""`tether demo` shows all three kinds of interruption and checks its own claims (R1)."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_every_scenario_and_its_checks_pass() -> None:
    """R1: preemption, a SIGKILLed worker mid-refund, nested subtasks, a fault handed to a person."""
    result = subprocess.run([sys.executable, "-m", "tether", "demo"], capture_output=True,
                            text=True, timeout=120)
    out = " ".join(result.stdout.split())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every check passed" in out
    assert "SIGKILLed" in out
    assert "recovery: resume, reconcile" in out
    assert out.count("1 ✓") == 3
