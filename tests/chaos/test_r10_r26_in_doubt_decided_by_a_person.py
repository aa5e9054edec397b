"""R10, R26 (issue 13): a refund in doubt after a SIGKILL is settled by a person, never by a resume.

A worker process is SIGKILLed inside a blind refund (the provider paid; nobody can ask it
whether it did). The next worker parks the task. A plain ``tether resume`` is refused, naming
the three answers, and pays nothing; ``tether decide`` records what the person says, with who
said it, and the next worker carries on from there. The provider's ledger is the judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import app
import pytest
from test_sigkill_recovery import (  # the chaos suite's child processes and checkers
    BLIND_CALLS,
    Child,
    Paths,
    cli,
    refund_problems,
    run_to_kill,
    state,
    submit,
    with_harness,
)


def _parked_after_kill(paths: Paths, children: Callable[..., Child]) -> None:
    submit(paths, "refunder", {"calls": BLIND_CALLS}, "blind")
    run_to_kill(paths, children, "inside_tool@2")  # b1 paid, then the worker died
    parked = state(paths, "blind")
    assert parked.status == "needs_human" and "outcome unknown" in (parked.reason or "")
    assert refund_problems(paths.ledger, once=["b1"], never=["b2"]) == []


def test_r10_a_plain_resume_after_a_kill_is_refused_and_pays_nothing(
        paths: Paths, children: Callable[..., Child]) -> None:
    """R10: `tether resume` on the parked task exits non-zero listing happened, not_happened
    and skip; a worker run afterwards pays nothing more and the task stays parked."""
    _parked_after_kill(paths, children)
    refused = cli(paths, "resume", "blind")
    assert refused.returncode != 0, refused.stdout
    said = " ".join((refused.stdout + refused.stderr).split())
    for answer in ("happened", "not_happened", "skip"):
        assert answer in said, said
    worker = children(paths, "drain")
    worker.expect("READY")
    worker.assert_clean_exit()
    assert state(paths, "blind").status == "needs_human"
    assert refund_problems(paths.ledger, once=["b1"], never=["b2"]) == []


@pytest.mark.parametrize(("outcome", "b1_paid"), [("happened", 1), ("skip", 1),
                                                  ("not_happened", 2)])
def test_r10_r26_the_person_decides_and_the_next_worker_carries_on(
        paths: Paths, children: Callable[..., Child], outcome: str, b1_paid: int) -> None:
    """R10/R26: the person's answer is applied once; `happened` and `skip` never call the
    provider again, `not_happened` calls it once more under the same key (the person said it
    had not paid: the ledger records what the person asked for); b2 then runs once."""
    _parked_after_kill(paths, children)
    args = ["decide", "blind", outcome]
    if outcome == "happened":
        args += ["--result", json.dumps(app.refund_result("b1", 15))]
    decided = cli(paths, *args)
    assert decided.returncode == 0, (decided.stdout, decided.stderr)
    worker = children(paths, "drain")
    worker.expect("READY")
    worker.assert_clean_exit()
    st = state(paths, "blind")
    assert st.status == "completed", (st.status, st.reason, st.strategies)
    assert app.refund_counts(paths.ledger)["b1"] == b1_paid
    assert app.refund_counts(paths.ledger)["b2"] == 1
    assert st.strategies.count("human_decision") == 1, st.strategies
    decision = next(r for r in st.log if r["resume_strategy"] == "human_decision")
    assert "cli:" in decision["detail"], decision

    async def decide_rows(h):  # type: ignore[no-untyped-def]
        return [row for row in await h.history("blind") if row.get("type") == "decide"]

    rows = with_harness(paths, decide_rows)
    assert [row["content"]["outcome"] for row in rows] == [outcome]
    assert rows[0]["content"]["by"].startswith("cli:")
