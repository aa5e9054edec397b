"""Worker processes for kill tests, forked from a server that imported everything once.

Importing ``openai``, ``pydantic_ai`` or ``agents`` (and tether) takes seconds; a kill test
starts a worker for every kill. So one server process per set of modules imports them, then
forks a worker per request. Each worker is a real process of its own: its environment is
set, its failpoints armed from ``TETHER_FAILPOINTS`` as any worker's are (the server imported
:mod:`tether.failpoints` before the variable was set, so the worker loads that module again:
every failpoint call looks its armed points up there), and a failpoint SIGKILLs it as it
would any worker. The test process talks to the server over pipes (one JSON line per request
and per answer) and may SIGKILL a worker by its pid.

This module is the server when run as a script (``python agents_forkserver.py MODULE...``);
it imports nothing but the standard library until it preloads the modules it is given.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

STARTUP = 300.0
"""Seconds the server may take to import its libraries (a loaded CI machine is slow)."""


class Forkserver:
    """A running server (see the module docstring); :func:`forkserver` shares one per set of
    preloaded modules."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TETHER_FAILPOINTS"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the case's module too
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._answer(STARTUP)

    def start(self, entry: str, argv: list[str], env: dict[str, str], log: str) -> int:
        """Fork a worker running ``entry(argv)`` (``module:function``) with *env* added to
        its environment; its output goes to *log*. Returns its pid."""
        return int(self._ask({"op": "fork", "entry": entry, "argv": argv, "env": env,
                              "log": log})["pid"])

    def wait(self, pid: int, timeout: float) -> int:
        """The worker's exit code (``-9``: SIGKILLed), killing it first if it is still
        running after *timeout* seconds."""
        deadline = time.monotonic() + timeout
        while True:
            code = self._ask({"op": "poll", "pid": pid})["code"]
            if code is not None:
                return int(code)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                self._ask({"op": "wait", "pid": pid})
                raise AssertionError(f"worker {pid} still ran after {timeout} s; killed")
            time.sleep(0.01)

    def running(self, pid: int) -> bool:
        return self._ask({"op": "poll", "pid": pid})["code"] is None

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the server ends at the end of its input
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer(30.0)

    def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"the fork server (pid {self.proc.pid}) did not answer"
                               f" (exit code {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer


_SERVERS: dict[tuple[str, ...], Forkserver] = {}


def forkserver(preload: tuple[str, ...]) -> Forkserver:
    """The shared server that preloaded *preload*, started on first use."""
    key = tuple(sorted(set(preload)))
    if key not in _SERVERS or _SERVERS[key].proc.poll() is not None:
        _SERVERS[key] = Forkserver(key)
    return _SERVERS[key]


@atexit.register
def _close_all() -> None:
    for server in _SERVERS.values():
        server.close()


# ---------------------------------------------------------------------------- the server


def serve(preload: list[str]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # not tether.testing
    for name in preload:
        importlib.import_module(name)
    out = sys.stdout
    codes: dict[int, int] = {}
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "fork":
            out.flush()
            pid = os.fork()
            if pid == 0:
                _worker(request)
            print(json.dumps({"pid": pid}), file=out, flush=True)
            continue
        pid = int(request["pid"])
        if pid not in codes:
            done, status = os.waitpid(pid, 0 if request["op"] == "wait" else os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        print(json.dumps({"code": codes.get(pid)}), file=out, flush=True)


def _worker(request: dict[str, Any]) -> None:
    """In the forked worker: never returns."""
    code = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.setpgid(0, 0)  # a signal to the test's process group does not reach it
        os.environ.pop("TETHER_FAILPOINTS", None)
        os.environ.update(request["env"])
        if "tether.failpoints" in sys.modules:  # armed from this worker's environment
            importlib.reload(sys.modules["tether.failpoints"])
        module, _, function = request["entry"].partition(":")
        code = int(getattr(importlib.import_module(module), function)(request["argv"]))
    except BaseException:  # everything the worker did is in its log
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1:])
