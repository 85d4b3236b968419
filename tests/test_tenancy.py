"""A tenant's record: deleting one without jobs frees its place under tenants_max and is audited, one with jobs or none is refused; a create over a quota is judged at the edge as apply judges it, refused there only once caught up, and then with no proposal."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, strategies as st

from raftsched import limits
from raftsched.api.app import _refuse_over_quota, make_app
from raftsched.core import commands, jobspec, keys, tenancy
from raftsched.core.tx import AUDIT, TENANTS, Tx
from raftsched.errors import QuotaExceeded
from raftsched.runtime.port import StoreQueries
from raftsched.testing.replica import Replica

QUOTA = {"jobs_max": 10, "creates_per_s": 100}


def put(log: Replica, tenant: str) -> dict:
    return log.run(commands.put_tenant(tenant=tenant, quota={}, actor=None, at_ms=1_000))


def delete(log: Replica, tenant: str) -> dict:
    return log.run(commands.delete_tenant(tenant=tenant, actor="tok_0123456789abcdef",
                                          at_ms=2_000))


def create(log: Replica, tenant: str, job_id: str) -> dict:
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z",
                                    "target": {"type": "http", "url": "https://h.example/x"}})
    return log.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec["spec"],
                                       idempotency_key=None, shard=keys.shard_of(job_id, 16),
                                       next_ms=None, at_ms=1_500, quota=QUOTA))


def test_deleting_a_tenant_without_jobs_frees_its_place(monkeypatch):
    monkeypatch.setattr(limits, "tenants_max", 2)
    log = Replica()
    assert put(log, "a")["ok"] and put(log, "b")["ok"]
    assert put(log, "c")["limit"] == "tenants_max"
    assert delete(log, "a") == {"ok": True}
    assert log.store.get(TENANTS, b"a") is None
    assert put(log, "c")["ok"]
    audit = [rec for _, rec in log.store.scan(AUDIT)]
    assert (audit[-2]["action"], audit[-2]["subject"], audit[-2]["actor"]) == \
        ("tenant.delete", "a", "tok_0123456789abcdef")


def test_a_tenant_with_jobs_or_without_a_record_is_not_deleted():
    log = Replica()
    assert create(log, "t1", "job_t1a")["ok"]
    refused = delete(log, "t1")
    assert (refused["error"], "has 1 jobs" in refused["detail"]) == ("conflict", True)
    assert log.store.get(TENANTS, b"t1")["jobs"] == 1
    assert log.run(commands.delete_job(job_id="job_t1a", at_ms=1_800))["ok"]
    assert delete(log, "t1") == {"ok": True}
    assert delete(log, "t1")["error"] == "not_found"


# --- a create over a quota is answered before it is proposed --------------------------------

class _Tenants:
    """A read view holding one tenant record."""

    def __init__(self, record: dict) -> None:
        self.record = record

    def get(self, table: str, key: bytes) -> dict | None:
        return self.record if table == TENANTS and key == b"t" else None


@given(st.integers(0, 6), st.one_of(st.none(), st.integers(0, 20_000)),
       st.integers(0, 10_000), st.integers(1, 5), st.integers(1, 5))
def test_the_edge_judges_a_create_as_apply_does_and_changes_nothing(jobs, bucket_milli, later_ms,
                                                                    jobs_max, rate_per_s):
    record = {"v": 1, "name": "t", "quota": {}, "jobs": jobs, "bucket_milli": bucket_milli,
              "bucket_ms": 50_000, "created_ms": 0}
    quota = {"jobs_max": jobs_max, "creates_per_s": rate_per_s}
    at_ms = 50_000 + later_ms
    before = copy.deepcopy(record)
    edge = tenancy.create_refusal(record, quota, "t", at_ms)
    assert record == before
    applied = tenancy.CreateCounter(Tx(_Tenants(copy.deepcopy(record))), "t", quota,
                                    at_ms).take()
    assert edge == applied
    assert tenancy.create_refusal(None, quota, "t", at_ms) is None


class _Node:
    """A stand-in port: its tenant record changes once it has caught up."""

    def __init__(self, local: dict, caught_up: dict) -> None:
        self.record, self._caught_up, self.waits = local, caught_up, 0

    def tenant(self, name: str) -> dict:
        return self.record

    def now_ms(self) -> int:
        return 60_000

    async def wait_caught_up(self) -> None:
        self.waits += 1
        self.record = self._caught_up


def _record(jobs: int) -> dict:
    return {"v": 1, "name": "t", "quota": {}, "jobs": jobs, "bucket_milli": None,
            "bucket_ms": 0, "created_ms": 0}


async def test_a_create_over_jobs_max_is_refused_at_the_edge_once_caught_up():
    quota = {"jobs_max": 2, "creates_per_s": 100}
    node = _Node(_record(2), caught_up=_record(2))
    with pytest.raises(QuotaExceeded) as caught:
        await _refuse_over_quota(node, "t", quota)
    assert (caught.value.limit, node.waits) == ("jobs_max", 1)
    # A delete this node had not applied yet: the create goes on to apply.
    node = _Node(_record(2), caught_up=_record(1))
    await _refuse_over_quota(node, "t", quota)
    assert node.waits == 1
    # Under the quota here: no wait at all.
    node = _Node(_record(1), caught_up=_record(1))
    await _refuse_over_quota(node, "t", quota)
    assert node.waits == 0


class _Port(StoreQueries):
    """A node port over a replica: proposals are applied at once, and counted."""

    def __init__(self, log: Replica) -> None:
        super().__init__(log.store)
        self.log, self.proposed = log, []
        self.node_id, self.shard_count = "n1", 16
        self.config = SimpleNamespace(insecure_no_auth=True, allow_target_cidrs=(),
                                      allow_commands=False)

    def now_ms(self) -> int:
        return 1_796_000_000_000   # late 2026

    def check_room(self) -> None:
        return None

    def shard_of(self, job_id: str) -> int:
        return keys.shard_of(job_id, self.shard_count)

    def quota_of(self, tenant: str) -> dict:
        return {"jobs_max": 1, "creates_per_s": 1000}

    async def wait_caught_up(self, timeout_s: float = 0) -> None:
        return None

    async def propose(self, command: dict) -> dict:
        self.proposed.append(command)
        return self.log.run(command)

    def admit(self, jobs: int, tenant: str) -> contextlib.nullcontext:
        return contextlib.nullcontext()

    async def propose_create(self, command: dict, body_bytes: int) -> dict:
        return await self.propose(command)


async def test_a_single_create_over_jobs_max_answers_429_without_a_proposal():
    port = _Port(Replica())
    body = {"run_at": "2030-01-01T00:00:00Z",
            "target": {"type": "http", "url": "https://h.example/x"}}
    async with TestClient(TestServer(make_app(port))) as client:
        assert (await client.post("/v1/jobs", json=body)).status == 201
        assert len(port.proposed) == 1
        over = await client.post("/v1/jobs", json=body)
        assert (over.status, (await over.json())["limit"]) == (429, "jobs_max")
        assert len(port.proposed) == 1   # refused at the edge: no Raft entry
        # With an idempotency key the create goes to apply, which may answer
        # the job the key made.
        keyed = await client.post("/v1/jobs", json=dict(body, idempotency_key="k1"))
        assert keyed.status == 429 and len(port.proposed) == 2
