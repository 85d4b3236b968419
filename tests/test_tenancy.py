"""A tenant's record in apply: deleting one without jobs frees its place under tenants_max and is audited; one with jobs, or none, is refused."""

from __future__ import annotations

from raftsched import limits
from raftsched.core import commands, jobspec, keys
from raftsched.core.tx import AUDIT, TENANTS
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
