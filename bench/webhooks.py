"""Event ingestion through the signed webhook endpoint (issue 6).

A ``tether serve --with-worker`` process (SQLite, default durability) holds 50 tasks that
each wait for "ping" events in a loop. The sender posts N signed webhooks with C in flight
and reports requests per second; the store then gives, per event, the time from being
accepted (stored, before the 202) to being applied by the task's loop: p50 and p99.

    python bench/webhooks.py --requests 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

import tether as tt
from tether.web.server import sign

HERE = Path(__file__).resolve().parent
SECRET = "bench-secret"
TASKS = 50


def build(store: str) -> tt.Harness:
    """The app the server loads (``--app webhooks:build``)."""
    h = tt.Harness(store, settings=tt.Settings(poll_interval=0.05, inbox_capacity=100_000),
                   protocol={"ping": tt.Priority.P1})

    @h.agent("listener")
    class Listener(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            return tt.Wait("ping")  # forever: each ping is applied, then it waits again

    return h


async def send_all(base: str, requests: int, concurrency: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)

    async def sender(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            body = orjson.dumps({"id": f"d{n}", "type": "ping", "task_id": f"t{n % TASKS}",
                                 "payload": {"n": n}})
            stamp = str(int(time.time()))
            answer = await client.post("/hooks/bench", content=body, headers={
                "X-Tether-Timestamp": stamp, "X-Tether-Signature": sign(SECRET, stamp, body)})
            assert answer.status_code == 202, answer.text

    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        started = time.perf_counter()
        await asyncio.gather(*(sender(client) for _ in range(concurrency)))
        return requests / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--worker-concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "hooks.db"
        url = f"sqlite:///{db}"

        async def submit() -> None:
            async with build(url) as h:
                for n in range(TASKS):
                    await h.submit("listener", task_id=f"t{n}")

        asyncio.run(submit())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(HERE), "TETHER_TOKENS": "bench:operator",
               "TETHER_WEBHOOK_SECRETS": f"bench:{SECRET}"}
        server = subprocess.Popen([sys.executable, "-m", "tether", "--store", url, "--app",
                                   "webhooks:build", "serve", "--port", str(port), "--with-worker",
                                   "--concurrency", str(args.worker_concurrency)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                httpx.get(f"{base}/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        rate = asyncio.run(send_all(base, args.requests, args.concurrency))
        for _ in range(600):  # until the loops applied every event
            with sqlite3.connect(db) as conn:
                left = conn.execute("SELECT COUNT(*) FROM events WHERE status = 'pending'"
                                    ).fetchone()[0]
            if left == 0:
                break
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        with sqlite3.connect(db) as conn:
            delays = sorted(done - created for created, done in conn.execute(
                "SELECT created_at, done_at FROM events WHERE done_at IS NOT NULL"))
            statuses = dict(conn.execute("SELECT status, COUNT(*) FROM events GROUP BY status"))
    p99 = delays[int(0.99 * (len(delays) - 1))]
    print(f"webhooks: {args.requests} signed POSTs, {args.concurrency} in flight:"
          f" {rate:.0f} requests/s accepted (202, durable); accepted -> applied p50"
          f" {statistics.median(delays) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms;"
          f" events {statuses}")


if __name__ == "__main__":
    main()
