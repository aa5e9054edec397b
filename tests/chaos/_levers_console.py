"""A lever process of the levers-under-fire test: a person at a terminal, with or without the
app's code (``python -m tests.chaos._levers_console``, from the site's folder).

Environment: ``LEVERS_STORE`` (the store URL), ``LEVERS_DIR`` (the site: ledger, gates,
approvals), ``LEVERS_CODE`` = ``app`` (the harness of ``tests.chaos._levers_app:harness``, as
``--app`` loads it) or ``bare`` (``tt.Harness(store)`` with nothing registered),
``TETHER_CACHE`` (the Redis cache, if the site has one), ``LEVERS_UNSAFE=1`` (negative control:
see ``_levers_unsafe``; the person's decisions are then written through the protocol, past
the harness's own checks).

It reads one JSON request per line on stdin (``{"id", "op", ...}``) and answers each with one
JSON line on stdout (``{"id", "ok", ...}``); requests run concurrently. A person's decision
(``decide``) is honest: they look at the task first, then at the provider's dashboard (the
ledger, by order), and never say ``not_happened`` about an order the provider shows paid.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import tether as tt
from tether.apps import load_harness
from tether.protocol import CONTROL_EVENTS

APP = "tests.chaos._levers_app:harness"


def _app_module() -> Any:
    from tests.chaos import _levers_app

    return _levers_app


def build() -> tt.Harness:
    url = os.environ["LEVERS_STORE"]
    if os.environ.get("LEVERS_CODE") == "app":
        return load_harness(APP, url)
    # nothing registered; the same lease and kept versions as the app (settings are not code)
    return tt.Harness(url, settings=_app_module().SETTINGS)


class Console:
    def __init__(self) -> None:
        self.harness = build()
        self.unsafe = os.environ.get("LEVERS_UNSAFE") == "1"

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        fn = getattr(self, f"op_{op}")
        return await fn(req)

    async def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        _ = self.harness.store
        return {"pong": os.getpid()}

    async def op_submit(self, req: dict[str, Any]) -> dict[str, Any]:
        task_id = await self.harness.submit("levers", req["input"], task_id=req["task"])
        return {"task": task_id}

    async def op_observe(self, req: dict[str, Any]) -> dict[str, Any]:
        return _app_module().observe(await self.harness.get(req["task"]))

    async def op_emit(self, req: dict[str, Any]) -> dict[str, Any]:
        receipt = await self.harness.emit(tt.Event(req["type"], req["task"], req.get("payload"),
                                                   priority=req.get("priority"),
                                                   source_event_id=req.get("source_event_id")))
        return {"event_id": receipt.event_id, "outcome": receipt.outcome}

    async def op_resume(self, req: dict[str, Any]) -> dict[str, Any]:
        receipt = await self.harness.resume(req["task"], message=req.get("message"), by=req["by"])
        return await self._receipt(req["task"], receipt)

    async def op_cancel(self, req: dict[str, Any]) -> dict[str, Any]:
        receipt = await self.harness.cancel(req["task"], by=req["by"])
        return await self._receipt(req["task"], receipt)

    async def op_rollback(self, req: dict[str, Any]) -> dict[str, Any]:
        versions = [v for v, *_ in await self.harness.reads.versions(req["task"])]
        version = pick(versions, req["pick"])
        receipt = await self.harness.rollback(req["task"], version,
                                              redo_side_effects=req["redo"], by=req["by"])
        return {"version": version, **await self._receipt(req["task"], receipt)}

    async def op_fork(self, req: dict[str, Any]) -> dict[str, Any]:
        version = None
        if req.get("pick") is not None:
            versions = [v for v, *_ in await self.harness.reads.versions(req["task"])]
            version = pick(versions, req["pick"])
        seen = _app_module().observe(await self.harness.get(req["task"]))
        fork_id = await self.harness.fork(req["task"], version, new_task_id=req["new_task"],
                                          redo_side_effects=req["redo"], by=req["by"])
        return {"fork": fork_id, "version": version, "source_seen": seen}

    async def op_delete(self, req: dict[str, Any]) -> dict[str, Any]:
        await self.harness.delete(req["task"], by=req["by"])
        return {"deleted": req["task"]}

    async def op_purge(self, req: dict[str, Any]) -> dict[str, Any]:
        """Purge finished tasks last changed before ``before`` (older rounds' tasks)."""
        keep = max(0.001, time.time() - float(req["before"]))
        h = self.harness
        saved = h.settings
        h.settings = saved.replace(retain_completed=keep, retain_failed=keep,
                                   retain_cancelled=keep)
        try:
            swept = await h.housekeep(collect=True)
        finally:
            h.settings = saved
        return {"purged": list(swept.tasks), "blobs": swept.blobs}

    async def op_decide(self, req: dict[str, Any]) -> dict[str, Any]:
        """A person settles a call: look at the task, then at the provider, then answer."""
        task_id = req["task"]
        app = _app_module()
        seen = app.observe(await self.harness.get(task_id))
        queued = sum(1 for e in await self.harness.reads.events(task_id)
                     if str(e.status) == "pending" and e.event.type in CONTROL_EVENTS)
        why = app.why_not_decide(seen, req["persona"], queued)
        if why is not None:
            return {"sent": False, "why": why, "obs": seen}
        call = seen["call"]
        outcome, result, paid = _app_module().honest_answer(call, req["skip"])
        base = {"sent": True, "outcome": outcome, "obs": seen, "paid_seen": paid}
        if self.unsafe:
            # NEGATIVE CONTROL: the decision goes in as the person made it, through the
            # protocol, past the harness's checks (a live call, a record of its outcome)
            payload = {"outcome": outcome, "by": req["by"], "result": result,
                       "key": call["key"], "attempt": call["attempt"], "branch": seen["branch"],
                       "status": seen["status"], "version": seen["version"]}
            receipt = await self.harness._control(tt.Event("decide", task_id, payload))
        else:
            receipt = await self.harness.decide(task_id, outcome, result, by=req["by"],
                                                etag=seen["etag"])
        return {**base, **await self._receipt(task_id, receipt)}

    async def _receipt(self, task_id: str, receipt: tt.EmitReceipt) -> dict[str, Any]:
        found = [e for e in await self.harness.reads.events(task_id)
                 if e.event.id == receipt.event_id]
        stored = found[0] if found else None
        return {"event_id": receipt.event_id, "outcome_of_emit": receipt.outcome,
                "payload": None if stored is None else stored.event.payload,
                "event_status": None if stored is None else str(stored.status)}


def pick(versions: list[int], at: float) -> int:
    ordered = sorted(versions)
    return ordered[min(len(ordered) - 1, int(at * len(ordered)))]


async def serve() -> None:
    console = Console()
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    def read() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, None)

    threading.Thread(target=read, daemon=True).start()

    def answer(reply: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(reply, default=str) + "\n")
        sys.stdout.flush()

    async def run(req: dict[str, Any]) -> None:
        try:
            answer({"id": req["id"], "ok": True, **await console.handle(req)})
        except Exception as exc:  # every failure is the request's answer, not the console's end
            answer({"id": req["id"], "ok": False, "error_type": type(exc).__name__,
                    "error": str(exc)[:2000], "trace": traceback.format_exc()[-3000:]})

    running: set[asyncio.Task[None]] = set()
    answer({"id": 0, "ok": True, "ready": os.getpid()})
    while (line := await lines.get()) is not None:
        if line.strip():
            job = asyncio.create_task(run(json.loads(line)))
            running.add(job)
            job.add_done_callback(running.discard)
    if running:
        await asyncio.gather(*running)
    await console.harness.close()


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks when it hangs
    if os.environ.get("LEVERS_UNSAFE") == "1":
        from tests.chaos import _levers_unsafe

        _levers_unsafe.install()
    asyncio.run(serve())


if __name__ == "__main__":
    main()
