"""R26 in a real browser: Playwright drives Debian's Chromium (/usr/bin/chromium, never a
downloaded browser) through the console served over loopback. The screenshots it takes are
the ones in the README (docs/img/)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn

import services
import tether as tt
from tether.web.server import ServerConfig, create_app

CHROMIUM = "/usr/bin/chromium"
TOKEN = "operator-token-0123456789abcdef"
SHOTS = os.environ.get("TETHER_SCREENSHOTS")
"""Where to save the screenshots (``docs/img`` to refresh the README's); else a temp dir."""
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def app(db: Path) -> tt.Harness:
    h = tt.Harness(f"sqlite:///{db}", settings=tt.Settings(poll_interval=0.05))
    sent: list[int] = []

    @h.tool(side_effect=True)
    async def send_invoice(ctx: tt.ToolContext, customer: str) -> str:
        sent.append(1)
        if len(sent) == 1:
            raise tt.OutcomeUnknown("the mail gateway timed out after accepting the request")
        return f"invoice sent to {customer}"

    @h.agent("biller")
    class Biller(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.step == 0:
                return tt.Reply(f"billing {t.input['customer']}")
            if t.step == 1:
                return tt.ToolCall("send_invoice", {"customer": t.input["customer"]})
            return tt.Finish(t.last_tool_result)

    return h


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[tuple[str, tt.Harness]]:
    if shutil.which(CHROMIUM) is None:
        services.unavailable("Debian's Chromium (apt-get install chromium)", "not installed")
    harness = app(tmp_path / "console.db")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(
        create_app(harness, ServerConfig({TOKEN: "operator"})), host="127.0.0.1", port=port,
        log_level="error"))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(server.serve()), asyncio.create_task(harness.serve(stop=stop))]
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}", harness
    server.should_exit = True
    stop.set()
    await asyncio.gather(*tasks)
    await harness.close()


async def test_r26_a_person_decides_a_parked_call_and_rolls_the_task_back_in_the_console(
        console: tuple[str, tt.Harness], tmp_path: Path) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    base, harness = console
    parked = await harness.submit("biller", {"customer": "ACME"}, task_id="invoice-acme")
    await harness.submit("biller", {"customer": "Globex"}, task_id="invoice-globex")
    for _ in range(200):
        if (await harness.store.get_task(parked)).status is tt.Status.NEEDS_HUMAN:
            break
        await asyncio.sleep(0.05)
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{base}/console")
        await page.fill("input[name=token]", TOKEN)
        await page.click("button[type=submit]")
        row = page.locator("tr", has_text="invoice-acme")
        await row.locator(".s-needs_human").wait_for()
        img = Path(SHOTS) if SHOTS else tmp_path
        img.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(img / "console-tasks.png"))

        await row.locator("a").click()
        await page.wait_for_url(f"{base}/console/tasks/invoice-acme")
        # the invoice is in doubt: the page asks what became of it instead of offering resume
        assert await page.locator("input[name=message]").count() == 0
        await page.check("input[name=outcome][value=not_happened]")  # checked: not sent
        await page.screenshot(path=str(img / "console-decide.png"))
        async with page.expect_navigation():  # the form posts, then redirects back
            await page.click("text=Decide")
        await page.locator(".flash", has_text="decision sent").wait_for()
        for _ in range(100):
            if await page.locator("#status").inner_text() == "completed":
                break
            await asyncio.sleep(0.1)
            await page.goto(f"{base}/console/tasks/invoice-acme")
        assert await page.locator("#status").inner_text() == "completed"
        assert "invoice sent to ACME" in await page.content()
        await page.screenshot(path=str(img / "console-task.png"), full_page=True)

        before = int(await page.locator("#version").inner_text())
        first = (await harness.store.list_versions(parked))[0][0]
        await page.select_option("select[name=version]", str(first))
        async with page.expect_navigation():
            await page.click("text=Roll back")
        await page.locator(".flash", has_text="rollback sent").wait_for()
        after = int(await page.locator("#version").inner_text())
        assert after > before
        async with page.expect_navigation():
            await page.click("text=Sign out")
        await page.locator("input[name=token]").wait_for()  # the session is over
        await page.goto(f"{base}/console/tasks/invoice-acme")
        assert await page.locator("input[name=token]").count() == 1
        await browser.close()
    info = await harness.get(parked)
    assert "rollback" in [r["resume_strategy"] for r in await harness.store.list_recovery_log(parked)]
    assert info.version == after or info.version > before
