"""R26 in a real browser: Playwright drives Debian's Chromium (/usr/bin/chromium, never a
downloaded browser) through the console served over loopback. The screenshots it takes are
the ones in the README (docs/img/)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import services
import tether as tt
from serving import served, until
from tether.web.server import ServerConfig

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

    @h.agent("gate")
    class Gate(tt.Agent):
        async def plan(self, t: tt.TaskView) -> tt.Action:
            if t.last_event is None:
                return tt.Reply("asking for approval") if t.step == 0 else tt.Wait("approval")
            return tt.Finish(t.last_event["payload"])

    return h


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[tuple[str, tt.Harness]]:
    if shutil.which(CHROMIUM) is None:
        services.unavailable("Debian's Chromium (apt-get install chromium)", "not installed")
    harness = app(tmp_path / "console.db")
    async with served(harness, ServerConfig({TOKEN: "operator"})) as running:
        yield running.base, harness


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
        await page.select_option("form[action$=rollback] select[name=version]", str(first))
        async with page.expect_navigation():
            await page.click("text=Roll back")
        await page.locator(".flash", has_text="rollback to version").wait_for()
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


async def test_r26_a_person_sends_an_event_and_sees_the_rollback_marked_in_the_timeline(
        console: tuple[str, tt.Harness]) -> None:
    """Issue 18 in the browser: the send-event form refuses a payload that is not JSON and
    sends one that is; the timeline gives each row its time and duration, and marks the
    person's decision and the rollback; a 404 is a page; the list works 420 px wide."""
    playwright_api = pytest.importorskip("playwright.async_api")
    base, harness = console
    await harness.submit("gate", task_id="approve-me")
    await harness.submit("biller", {"customer": "Initech"}, task_id="invoice-initech")
    await until(harness, "approve-me", tt.Status.WAITING)
    await until(harness, "invoice-initech", tt.Status.NEEDS_HUMAN)
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{base}/console")
        await page.fill("input[name=token]", TOKEN)
        await page.click("button[type=submit]")
        await page.goto(f"{base}/console/tasks/approve-me")
        form = page.locator("#send-event")
        assert await form.is_visible()  # opened: the task waits for an event
        assert await form.locator("select[name=type]").input_value() == "approval"
        await form.locator("textarea[name=payload]").fill("{not json")
        async with page.expect_navigation():
            await form.locator("button[type=submit]").click()
        await page.locator(".flash.error", has_text="not valid JSON").wait_for()
        await form.locator("textarea[name=payload]").fill('{"approved": "by the browser"}')
        await form.locator("select[name=priority]").select_option("1")
        async with page.expect_navigation():
            await form.locator("button[type=submit]").click()
        await page.locator(".flash", has_text="event approval sent").wait_for()
        await until(harness, "approve-me", tt.Status.COMPLETED)
        assert (await harness.get("approve-me")).snapshot.result == {"approved": "by the browser"}
        await page.reload()
        assert await page.locator("#send-event").count() == 0  # completed: nothing to send
        assert await page.locator("text=Cancel").count() == 0
        first = page.locator("table.timeline tbody tr").first
        assert await first.locator("span[title]").get_attribute("title")  # full time on hover

        await page.goto(f"{base}/console/tasks/invoice-initech")
        await page.check("input[name=outcome][value=not_happened]")
        async with page.expect_navigation():
            await page.click("text=Decide")
        await until(harness, "invoice-initech", tt.Status.COMPLETED)
        await page.reload()
        person = page.locator("table.timeline tr.mark-person", has_text="human decision")
        assert await person.count() == 1 and await person.locator(".tag-person").is_visible()
        assert await page.locator("table.timeline tr.mark-rollback").count() == 0
        first_version = (await harness.store.list_versions("invoice-initech"))[0][0]
        await page.select_option("form[action$=rollback] select[name=version]", str(first_version))
        async with page.expect_navigation():
            await page.click("text=Roll back")
        await page.locator(".flash", has_text="rollback to version").wait_for()
        marked = page.locator("table.timeline tr.mark-rollback")
        await marked.first.wait_for()
        assert "rolled back to version" in await marked.first.inner_text()
        durations = await page.locator("table.timeline tbody tr td:nth-child(3)").all_inner_texts()
        assert any(d.startswith("+") and d.endswith("s") for d in durations)

        missing = await page.goto(f"{base}/console/tasks/no-such-task")
        assert missing is not None and missing.status == 404
        assert "no-such-task" in await page.locator("#error-page").inner_text()

        await page.set_viewport_size({"width": 420, "height": 800})
        await page.goto(f"{base}/console?agent=gate")
        await page.locator("tr", has_text="approve-me").wait_for()
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 420, f"the list is {width} px wide at 420 px"
        assert await page.locator("tr", has_text="invoice-initech").count() == 0
        await browser.close()


async def test_the_task_page_says_what_it_waits_for_confirms_a_cancel_links_a_fork_and_fits(
        console: tuple[str, tt.Harness]) -> None:
    """Issue 29 in the browser: a waiting task says what it waits for; Cancel asks first
    (dismissed: nothing is cancelled); a fork links to its source; a finished task's page
    says so (not "live"); the task page fits 420 px."""
    playwright_api = pytest.importorskip("playwright.async_api")
    base, harness = console
    await harness.submit("gate", task_id="waits-here")
    await until(harness, "waits-here", tt.Status.WAITING)
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(f"{base}/console")
        await page.fill("input[name=token]", TOKEN)
        await page.click("button[type=submit]")
        await page.goto(f"{base}/console/tasks/waits-here")
        assert "waiting for approval, with no timeout" in " ".join(
            (await page.locator("#waits").inner_text()).split())
        page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.dismiss()))
        await page.click("form.cancel button")
        await asyncio.sleep(0.3)
        assert (await harness.get("waits-here")).record.status is tt.Status.WAITING
        fork = await harness.fork("waits-here", new_task_id="forked-one")
        await page.goto(f"{base}/console/tasks/{fork}")
        link = page.locator("#forked-from a")
        assert await link.inner_text() == "waits-here"
        await page.set_viewport_size({"width": 420, "height": 800})
        await page.goto(f"{base}/console/tasks/waits-here")
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 420, f"the task page is {width} px wide at 420 px"
        await harness.emit(tt.Event("approval", "waits-here", "ok"))
        await until(harness, "waits-here", tt.Status.COMPLETED)
        await page.locator("#live", has_text="finished").wait_for(timeout=10_000)
        await browser.close()
