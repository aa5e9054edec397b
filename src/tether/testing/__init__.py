"""Fault injection and torture runs for your own agents (``tether torture``).

    import tether.testing as tt_testing
    report = await tt_testing.torture(tt_testing.Target("myapp:harness", "my_agent", {...}))
    assert report.ok, report.violations

See :mod:`tether.testing.chaos` for what is run and what counts as a violation.
"""

from tether.testing.chaos import Target, TortureReport, Violation, torture
from tether.testing.faults import FaultPlan, InjectedFault, Ledger

__all__ = ["FaultPlan", "InjectedFault", "Ledger", "Target", "TortureReport", "Violation",
           "torture"]
