"""R13: when a worker renews each lease it holds (``tether.engine.worker.Renewals``): once a
third of the lease has passed since that lease was taken or last renewed, not on one schedule
for all of them (a lease taken a moment ago is not written again)."""

from __future__ import annotations

from tether.engine.worker import Renewals


def test_a_lease_is_due_a_third_of_its_length_after_it_was_taken_or_renewed() -> None:
    renewals = Renewals(lease_seconds=3.0)
    renewals.started("a", at=100.0)
    renewals.started("b", at=100.9)  # taken just before a's renewal falls due
    assert not renewals.due("a", 100.99)
    assert renewals.due("a", 101.0) and not renewals.due("b", 101.0)
    assert renewals.due("b", 101.9)
    renewals.started("a", at=101.0)  # renewed: the next third starts now
    assert not renewals.due("a", 101.9) and renewals.due("a", 102.0)


def test_a_lease_not_known_is_due_and_a_forgotten_one_is_not_remembered() -> None:
    """A claim the schedule has not seen is renewed at the next look rather than never."""
    renewals = Renewals(lease_seconds=3.0)
    assert renewals.due("unknown", 5.0)
    renewals.started("a", at=100.0)
    renewals.forget("a")
    renewals.forget("a")  # forgetting twice is harmless
    assert renewals.due("a", 100.0)
