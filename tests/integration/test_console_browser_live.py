"""R2, R14, R26 in a real browser (Debian's Chromium through Playwright, over loopback): the
task page follows the task from its stream without reloading; versions are labelled by step,
status and time; the diff of two versions is side by side and coloured; a fork starts from
the form; and a crash (a worker process SIGKILLed in the middle of a refund) is diagnosed
from the console alone. The screenshots are the README's (``TETHER_SCREENSHOTS=docs/img``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_console_browser import CHROMIUM, FLAGS, SHOTS, TOKEN

import services
import tether as tt
from serving import Served, served, until
from tether.web.server import ServerConfig

APP = '''
import asyncio
import os

import tether as tt

harness = tt.Harness(settings=tt.Settings(poll_interval=0.05, lease_seconds=1.0))


def paid() -> list[str]:
    path = os.environ["REFUND_LEDGER"]
    return open(path).read().split() if os.path.exists(path) else []


@harness.tool(side_effect=True)
async def refund(ctx: tt.ToolContext, order: str) -> str:
    with open(os.environ["REFUND_LEDGER"], "a") as ledger:
        ledger.write(order + "\\n")
    await asyncio.sleep(float(os.environ.get("REFUND_HANG", "0")))  # a slow provider
    return f"refunded {order}"


@refund.reconcile
async def refund_found(ctx: tt.ToolContext, order: str) -> str | None:
    return f"refunded {order} (found by reconcile)" if order in paid() else None


@harness.agent("refunds")
class Refunds(tt.Agent):
    async def plan(self, t):
        if t.step == 0:
            return tt.Reply(f"refunding order {t.input['order']}")
        if t.step == 1:
            return tt.ToolCall("refund", {"order": t.input["order"]})
        return tt.Finish(t.last_tool_result)


@harness.agent("gate")
class Gate(tt.Agent):
    async def plan(self, t):
        if t.step == 0:
            return tt.Reply("asking for approval")
        if t.last_event is None:
            return tt.Wait("approval")
        return tt.Finish(t.last_event["payload"])
'''


def app_module(folder: Path) -> tuple[str, Any]:
    name = f"liveapp_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(APP)
    sys.path.insert(0, str(folder))
    return name, __import__(name)


@pytest.fixture
async def console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Console]:
    """The console of the app above; its worker starts when a test asks."""
    if shutil.which(CHROMIUM) is None:
        services.unavailable("Debian's Chromium (apt-get install chromium)", "not installed")
    monkeypatch.setenv("REFUND_LEDGER", str(tmp_path / "ledger.txt"))
    name, module = app_module(tmp_path)
    harness: tt.Harness = module.harness
    harness.use_store(f"sqlite:///{tmp_path / 'live.db'}")
    async with served(harness, ServerConfig({TOKEN: "operator"}), worker=False) as running:
        yield Console(running, f"{name}:harness")


class Console:
    """The served console and the import path of its app (for workers in other processes)."""

    def __init__(self, running: Served, app: str) -> None:
        self.base, self.harness, self.app = running.base, running.harness, app
        self.start_worker = running.start_worker


async def signed_in(pw: Any, base: str, width: int = 1280) -> tuple[Any, Any]:
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
    page = await browser.new_page(viewport={"width": width, "height": 900})
    await page.goto(f"{base}/console")
    await page.fill("input[name=token]", TOKEN)
    await page.click("button[type=submit]")
    return browser, page


def shots(tmp_path: Path) -> Path:
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def test_r26_the_task_page_follows_the_task_live_labels_versions_diffs_and_forks(
        console: Console, tmp_path: Path) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    base, harness = console.base, console.harness
    console.start_worker()
    await harness.submit("gate", task_id="live-gate")
    await until(harness, "live-gate", tt.Status.WAITING)
    async with playwright_api.async_playwright() as pw:
        browser, page = await signed_in(pw, base)
        await page.goto(f"{base}/console/tasks/live-gate")
        await page.locator("#live.on").wait_for()  # the stream is open
        rows_before = await page.locator("#timeline-body tr").count()
        await page.evaluate("window.sameDocument = 'still here'")
        await harness.emit(tt.Event("approval", "live-gate", {"approved": "on call"}))
        await page.locator("#status", has_text="completed").wait_for(timeout=20_000)
        assert await page.evaluate("window.sameDocument") == "still here"  # no reload
        await page.locator("#timeline-body tr", has_text="finish").wait_for()
        assert await page.locator("#timeline-body tr").count() > rows_before
        await page.locator("#send-event").wait_for(state="detached")  # levers followed too

        labels = await page.locator("form[action$=rollback] select option").all_inner_texts()
        assert labels and all(re.fullmatch(
            r"v\d+ · step \d+ · (pending|running|waiting|completed|paused) · \d\d:\d\d:\d\d",
            label) for label in labels), labels
        assert "completed" in labels[0] and "pending" in labels[-1]  # newest first

        versions = [v for v, _, _ in await harness.store.list_versions("live-gate")]
        await page.select_option("select[name=a]", str(versions[0]))
        await page.select_option("select[name=b]", str(versions[-1]))
        async with page.expect_navigation():
            await page.click("text=Diff")
        old = page.locator("table.diff td.old").first
        new = page.locator("table.diff td.new").first
        colour = "el => getComputedStyle(el).backgroundColor"
        assert await old.evaluate(colour) == "rgb(254, 228, 226)"  # removed: red
        assert await new.evaluate(colour) == "rgb(220, 250, 230)"  # added: green
        old_box, new_box = await old.bounding_box(), await new.bounding_box()
        assert old_box and new_box and old_box["x"] < new_box["x"]  # side by side
        assert re.fullmatch(r"\d+ lines? differs?", await page.locator("#diff-summary").inner_text())
        await page.screenshot(path=str(shots(tmp_path) / "console-diff.png"))

        await page.goto(f"{base}/console/tasks/live-gate")
        await page.click("text=Fork a new task from a version")
        options = page.locator("form[action$=fork] select option")
        labelled = dict(zip(await options.evaluate_all("os => os.map(o => o.value)"),
                            await options.all_inner_texts(), strict=True))
        waiting = next(v for v, label in labelled.items() if "waiting" in label)
        await page.select_option("form[action$=fork] select[name=version]", waiting)
        await page.fill("form[action$=fork] input[name=task_id]", "live-gate-retry")
        async with page.expect_navigation():
            await page.click("form[action$=fork] button[type=submit]")
        assert page.url.endswith("/console/tasks/live-gate-retry")
        await page.locator(".flash", has_text="forked from live-gate").wait_for()
        assert await page.locator("#timeline-body tr", has_text="fork").count() == 1
        assert await page.locator("#status").inner_text() == "waiting"
        await browser.close()
    assert (await harness.get("live-gate")).record.status is tt.Status.COMPLETED
    forked = await harness.store.list_recovery_log("live-gate-retry")
    assert forked[0]["resume_strategy"] == "fork"


async def test_r26_a_crash_is_diagnosed_from_the_console_alone(
        console: Console, tmp_path: Path) -> None:
    """A worker process pays a refund and is SIGKILLed before the provider answers; the
    worker of the console's process takes the task over once the dead one's lease ends.
    The console shows where the crash landed (a crash row after the refund's resume point),
    who held the task, what the recovery did (reconcile found the refund), and the result:
    the refund paid once."""
    playwright_api = pytest.importorskip("playwright.async_api")
    base, harness = console.base, console.harness
    task_id = await harness.submit("refunds", {"order": "A-1001"}, task_id="refund-a1001")
    doomed = subprocess.Popen(
        [sys.executable, "-m", "tether", "--store", f"sqlite:///{tmp_path / 'live.db'}",
         "--app", console.app, "worker"], cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "REFUND_HANG": "600"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ledger = tmp_path / "ledger.txt"
    try:
        for _ in range(600):
            if ledger.exists() and "A-1001" in ledger.read_text():
                break
            await asyncio.sleep(0.05)
        assert ledger.read_text().split() == ["A-1001"], "the refund was never paid"
        async with playwright_api.async_playwright() as pw:
            browser, page = await signed_in(pw, base)
            await page.goto(f"{base}/console/tasks/{task_id}")
            assert "held by" in await page.locator("#lease").inner_text()
            await page.screenshot(path=str(shots(tmp_path) / "console-in-flight.png"))
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(timeout=30)
            console.start_worker()
            await page.locator("#status", has_text="completed").wait_for(timeout=30_000)
            await page.locator("#timeline-body tr.mark-crash").first.wait_for()
            await page.reload()  # the page as a person opening it later sees it
            rows = await page.locator("#timeline-body tr").all_inner_texts()
            call = next(i for i, r in enumerate(rows) if "tool call refund" in r)
            crashed = next(i for i, r in enumerate(rows) if "after the worker died" in r)
            assert crashed > call  # the crash landed after the refund's resume point
            assert "crash" in rows[crashed].lower()
            assert any("found by reconcile" in r for r in rows[crashed:])
            await page.screenshot(path=str(shots(tmp_path) / "console-crash.png"),
                                  full_page=True)
            await browser.close()
    finally:
        doomed.kill()
    assert ledger.read_text().split() == ["A-1001"]  # paid once
    assert (await harness.get(task_id)).snapshot.result == "refunded A-1001 (found by reconcile)"
