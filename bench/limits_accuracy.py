"""How exactly do tether's shared limits hold, seen from the provider's side?

Four ``tether worker`` processes share one store (SQLite, and PostgreSQL when reachable) and
call a fake provider: an HTTP server in this process that counts requests in flight and
stamps each arrival. Every task makes one call to ``chat`` (a 50 ms answer, declared under
a limit of CONCURRENCY at once) and one to ``search`` (instant, under RATE per second).

Reported, per store:

* **max in flight**: the most ``chat`` requests the provider had open at once, against the
  limit; and the throughput it allowed;
* **max per second**: the most ``search`` requests in any one-second window, as admitted by
  the store (``ToolContext.admitted_at``) and as they arrived at the provider, against the
  limit; arrivals can bunch a little after admission (the hop from the worker to the
  provider takes a variable time), which is why both are shown.

Then the 429 experiment: the provider itself allows RATE searches a second and answers 429
with ``Retry-After: 1`` past that. Three ways to meet it: tether admitting at the provider's
rate (``per_second=RATE``); tether with a limit that only learns from the 429s (a
``RateLimited`` closes it for every task); and each call retrying on its own, as without
shared limits. The count of 429s the provider had to send is the figure.

    .bench-venv/bin/python bench/limits_accuracy.py [--tasks 200] [--out docs/benchmarks-limits.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CONCURRENCY = 8
RATE = 20
WORKERS = 4
PG_URL = os.environ.get("TETHER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

APP = '''
import asyncio, json, os, urllib.error, urllib.request
import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05))
MODE = os.environ["BENCH_MODE"]
harness.limit("chat", concurrency=int(os.environ["BENCH_CONCURRENCY"]))
if MODE == "admit":
    harness.limit("search", per_second=int(os.environ["BENCH_RATE"]))
elif MODE == "learn":
    harness.limit("search", concurrency=100_000)  # admits all; closes on a 429
SEARCH_LIMITS = ("search",) if MODE in ("admit", "learn") else ()
URL = os.environ["BENCH_PROVIDER"]


def ask(path, body):
    request = urllib.request.Request(URL + path, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, None
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("retry-after")


@harness.tool(limits=("chat",))
async def chat(ctx: tt.ToolContext, n: int) -> int:
    await asyncio.to_thread(ask, "/chat", {"n": n})
    return n


@harness.tool(limits=SEARCH_LIMITS, retry=tt.RetryPolicy(max_attempts=50, backoff=0.05,
                                                         max_backoff=1.0))
async def search(ctx: tt.ToolContext, n: int) -> int:
    status, wait = await asyncio.to_thread(ask, "/search", {"n": n, "admitted": ctx.admitted_at})
    if status == 429:
        if SEARCH_LIMITS:
            raise tt.RateLimited(float(wait or 1))
        raise ConnectionError("429 from the provider")
    return n


@harness.agent("job")
class Job(tt.Agent):
    async def plan(self, t):
        done = t.scratch.setdefault("done", [])
        for tool in os.environ["BENCH_TOOLS"].split(","):
            if tool not in done:
                done.append(tool)
                return tt.ToolCall(tool, {"n": t.input})
        return tt.Finish(t.input)
'''


class Provider:
    """The fake provider's books, kept by its request threads."""

    def __init__(self, enforce_rate: int | None) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.chats = 0
        self.arrivals: list[float] = []
        self.admitted: list[float] = []
        self.refused = 0
        self.enforce_rate = enforce_rate
        self.first = self.last = 0.0

    def chat(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.first = self.first or time.time()
        time.sleep(0.05)
        with self.lock:
            self.in_flight -= 1
            self.chats += 1
            self.last = time.time()

    def search(self, body: dict[str, Any]) -> bool:
        now = time.time()
        with self.lock:
            if self.enforce_rate is not None and sum(
                    1 for at in self.arrivals if now - at < 1.0) >= self.enforce_rate:
                self.refused += 1
                return False
            self.arrivals.append(now)
            if body.get("admitted"):
                self.admitted.append(float(body["admitted"]))
            return True


@contextmanager
def serving(provider: Provider) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if self.path == "/chat":
                provider.chat()
                ok = True
            else:
                ok = provider.search(body)
            self.send_response(200 if ok else 429)
            if not ok:
                self.send_header("retry-after", "1")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def densest(times: list[float]) -> int:
    times = sorted(times)
    return max((sum(1 for other in times[i:] if other - at < 1.0) for i, at in
                enumerate(times)), default=0)


def run(store: str, tasks: int, mode: str, tools: str, enforce: int | None) -> Provider:
    provider = Provider(enforce)
    with tempfile.TemporaryDirectory() as folder, serving(provider) as url, \
            store_url(store, folder) as url_of_store:
        (Path(folder) / "limitsbench.py").write_text(APP)
        env = {**os.environ, "PYTHONPATH": folder, "TETHER_STORE": url_of_store,
               "TETHER_APP": "limitsbench:harness", "BENCH_PROVIDER": url, "BENCH_MODE": mode,
               "BENCH_TOOLS": tools, "BENCH_CONCURRENCY": str(CONCURRENCY),
               "BENCH_RATE": str(RATE)}
        tether = [sys.executable, "-m", "tether"]
        subprocess.run([*tether, "migrate"], env=env, cwd=folder, check=True,
                       capture_output=True)
        submit = ("import asyncio, os, limitsbench as app\n"
                  "app.harness.use_store(os.environ['TETHER_STORE'])\n"
                  "async def go():\n    async with app.harness as h:\n"
                  f"        for n in range({tasks}): await h.submit('job', n)\n"
                  "asyncio.run(go())")
        subprocess.run([sys.executable, "-c", submit], env=env, cwd=folder, check=True)
        workers = [subprocess.Popen([*tether, "worker", "--concurrency", "8", "--until-idle"],
                                    env=env, cwd=folder, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
                   for _ in range(WORKERS)]
        for worker in workers:
            if worker.wait(timeout=900) != 0:
                raise SystemExit(f"a worker failed on {store} ({mode})")
    return provider


@contextmanager
def store_url(store: str, folder: str) -> Iterator[str]:
    """A SQLite file in *folder*, or a fresh PostgreSQL database dropped after the run (the
    server is shared: a run leaves nothing behind on it)."""
    if store == "sqlite":
        yield f"sqlite:///{folder}/bench.db"
        return
    import psycopg

    name = f"tether_limits_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_reachable() -> bool:
    try:
        import psycopg

        with psycopg.connect(PG_URL, connect_timeout=2):
            return True
    except Exception:
        return False


def report(tasks: int) -> list[str]:
    stores = ["sqlite"] + (["postgres"] if pg_reachable() else [])
    lines = [f"### Limit accuracy ({WORKERS} worker processes, {tasks} tasks)", "",
             "| store | limit | most seen at the provider | most admitted by the store |"
             " throughput |", "|---|---|---|---|---|"]
    for store in stores:
        seen = run(store, tasks, "admit", "chat,search", None)
        took = max(seen.last - seen.first, 1e-9)
        lines.append(f"| {store} | chat: {CONCURRENCY} at once | {seen.most_in_flight} in flight"
                     f" | - | {seen.chats / took:.0f} calls/s |")
        lines.append(f"| {store} | search: {RATE} per second | {densest(seen.arrivals)} in one"
                     f" second | {densest(seen.admitted)} in one second |"
                     f" {len(seen.arrivals)} calls |")
    lines += ["", f"### A provider that allows {RATE} searches a second ({tasks} tasks, SQLite)",
              "", "| how tether meets it | 429s the provider sent | searches served |",
              "|---|---|---|"]
    for mode, label in (("admit", f"a shared limit of {RATE} per second"),
                        ("learn", "a shared limit closed by each 429 (RateLimited)"),
                        ("alone", "no shared limit: each call retries on its own")):
        seen = run("sqlite", tasks, mode, "search", RATE)
        lines.append(f"| {label} | {seen.refused} | {len(seen.arrivals)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    text = "\n".join(report(args.tasks)) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
