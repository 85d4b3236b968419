"""A node calls its peers' APIs through one client (runtime/peer.py): every
caller's calls to a peer reuse kept-alive connections, carry the node
credential, and each has its own timeout."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from raftsched.runtime.peer import PeerClient, node_credential


@pytest.fixture
async def peer():
    """A stand-in peer on 127.0.0.1: answers GET /v1/node, counting the
    connections its requests came on and the credentials they carried."""
    seen = {"connections": set(), "auth": set()}

    async def status(request: web.Request) -> web.Response:
        seen["connections"].add(request.transport.get_extra_info("peername"))
        seen["auth"].add(request.headers.get("Authorization"))
        if request.query.get("slow"):
            await asyncio.sleep(1.0)
        return web.json_response({"role": "follower", "storage": {"full": None}})

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>")

    app = web.Application()
    app.router.add_get("/v1/node", status)
    app.router.add_get("/v1/html", not_json)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_calls_from_every_caller_reuse_one_connection_and_carry_the_credential(peer):
    url, seen = peer
    credential = node_credential("s3cret")
    client = PeerClient(headers={"Authorization": f"Bearer {credential}"}, ssl_context=None)
    await client.start()
    try:
        for _ in range(20):   # one caller after another: a clock probe, a storage check...
            body = await client.get_json(url + "/v1/node", timeout_s=2.0)
            assert body["role"] == "follower"
        status, raw = await client.get(url + "/v1/node", timeout_s=2.0)
        assert status == 200 and b"follower" in raw
    finally:
        await client.close()
    assert len(seen["connections"]) == 1
    assert seen["auth"] == {f"Bearer {credential}"}


async def test_each_call_has_its_own_timeout_and_a_body_not_json_is_a_value_error(peer):
    url, _ = peer
    client = PeerClient(headers={}, ssl_context=None)
    await client.start()
    try:
        with pytest.raises(asyncio.TimeoutError):
            await client.get_json(url + "/v1/node", timeout_s=0.1, params={"slow": "1"})
        # The same client goes on serving the next call.
        assert (await client.get_json(url + "/v1/node", timeout_s=2.0))["role"] == "follower"
        with pytest.raises(ValueError):
            await client.get_json(url + "/v1/html", timeout_s=2.0)
    finally:
        await client.close()


async def test_a_client_not_started_or_closed_refuses_as_a_connection_error():
    client = PeerClient(headers={}, ssl_context=None)
    with pytest.raises(aiohttp.ClientConnectionError):
        await client.get_json("http://127.0.0.1:9/v1/node", timeout_s=0.1)
