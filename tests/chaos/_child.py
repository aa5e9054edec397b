"""One child process of the chaos tests, seen from the parent (imported as ``_child``).

The parent needs three things of a child it is about to kill: a handshake (wait for a
stdout line such as ``READY`` so kills land after start-up, not during it), the child's
stderr for the failure message, and signals sent to that child's own pid only.
"""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path


def killed_itself(script: str, *args: str, timeout: float = 50.0) -> None:
    """Run *script* (a test file run as a child) with *args*, and check that it ended by the
    SIGKILL it sends itself, not by an error of its own."""
    child = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                           timeout=timeout)
    assert child.returncode == -signal.SIGKILL, child.stderr


def stopped(pid: int, timeout: float = 2.0) -> bool:
    """Wait until the kernel shows every thread of *pid* stopped (state T in each
    /proc/<pid>/task/<tid>/stat). SIGSTOP stops a process's threads one by one: the main
    thread may show T while a store thread still runs and can still take a lock."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            states = {(task / "stat").read_text().rpartition(")")[2].split()[0]
                      for task in Path(f"/proc/{pid}/task").iterdir()}
        except (OSError, IndexError):
            return False
        if states and states <= {"T", "t"}:
            return True
        time.sleep(0.001)
    return False


class ChildProcess:
    """A process whose stdout is read line by line on a thread, so ``expect`` can time out."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, label: str,
                 timeout: float) -> None:
        self.label = label
        self.timeout = timeout
        self.stderr_path = cwd / f"{label}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(argv, env=env, cwd=str(cwd), stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def stderr(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def expect(self, prefix: str, timeout: float | None = None) -> str:
        """Wait for a stdout line starting with *prefix*; fail with the child's output if none."""
        timeout = self.timeout if timeout is None else timeout
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{self.label}: no {prefix!r} line within {timeout}s;"
                                     f" stdout so far {self.seen}; stderr:\n{self.stderr()}") from None
            if line is None:
                self.proc.wait(timeout=5)
                raise AssertionError(f"{self.label}: exited ({self.proc.returncode}) before"
                                     f" printing {prefix!r}; stdout {self.seen}; stderr:\n"
                                     f"{self.stderr()}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)  # this child only, by its own pid

    def wait(self, timeout: float | None = None) -> int:
        """Reap the child; one still running after *timeout* is killed and the test fails."""
        timeout = self.timeout if timeout is None else timeout
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.label}: still running after {timeout}s; stderr:\n"
                                 f"{self.stderr()}") from None
        self._stderr.close()
        return code

    def stop_outside_write_lock(self, database: Path) -> None:
        """SIGSTOP this child at a moment it holds no write lock on the SQLite *database*.

        A process frozen inside a SQLite write transaction (a lease renewal, a claim, a
        ledger write) blocks every other process's writes until it is woken: the tests
        that freeze a worker mean to freeze its *work*, not the file everyone shares.
        """
        for _ in range(500):
            self.signal(signal.SIGSTOP)
            stopped(self.proc.pid)  # kill() returns before the kernel has stopped it
            probe = sqlite3.connect(database, timeout=0.2, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:
                self.signal(signal.SIGCONT)
                time.sleep(0.005)
            finally:
                probe.close()
        raise AssertionError(f"{self.label}: could not stop it outside a write to {database}")

    def kill(self) -> int:
        """SIGKILL the child (waking it first if it was stopped) and reap it."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        code = self.proc.wait(timeout=10)
        self._stderr.close()
        return code
