"""A request aiohttp's parser cannot read (a request line or header over
request_line_bytes_max, a line that is not HTTP) is answered like every other
refusal, 400 application/problem+json naming the limit, not aiohttp's
text/plain; a request within the limit is served."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.api.problems import ProblemAppRunner


async def _jobs(request: web.Request) -> web.Response:
    return web.json_response({"jobs": []})


async def _serving():
    app = web.Application()
    app.router.add_get("/v1/jobs", _jobs)
    runner = ProblemAppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_a_request_line_over_the_limit_is_a_problem_naming_it():
    runner, base = await _serving()
    try:
        async with aiohttp.ClientSession() as session:
            within = "/v1/jobs?label=" + "a" * (limits.request_line_bytes_max - 200)
            async with session.get(base + within) as ok:
                assert ok.status == 200, await ok.text()
            over = "/v1/jobs?label=" + "a" * (limits.request_line_bytes_max + 10)
            async with session.get(base + over) as refused:
                body = await refused.json(content_type=None)
                assert refused.status == 400, body
                assert refused.headers["Content-Type"].startswith("application/problem+json")
                assert body["limit"] == "request_line_bytes_max"
                assert body["type"] == "/problems/bad-request"
            async with session.get(base + "/v1/jobs",
                                   headers={"X-Long": "b" * (limits.request_line_bytes_max + 10)}
                                   ) as refused:
                assert refused.status == 400
                assert (await refused.json(content_type=None))["limit"] == "request_line_bytes_max"
    finally:
        await runner.cleanup()


async def test_a_line_that_is_not_http_is_a_problem():
    runner, base = await _serving()
    try:
        host, port = base.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split(b" ")[1] == b"400", answer
        assert b"application/problem+json" in head
        assert b'"/problems/bad-request"' in body
    finally:
        await runner.cleanup()
