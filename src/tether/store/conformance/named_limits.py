"""Conformance: named limits shared by every worker (concurrency, rate, a 429's block, the
queue of tasks held back)."""

from __future__ import annotations

import asyncio
import time

from tether.model import Status
from tether.store.base import LimitRequest, Store
from tether.store.conformance.helpers import LEASE, claim, make_task, park


def ask(task_id: str, fence: int, holder: str, *, concurrency: int | None = None,
        rate: tuple[int, float] | None = None, priority: int = 2,
        key: str = "", tokens: tuple[int, float] | None = None) -> LimitRequest:
    return LimitRequest("provider", key, task_id, fence, holder, priority, concurrency, rate,
                        tokens)


class LimitConformance:
    """Limits in the store. Needs a ``store`` fixture."""

    async def test_a_concurrency_limit_admits_up_to_its_size_across_tasks(
            self, store: Store) -> None:
        """Issue 19: at most N holds at once, whoever asks; letting one go admits the next."""
        now = time.time()
        leases = {}
        for name in ("a", "b", "c"):
            await make_task(store, name)
            leases[name] = await claim(store, name, now)
        first = await store.acquire_limit(ask("a", leases["a"].fence, "a:1", concurrency=2), now)
        second = await store.acquire_limit(ask("b", leases["b"].fence, "b:1", concurrency=2), now)
        third = await store.acquire_limit(ask("c", leases["c"].fence, "c:1", concurrency=2), now)
        assert first.granted and second.granted and not third.granted
        assert third.retry_at is not None and third.retry_at > now
        assert "2 of 2 in use" in third.why
        again = await store.acquire_limit(ask("a", leases["a"].fence, "a:1", concurrency=2), now)
        assert again.granted  # the same holder asking again holds one slot, not two
        assert third.slot  # a slot let go may admit it: its worker may keep it waiting
        assert await store.release_limit("provider", "", "a:1", now) == "c"  # first in line
        assert (await store.acquire_limit(
            ask("c", leases["c"].fence, "c:1", concurrency=2), now)).granted
        usage = await store.limit_usage(now)
        assert [(u.name, u.in_use, u.waiting) for u in usage] == [("provider", 2, 0)]
        assert await store.release_limit("provider", "", "b:1", now) is None  # nobody waits

    async def test_a_slot_let_go_names_a_task_held_in_memory_without_parking_it(
            self, store: Store) -> None:
        """Issue 30: the task first in line may still be leased (its worker keeps it waiting
        in memory): letting a slot go names it, and leaves its row as it was (no wake time:
        it is not parked, and no other worker may claim it)."""
        now = time.time()
        for name in ("holder", "waiter"):
            await make_task(store, name)
        holder = await claim(store, "holder", now)
        waiter = await claim(store, "waiter", now)
        assert (await store.acquire_limit(ask("holder", holder.fence, "h", concurrency=1),
                                          now)).granted
        assert not (await store.acquire_limit(ask("waiter", waiter.fence, "w", concurrency=1),
                                              now)).granted
        assert await store.release_limit("provider", "", "h", now + 1) == "waiter"
        record = await store.get_task("waiter")
        assert record.lease_owner is not None and record.wake_at is None
        assert await store.claim("other", now + 1, LEASE) is None
        assert (await store.acquire_limit(ask("waiter", waiter.fence, "w", concurrency=1),
                                          now + 1)).granted

    async def test_a_hold_ends_when_its_task_is_taken_over(self, store: Store) -> None:
        """Issue 19, R13: a dead worker's slot is freed when another worker claims its task
        (the fence moves on): no clock, no renewal."""
        now = time.time()
        await make_task(store, "dead")
        await make_task(store, "next")
        dead = await claim(store, "dead", now)
        nxt = await claim(store, "next", now)
        assert (await store.acquire_limit(ask("dead", dead.fence, "d:1", concurrency=1), now)).granted
        assert not (await store.acquire_limit(ask("next", nxt.fence, "n:1", concurrency=1),
                                              now)).granted
        later = now + LEASE + 1
        assert await store.claim_task("dead", "w2", later, LEASE) is not None  # taken over
        assert (await store.acquire_limit(ask("next", nxt.fence, "n:1", concurrency=1),
                                          later)).granted

    async def test_a_rate_limit_admits_n_in_any_window(self, store: Store) -> None:
        """Issue 19: at most N admissions in any window; the answer says when the oldest
        leaves it."""
        now = time.time()
        await make_task(store, "r")
        lease = await claim(store, "r", now)
        answers = [await store.acquire_limit(ask("r", lease.fence, f"r:{n}", rate=(3, 10.0)),
                                             now + n) for n in range(4)]
        assert [a.granted for a in answers] == [True, True, True, False]
        assert answers[3].retry_at == now + 10.0
        assert (await store.acquire_limit(ask("r", lease.fence, "r:3", rate=(3, 10.0)),
                                          now + 10.5)).granted
        assert not answers[3].slot  # a window, not a slot, holds it back: no wait in memory

    async def test_only_a_concurrency_limit_s_line_is_waited_in_for_a_slot(
            self, store: Store) -> None:
        """Issue 30: behind a task waiting in a rate limit's line, a newcomer is held back
        ('others wait ahead') with nothing a slot let go could change; in a concurrency
        limit's line it is (a slot let go reaches the first in line at once)."""
        now = time.time()
        leases = {}
        for name in ("first", "late"):
            await make_task(store, name)
            leases[name] = await claim(store, name, now)
        one = (1, 10.0)
        assert (await store.acquire_limit(ask("first", leases["first"].fence, "f:0", rate=one),
                                          now)).granted
        assert not (await store.acquire_limit(ask("first", leases["first"].fence, "f:1",
                                                  rate=one), now + 1)).granted  # in line
        late = await store.acquire_limit(ask("late", leases["late"].fence, "l:0", rate=one),
                                         now + 11)
        assert not late.granted and late.why == "others wait ahead" and not late.slot

    async def test_a_token_budget_counts_what_admitted_calls_reported(
            self, store: Store) -> None:
        """Issue 19: calls are admitted while those of the window reported fewer tokens than
        the budget; the window moves on."""
        now = time.time()
        await make_task(store, "t")
        lease = await claim(store, "t", now)
        budget = (1000, 60.0)
        assert (await store.acquire_limit(ask("t", lease.fence, "c1", tokens=budget), now)).granted
        await store.spend_limit("provider", "", "c1", 700)
        assert (await store.acquire_limit(ask("t", lease.fence, "c2", tokens=budget),
                                          now + 1)).granted  # 700 < 1000
        await store.spend_limit("provider", "", "c2", 400)
        held = await store.acquire_limit(ask("t", lease.fence, "c3", tokens=budget), now + 2)
        assert not held.granted and "1100 of 1000 tokens" in held.why
        assert held.retry_at == now + 60.0
        assert (await store.acquire_limit(ask("t", lease.fence, "c3", tokens=budget),
                                          now + 60.5)).granted  # c1's 700 left the window

    async def test_tasks_held_back_are_served_by_priority_then_age(self, store: Store) -> None:
        """Issue 19: a P0 task's call goes before older P2 ones; letting a slot go wakes the
        first in line, and nobody jumps the queue while it is there."""
        now = time.time()
        for name in ("holder", "old", "urgent"):
            await make_task(store, name)
        holder = await claim(store, "holder", now)
        assert (await store.acquire_limit(ask("holder", holder.fence, "h", concurrency=1),
                                          now)).granted
        for name, priority, at in (("old", 2, now + 1), ("urgent", 0, now + 2)):
            lease = await claim(store, name, at)
            answer = await store.acquire_limit(ask(name, lease.fence, name, concurrency=1,
                                                   priority=priority), at)
            assert not answer.granted
            await store.release(lease)
            await park(store, name, Status.RUNNING, at, wake_at=at + 3600)
        await store.release_limit("provider", "", "h", now + 3)
        woken = await store.claim("w", now + 3, LEASE)
        assert woken is not None and woken.task_id == "urgent"  # the P0 one, though younger
        await make_task(store, "late")
        late = await claim(store, "late", now + 3)
        jumped = await store.acquire_limit(ask("late", late.fence, "late", concurrency=1),
                                           now + 3)
        assert not jumped.granted and jumped.why == "others wait ahead"
        assert (await store.acquire_limit(ask("urgent", woken.fence, "urgent", concurrency=1,
                                              priority=0), now + 3)).granted

    async def test_a_429_blocks_the_limit_for_everyone_until_then(self, store: Store) -> None:
        """Issue 19: a provider's Retry-After holds every task back until it passes."""
        now = time.time()
        await make_task(store, "t")
        lease = await claim(store, "t", now)
        await store.block_limit("provider", "", now + 30, now)
        held = await store.acquire_limit(ask("t", lease.fence, "t:1", concurrency=5), now + 1)
        assert not held.granted and held.retry_at == now + 30 and "429" in held.why
        assert [u.blocked_until for u in await store.limit_usage(now + 1)] == [now + 30]
        await store.block_limit("provider", "", now + 10, now + 1)  # a shorter one: no change
        assert not (await store.acquire_limit(ask("t", lease.fence, "t:1", concurrency=5),
                                              now + 20)).granted
        assert (await store.acquire_limit(ask("t", lease.fence, "t:1", concurrency=5),
                                          now + 31)).granted

    async def test_a_limits_size_is_kept_as_its_workers_define_it(self, store: Store) -> None:
        """Issue 29: operators read each limit's size from the store, without the app's code:
        unknown until a worker admits under it, then the newest definition."""
        now = time.time()
        await make_task(store, "t")
        lease = await claim(store, "t", now)
        await store.block_limit("provider", "", now + 5, now)
        (blocked,) = await store.limit_usage(now)
        assert (blocked.concurrency, blocked.rate, blocked.tokens) == (None, None, None)
        await store.acquire_limit(ask("t", lease.fence, "t:1", concurrency=3, rate=(5, 60.0),
                                      tokens=(1000, 60.0)), now + 6)
        (sized,) = await store.limit_usage(now + 6)
        assert (sized.concurrency, sized.rate, sized.tokens) == (3, (5, 60.0), (1000, 60.0))
        await store.acquire_limit(ask("t", lease.fence, "t:2", concurrency=4), now + 7)
        (changed,) = await store.limit_usage(now + 7)
        assert (changed.concurrency, changed.rate, changed.tokens) == (4, None, None)

    async def test_keys_are_separate_limits(self, store: Store) -> None:
        """Issue 19: "2 per tenant": each key has its own slots."""
        now = time.time()
        await make_task(store, "t")
        lease = await claim(store, "t", now)
        for tenant in ("acme", "globex"):
            assert (await store.acquire_limit(ask("t", lease.fence, f"{tenant}:1", key=tenant,
                                                  concurrency=1), now)).granted
        assert not (await store.acquire_limit(ask("t", lease.fence, "acme:2", key="acme",
                                                  concurrency=1), now)).granted

    async def test_admissions_made_together_never_pass_the_limit(self, store: Store) -> None:
        """Issue 19, R13: twenty tasks asking at once for a limit of three: three admitted."""
        now = time.time()
        leases = []
        for n in range(20):
            await make_task(store, f"race-{n}")
            leases.append(await claim(store, f"race-{n}", now))
        answers = await asyncio.gather(*(
            store.acquire_limit(ask(lease.task_id, lease.fence, lease.task_id, concurrency=3),
                                now) for lease in leases))
        assert sum(a.granted for a in answers) == 3
