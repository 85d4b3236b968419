"""Caps on shared replicated state are per tenant: a tenant that fills its topics, backfills or audit stream leaves the others their room, and its own audit writes never evict the admin's records or another tenant's."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched import limits
from raftsched.api.app import make_app
from raftsched.core import commands, keys, tenancy
from raftsched.core.tx import AUDIT, AUDIT_STREAMS, COUNTERS, TOPIC_META, Transition
from raftsched.testing.replica import Replica

from tests.test_backfill import record, setup, start
from tests.test_tenancy import _Port


# --- topics -------------------------------------------------------------------------------

def publish(log: Replica, tenant: str, topic: str, n: int = 1) -> dict:
    return log.run(commands.publish(topic=keys.scoped(tenant, topic), key=None, message="m",
                                    execution_id=f"exe_{tenant}_{topic}_{n}", job_id="job_a1",
                                    at_ms=1_000 + n))


def test_a_tenant_at_its_topic_bound_leaves_the_others_room(monkeypatch):
    monkeypatch.setattr(limits, "topics_per_tenant_max", 2)
    monkeypatch.setattr(limits, "topics_max", 5)
    log = Replica()
    assert publish(log, "a", "t1")["ok"] and publish(log, "a", "t2")["ok"]
    refused = publish(log, "a", "t3")
    assert (refused["ok"], refused["limit"]) == (False, "topics_per_tenant_max")
    assert "tenant a" in refused["detail"]
    assert log.store.get(TOPIC_META, b"a/t3") is None
    assert publish(log, "a", "t1", 2)["ok"]          # its existing topics go on
    assert publish(log, "b", "t1")["ok"] and publish(log, "b", "t2")["ok"]
    assert publish(log, "c", "t1")["ok"]
    refused = publish(log, "d", "t1")                  # the cluster's bound still holds
    assert refused["limit"] == "topics_max"


# --- backfills ----------------------------------------------------------------------------

def test_a_tenant_at_its_backfill_records_bound_leaves_the_others_room(monkeypatch):
    monkeypatch.setattr(limits, "backfills_per_tenant_max", 2)
    monkeypatch.setattr(limits, "backfills_max", 4)
    replica = setup()
    other = "job_" + "b" * 20
    setup(job_id=other, tenant="t2", replica=replica)
    assert start(replica, "bf_1")["ok"] and start(replica, "bf_2")["ok"]
    replica.run(commands.cancel_backfill(backfill_id="bf_1", reason=None, at_ms=1))
    refused = start(replica, "bf_3")                   # ended, but kept: still counted
    assert (refused["error"], refused["limit"]) == ("limit", "backfills_per_tenant_max")
    assert start(replica, "bf_4", job_id=other, tenant="t2")["ok"]
    assert record(replica, "bf_4")["tenant"] == "t2"
    # Purged, a record frees its tenant's place.
    purged = replica.run(commands.purge(
        at_ms=10 ** 13, history_max_runs=1000, history_max_age_ms=10 ** 9,
        finished_job_retention_ms=1, idempotency_ttl_ms=10 ** 9, runs=[], jobs=[], idem=[],
        backfills=["bf_1"]))
    assert purged["backfills"] == 1
    assert start(replica, "bf_3")["ok"]


# --- audit --------------------------------------------------------------------------------

def token(log: Replica, token_id: str, tenant: str, role: str) -> None:
    assert log.run(commands.create_token(token_id=token_id, tenant=tenant, role=role,
                                         name=token_id, sha256="0" * 64, actor="bootstrap",
                                         at_ms=1_000))["ok"]


def pause(log: Replica, job_id: str, tenant: str, actor: str, n: int) -> None:
    assert log.run(commands.scoped(commands.pause_job(job_id=job_id, note=f"n{n}", at_ms=2_000 + n),
                                   tenant=tenant, actor=actor))["ok"]


def audit(log: Replica) -> list[dict]:
    return [rec for _, rec in log.store.scan(AUDIT)]


@pytest.fixture
def small_audit(monkeypatch):
    # (raising=False: the same bounds show what an audit without streams keeps)
    monkeypatch.setattr(limits, "audit_admin_entries_max", 5, raising=False)
    monkeypatch.setattr(limits, "audit_entries_per_tenant_max", 4, raising=False)
    monkeypatch.setattr(limits, "audit_entries_max", 6)
    monkeypatch.setattr(limits, "audit_entries_kept_min", 2, raising=False)


def test_a_writers_own_writes_evict_only_its_own_audit_records(small_audit):
    log = setup()                                       # job of tenant default
    other = "job_" + "b" * 20
    setup(job_id=other, tenant="t2", replica=log)
    token(log, "tok_admin", "default", "admin")
    token(log, "tok_writer", "default", "writer")
    token(log, "tok_w2", "t2", "writer")
    pause(log, other, "t2", "tok_w2", 0)
    pause(log, "job_" + "a" * 20, "default", "tok_admin", 0)   # an admin's job write
    for n in range(1, 50):
        pause(log, "job_" + "a" * 20, "default", "tok_writer", n)
    kept = audit(log)
    admin = [r for r in kept if r["action"].startswith("token.") or r["actor"] == "tok_admin"]
    assert [r["subject"] for r in admin if r["action"] == "token.create"] == \
        ["tok_admin", "tok_writer", "tok_w2"]
    assert any(r["actor"] == "tok_admin" for r in admin)
    assert [r["action"] for r in kept if r["actor"] == "tok_w2"] == ["job.pause"]
    writer = [r for r in kept if r["actor"] == "tok_writer"]
    assert len(writer) == 4   # the tenant's stream keeps its newest 4
    assert writer[-1]["seq"] == max(r["seq"] for r in kept)


def test_the_admin_stream_and_each_tenant_stream_are_bounded(small_audit):
    log = setup()
    for n in range(20):
        token(log, f"tok_{n:02d}", "default", "reader")
    kept = audit(log)
    assert [r["subject"] for r in kept if r["action"] == "token.create"] == \
        [f"tok_{n:02d}" for n in range(15, 20)]          # the admin's newest 5
    ring = log.store.get(COUNTERS, b"audit\x00" + tenancy.ADMIN_STREAM.encode())
    assert ring["next"] - ring["first"] == 5
    assert len(list(log.store.scan(AUDIT_STREAMS))) == len(kept)


def test_while_the_tenants_pool_is_full_a_writer_drops_its_own_down_to_the_minimum(
        small_audit, monkeypatch):
    monkeypatch.setattr(limits, "audit_entries_max", 8)
    log = Replica()
    jobs = {tenant: f"job_{tenant * 20}" for tenant in "abc"}
    for tenant in "ab":
        setup(job_id=jobs[tenant], tenant=tenant, replica=log)   # a job.create each
        for n in range(3):
            pause(log, jobs[tenant], tenant, "tok_x", n)
    # a and b hold 4 each: the pool is full. c writes and drops only its own,
    # keeping audit_entries_kept_min.
    setup(job_id=jobs["c"], tenant="c", replica=log)
    for n in range(3):
        pause(log, jobs["c"], "c", "tok_x", n)
    counts = {t: sum(1 for r in audit(log) if r["tenant"] == t) for t in "abc"}
    assert counts == {"a": 4, "b": 4, "c": 2}


def test_records_from_before_streams_go_as_they_used_to(monkeypatch):
    monkeypatch.setattr(limits, "audit_entries_max", 3)
    log = Replica()
    # Records as an older build wrote them: in the table, in no stream.
    for seq in (1, 2):
        log.store.commit(Transition(writes=((AUDIT, keys.u64(seq), {
            "v": 1, "seq": seq, "at_ms": 0, "actor": None, "action": "job.create",
            "tenant": "default", "subject": "x", "detail": {}}),
            (COUNTERS, b"audit", {"v": 1, "count": seq}),), effects=(), result={}),
            log.index + 1)
        log.index += 1
    token(log, "tok_1", "default", "reader")     # seq 3: streams start here
    token(log, "tok_2", "default", "reader")     # seq 4 drops seq 1
    assert [r["seq"] for r in audit(log)] == [2, 3, 4]
    token(log, "tok_3", "default", "reader")     # seq 5 drops seq 2
    token(log, "tok_4", "default", "reader")     # seq 6 drops nothing: 3 is in a stream
    assert [r["seq"] for r in audit(log)] == [3, 4, 5, 6]


async def test_the_audit_api_keeps_the_admins_records_under_a_writers_burst(monkeypatch,
                                                                            small_audit):
    port = _Port(Replica())
    port.forget_quota = lambda tenant: None
    body = {"run_at": "2030-01-01T00:00:00Z",
            "target": {"type": "http", "url": "https://h.example/x"}}
    monkeypatch.setattr(port, "quota_of", lambda tenant: {"jobs_max": 100,
                                                          "creates_per_s": 1000})
    async with TestClient(TestServer(make_app(port))) as client:
        assert (await client.put("/v1/tenants/default", json={})).status == 200
        for _ in range(12):
            assert (await client.post("/v1/jobs", json=body)).status == 201
        answer = await client.get("/v1/audit", params={"limit": "100"})
        records = (await answer.json())["records"]
    assert answer.status == 200
    assert [r["action"] for r in records].count("tenant.put") == 1
    assert [r["action"] for r in records].count("job.create") == 4


async def test_the_api_answers_409_naming_the_tenants_backfill_bound_and_serves_another(
        monkeypatch):
    monkeypatch.setattr(limits, "backfills_per_tenant_max", 1, raising=False)
    port = _Port(Replica())
    monkeypatch.setattr(port, "quota_of", lambda tenant: {"jobs_max": 100,
                                                          "creates_per_s": 1000})
    job = {"schedule": {"cron": "0 * * * *"},
           "target": {"type": "http", "url": "https://h.example/x"}}
    window = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T03:00:00Z"}
    async with TestClient(TestServer(make_app(port))) as client:
        ids = {}
        for tenant in ("a", "b"):
            created = await client.post("/v1/jobs", json=job, params={"tenant": tenant})
            assert created.status == 201, await created.text()
            ids[tenant] = (await created.json())["job_id"]

        async def backfill(tenant: str):
            return await client.post(f"/v1/jobs/{ids[tenant]}:backfill", json=window,
                                     params={"tenant": tenant})

        assert (await backfill("a")).status == 202
        refused = await backfill("a")
        problem = await refused.json()
        assert (refused.status, problem["limit"]) == (409, "backfills_per_tenant_max")
        assert (await backfill("b")).status == 202
