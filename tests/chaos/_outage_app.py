"""The chaos app (``app.py``) as ``tether worker --app _outage_app:cli_harness`` runs it, with
three test-only knobs set from the environment before the worker starts:

- ``TETHER_CHAOS_CLOCK_SKEW``  seconds added to this process's wall clock (``time.time``),
  e.g. ``-30`` for a machine whose clock runs 30 s behind (tether reads the wall clock only
  through ``time.time()``; ``asyncio`` sleeps on the monotonic clock, which is unchanged).
- ``TETHER_CHAOS_BUSY_MS``     the SQLite store's busy timeout in milliseconds (default 10 s),
  so a test can hold the write lock for a few busy timeouts without waiting minutes.
- ``TETHER_CHAOS_LOG=1``       log the ``tether`` loggers at INFO to stderr as
  ``LOG <level> <logger>: <message>`` lines, so a test can count what a worker logged.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_skew = float(os.environ.get("TETHER_CHAOS_CLOCK_SKEW", "0") or 0)
if _skew:
    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + _skew

    time.time = _skewed_time

if os.environ.get("TETHER_CHAOS_LOG") == "1":
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("LOG %(levelname)s %(name)s: %(message)s"))
    _logger = logging.getLogger("tether")
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

_busy_ms = os.environ.get("TETHER_CHAOS_BUSY_MS")
if _busy_ms:
    from tether.store.sqlite import SQLiteStore

    _init = SQLiteStore.__init__

    def _init_with_busy_timeout(self: SQLiteStore, path: str, synchronous: str = "FULL",
                                busy_timeout_ms: int = 10_000) -> None:
        _init(self, path, synchronous, int(_busy_ms or busy_timeout_ms))

    SQLiteStore.__init__ = _init_with_busy_timeout  # type: ignore[method-assign]

import app  # noqa: E402 - after the clock is skewed and the store patched

cli_harness = app.cli_harness
