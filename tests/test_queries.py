"""The node's named queries read the state a replica applied: records by id, pages that go on without repeating or skipping, bounded scans, topics, the cluster and tenancy."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core import commands, keys, queries
from raftsched.core.tx import JOBS
from raftsched.testing.replica import EVERY_2S, HTTP, Replica

SHARDS = 16
QUOTA = {"jobs_max": None, "creates_per_s": None, "runs_concurrent_max": None, "weight": None}


def spec(name: str = "j", labels: dict | None = None) -> dict:
    return {"name": name, "schedule": EVERY_2S, "target": HTTP, "retry": {"max_attempts": 1},
            "concurrency": {"policy": "allow"}, "metadata": {}, "labels": labels or {}}


def make_job(log: Replica, job_id: str, tenant: str = "t1", **over) -> None:
    result = log.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec(**over),
                                         idempotency_key=None,
                                         shard=keys.shard_of(job_id, SHARDS), next_ms=None,
                                         at_ms=1))
    assert result["ok"], result


def trigger(log: Replica, job_id: str, at_ms: int) -> str:
    result = log.run(commands.trigger_job(job_id=job_id, scheduled_ms=at_ms, node="n1",
                                          at_ms=at_ms))
    assert result["ok"], result
    return result["run"]["id"]


def all_pages(reader, tenant: str, filters: dict, limit: int) -> list[list[str]]:
    pages, after = [], None
    while True:
        runs, after = queries.runs_page(reader, tenant, filters, limit, after)
        pages.append([run["id"] for run in runs])
        if after is None:
            return pages


def test_jobs_and_runs_by_id():
    log = Replica()
    make_job(log, "job_a1")
    run_id = trigger(log, "job_a1", 5_000)
    assert queries.job(log.store, "job_a1")["id"] == "job_a1"
    assert queries.job(log.store, "job_zz") is None
    assert queries.run(log.store, run_id)["job_id"] == "job_a1"
    assert queries.run(log.store, "run_" + "0" * 24) is None
    # An id no key can hold reads as nothing rather than failing.
    assert queries.run(log.store, "r" * (limits.lmdb_key_bytes_max + 1)) is None
    log.run(commands.cancel_run(run_id=run_id, reason="x", at_ms=6_000))
    assert queries.run_states(log.store, [run_id, "run_gone"]) == ["cancelled", None]


def test_a_jobs_runs_come_latest_first_and_bounded():
    log = Replica()
    make_job(log, "job_a1")
    make_job(log, "job_a10")   # its index prefix must not leak into job_a1's
    runs = [trigger(log, "job_a1", ms) for ms in (1_000, 3_000, 2_000)]
    trigger(log, "job_a10", 4_000)
    assert [r["id"] for r in queries.job_runs(log.store, "job_a1", 10)] == \
        [runs[1], runs[2], runs[0]]
    assert [r["id"] for r in queries.job_runs(log.store, "job_a1", 2)] == [runs[1], runs[2]]
    assert queries.occurrences_with_a_run(log.store, "job_a1", [1_000, 1_500, 3_000]) == 2


def test_runs_pages_go_on_from_their_position_newest_first():
    log = Replica()
    make_job(log, "job_a1")
    make_job(log, "job_b2")
    make_job(log, "job_c3", tenant="t2")
    a = [trigger(log, "job_a1", ms) for ms in (1_000, 2_000, 3_000)]
    b = [trigger(log, "job_b2", ms) for ms in (1_500, 2_500)]
    trigger(log, "job_c3", 2_200)
    assert all_pages(log.store, "t1", {}, 2) == [[a[2], b[1]], [a[1], b[0]], [a[0]]]
    assert all_pages(log.store, "t1", {"job_id": "job_a1"}, 2) == [[a[2], a[1]], [a[0]]]
    # Another tenant's job is answered as one without runs.
    assert all_pages(log.store, "t2", {"job_id": "job_a1"}, 2) == [[]]
    window = {"scheduled_after": 1_500, "scheduled_before": 3_000}
    assert sum(all_pages(log.store, "t1", window, 10), []) == [b[1], a[1], b[0]]


def test_a_runs_page_reads_a_bounded_number_of_rows(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "list_scan_rows_max", 2)
    log = Replica()
    make_job(log, "job_a1")
    runs = [trigger(log, "job_a1", ms) for ms in (1_000, 2_000, 3_000)]
    log.run(commands.cancel_run(run_id=runs[0], reason="x", at_ms=9_000))
    found, after = queries.runs_page(log.store, "t1", {"state": "cancelled"}, 10, None)
    assert found == []
    assert after == (2_000, runs[1])   # two rows read, none matched: go on from there
    found, after = queries.runs_page(log.store, "t1", {"state": "cancelled"}, 10, after)
    assert [r["id"] for r in found] == [runs[0]]
    assert after is None


def test_jobs_pages_in_id_order_with_filters_and_a_bounded_scan(monkeypatch):
    log = Replica()
    for job_id in ("job_a1", "job_a2", "job_a3", "job_a4"):
        make_job(log, job_id, name="billing" if job_id != "job_a2" else "other")
    make_job(log, "job_b1", tenant="t2")
    jobs, last, more = queries.jobs_page(log.store, "t1", {}, 2, None)
    assert ([j["id"] for j in jobs], last, more) == (["job_a1", "job_a2"], "job_a2", True)
    jobs, last, _ = queries.jobs_page(log.store, "t1", {}, 10, last)
    assert ([j["id"] for j in jobs], last) == (["job_a3", "job_a4"], "job_a4")
    named = queries.jobs_page(log.store, "t1", {"name_prefix": "bill"}, 10, None)[0]
    assert [j["id"] for j in named] == ["job_a1", "job_a3", "job_a4"]
    monkeypatch.setattr(limits, "list_scan_rows_max", 2)
    jobs, last, more = queries.jobs_page(log.store, "t1", {"name_prefix": "none"}, 2, None)
    assert (jobs, last, more) == ([], "job_a2", True)   # stopped after two rows, may go on


class CountingReader:
    """A store that counts the job records and index rows a query reads."""

    def __init__(self, store) -> None:
        self.store, self.rows = store, 0

    def get(self, table, key):
        self.rows += table == JOBS
        return self.store.get(table, key)

    def scan(self, table, **kw):
        rows = self.store.scan(table, **kw)
        self.rows += len(rows)
        return rows


def test_a_jobs_listing_reads_the_callers_tenant_only():
    log = Replica()
    for i in range(300):
        make_job(log, f"job_b{i:03d}", tenant="t2", name="bulk")
    make_job(log, "job_c1", name="billing")
    make_job(log, "job_c2", name="other")
    reader = CountingReader(log.store)
    jobs, last, more = queries.jobs_page(reader, "t1", {"name_prefix": "bill"}, 50, None)
    assert ([j["id"] for j in jobs], last, more) == (["job_c1"], "job_c2", False)
    assert reader.rows <= 2 * 2   # two index rows and two jobs, none of t2's 300


def test_topics_and_groups():
    log = Replica()
    topic = keys.scoped("t1", "events")
    assert queries.topic_bounds(log.store, topic) == (1, 1)
    for n in range(3):
        assert log.run(commands.publish(topic=topic, key=None, message={"n": n},
                                        execution_id=f"exe_{n}", job_id="job_a1",
                                        at_ms=1_000 + n))["ok"]
    assert queries.topic_bounds(log.store, topic) == (1, 4)
    assert [m["message"] for m in queries.topic_messages(log.store, topic, 2, 10)] == \
        [{"n": 1}, {"n": 2}]
    assert queries.topic_messages(log.store, topic, 1, 1)[0]["offset"] == 1
    assert queries.topic_messages(log.store, keys.scoped("t2", "events"), 1, 10) == []
    assert queries.group_offset(log.store, topic, "g1") is None
    assert log.run(commands.commit_offset(topic=topic, group="g1", offset=2, at_ms=2_000))["ok"]
    assert queries.group_offset(log.store, topic, "g1")["offset"] == 2


def test_cluster_tenancy_and_audit():
    log = Replica()
    for node in ("n2", "n1"):
        log.run(commands.register_node(node=node, http=f"http://127.0.0.1:1/{node}",
                                       raft="127.0.0.1:2", at_ms=1))
    assert [n["id"] for n in queries.registered_nodes(log.store)] == ["n1", "n2"]
    assert queries.registered_node(log.store, "n2")["http"] == "http://127.0.0.1:1/n2"
    assert queries.registered_node(log.store, "n9") is None
    log.run(commands.assign_shards(assignments=[(3, "n1"), (0, "n2")], at_ms=1))
    assert [(shard, state["owner"]) for shard, state in queries.shards(log.store)] == \
        [(0, "n2"), (3, "n1")]
    for n, tenant in enumerate(("t2", "t1")):
        assert log.run(commands.create_token(token_id=f"tok_{n:016x}", tenant=tenant,
                                             role="reader", name="", sha256="0" * 64,
                                             actor="admin", at_ms=10 + n))["ok"]
    assert [t["tenant"] for t in queries.tokens(log.store)] == ["t2", "t1"]
    assert queries.token(log.store, "tok_0000000000000001")["tenant"] == "t1"
    assert queries.token(log.store, "tok_ffffffffffffffff") is None
    assert log.run(commands.put_tenant(tenant="t1", quota=dict(QUOTA, jobs_max=5),
                                       actor="admin", at_ms=20))["ok"]
    assert queries.tenant(log.store, "t1")["quota"]["jobs_max"] == 5
    assert queries.tenant(log.store, "t9") is None
    assert [name for name, _ in queries.tenants(log.store)] == ["t1"]
    seqs = [r["seq"] for r in queries.audit_after(log.store, 0, 10)]
    assert len(seqs) == 3
    assert seqs == sorted(seqs)
    assert [r["seq"] for r in queries.audit_after(log.store, seqs[0], 1)] == [seqs[1]]


# --- what the loops read ----------------------------------------------------------------

def test_due_entries_of_a_shard_by_range_earliest_first():
    log = Replica()
    shard = 3
    job_ids = [f"job_d{i}" for i in range(4)]
    for i, job_id in enumerate(job_ids):
        log.run(commands.create_job(job_id=job_id, tenant="t1", spec=spec(), idempotency_key=None,
                                    shard=shard, next_ms=10_000 + 1000 * i, at_ms=1))
    assert queries.earliest_due(log.store, shard) == 10_000
    assert queries.earliest_due(log.store, shard + 1) is None
    upto = queries.due(log.store, shard, None, 11_000, 10)
    assert [(due_ms, kind, ident) for due_ms, kind, ident, _ in upto] == [
        (10_000, keys.KIND_OCCURRENCE, "job_d0"), (11_000, keys.KIND_OCCURRENCE, "job_d1")]
    assert upto[0][3]["tn"] == "t1"
    ahead = queries.due(log.store, shard, 11_000, 13_000, 10)   # after 11 s, up to 13 s
    assert [ident for _, _, ident, _ in ahead] == ["job_d2", "job_d3"]
    assert len(queries.due(log.store, shard, None, 13_000, 3)) == 3   # bounded
    assert queries.due_tenant(log.store, keys.KIND_OCCURRENCE, "job_d1") == "t1"
    assert queries.due_tenant(log.store, keys.KIND_OCCURRENCE, "job_gone") is None


def test_shards_owned_and_their_open_runs():
    log = Replica()
    make_job(log, "job_o1")
    shard = keys.shard_of("job_o1", SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1"), (shard + 1, "n2")], at_ms=1))
    assert queries.owned_shards(log.store, "n1") == {shard: 1}
    assert queries.shard_owners(log.store) == {shard: "n1", shard + 1: "n2"}
    assert queries.shard(log.store, shard)["owner"] == "n1"
    run_ids = [trigger(log, "job_o1", at_ms) for at_ms in (5_000, 6_000)]
    assert [run["id"] for run in queries.open_runs(log.store, shard, 10)] == sorted(run_ids)
    assert len(queries.open_runs(log.store, shard, 1)) == 1
    assert queries.open_runs(log.store, shard + 1, 10) == []
