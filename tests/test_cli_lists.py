"""`raftsched jobs create -f` with a list of any length: batchCreates of at
most batch_create_jobs_max jobs and batch_request_body_bytes_max bytes, sent
in order, each sent again while a node refuses it busy, and, across several
batches (every job then carries an idempotency key), after an answer lost
or an unknown outcome, so that no job is created twice. The CLI runs in a
thread against an in-process node (testing/inprocess.py) on a loopback port,
behind a stand-in that answers each batchCreate as a test scripts it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from raftsched import limits
from raftsched.cli import main
from raftsched.client.bulk import batches_of
from raftsched.core.apply import JOBS
from raftsched.testing.inprocess import ReplicaPort, api_client

JOB = {"schedule": {"every": "1h"}, "target": {"type": "http", "url": "https://h.example/x"}}


def created_jobs(port: ReplicaPort) -> list[dict]:
    """Every job the node holds, in id order (the order they were made)."""
    return [job for _, job in port.replica.store.scan(JOBS)]


# --- where a list is cut ---------------------------------------------------------------------

def test_a_list_is_cut_at_the_job_bound_and_at_the_byte_bound_in_order():
    assert batches_of([]) == []
    assert batches_of([JOB] * 1) == [(0, 1)]
    n = limits.batch_create_jobs_max
    assert batches_of([JOB] * (2 * n + 1)) == [(0, n), (n, 2 * n), (2 * n, 2 * n + 1)]
    # Jobs of 60 KB each: a batch of them is cut by bytes long before 1000 jobs.
    big = [dict(JOB, metadata={"blob": "x" * 60_000, "i": i}) for i in range(150)]
    spans = batches_of(big)
    assert spans[0][0] == 0 and spans[-1][1] == len(big)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))   # contiguous, in order
    assert len(spans) > 1
    for start, end in spans:
        body = json.dumps({"jobs": big[start:end]}, allow_nan=False).encode()
        assert len(body) <= limits.batch_request_body_bytes_max
        # and as full as the bound allows: one more job would not fit
        if end < len(big):
            fuller = json.dumps({"jobs": big[start:end + 1]}, allow_nan=False).encode()
            assert len(fuller) > limits.batch_request_body_bytes_max


# --- against a node ---------------------------------------------------------------------------

class StandIn:
    """Passes each request on to the node at `node_url`, except batchCreates,
    which it answers as `script` says, one word per batchCreate in turn
    (then `forward`): `forward`; `busy` (503 busy, Retry-After 0, nothing
    passed on); `lost` (passed on and applied there, the connection then
    dropped: the answer is lost); `refuse` (a 400 problem, nothing passed on)."""

    def __init__(self, node_url: str, script: list[str]) -> None:
        self.node_url, self.script = node_url, list(script)
        self.batches: list[list[dict]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> "StandIn":
        app = web.Application(client_max_size=2 * limits.batch_request_body_bytes_max)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        word = "forward"
        if request.path.endswith(":batchCreate"):
            self.batches.append(json.loads(body)["jobs"])
            word = self.script.pop(0) if self.script else "forward"
        if word == "busy":
            return web.json_response({"type": "/problems/busy", "title": "Busy", "status": 503,
                                      "detail": "stand-in", "reason": "busy"},
                                     status=503, headers={"Retry-After": "0"})
        if word == "refuse":
            return web.json_response({"type": "/problems/invalid-field", "title": "Invalid",
                                      "status": 400, "detail": "stand-in", "field": "jobs"},
                                     status=400)
        async with aiohttp.ClientSession() as session:
            async with session.request(request.method, self.node_url + request.path_qs,
                                       data=body,
                                       headers={"Content-Type": "application/json"}) as answer:
                text = await answer.read()
                status = answer.status
        if word == "lost":   # applied there; the answer never reaches the client
            assert request.transport is not None
            request.transport.abort()
        return web.Response(body=text, status=status, content_type="application/json")


def write_jobs(tmp_path: Path, jobs: list[dict]) -> str:
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    return str(path)


async def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def create_through(tmp_path: Path, capsys, jobs: list[dict], script: list[str],
                         *extra: str) -> tuple[ReplicaPort, StandIn, int, str, str]:
    """`raftsched jobs create -f` of `jobs` through a stand-in answering as
    `script` says, in front of an in-process node: the node, the stand-in,
    and the exit code, stdout and stderr."""
    port = ReplicaPort()
    async with api_client(port) as node:
        async with StandIn(str(node.make_url("")).rstrip("/"), script) as stand_in:
            code, out, err = await run_cli(capsys, "jobs", "create", "-f",
                                           write_jobs(tmp_path, jobs), "--url", stand_in.url,
                                           *extra)
    return port, stand_in, code, out, err


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 10 jobs, on both sides (the node reads the same limits), so
    that lists of a few batches take a moment."""
    monkeypatch.setattr(limits, "batch_create_jobs_max", 10)


@pytest.fixture
def quick_resend(monkeypatch):
    monkeypatch.setattr(limits, "batch_resend_wait_max_s", 0.05)


async def test_a_list_of_two_and_a_half_batches_goes_in_three_each_job_once(tmp_path, capsys,
                                                                           small_batches):
    n = 25
    jobs = [dict(JOB, name=f"j{i}") for i in range(n)]
    port, stand_in, code, out, err = await create_through(
        tmp_path, capsys, jobs, [], "--output", "json")
    assert code == 0, err
    results = json.loads(out)["results"]
    assert len(results) == n and all(r["created"] for r in results)
    assert [len(b) for b in stand_in.batches] == [10, 10, 5]
    made = created_jobs(port)
    assert [job["spec"]["name"] for job in made] == [f"j{i}" for i in range(n)]
    # Across batches each job carried a key, so a batch could be sent again.
    assert all(job["idempotency_key"].startswith("client-")
               for batch in stand_in.batches for job in batch)


async def test_a_batch_refused_busy_is_sent_again_and_its_jobs_made_once(tmp_path, capsys,
                                                                         quick_resend):
    jobs = [dict(JOB, name=f"j{i}") for i in range(10)]   # one batch: no keys added
    port, stand_in, code, out, err = await create_through(
        tmp_path, capsys, jobs, ["busy", "busy"], "--output", "json")
    assert code == 0, err
    assert len(stand_in.batches) == 3
    assert "idempotency_key" not in stand_in.batches[-1][0]
    assert len(created_jobs(port)) == 10


async def test_a_batch_whose_answer_was_lost_is_sent_again_with_its_keys(tmp_path, capsys,
                                                                        quick_resend,
                                                                        small_batches):
    n = 15
    jobs = [dict(JOB, name=f"j{i}") for i in range(n)]
    port, stand_in, code, out, err = await create_through(
        tmp_path, capsys, jobs, ["forward", "lost"], "--output", "json")
    assert code == 0, err
    assert [len(b) for b in stand_in.batches] == [10, 5, 5]
    assert stand_in.batches[1] == stand_in.batches[2]          # the same keys, sent again
    results = json.loads(out)["results"]
    assert len(results) == n
    assert [r["created"] for r in results[-5:]] == [False] * 5    # made by the lost send
    assert [job["spec"]["name"] for job in created_jobs(port)] == [f"j{i}" for i in range(n)]


async def test_a_single_batch_whose_answer_was_lost_is_not_sent_again(tmp_path, capsys,
                                                                     quick_resend):
    """Without keys, an unknown outcome cannot be sent again safely: the CLI
    says so (exit 2) and the node holds the jobs once."""
    jobs = [dict(JOB, name=f"j{i}") for i in range(3)]
    port, stand_in, code, out, err = await create_through(
        tmp_path, capsys, jobs, ["lost"])
    assert code == 2, (out, err)
    assert len(stand_in.batches) == 1 and len(created_jobs(port)) == 3
    assert "jobs 0-2 of the list have no result, for this error:" in err


async def test_a_batch_refused_midway_shows_what_was_made_and_from_where_not(tmp_path, capsys,
                                                                            small_batches):
    n = 21
    jobs = [dict(JOB, name=f"j{i}") for i in range(n)]
    port, stand_in, code, out, err = await create_through(
        tmp_path, capsys, jobs, ["forward", "refuse"], "--output", "json")
    assert code == 1, (out, err)
    assert len(stand_in.batches) == 2   # the third was never sent
    assert len(json.loads(out.split("\n{", 1)[0])["results"]) == 10
    assert "jobs 0-9 of the list have their results above; jobs 10-20 have none" in err
    assert len(created_jobs(port)) == 10


async def test_the_client_s_create_jobs_raises_with_the_results_so_far(tmp_path, small_batches):
    """raftsched.client.bulk, as a Python program uses it: the results of the
    batches sent, then BatchNotSent naming the first job without one."""
    from raftsched.client import BadRequest, Client, bulk
    n = limits.batch_create_jobs_max + 10
    jobs = [dict(JOB, name=f"j{i}") for i in range(n)]
    port, seen = ReplicaPort(), []
    async with api_client(port) as node:
        async with StandIn(str(node.make_url("")).rstrip("/"),
                           ["forward", "refuse"]) as stand_in:
            with pytest.raises(bulk.BatchNotSent) as raised:
                await asyncio.to_thread(bulk.create_jobs, Client(stand_in.url), jobs,
                                        lambda done, total: seen.append((done, total)))
    error = raised.value
    assert (error.start, error.total) == (limits.batch_create_jobs_max, n)
    assert len(error.results) == limits.batch_create_jobs_max
    assert isinstance(error.cause, BadRequest)
    assert seen == [(limits.batch_create_jobs_max, n)]
    assert len(created_jobs(port)) == limits.batch_create_jobs_max
