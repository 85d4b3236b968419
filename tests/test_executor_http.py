"""The HTTP executor sends the idempotency headers and reports failures as data."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from raftsched import limits
from raftsched.executors.base import Attempt
from raftsched.executors.http import HttpExecutor
from raftsched.executors.netguard import AddressPolicy

# The sinks here listen on loopback, which nodes refuse unless allowed.
LOOPBACK = AddressPolicy.parse(["127.0.0.0/8"])

ATTEMPT = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_abc",
                  scheduled_ms=1_796_000_000_000, attempt=1, fencing_token=0)


def target(url: str, **over) -> dict:
    t = {"type": "http", "url": url, "method": "POST", "headers": {"X-Team": "a"},
         "body": {"k": 1}, "timeout_s": 2.0}
    t.update(over)
    return t


async def serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/hook", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/hook"


async def test_success_carries_the_execution_id_and_job_headers():
    seen: list[web.Request] = []
    bodies: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request)
        bodies.append(await request.read())
        return web.Response(status=204)

    runner, url = await serve(handler)
    executor = HttpExecutor(LOOPBACK)
    await executor.start()
    try:
        outcome = await executor.run(ATTEMPT, target(url), int(time.time() * 1000) + 5000)
    finally:
        await executor.close()
        await runner.cleanup()
    assert outcome.ok
    assert outcome.http_status == 204
    headers = seen[0].headers
    assert headers["Idempotency-Key"] == "exe_abc"
    assert headers["X-Raftsched-Job-Id"] == "job_1"
    assert headers["X-Raftsched-Scheduled-For"] == "2026-11-30T00:53:20Z"
    assert headers["X-Raftsched-Attempt"] == "1"
    assert headers["X-Team"] == "a"
    assert headers["Content-Type"] == "application/json"
    assert bodies[0] == b'{"k":1}'


async def test_non_2xx_timeout_and_refused_are_failures_not_exceptions():
    async def handler(request: web.Request) -> web.Response:
        if request.query.get("slow"):
            await asyncio.sleep(2)
        return web.Response(status=503, text="try later")

    runner, url = await serve(handler)
    executor = HttpExecutor(LOOPBACK)
    await executor.start()
    try:
        deadline = int(time.time() * 1000) + 5000
        failed = await executor.run(ATTEMPT, target(url), deadline)
        slow = await executor.run(ATTEMPT, target(url + "?slow=1", timeout_s=0.2), deadline)
        refused = await executor.run(ATTEMPT, target("http://127.0.0.1:9/x"), deadline)
    finally:
        await executor.close()
        await runner.cleanup()
    assert not failed.ok
    assert failed.http_status == 503
    assert "try later" in failed.error
    assert not slow.ok
    assert slow.error.startswith("timed out")
    assert not refused.ok
    assert refused.http_status is None
    assert refused.error


async def test_connections_to_one_host_are_bounded_and_reused(monkeypatch):
    # A slow target and ten times as many calls as the bound: without the
    # bound every call would hold a connection of its own at once.
    monkeypatch.setattr(limits, "http_connections_per_host_max", 4)
    inflight = [0, 0]   # now, most at once
    ports: set[int] = set()

    async def handler(request: web.Request) -> web.Response:
        ports.add(request.transport.get_extra_info("peername")[1])
        inflight[0] += 1
        inflight[1] = max(inflight[1], inflight[0])
        await asyncio.sleep(0.05)   # the target's own work
        inflight[0] -= 1
        return web.Response(status=204)

    runner, url = await serve(handler)
    executor = HttpExecutor(LOOPBACK)
    await executor.start()
    try:
        deadline_ms = int(time.time() * 1000) + 20_000
        outcomes = await asyncio.gather(*(executor.run(ATTEMPT, target(url, timeout_s=20.0),
                                                       deadline_ms) for _ in range(40)))
    finally:
        await executor.close()
        await runner.cleanup()
    assert all(o.ok for o in outcomes)
    assert inflight[1] == 4
    assert len(ports) == 4


async def test_an_empty_body_leaves_no_output_and_a_body_is_kept():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=200, text="" if request.query.get("empty") else "done: 3 rows")

    runner, url = await serve(handler)
    executor = HttpExecutor(LOOPBACK)
    await executor.start()
    try:
        deadline_ms = int(time.time() * 1000) + 5000
        empty = await executor.run(ATTEMPT, target(url + "?empty=1"), deadline_ms)
        full = await executor.run(ATTEMPT, target(url), deadline_ms)
    finally:
        await executor.close()
        await runner.cleanup()
    assert (empty.ok, empty.output) == (True, None)
    assert (full.ok, full.output) == (True, {"http_body": "done: 3 rows"})


async def test_a_cookie_a_target_sets_is_never_sent_with_a_later_call():
    """One session calls every job's target, of every tenant: a cookie one
    target's answer sets must not ride along with the next call to that host
    (another job's, perhaps another tenant's). Called by name, not by address:
    a cookie jar keeps no cookie of a host named by its IP address."""
    cookies: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        response = web.Response(status=200)
        response.set_cookie("session", "tenant-a-secret", path="/")
        return response

    runner, url = await serve(handler)
    by_name = url.replace("127.0.0.1", "localhost")
    executor = HttpExecutor(LOOPBACK)
    await executor.start()
    try:
        deadline = int(time.time() * 1000) + 5000
        first = await executor.run(ATTEMPT, target(by_name), deadline)
        second = await executor.run(ATTEMPT, target(by_name), deadline)
    finally:
        await executor.close()
        await runner.cleanup()
    assert first.ok and second.ok, (first, second)
    assert cookies == [None, None]
