"""Long-poll waiters keyed by names callers choose (topic readers, worker claims) are bounded per tenant and per node, refused with 429 naming the limit past either, and freed when their last waiter leaves."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftsched import limits
from raftsched.api.app import make_app
from raftsched.core import keys
from raftsched.errors import QuotaExceeded
from raftsched.runtime.port import StoreQueries
from raftsched.runtime.waiters import Waiters
from raftsched.runtime.workers import WorkerService
from raftsched.testing.replica import Replica


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


def waiters(names_max: int = 100, per_tenant_max: int = 10) -> Waiters:
    return Waiters(names_max=names_max, names_per_tenant_max=per_tenant_max,
                   names_limit="waited_names_max",
                   per_tenant_limit="waited_names_per_tenant_max", what="topics")


class TopicPort(StoreQueries):
    """A node port whose topic reads wait on `waiters`."""
    node_id, shard_count = "n1", 16
    config = SimpleNamespace(insecure_no_auth=True, allow_target_cidrs=(), allow_commands=False)

    def __init__(self, waiters: Waiters) -> None:
        super().__init__(Replica().store)
        self._waiters = waiters

    def topic_waiting(self, topic):
        return self._waiters.waiting(topic)


async def test_many_names_come_and_go_and_leave_nothing_behind():
    w = waiters()
    woken = []

    async def wait_once(name: str) -> None:
        with w.waiting(name) as waiting:
            event = waiting.event()
            await event.wait()
            woken.append(name)

    tasks = [asyncio.ensure_future(wait_once(f"t/topic-{i}")) for i in range(7)]
    await until(lambda: len(w) == 7)
    for i in range(7):
        w.wake(f"t/topic-{i}")
    await asyncio.gather(*tasks)
    assert sorted(woken) == sorted(f"t/topic-{i}" for i in range(7))
    assert len(w) == 0
    for i in range(1000):   # names used once each
        with w.waiting(f"t/name-{i}"):
            pass
    assert len(w) == 0
    assert w._per_tenant == {}


def test_a_tenant_at_its_bound_leaves_room_for_another():
    w = waiters(names_max=15, per_tenant_max=10)
    with contextlib.ExitStack() as held:
        for i in range(10):
            held.enter_context(w.waiting(f"a/q{i}"))
        held.enter_context(w.waiting("a/q0"))   # a second waiter on a held name: no new entry
        with pytest.raises(QuotaExceeded) as refused:
            held.enter_context(w.waiting("a/q10"))
        assert refused.value.limit == "waited_names_per_tenant_max"
        assert refused.value.retry_after_s >= 1
        for i in range(5):
            held.enter_context(w.waiting(f"b/q{i}"))   # another tenant still waits
        with pytest.raises(QuotaExceeded) as refused:
            held.enter_context(w.waiting("c/q0"))
        assert refused.value.limit == "waited_names_max"
        assert len(w) == 15
    assert len(w) == 0
    with w.waiting("a/q10"):
        pass


async def test_a_waiter_gets_the_wake_that_comes_while_it_looks():
    w = waiters()
    with w.waiting("t/x") as waiting:
        event = waiting.event()
        w.wake("t/x")        # between taking the event and waiting on it
        await asyncio.wait_for(event.wait(), 1)
        assert not waiting.event().is_set()   # the next wait waits for the next wake


def _workers() -> WorkerService:
    """A worker service over an empty replica: its claims only wait."""
    async def caught_up() -> None:
        pass
    return WorkerService(Replica().replicated(now_ms=lambda: 1_796_000_000_000),
                         report=lambda *report: asyncio.get_running_loop().create_future(),
                         outputs=None, wait_caught_up=caught_up, run_lease_ms=5000,
                         run_heartbeat_ms=1000)


async def test_worker_claims_on_many_queues_free_their_entries():
    workers = _workers()
    # Each claim waits long enough that all fifty are seen waiting at once even
    # on a loaded machine; a shorter wait let the first time out before the last began.
    claims = [asyncio.ensure_future(workers.claim("w", keys.scoped("t", f"q{i}"), 1, 2.0))
              for i in range(50)]
    await until(lambda: workers.waiting_queues() == 50)
    assert await asyncio.gather(*claims) == [[]] * 50
    assert workers.waiting_queues() == 0
    # A claim that does not wait takes no entry.
    assert await workers.claim("w", keys.scoped("t", "q"), 1, 0) == []
    assert workers.waiting_queues() == 0


async def test_a_claim_on_a_new_queue_past_the_tenants_bound_is_refused(monkeypatch):
    monkeypatch.setattr(limits, "waited_names_per_tenant_max", 2)
    workers = _workers()
    held = [asyncio.ensure_future(workers.claim("w", keys.scoped("a", f"q{i}"), 1, 2.0))
            for i in range(2)]
    await until(lambda: workers.waiting_queues() == 2)
    with pytest.raises(QuotaExceeded) as refused:
        await workers.claim("w", keys.scoped("a", "q2"), 1, 5)
    assert refused.value.limit == "waited_names_per_tenant_max"
    other = asyncio.ensure_future(workers.claim("w", keys.scoped("b", "q0"), 1, 0.05))
    assert await other == []
    assert await asyncio.gather(*held) == [[], []]
    assert workers.waiting_queues() == 0


async def test_a_topic_long_poll_past_the_bound_answers_429_with_retry_after():
    w = waiters(per_tenant_max=1)

    async with TestClient(TestServer(make_app(TopicPort(w)))) as client:
        first = asyncio.ensure_future(client.get("/v1/topics/one/messages",
                                                 params={"wait_s": "0.5"}))
        await until(lambda: len(w) == 1)
        refused = await client.get("/v1/topics/two/messages", params={"wait_s": "5"})
        problem = await refused.json()
        assert (refused.status, problem["limit"]) == (429, "waited_names_per_tenant_max")
        assert refused.headers["Retry-After"] == "1"
        # Without waiting, a read takes no entry.
        assert (await client.get("/v1/topics/two/messages")).status == 200
        w.wake(keys.scoped("default", "one"))   # nothing appended: it waits on
        assert len(w) == 1
        assert (await first).status == 200     # its wait_s ran out
    assert len(w) == 0


async def test_the_remote_worker_waits_out_a_refused_claim_and_claims_again():
    from raftsched.runtime.remote_worker import RemoteWorker

    claims = []

    async def claim(request: web.Request) -> web.Response:
        claims.append(await request.json())
        if len(claims) == 1:
            return web.json_response({"type": "quota-exceeded", "limit": "waited_names_max",
                                      "detail": "full"}, status=429,
                                     headers={"Retry-After": "0.1"})
        return web.json_response({"runs": [], "node": "n1"})

    app = web.Application()
    app.router.add_post("/v1/workers/w/claim", claim)
    async with TestServer(app, host="127.0.0.1") as server:
        worker = RemoteWorker([str(server.make_url(""))], "q", 1, "w")
        task = asyncio.ensure_future(worker.run())
        try:
            await until(lambda: len(claims) >= 3)
            assert worker.supervisor.failures["claim"] == 0   # waited, did not fail
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_as_the_node_stops_waiting_claims_answer_at_once_and_none_waits_again():
    """WorkerService.end_waits (Node.stop): a claim waiting 30 s answers now,
    empty, and a claim made after it does not wait."""
    workers = _workers()
    waiting = [asyncio.ensure_future(workers.claim("w", keys.scoped("t", f"q{i}"), 1, 30.0))
               for i in range(3)]
    await until(lambda: workers.waiting_queues() == 3)
    started = asyncio.get_running_loop().time()
    workers.end_waits()
    assert await asyncio.wait_for(asyncio.gather(*waiting), 5) == [[]] * 3
    assert await asyncio.wait_for(workers.claim("w", keys.scoped("t", "q9"), 1, 30.0), 5) == []
    assert asyncio.get_running_loop().time() - started < 5
    assert workers.waiting_queues() == 0


async def test_as_the_node_stops_a_topic_long_poll_answers_at_once():
    w = waiters()

    async with TestClient(TestServer(make_app(TopicPort(w)))) as client:
        poll = asyncio.ensure_future(client.get("/v1/topics/one/messages",
                                                params={"wait_s": "30"}))
        await until(lambda: len(w) == 1)
        w.close()
        answer = await asyncio.wait_for(poll, 5)
        assert answer.status == 200 and (await answer.json())["messages"] == []
    assert len(w) == 0


async def test_a_waiting_claim_whose_worker_went_away_claims_nothing_when_woken(monkeypatch):
    """A draining worker withdraws its claim (it closes the connection): the
    node, woken by a run of the queue, must not grant it to no one."""
    workers = _workers()
    tries: list[str] = []

    async def try_claim(worker_id: str, queue: str, max_runs: int) -> list[dict]:
        tries.append(queue)
        return []

    monkeypatch.setattr(workers, "_try_claim", try_claim)
    gone = [False]
    queue = keys.scoped("t", "q")
    claim = asyncio.ensure_future(workers.claim("w", queue, 1, 30.0, lambda: gone[0]))
    await until(lambda: workers.waiting_queues() == 1)
    workers.queued(queue)                     # still there: it looks again
    await until(lambda: len(tries) >= 3)
    gone[0] = True
    looked = len(tries)
    workers.queued(queue)                     # gone: it answers, claiming nothing
    assert await asyncio.wait_for(claim, 5) == []
    assert len(tries) == looked and workers.waiting_queues() == 0


async def test_a_handler_sees_its_caller_gone_once_the_connection_is_closed():
    """What api/execution.py's claim reads as the worker gone: a node's
    runner lets a handler run on after its client closed the connection
    (no handler cancellation), without its transport."""
    from raftsched.api.execution import _gone
    from raftsched.testing.cluster import free_ports
    seen: list[bool] = []
    waiting = asyncio.Event()

    async def long_poll(request: web.Request) -> web.Response:
        seen.append(_gone(request))
        waiting.set()
        for _ in range(500):
            if _gone(request):
                seen.append(True)
                break
            await asyncio.sleep(0.01)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/claim", long_poll)
    runner = web.AppRunner(app, handle_signals=False)   # as a node's: no cancellation
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /claim HTTP/1.1\r\nHost: n1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 2\r\n\r\n{}")
        await asyncio.wait_for(waiting.wait(), 5)
        writer.close()                        # the worker withdraws its claim
        await until(lambda: len(seen) == 2)
    finally:
        await runner.cleanup()
    assert seen == [False, True]
