"""Run and job listings: the run index follows runs in and out, pages never repeat or skip a run while runs are added, filters and tokens are checked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from raftsched import limits
from raftsched.api import history
from raftsched.core import commands, keys, queries
from raftsched.core.tx import JOBS, RUNS, RUNS_BY_TENANT
from raftsched.errors import InvalidInput
from raftsched.runtime.port import StoreQueries
from raftsched.testing.proptest import examples
from raftsched.testing.replica import Replica

SHARDS = 16
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST", "headers": {},
        "body": None, "timeout_s": 5.0}


def spec(name: str = "j", labels: dict | None = None) -> dict:
    return {"name": name, "schedule": {"kind": "every", "every_ms": 1000, "text": "1s"},
            "target": HTTP, "retry": {"max_attempts": 1}, "concurrency": {"policy": "allow"},
            "metadata": {}, "labels": labels or {}}


# Job ids have the API's shape ("job_" and 20 hex digits): a run's id is made
# from its job's (keys.run_id), and a page token holds only ids of the API's shape.
def make_job(log: Replica, job_id: str, tenant: str = "t1", **over) -> None:
    log.run(commands.create_job(job_id=job_id, tenant=tenant, spec=spec(**over),
                                idempotency_key=None, shard=keys.shard_of(job_id, SHARDS),
                                next_ms=None, at_ms=1))


def trigger(log: Replica, job_id: str, at_ms: int) -> str:
    result = log.run(commands.trigger_job(job_id=job_id, scheduled_ms=at_ms, node="n1",
                                          at_ms=at_ms))
    assert result["ok"], result
    return result["run"]["id"]


def page_through(node, tenant: str, filters: dict, limit: int, between=None) -> list[str]:
    """Every page's run ids, in order; `between()` runs after each page."""
    seen: list[str] = []
    token = None
    while True:
        runs, token = history.list_runs_page(node, tenant, filters, limit, token)
        seen += [run["id"] for run in runs]
        if between is not None:
            between()
        if token is None:
            return seen


def test_the_index_follows_runs_in_and_out():
    log = Replica()
    make_job(log, "job_000000000000000000a1")
    run_id = trigger(log, "job_000000000000000000a1", 5_000)
    key = keys.runs_by_tenant_key("t1", 5_000, run_id)
    assert log.store.get(RUNS_BY_TENANT, key) == 1
    log.run(commands.cancel_run(run_id=run_id, reason="done", at_ms=5_001))
    purge = log.run(commands.purge(at_ms=10 ** 12, history_max_runs=1, history_max_age_ms=1,
                                   finished_job_retention_ms=1, idempotency_ttl_ms=1,
                                   runs=[(run_id, "job_000000000000000000a1")], jobs=[], idem=[]))
    assert purge["runs"] == 1
    assert log.store.get(RUNS, run_id.encode()) is None
    assert log.store.get(RUNS_BY_TENANT, key) is None


def test_runs_come_newest_first_and_only_the_tenants_own():
    log = Replica()
    make_job(log, "job_000000000000000000a1")
    make_job(log, "job_000000000000000000b2", tenant="t2")
    mine = [trigger(log, "job_000000000000000000a1", ms) for ms in (3_000, 1_000, 2_000)]
    trigger(log, "job_000000000000000000b2", 2_500)
    node = StoreQueries(log.store)   # the node's queries, over this replica's store
    assert page_through(node, "t1", {}, 2) == [mine[0], mine[2], mine[1]]
    assert page_through(node, "t2", {"job_id": "job_000000000000000000a1"}, 10) == []


def test_filters_by_job_state_trigger_and_time():
    log = Replica()
    make_job(log, "job_000000000000000000a1")
    make_job(log, "job_000000000000000000b2")
    a = [trigger(log, "job_000000000000000000a1", ms) for ms in (1_000, 2_000, 3_000, 4_000)]
    b = trigger(log, "job_000000000000000000b2", 2_500)
    log.run(commands.cancel_run(run_id=a[1], reason="x", at_ms=9_000))
    node = StoreQueries(log.store)   # the node's queries, over this replica's store
    assert page_through(node, "t1", {"job_id": "job_000000000000000000a1"}, 3) == a[::-1]
    assert page_through(node, "t1", {"state": "cancelled"}, 3) == [a[1]]
    assert page_through(node, "t1", {"trigger": "manual"}, 10) == [a[3], a[2], b, a[1], a[0]]
    assert page_through(node, "t1", {"trigger": "schedule"}, 10) == []
    window = {"scheduled_after": 2_000, "scheduled_before": 4_000}
    assert page_through(node, "t1", window, 1) == [a[2], b, a[1]]
    assert page_through(node, "t1", dict(window, job_id="job_000000000000000000a1"), 1) == [a[2], a[1]]


def test_a_page_reads_a_bounded_number_of_rows(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "list_scan_rows_max", 3)
    log = Replica()
    make_job(log, "job_000000000000000000a1")
    runs = [trigger(log, "job_000000000000000000a1", ms) for ms in range(1_000, 8_000, 1_000)]
    log.run(commands.cancel_run(run_id=runs[0], reason="x", at_ms=9_000))
    node = StoreQueries(log.store)   # the node's queries, over this replica's store
    first, token = history.list_runs_page(node, "t1", {"state": "cancelled"}, 10, None)
    assert first == [] and token is not None   # three rows read, none matched: go on
    assert page_through(node, "t1", {"state": "cancelled"}, 10) == [runs[0]]


@settings(deadline=None, max_examples=examples(60))
@given(initial=st.lists(st.integers(0, 50), min_size=1, max_size=40, unique=True),
       added=st.lists(st.lists(st.integers(0, 100), max_size=4), max_size=12),
       limit=st.integers(1, 7), by_job=st.booleans())
def test_paging_is_stable_while_runs_are_added(initial, added, limit, by_job):
    """Runs added between pages, at any time (before, among or after those
    already shown), never make a page repeat a run or skip one that existed
    when the listing began."""
    log = Replica()
    make_job(log, "job_000000000000000000a1")
    before = {trigger(log, "job_000000000000000000a1", ms * 1000) for ms in initial}
    node = StoreQueries(log.store)   # the node's queries, over this replica's store
    batches = iter(added)
    made = set(before)

    def add_some() -> None:
        for ms in next(batches, []):
            made.add(trigger(log, "job_000000000000000000a1", ms * 1000 + 1))

    seen = page_through(node, "t1", {"job_id": "job_000000000000000000a1"} if by_job else {}, limit, add_some)
    assert len(seen) == len(set(seen))
    assert before <= set(seen) <= made
    scheduled = [log.store.get(RUNS, r.encode())["scheduled_ms"] for r in seen]
    # Each page starts below the last key shown: newest first across pages too.
    assert scheduled == sorted(scheduled, reverse=True)


# --- tokens and filters at the edge ---------------------------------------------------

def test_a_token_is_opaque_and_tied_to_its_filters():
    token = history.encode_token("runs", {"state": "failed"}, [5_000, "run_x"])
    assert history.decode_token(token, "runs", {"state": "failed"}) == [5_000, "run_x"]
    with pytest.raises(InvalidInput) as other:
        history.decode_token(token, "runs", {"state": "succeeded"})
    assert other.value.field == "page_token"
    assert "other filters" in other.value.detail
    for bad in ("not-a-token", token[:-3], "x" * (limits.page_token_chars_max + 1),
                history.encode_token("jobs", {"state": "failed"}, ["job_x"])):
        with pytest.raises(InvalidInput) as exc:
            history.decode_token(bad, "runs", {"state": "failed"})
        assert exc.value.field == "page_token"


def request(query: list[tuple[str, str]]) -> SimpleNamespace:
    from multidict import MultiDict
    return SimpleNamespace(query=MultiDict(query))


@pytest.mark.parametrize("query, field", [
    ([("state", "dead")], "state"),
    ([("trigger", "cron")], "trigger"),
    ([("job_id", "job_1")], "job_id"),
    ([("scheduled_after", "yesterday")], "scheduled_after"),
    ([("scheduled_after", "2026-01-02T00:00:00Z"), ("scheduled_before", "2026-01-01T00:00:00Z")],
     "scheduled_before"),
])
def test_bad_run_filters_are_named(query, field):
    with pytest.raises(InvalidInput) as exc:
        history.run_filters(request(query))
    assert exc.value.field == field


def test_run_filters_are_read():
    filters = history.run_filters(request([("state", "failed"), ("trigger", "retry"),
                                           ("scheduled_after", "1970-01-01T00:00:01Z")]))
    assert filters == {"state": "failed", "trigger": "retry", "scheduled_after": 1000}


@pytest.mark.parametrize("query, field", [
    ([("status", "deleted")], "status"),
    ([("name_prefix", "x" * (limits.job_name_chars_max + 1))], "name_prefix"),
    ([("label", "team")], "label"),
    ([("label", ":x")], "label"),
    ([("label", f"k{i}:v") for i in range(limits.label_filters_max + 1)], "label"),
])
def test_bad_job_filters_are_named(query, field):
    with pytest.raises(InvalidInput) as exc:
        history.job_filters(request(query))
    assert exc.value.field == field


def test_jobs_match_by_status_name_and_every_label():
    log = Replica()
    make_job(log, "job_000000000000000000a1", name="billing-daily", labels={"team": "pay", "tier": "1"})
    job = log.store.get(JOBS, b"job_000000000000000000a1")
    filters = history.job_filters(request([("label", "team:pay"), ("label", "tier:1"),
                                           ("name_prefix", "billing"), ("status", "active")]))
    assert queries.job_matches(job, "t1", filters)
    assert not queries.job_matches(job, "t2", filters)
    for other in ([("label", "team:ops")], [("label", "owner:pay")],
                  [("name_prefix", "daily")], [("status", "paused")]):
        assert not queries.job_matches(job, "t1", history.job_filters(request(other)))


def test_overlap_bodies():
    assert history.parse_overlap(None) is None
    assert history.parse_overlap({}) is None
    assert history.parse_overlap({"overlap": "allow"}) == "allow"
    for bad, field in (({"overlap": "skip"}, "overlap"), ({"colour": 1}, "colour"),
                       ([], "body")):
        with pytest.raises(InvalidInput) as exc:
            history.parse_overlap(bad)
        assert exc.value.field == field
