"""``bench/instructions.py`` keeps working (issue 28's instruction counts): the workload its
callgrind runs count, run here without valgrind, plain and under tether, finishes every task
with its N tool calls (the child checks the last run's answer and calls, and exits
non-zero otherwise).

Counting itself takes minutes under valgrind, so it is not run here; what would break it is
the workload (the agent of ``langchain_durable.py``, the harness settings), which is.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import services

ROOT = Path(__file__).resolve().parents[2]
BENCH_PYTHON = Path(os.environ.get("TETHER_BENCH_PYTHON", ROOT / ".bench-venv" / "bin" / "python"))


@pytest.mark.parametrize("system", ["plain", "tether"])
def test_the_counted_workload_runs_every_task(system: str, tmp_path: Path) -> None:
    if not BENCH_PYTHON.exists():
        message = f"no benchmark environment at {BENCH_PYTHON} (.ci/bench-venv builds it)"
        if services.required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    done = subprocess.run(
        [str(BENCH_PYTHON), "bench/instructions.py", "--child", system, "2", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": "", "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(tmp_path.glob("tether-instructions-*")), "the run's folder is left behind"
