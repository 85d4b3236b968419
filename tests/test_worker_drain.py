"""A worker stopped with SIGTERM drains: it claims no more runs (the claim
waiting for runs is withdrawn), lets the commands it runs end while it
heartbeats their leases, and reports them, for at most --drain-s; what is
still running then is killed. The node is a stand-in (RemoteWorker._post);
the commands are real."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from aiohttp import web

from raftsched import limits
from raftsched.runtime.remote_worker import RemoteWorker
from raftsched.testing.cluster import free_ports
from tests.test_supervision import assignment, until


class Node:
    """Hands out `runs` on the first claim; later claims wait (a long poll)
    until withdrawn. Notes every request and what became of each claim."""

    def __init__(self, runs: list[dict]) -> None:
        self.runs = runs
        self.claims_sent = 0
        self.claims_withdrawn = 0
        self.heartbeats: list[float] = []
        self.completed: list[dict] = []

    async def post(self, path: str, body: dict, timeout_s: float):
        kind = path.rsplit("/", 1)[1]
        if kind == "claim":
            self.claims_sent += 1
            if self.runs:
                runs, self.runs = self.runs, []
                return {"runs": runs}
            try:
                await asyncio.sleep(timeout_s)
            except asyncio.CancelledError:
                self.claims_withdrawn += 1
                raise
            return {"runs": []}
        if kind == "heartbeat":
            self.heartbeats.append(time.monotonic())
            return {"lost": []}
        self.completed.extend(body["results"])
        return {"accepted": [True] * len(body["results"])}


async def serving(node: Node, monkeypatch, slots: int = 2) -> tuple[RemoteWorker, asyncio.Task]:
    monkeypatch.setattr(RemoteWorker, "_post", node.post)
    worker = RemoteWorker(["http://127.0.0.1:9"], "q", slots, "w1")
    return worker, asyncio.ensure_future(worker.run())


async def stopped(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_drain_lets_the_running_command_end_and_reports_it_claiming_nothing_more(
        monkeypatch, tmp_path):
    done = tmp_path / "done"
    # Longer than the worker's first heartbeat wait (1 s, before a claim says 50 ms).
    node = Node([assignment("run_a", f"sleep 1.5; echo ok > {done}")])
    worker, task = await serving(node, monkeypatch)
    try:
        # run_a runs, and the next claim waits for runs at the node.
        await until(lambda: "run_a" in worker._running and node.claims_sent == 2, 10,
                    "run_a to start and a second claim to wait")
        began = time.monotonic()
        assert await worker.drain(10) is True
        took_s = time.monotonic() - began
        claims_at_drain = node.claims_sent
        beats_during = [t for t in node.heartbeats if t >= began]
    finally:
        await stopped(task)
    assert done.read_text() == "ok\n"   # it ran to its end, not killed
    assert [(r["run_id"], r["ok"]) for r in node.completed] == [("run_a", True)]
    assert node.claims_withdrawn == 1 and claims_at_drain == node.claims_sent == 2
    assert 0.3 <= took_s < 5, took_s   # it waited for the command, no longer
    assert beats_during, "the run's lease was not heartbeated while draining"


async def test_an_idle_worker_drains_at_once_withdrawing_its_waiting_claim(monkeypatch):
    node = Node([])
    worker, task = await serving(node, monkeypatch)
    try:
        await until(lambda: node.claims_sent == 1, 10, "a claim to wait")
        began = time.monotonic()
        assert await worker.drain(10) is True
        took_s = time.monotonic() - began
    finally:
        await stopped(task)
    assert node.claims_withdrawn == 1 and node.claims_sent == 1
    assert took_s < 1.0, took_s


async def test_a_drain_that_runs_out_of_time_says_so_and_the_stop_kills_the_command(
        monkeypatch, tmp_path):
    done = tmp_path / "done"
    node = Node([assignment("run_a", f"sleep 20; echo ok > {done}")])
    worker, task = await serving(node, monkeypatch)
    try:
        await until(lambda: "run_a" in worker._running, 10, "run_a to start")
        began = time.monotonic()
        assert await worker.drain(0.3) is False
        assert 0.3 <= time.monotonic() - began < 2
    finally:
        await stopped(task)
    assert not worker._running
    assert node.completed == []   # killed: the cluster retries it once its lease expires
    assert not done.exists()


async def test_runs_a_claim_brought_as_the_drain_began_are_run_and_reported(monkeypatch):
    node = Node([assignment("run_a", "true"), assignment("run_b", "true")])
    monkeypatch.setattr(RemoteWorker, "_post", node.post)
    worker = RemoteWorker(["http://127.0.0.1:9"], "q", 2, "w1")
    task = asyncio.ensure_future(worker.run())
    try:
        # Drain as soon as the first claim is sent: its answer still counts.
        await until(lambda: node.claims_sent >= 1, 10, "the first claim")
        assert await worker.drain(10) is True
    finally:
        await stopped(task)
    assert sorted(r["run_id"] for r in node.completed) == ["run_a", "run_b"]


async def test_the_worker_refuses_a_drain_time_out_of_bounds():
    port = free_ports(1)[0]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "raftsched", "worker", "--queue", "q1", "--cluster",
        f"http://127.0.0.1:{port}", "--drain-s", str(limits.worker_drain_s_max + 1),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "worker_drain_s_max" in err.decode()


class NodeServer:
    """A stand-in node over HTTP on 127.0.0.1 for a `raftsched worker`
    process: its first claim gets `run`, later claims wait; it notes the
    results reported."""

    def __init__(self, run: dict) -> None:
        self.runs = [run]
        self.completed: list[dict] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()   # ends the claims that wait

    async def claim(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.runs:
            runs, self.runs = self.runs, []
            return web.json_response({"runs": runs, "node": "n1"})
        try:
            await asyncio.wait_for(self._closing.wait(), body["wait_s"])
        except asyncio.TimeoutError:
            pass
        return web.json_response({"runs": [], "node": "n1"})

    async def heartbeat(self, request: web.Request) -> web.Response:
        return web.json_response({"lost": []})

    async def complete(self, request: web.Request) -> web.Response:
        results = (await request.json())["results"]
        self.completed.extend(results)
        return web.json_response({"accepted": [True] * len(results)})

    async def __aenter__(self) -> "NodeServer":
        app = web.Application()
        app.router.add_post("/v1/workers/{worker}/claim", self.claim)
        app.router.add_post("/v1/workers/{worker}/heartbeat", self.heartbeat)
        app.router.add_post("/v1/workers/{worker}/complete", self.complete)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        port = free_ports(1)[0]
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        self._closing.set()
        await self._runner.cleanup()


async def _lines_until(stream: asyncio.StreamReader, text: str, what: str) -> str:
    seen = ""
    while text not in (line := (await asyncio.wait_for(stream.readline(), 60)).decode()):
        assert line, f"the worker exited before {what}: {seen}"
        seen += line
    return seen + line


@pytest.mark.parametrize("second_signal", [False, True])
async def test_sigterm_drains_the_worker_and_a_second_signal_stops_it_at_once(
        tmp_path, second_signal):
    """The command running when SIGTERM comes runs to its end and is
    reported, then the worker exits 0; a second signal while it drains
    stops it at once, killing the command, also with 0."""
    done = tmp_path / "done"
    seconds = 30 if second_signal else 1.5
    async with NodeServer(assignment("run_a", f"sleep {seconds}; echo ok > {done}")) as node:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "raftsched", "worker", "--queue", "q1", "--cluster",
            node.url, "--drain-s", "60", env=dict(os.environ, RAFTSCHED_TOKEN="t"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            assert process.stderr is not None
            await _lines_until(process.stderr, "run_a attempt 1: starting", "it started run_a")
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            await _lines_until(process.stderr, "draining", "it said it drains")
            if second_signal:
                process.send_signal(signal.SIGTERM)
            rest = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
            assert await asyncio.wait_for(process.wait(), 60) == 0, rest
            took_s = time.monotonic() - signalled
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    if second_signal:
        assert "a second signal; stopping without draining" in rest, rest
        assert node.completed == [] and not done.exists()
        assert took_s < 10, took_s
    else:
        assert "drained" in rest, rest
        assert done.read_text() == "ok\n"
        assert [(r["run_id"], r["ok"]) for r in node.completed] == [("run_a", True)]
