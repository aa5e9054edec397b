"""The limits benchmark keeps working: ``bench/limits_accuracy.py`` at a tiny size, in the
benchmark's own environment. Speed is never asserted; the counts that do not depend on it
are: the provider never saw more calls in flight than the concurrency limit, the store never
admitted more searches in a second than the rate, and every search was served."""

from __future__ import annotations

import os
import subprocess

from test_bench_pydantic_ai import BENCH_PYTHON, ROOT, rows

import services

TASKS = 12


def test_the_limits_benchmark_runs_and_its_limits_held() -> None:
    if not BENCH_PYTHON.exists():
        services.unavailable(f"the benchmark environment {BENCH_PYTHON}", "not built")
    done = subprocess.run([str(BENCH_PYTHON), "bench/limits_accuracy.py", "--tasks", str(TASKS)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    out = done.stdout
    sqlite = rows(out, "sqlite")
    assert len(sqlite) == 2, out
    chat, search = sqlite
    assert int(chat[2].split()[0]) <= 8  # most in flight, against 8 at once
    assert int(search[3].split()[0]) <= 20  # most admitted in a second, against 20
    served = [row for row in out.splitlines() if row.startswith("| a shared limit")
              or row.startswith("| no shared limit")]
    assert len(served) == 3 and all(row.rstrip(" |").endswith(str(TASKS)) for row in served)
