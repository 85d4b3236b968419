"""A client given several node URLs sends a call to the next node when one
gives no answer, but only where sending it twice cannot do it twice: nothing
was sent, a read, or a create carrying idempotency keys (the client adds one
where the caller gave none). In-process nodes (testing/inprocess.py) on real
loopback ports, and stand-ins for a dead node: a closed port, a node that
takes the request and drops the connection (after passing it on, or not),
and one that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from raftsched import limits
from raftsched.client import AsyncClient, CannotConnect, Client, Timeout, operations, wire
from raftsched.core import commands
from raftsched.testing.cluster import free_ports
from raftsched.testing.inprocess import ReplicaPort, api_client

JOB = {"schedule": {"every": "1h"}, "target": {"type": "http", "url": "https://h.example/x"}}


def closed_url() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"


class StandIn:
    """A node that reads each request whole and never answers it: it closes
    the connection (after forwarding the request to `forward_to` and reading
    that node's answer, when given), or with `hang`, keeps it open."""

    def __init__(self, forward_to: str | None = None, hang: bool = False) -> None:
        self.forward_to, self.hang = forward_to, hang
        self.bodies: list[dict] = []
        self._server: asyncio.AbstractServer | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> "StandIn":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        for writer in self._held:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ")
        headers = dict(line.split(": ", 1) for line in lines[1:] if line)
        length = int(headers.get("Content-Length", "0"))
        body = await reader.readexactly(length) if length else b""
        if body:
            self.bodies.append(json.loads(body))
        if self.forward_to is not None:
            async with aiohttp.ClientSession() as session:
                async with session.request(method, self.forward_to + path, data=body,
                                           headers={k: v for k, v in headers.items()
                                                    if k in ("Authorization", "Content-Type")}
                                           ) as answer:
                    await answer.read()   # applied there; the answer is lost here
        if self.hang:
            self._held.append(writer)
            return
        writer.transport.abort()


@contextlib.asynccontextmanager
async def live_node() -> AsyncIterator[tuple[str, ReplicaPort]]:
    port = ReplicaPort()
    async with api_client(port) as client:
        yield str(client.make_url("")).rstrip("/"), port


def proposed(port: ReplicaPort, *kinds: type) -> list:
    return [c for c in port.proposed if isinstance(c, kinds)]


def jobs_of(port: ReplicaPort) -> list:
    return proposed(port, commands.CreateJob, commands.CreateJobs)


# --- settings ------------------------------------------------------------------------------

def test_several_urls_are_taken_in_order_each_once():
    settings = wire.Settings.resolve("http://a:1/, http://b:2 ,http://a:1", None, None, None,
                                     environ={})
    assert settings.urls == ("http://a:1", "http://b:2")
    assert settings.url == "http://a:1"
    from_env = wire.Settings.resolve(None, None, None, None,
                                     environ={"RAFTSCHED_URL": "http://c:3,http://d:4"})
    assert from_env.urls == ("http://c:3", "http://d:4")
    assert wire.Settings.resolve(None, None, None, None, environ={}).urls == (wire.DEFAULT_URL,)


def test_an_empty_url_or_too_many_are_refused():
    with pytest.raises(ValueError, match="empty"):
        wire.Settings.resolve("http://a:1,,http://b:2", None, None, None, environ={})
    many = ",".join(f"http://n{i}:1" for i in range(limits.client_urls_max + 1))
    with pytest.raises(ValueError, match="client_urls_max"):
        wire.Settings.resolve(many, None, None, None, environ={})


def test_creates_get_keys_only_when_another_node_may_be_sent_them():
    one = wire.Settings.resolve("http://a:1", None, None, None, environ={})
    two = wire.Settings.resolve("http://a:1,http://b:2", None, None, None, environ={})
    single = operations.create_job(dict(JOB))
    assert wire.keyed(single, one).body == JOB
    keyed = wire.keyed(single, two).body
    assert keyed["idempotency_key"].startswith("client-") and keyed.items() >= JOB.items()
    own = operations.create_job(dict(JOB, idempotency_key="mine"))
    assert wire.keyed(own, two).body["idempotency_key"] == "mine"
    batch = wire.keyed(operations.batch_create_jobs([JOB, dict(JOB, idempotency_key="k")]),
                       two).body["jobs"]
    assert batch[0]["idempotency_key"].startswith("client-")
    assert batch[1]["idempotency_key"] == "k"
    pause = operations.pause_job("job_" + "0" * 20)
    assert wire.keyed(pause, two) is pause


# --- against nodes ---------------------------------------------------------------------------

async def test_a_node_that_refuses_is_passed_over_and_the_next_answers():
    async with live_node() as (url, port):
        refused = closed_url()
        async with AsyncClient(f"{refused},{url}") as api:
            job = await api.create_job(dict(JOB))
            assert (await api.get_job(job["job_id"]))["job_id"] == job["job_id"]
            # The node that answered is asked first from then on.
            assert api._nodes.order()[0] == url
        assert len(jobs_of(port)) == 1

        def blocking() -> str:
            return Client(f"{refused},{url}").create_job(dict(JOB))["job_id"]
        assert (await asyncio.to_thread(blocking)).startswith("job_")
        assert len(jobs_of(port)) == 2


async def test_a_create_whose_answer_was_lost_is_sent_again_and_makes_one_job():
    async with live_node() as (url, port), StandIn(forward_to=url) as lossy:
        # (A new client each time: one asks the node that answered it first.)
        async with AsyncClient(f"{lossy.url},{url}") as api:
            job = await api.create_job(dict(JOB, name="once"))
        async with AsyncClient(f"{lossy.url},{url}") as api:
            batch = await api.batch_create_jobs([dict(JOB, name="b1"), dict(JOB, name="b2")])
        # The first node took each create (and answered nothing); the second
        # got it again with the same keys and answered the jobs already made.
        [single, many] = lossy.bodies
        assert job["idempotency_key"] == single["idempotency_key"]
        assert all(j["idempotency_key"].startswith("client-") for j in many["jobs"])
        assert [r["created"] for r in batch["results"]] == [False, False]
        # Each create was proposed twice and made its jobs once.
        assert len(jobs_of(port)) == 4
        stored = [key.decode() for key, _ in port.replica.store.scan("jobs")]
        assert len(stored) == 3 and job["job_id"] in stored


async def test_a_write_without_keys_is_not_sent_again_after_no_answer():
    async with live_node() as (url, port), StandIn() as dropping:
        async with AsyncClient(url) as setup:
            job = await setup.create_job(dict(JOB))
        async with AsyncClient(f"{dropping.url},{url}") as api:
            with pytest.raises(CannotConnect) as caught:
                await api.pause_job(job["job_id"])
        assert caught.value.sent is True and caught.value.url.startswith(dropping.url)
        assert not proposed(port, commands.PauseJob)

        def blocking() -> None:
            Client(f"{dropping.url},{url}").pause_job(job["job_id"])
        with pytest.raises(CannotConnect):
            await asyncio.to_thread(blocking)
        assert not proposed(port, commands.PauseJob)


async def test_a_read_goes_to_the_next_node_when_one_does_not_answer_in_time():
    async with live_node() as (url, _), StandIn(hang=True) as hung:
        async with AsyncClient(f"{hung.url},{url}", timeout_s=0.5) as api:
            assert (await api.list_jobs())["jobs"] == []
        async with AsyncClient(hung.url, timeout_s=0.5) as alone:
            with pytest.raises(Timeout):
                await alone.list_jobs()


async def test_when_no_node_answers_the_error_names_each():
    first, second = closed_url(), closed_url()
    async with AsyncClient(f"{first},{second}") as api:
        with pytest.raises(CannotConnect) as caught:
            await api.create_job(dict(JOB))
    assert first in str(caught.value) and second in str(caught.value)
    assert caught.value.sent is False
    with pytest.raises(CannotConnect) as blocking:
        Client(f"{first},{second}").list_jobs()
    assert first in str(blocking.value) and second in str(blocking.value)
    assert blocking.value.sent is False
