"""A worker's completion is checked against the run's holder and attempt before any output is stored: a stale or foreign worker is refused (409) and stores nothing, and the remote worker drops what was refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from raftsched.api.app import make_app
from raftsched.core import commands, jobspec, keys
from raftsched.errors import Conflict
from raftsched.runtime.port import StoreQueries
from raftsched.runtime.remote_worker import RemoteWorker
from raftsched.runtime.workers import WorkerService
from raftsched.testing.replica import Replica

AT_MS = 1_796_000_000_000


class _Reporter:
    """Applies each report at once, as its own run_updates entry."""

    def __init__(self, log: Replica) -> None:
        self.log = log

    def send(self, update: dict, tenant: str = "", cost: int = 1,
             hold: bool = False) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        result = self.log.run(commands.run_updates(updates=[update]))
        future.set_result(result["accepted"][0])
        return future


class _Outputs:
    def __init__(self) -> None:
        self.stored: list[tuple[str, int, dict]] = []

    def put(self, run_id: str, attempt: int, record: dict, *, now_ms: int, tenant: str) -> bool:
        self.stored.append((run_id, attempt, dict(record, tenant=tenant)))
        return True

    def get(self, run_id: str) -> list[dict]:
        return [record for rid, _, record in self.stored if rid == run_id]


class _Node:
    """What the test looks at: the reports applied, the outputs kept, the
    waits for the log to catch up."""

    def __init__(self, log: Replica) -> None:
        self.store, self.reporter, self.outputs = log.store, _Reporter(log), _Outputs()
        self.caught_up = 0

    def now_ms(self) -> int:
        return AT_MS

    async def wait_caught_up(self, timeout_s: float = 0) -> None:
        self.caught_up += 1


def _queued_run(log: Replica, tenant: str = "t") -> str:
    # Command targets are a grant an admin gives the tenant.
    assert log.run(commands.put_tenant(tenant=tenant, quota={}, commands=True,
                                       actor="bootstrap", at_ms=AT_MS))["ok"]
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z",
                                    "target": {"type": "command", "argv": ["true"],
                                               "queue": "q"}})["spec"]
    assert log.run(commands.create_job(job_id="job_000000000000000000c1", tenant=tenant, spec=spec,
                                       idempotency_key=None, shard=keys.shard_of("job_000000000000000000c1", 16),
                                       next_ms=None, at_ms=AT_MS))["ok"]
    return log.run(commands.trigger_job(job_id="job_000000000000000000c1", scheduled_ms=AT_MS, node="n1",
                                        at_ms=AT_MS))["run"]["id"]


def _result(run_id: str, attempt: int = 1, stdout: str = "out") -> dict:
    return {"run_id": run_id, "attempt": attempt, "ok": True, "exit_code": 0, "error": None,
            "output": {"stdout": stdout}}


@pytest.fixture
def service() -> tuple[WorkerService, _Node, Replica]:
    log = Replica()
    node = _Node(log)
    workers = WorkerService(log.replicated(now_ms=node.now_ms), report=node.reporter.send,
                            outputs=node.outputs, wait_caught_up=node.wait_caught_up,
                            run_lease_ms=5000, run_heartbeat_ms=1000)
    return workers, node, log


async def test_only_the_holder_of_the_attempt_completes_and_stores_output(service):
    workers, node, log = service
    run_id = _queued_run(log)
    granted = await workers.claim("w-a", keys.scoped("t", "q"), 1, 0)
    assert [g["run_id"] for g in granted] == [run_id]
    # Another worker of the tenant, and the holder with a wrong attempt: refused,
    # nothing stored, nothing reported.
    for worker, attempt in (("w-b", 1), ("w-a", 2)):
        with pytest.raises(Conflict) as refused:
            await workers.complete(worker, [_result(run_id, attempt, "forged")], "t")
        assert refused.value.field == "results[0].run_id"
    assert node.outputs.stored == []
    assert log.get_run(run_id)["state"] == "running"
    assert node.caught_up == 2   # a refusal is judged on caught-up state
    # Another tenant's worker cannot complete it either.
    with pytest.raises(Conflict):
        await workers.complete("w-a", [_result(run_id)], "other")
    assert await workers.complete("w-a", [_result(run_id)], "t") == [True]
    assert [(r, a, rec["stdout"], rec["tenant"]) for r, a, rec in node.outputs.stored] == \
        [(run_id, 1, "out", "t")]   # counted against the run's tenant
    assert log.get_run(run_id)["state"] == "succeeded"
    # The same completion again (its answer was lost): the run moved on, refused.
    with pytest.raises(Conflict):
        await workers.complete("w-a", [_result(run_id, 1, "again")], "t")
    assert len(node.outputs.stored) == 1


async def test_the_output_is_kept_before_the_finish_is_proposed():
    # A client that reads the run finished and then asks for its logs finds them.
    log = Replica()
    node = _Node(log)
    stored_at_report = []

    def report(update: commands.RunFinish, *args, **kwargs) -> asyncio.Future:
        stored_at_report.append((type(update).__name__, [r for r, _, _ in node.outputs.stored]))
        return node.reporter.send(update, *args, **kwargs)

    workers = WorkerService(log.replicated(now_ms=node.now_ms), report=report,
                            outputs=node.outputs, wait_caught_up=node.wait_caught_up,
                            run_lease_ms=5000, run_heartbeat_ms=1000)
    run_id = _queued_run(log)
    await workers.claim("w-a", keys.scoped("t", "q"), 1, 0)
    stored_at_report.clear()
    assert await workers.complete("w-a", [_result(run_id)], "t") == [True]
    assert stored_at_report == [("RunFinish", [run_id])]


async def test_a_worker_whose_lease_expired_stores_nothing(service):
    workers, node, log = service
    run_id = _queued_run(log)
    await workers.claim("w-a", keys.scoped("t", "q"), 1, 0)
    lease_ms = log.get_run(run_id)["lease_ms"]
    assert log.run(commands.expire_leases(items=[(run_id, 1, 0)], at_ms=lease_ms + 1))["expired"]
    with pytest.raises(Conflict):
        await workers.complete("w-a", [_result(run_id, 1, "late")], "t")
    assert node.outputs.stored == []


async def test_the_api_answers_409_problem_json_naming_the_result(service):
    workers, node, log = service
    run_id = _queued_run(log)
    await workers.claim("w-a", keys.scoped("t", "q"), 1, 0)

    class _Port(StoreQueries):
        node_id, shard_count = "n1", 16
        config = SimpleNamespace(insecure_no_auth=True, allow_target_cidrs=(),
                                 allow_commands=False)

        def now_ms(self) -> int:
            return AT_MS

        async def complete_runs(self, worker_id, results, tenant):
            return await workers.complete(worker_id, results, tenant)

    port = _Port(log.store)
    async with TestClient(TestServer(make_app(port))) as client:
        answer = await client.post("/v1/workers/w-b/complete",
                                   json={"results": [_result(run_id)]})
        problem = await answer.json()
    assert answer.status == 409
    assert answer.content_type == "application/problem+json"
    assert problem["field"] == "results[0].run_id"
    assert node.outputs.stored == []


async def test_the_remote_worker_drops_a_refused_result_and_sends_the_rest():
    bodies: list[list[str]] = []

    async def complete(request: web.Request) -> web.Response:
        results = (await request.json())["results"]
        bodies.append([r["run_id"] for r in results])
        if results[0]["run_id"] == "run_stale":
            return web.json_response({"type": "conflict", "field": "results[0].run_id",
                                      "detail": "not held"}, status=409,
                                     content_type="application/problem+json")
        return web.json_response({"accepted": [True] * len(results)})

    app = web.Application()
    app.router.add_post("/v1/workers/w/complete", complete)
    async with TestServer(app, host="127.0.0.1") as server:
        worker = RemoteWorker([str(server.make_url(""))], "q", 1, "w")
        worker._results.extend([_result("run_stale"), _result("run_held")])
        worker._results_ready.set()
        task = asyncio.ensure_future(worker.run())
        try:
            deadline = asyncio.get_running_loop().time() + 10
            while worker.completed_total < 1:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert bodies == [["run_stale", "run_held"], ["run_held"]]
    assert worker._results == []
