"""A private PostgreSQL cluster that a test may stop and start (imported as ``_pgcluster``).

The shared test server (``services``) must never be restarted by a test, so a test that
needs PostgreSQL to go away and come back gets its own cluster: its own data directory
and a free port, created with ``initdb`` and run with ``pg_ctl``. As root, both run as the
``postgres`` user (initdb refuses root), in a folder that user owns.

Without the PostgreSQL binaries the test is skipped locally and fails under CI, like the
service tests (``services.unavailable``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import services

BIN_DIRS = [os.environ.get("TETHER_TEST_PG_BIN", ""), "/usr/lib/postgresql/17/bin",
            "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin",
            "/usr/lib/postgresql/14/bin"]


def _bin_dir() -> Path | None:
    for folder in BIN_DIRS:
        if folder and (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    """One throwaway PostgreSQL cluster on 127.0.0.1:<port>, trust auth, database ``tether``."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            services.unavailable("PostgreSQL binaries (initdb, pg_ctl)", "not installed; set"
                                 " TETHER_TEST_PG_BIN to their folder")
            raise AssertionError("unreachable")
        self.bin = bin_dir
        self.port = _free_port()
        self.base = Path(tempfile.mkdtemp(prefix="tether-pgcluster-"))
        self.data = self.base / "data"
        self.logfile = self.base / "server.log"
        self._user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                services.unavailable("a 'postgres' user to run initdb as", "no such user")
            os.chown(self.base, account.pw_uid, account.pw_gid)
            self._user = ["runuser", "-u", "postgres", "--"]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/tether"

    def _run(self, *argv: str, timeout: float = 60) -> str:
        done = subprocess.run([*self._user, *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}"
                                 f"\n{done.stderr}\n{self.log()}")
        return done.stdout

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def init(self) -> Cluster:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        import psycopg

        admin = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE DATABASE tether")
        return self

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1"
                   " -c fsync=off -c max_connections=60")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
                  "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60",
                  "stop")

    def running(self) -> bool:
        done = subprocess.run([*self._user, str(self.bin / "pg_ctl"), "-D", str(self.data),
                               "status"], capture_output=True, text=True, check=False)
        return done.returncode == 0

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            with contextlib.suppress(AssertionError):
                self.stop("immediate")
        for _ in range(3):
            shutil.rmtree(self.base, ignore_errors=True)
            if not self.base.exists():
                return
            time.sleep(0.2)
