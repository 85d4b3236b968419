"""Command targets are a per-tenant grant an admin gives: without it a create, batch item or update with a command target (node-run or for a worker queue) is refused 403 naming the field, at the edge and again in apply (so a stale edge slips nothing through), the grant is audited, and a PUT that leaves it out keeps it."""

from __future__ import annotations

import msgspec
from aiohttp.test_utils import TestClient, TestServer

from raftsched.api.app import make_app
from raftsched.core import codec, commands, jobspec, keys
from raftsched.core.tx import AUDIT, JOBS
from raftsched.testing.inprocess import ReplicaPort
from raftsched.testing.replica import Replica

NODE_COMMAND = {"type": "command", "argv": ["true"]}
QUEUE_COMMAND = {"type": "command", "argv": ["true"], "queue": "batch"}
HTTP = {"type": "http", "url": "https://h.example/x"}


def body(target: dict) -> dict:
    return {"run_at": "2030-01-01T00:00:00Z", "target": target}


def spec_of(target: dict) -> dict:
    return jobspec.validate_create(body(target))["spec"]


def dag_spec(target: dict) -> dict:
    return jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z", "dag": {"tasks": [
        {"id": "a", "target": HTTP}, {"id": "b", "depends_on": ["a"], "target": target}]}})["spec"]


def grant(log: Replica, tenant: str, value: bool | None, at_ms: int = 1_000) -> dict:
    return log.run(commands.put_tenant(tenant=tenant, quota={}, actor="tok_0123456789abcdef",
                                       at_ms=at_ms, commands=value))


def create(log: Replica, tenant: str, job_id: str, spec: dict) -> dict:
    return log.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec,
                                       idempotency_key=None, shard=keys.shard_of(job_id, 16),
                                       next_ms=None, at_ms=1_500))


# --- apply ----------------------------------------------------------------------------------

def test_apply_refuses_a_command_job_of_a_tenant_without_the_grant():
    log = Replica()
    for target in (NODE_COMMAND, QUEUE_COMMAND):
        refused = create(log, "t1", "job_c1", spec_of(target))
        assert refused["ok"] is False
        assert refused["error"] == "forbidden"
        assert refused["field"] == "target.type"
        assert "PUT /v1/tenants/t1" in refused["detail"]
    assert log.store.get(JOBS, keys.job_key("job_c1")) is None
    in_dag = create(log, "t1", "job_c2", dag_spec(NODE_COMMAND))
    assert (in_dag["error"], in_dag["field"]) == ("forbidden", "dag.tasks[1].target.type")
    assert create(log, "t1", "job_h1", spec_of(HTTP))["ok"] is True
    assert grant(log, "t1", True)["ok"] is True
    assert create(log, "t1", "job_c1", spec_of(NODE_COMMAND))["ok"] is True
    # Another tenant's grant is not this one's.
    assert create(log, "t2", "job_c3", spec_of(QUEUE_COMMAND))["error"] == "forbidden"


def test_a_batch_refuses_only_its_command_items_without_the_grant():
    log = Replica()
    items = [commands.create_job_item(job_id=job_id, spec=spec_of(target), idempotency_key=None,
                                      shard=keys.shard_of(job_id, 16), next_ms=None)
             for job_id, target in (("job_b1", HTTP), ("job_b2", QUEUE_COMMAND))]
    result = log.run(commands.create_jobs(tenant="t1", at_ms=1_500, items=items))
    first, second = result["results"]
    assert first["ok"] is True
    assert (second["ok"], second["error"], second["field"]) == (False, "forbidden", "target.type")


def test_an_update_to_a_command_is_refused_once_the_grant_is_withdrawn():
    log = Replica()
    grant(log, "t1", True)
    job = create(log, "t1", "job_c1", spec_of(QUEUE_COMMAND))["job"]
    grant(log, "t1", False, at_ms=2_000)
    update = commands.scoped(commands.update_job(job_id="job_c1", spec=spec_of(QUEUE_COMMAND),
                                                 expected_version=job["version"], next_ms=None,
                                                 at_ms=3_000), tenant="t1", actor=None)
    refused = log.run(update)
    assert (refused["ok"], refused["error"], refused["field"]) == (False, "forbidden",
                                                                    "target.type")
    assert log.job("job_c1")["version"] == job["version"]
    # Moving the job away from commands is allowed.
    to_http = msgspec.structs.replace(update, spec=spec_of(HTTP))
    assert log.run(to_http)["ok"] is True


def test_the_grant_is_audited_and_a_put_without_it_keeps_it():
    log = Replica()
    assert grant(log, "t1", True)["tenant"]["commands"] is True
    assert grant(log, "t1", None)["tenant"]["commands"] is True   # quotas only
    assert grant(log, "t1", False)["tenant"]["commands"] is False
    puts = [rec for _, rec in log.store.scan(AUDIT) if rec["action"] == "tenant.put"]
    assert [r["detail"]["commands"] for r in puts] == [True, True, False]
    assert {r["actor"] for r in puts} == {"tok_0123456789abcdef"}


def test_a_grant_that_is_not_a_boolean_does_not_decode():
    command = msgspec.to_builtins(commands.put_tenant(tenant="t1", quota={}, actor=None,
                                                      at_ms=1))
    command["commands"] = "yes"
    result = Replica().run_entry(codec.pack(command))
    assert result["error"] == "invalid_command"


# --- the API --------------------------------------------------------------------------------

class _Port(ReplicaPort):
    """A node port over a replica: proposals are applied at once, and counted.
    `stale_tenant`: what this node's (behind) copy of every tenant record says."""

    def __init__(self, log: Replica, stale_tenant: dict | None = None) -> None:
        super().__init__(log, quota={"jobs_max": 1000, "creates_per_s": 1000,
                                     "runs_concurrent_max": 10, "weight": 1},
                         allow_commands=True, idempotency_ttl_s=60.0)
        self.log, self.catch_ups = log, 0
        self.stale_tenant = stale_tenant

    def tenant(self, name: str) -> dict | None:
        if self.stale_tenant is not None:
            return self.stale_tenant
        return super().tenant(name)

    async def wait_caught_up(self, timeout_s: float = 0) -> None:
        self.catch_ups += 1


async def test_the_api_refuses_command_jobs_with_403_until_an_admin_grants_them():
    port = _Port(Replica())
    async with TestClient(TestServer(make_app(port))) as client:
        for target in (NODE_COMMAND, QUEUE_COMMAND):
            refused = await client.post("/v1/jobs", json=body(target))
            problem = await refused.json()
            assert refused.status == 403, problem
            assert problem["field"] == "target.type"
            assert "commands" in problem["detail"]
        assert port.proposed == []   # refused at the edge, once caught up
        assert port.catch_ups >= 1
        batch = await client.post("/v1/jobs:batchCreate",
                                  json={"jobs": [body(HTTP), body(QUEUE_COMMAND)]})
        first, second = (await batch.json())["results"]
        assert "job_id" in first
        assert (second["error"]["status"], second["error"]["field"]) == (403, "target.type")
        job_id = first["job_id"]
        patched = await client.patch(f"/v1/jobs/{job_id}", json={"target": QUEUE_COMMAND})
        assert patched.status == 403
        assert (await patched.json())["field"] == "target.type"

        bad = await client.put("/v1/tenants/default", json={"commands": "yes"})
        assert bad.status == 400
        assert (await bad.json())["field"] == "commands"
        granted = await client.put("/v1/tenants/default", json={"commands": True})
        assert granted.status == 200
        assert (await granted.json())["commands"] is True
        assert (await client.post("/v1/jobs", json=body(NODE_COMMAND))).status == 201
        assert (await client.patch(f"/v1/jobs/{job_id}",
                                   json={"target": QUEUE_COMMAND})).status == 200
        shown = await client.get("/v1/tenants/default")
        assert (await shown.json())["commands"] is True


async def test_apply_refuses_what_a_stale_edge_let_through():
    """This node still believes the grant stands; the leader's state withdrew it."""
    log = Replica()
    granted = grant(log, "default", True)["tenant"]
    grant(log, "default", False, at_ms=2_000)
    port = _Port(log, stale_tenant=granted)
    async with TestClient(TestServer(make_app(port))) as client:
        refused = await client.post("/v1/jobs", json=body(QUEUE_COMMAND))
        assert refused.status == 403
        assert (await refused.json())["field"] == "target.type"
    assert len(port.proposed) == 1   # the edge let it through: apply refused it
    assert log.store.scan(JOBS) == []
