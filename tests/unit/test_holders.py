"""Which lease holders are certainly dead (issue 29): a worker of this place (kernel and PID
namespace) whose process is gone, reaped or a zombie; never one that may be alive, nor one
of another place, nor this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tether.engine import holders


def holder(pid: int, place: str | None = None) -> str:
    return f"host:{pid}:abc123:{holders.place() if place is None else place}"


def test_r13_a_worker_id_names_its_host_process_and_place() -> None:
    _, pid, _, place = holders.new_worker_id().rsplit(":", 3)
    assert int(pid) == os.getpid() and place == holders.place() and len(place) == 10


def test_r13_a_killed_process_is_dead_whether_reaped_or_a_zombie() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not holders.certainly_dead(holder(child.pid))  # alive
        os.kill(child.pid, signal.SIGKILL)
        end = time.monotonic() + 10  # the kernel ends it at once; a loaded machine may lag
        while not holders.certainly_dead(holder(child.pid)) and time.monotonic() < end:
            time.sleep(0.01)
        assert holders.certainly_dead(holder(child.pid))  # a zombie: killed, not yet reaped
    finally:
        child.wait(timeout=10)
    assert holders.certainly_dead(holder(child.pid))  # reaped: no such process


def test_r13_in_doubt_a_holder_is_alive() -> None:
    assert not holders.certainly_dead(holder(os.getpid()))  # this very process
    assert not holders.certainly_dead(holder(1))
    assert not holders.certainly_dead(holder(999_999_999, place="0123456789"))  # elsewhere
    for garbage in (None, "", "worker-7", "host:notapid:abc:x", f"host:12:{holders.place()}"):
        assert not holders.certainly_dead(garbage)


def test_r13_a_pid_out_of_range_is_never_judged() -> None:
    for pid in (0, 2**22, 10**20):
        assert not holders.certainly_dead(holder(pid))


def test_r13_a_harness_made_before_a_fork_names_the_child_in_its_worker_id() -> None:
    """A harness built before a fork (a daemon) must not hold leases under the parent's pid:
    when the parent exits, another worker would take the child's tasks for a dead worker's."""
    import tether as tt

    harness = tt.Harness("memory://")
    parent_pid = int(harness.worker_id.rsplit(":", 3)[1])
    assert parent_pid == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report its worker id's pid and leave at once
        os.write(write, harness.worker_id.encode())
        os._exit(0)
    os.close(write)
    seen = os.read(read, 1000).decode()
    os.waitpid(child, 0)
    assert int(seen.rsplit(":", 3)[1]) == child
    assert tt.Harness("memory://", worker_id="given-id").worker_id == "given-id"
