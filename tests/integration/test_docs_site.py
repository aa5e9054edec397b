"""The documentation site (issue 29): the tutorial's programs run as written, in an empty
folder, in order; each prints what the tutorial says it prints. (`mkdocs build --strict`
runs in `.ci/test`.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
EXPECTED = {
    "first_run.py": ["completed: refunded 5 EUR on A1, voucher sent", "payments: 2"],
    "kill_it.py": ["the worker died: exit -9", "completed: refunded 7 EUR on B2, voucher sent",
                   "payments for B2: 2 (a refund and a voucher, none twice)"],
    "a_person_decides.py": ["needs_human: outcome unknown: side-effecting call send_voucher",
                            "completed: refunded 3 EUR on C3, voucher sent"],
}


def test_every_tutorial_program_runs_as_written_and_prints_what_the_page_says(
        tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", TUTORIAL.read_text(), re.S)
    named = {re.match(r"# (\w+\.py)\n", b).group(1): b for b in blocks}  # type: ignore[union-attr]
    assert len(named) == len(blocks) == 4, "every block names its file on its first line"
    for name, text in named.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["PYTHONPATH"] = str(tmp_path)
    for program, lines in EXPECTED.items():
        ran = subprocess.run([sys.executable, program], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr[-2000:]
        for line in lines:
            assert line in ran.stdout, (program, ran.stdout)
    assert len((tmp_path / "payments.jsonl").read_text().splitlines()) == 6  # never twice
