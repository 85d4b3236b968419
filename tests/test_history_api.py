"""Over a real cluster: run listing pages stably and filters, retry keeps the execution id, trigger overrides overlap, job filters, H, jitter, not_after."""

from __future__ import annotations

import datetime as dt
import secrets
import time
import urllib.parse

import pytest

from raftsched.core.schedule import fire_delay_ms, resolve_hashed
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration


def job_body(url: str, **over) -> dict:
    body = {"name": "history", "schedule": {"cron": "0 3 * * *"},
            "target": {"type": "http", "url": url}, "retry": {"max_attempts": 1}}
    body.update(over)
    return body


def create(cluster, nid: str = "n1", **body) -> str:
    created = cluster.api(nid, "POST", "/v1/jobs", body)
    assert created.status == 201, created
    return created.body["job_id"]


def trigger(cluster, job_id: str, nid: str = "n1", body: dict | None = None):
    answer = cluster.api(nid, "POST", f"/v1/jobs/{job_id}:trigger", body)
    assert answer.status == 201, answer
    return answer.body


def run_of(cluster, run_id: str, nid: str = "n1") -> dict:
    return cluster.api(nid, "GET", f"/v1/runs/{run_id}?consistent=true").body


def wait_state(cluster, run_id: str, state: str, timeout_s: float = 15) -> dict:
    return wait_until(lambda: (r := run_of(cluster, run_id))["state"] == state and r,
                      timeout_s, f"run {run_id} to be {state}")


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def list_runs(cluster, nid: str, **query) -> tuple[list[str], list[dict]]:
    """Every page of GET /v1/runs with `query`: (run ids, the pages' bodies)."""
    seen, pages, token = [], [], None
    for _ in range(1000):
        params = dict(query, consistent="true", **({"page_token": token} if token else {}))
        page = cluster.api(nid, "GET", "/v1/runs?" + urllib.parse.urlencode(params))
        assert page.status == 200, page
        pages.append(page.body)
        seen += [run["run_id"] for run in page.body["runs"]]
        token = page.body["next_page_token"]
        if token is None:
            return seen, pages
    raise AssertionError("no last page")


def test_paging_is_stable_while_runs_are_added(shared_cluster, sink):
    c = shared_cluster
    job_id = create(c, **job_body(sink.url, schedule={"every": "1s"}))
    wait_until(lambda: len(c.api("n1", "GET", f"/v1/jobs/{job_id}/runs?consistent=true")
                           .body["runs"]) >= 6, 20, "six runs of the every-second job")
    existing = {r["run_id"] for r in c.api(
        "n2", "GET", f"/v1/jobs/{job_id}/runs?limit=500&consistent=true").body["runs"]}
    # Page two per page while the job keeps firing and manual runs are added.
    seen, token, scheduled = [], None, []
    for _ in range(200):
        query = f"job_id={job_id}&limit=2&consistent=true" + (f"&page_token={token}"
                                                               if token else "")
        page = c.api("n2", "GET", f"/v1/runs?{query}").body
        seen += [r["run_id"] for r in page["runs"]]
        # As instants: the text leaves out a whole second's milliseconds, so
        # "…18Z" sorts after "…18.154Z" as text though it is earlier.
        scheduled += [instant(r["scheduled_for"]) for r in page["runs"]]
        trigger(c, job_id, "n3")
        token = page["next_page_token"]
        if token is None:
            break
    assert len(seen) == len(set(seen)), "a run was shown twice"
    assert existing <= set(seen), "a run that existed when paging began was skipped"
    assert scheduled == sorted(scheduled, reverse=True)
    # The tenant-wide listing pages the same way (other tests' runs among them).
    everything, _ = list_runs(c, "n1", limit=50)
    assert len(everything) == len(set(everything))
    assert existing <= set(everything)
    assert c.api("n1", "DELETE", f"/v1/jobs/{job_id}").status == 204


def test_filters_find_dead_letters_by_job_trigger_and_time(shared_cluster, sink):
    c = shared_cluster
    failing = create(c, **job_body(sink.url + "/fail"))
    working = create(c, **job_body(sink.url))
    sink.status_for = lambda call: 500 if call.path.endswith("/fail") else 200
    bad = [trigger(c, failing)["run_id"] for _ in range(3)]
    good = trigger(c, working)["run_id"]
    for run_id in bad:
        wait_state(c, run_id, "failed")
    wait_state(c, good, "succeeded")
    dead, _ = list_runs(c, "n2", job_id=failing, state="failed")
    assert dead == bad[::-1]
    assert list_runs(c, "n3", job_id=working, state="failed")[0] == []
    assert list_runs(c, "n3", job_id=working, trigger="manual")[0] == [good]
    assert list_runs(c, "n3", job_id=working, trigger="schedule")[0] == []
    # A manual run is dated by the cluster's time (the median node's clock as
    # this node estimates it), which may trail this process's clock by a few
    # ms: the bound is taken from the first run itself. "After" is inclusive.
    first = run_of(c, bad[0])["scheduled_for"]
    recent, pages = list_runs(c, "n1", state="failed", scheduled_after=first, limit=1)
    assert set(bad) <= set(recent)
    assert all(len(p["runs"]) <= 1 for p in pages)
    assert all(instant(run_of(c, r)["scheduled_for"]) >= instant(first) for r in recent)
    before_first, _ = list_runs(c, "n1", job_id=failing, scheduled_before=first)
    assert before_first == []
    refused = c.api("n1", "GET", "/v1/runs?state=dead")
    assert (refused.status, refused.body["field"]) == (400, "state")
    other_filters = c.api("n1", "GET", f"/v1/runs?state=succeeded&page_token="
                                       f"{pages[0]['next_page_token']}")
    assert (other_filters.status, other_filters.body["field"]) == (400, "page_token")


def test_a_retried_failed_run_keeps_its_execution_id(shared_cluster, sink):
    c = shared_cluster
    job_id = create(c, **job_body(sink.url + "/flaky"))
    sink.status_for = lambda call: 500 if len(
        [x for x in sink.snapshot() if x.path.endswith("/flaky")]) <= 1 else 200
    run = trigger(c, job_id)
    failed = wait_state(c, run["run_id"], "failed")
    assert run["run_id"] in list_runs(c, "n2", state="failed", job_id=job_id)[0]
    retried = c.api("n2", "POST", f"/v1/runs/{run['run_id']}:retry")
    assert retried.status == 200, retried
    assert retried.body["run_id"] == run["run_id"]
    assert retried.body["execution_id"] == failed["execution_id"]
    assert (retried.body["attempt"], retried.body["trigger"], retried.body["first_trigger"],
            retried.body["redrives"]) == (2, "retry", "manual", 1)
    done = wait_state(c, run["run_id"], "succeeded")
    assert [a["attempt"] for a in done["attempts"]] == [1, 2]
    calls = [x for x in sink.snapshot() if x.path.endswith("/flaky")]
    assert [x.headers["X-Raftsched-Attempt"] for x in calls] == ["1", "2"]
    assert {x.headers["Idempotency-Key"] for x in calls} == {failed["execution_id"]}
    assert list_runs(c, "n1", job_id=job_id, trigger="retry")[0] == [run["run_id"]]
    again = c.api("n3", "POST", f"/v1/runs/{run['run_id']}:retry")
    assert (again.status, again.body["field"]) == (409, "run_id")
    missing = c.api("n3", "POST", "/v1/runs/run_" + "0" * 24 + ":retry")
    assert missing.status == 404


def test_a_trigger_can_override_the_concurrency_policy_once(shared_cluster, sink):
    c = shared_cluster
    job_id = create(c, **job_body(sink.url + "/slow", concurrency="skip_if_running"))
    release = time.monotonic() + 30
    sink.delay_for = lambda call: max(0.0, release - time.monotonic()) \
        if call.path.endswith("/slow") else 0.0
    try:
        first = trigger(c, job_id)
        wait_until(lambda: job_id in sink.by_job(), 10, "the first run to call the target")
        skipped = trigger(c, job_id, "n2")
        assert skipped["state"] == "skipped"
        assert first["run_id"] in skipped["reason"]
        forced = trigger(c, job_id, "n3", {"overlap": "allow"})
        assert forced["state"] in ("queued", "running")
        wait_until(lambda: sink.inflight_max.get(job_id) == 2, 10, "both runs at the target")
        bad = c.api("n1", "POST", f"/v1/jobs/{job_id}:trigger", {"overlap": "replace"})
        assert (bad.status, bad.body["field"]) == (400, "overlap")
    finally:
        release = 0
        sink.delay_for = None


def test_jobs_filter_by_status_name_and_labels(shared_cluster, sink):
    c = shared_cluster
    prefix = "lbl-" + secrets.token_hex(4)
    ids = {name: create(c, **job_body(sink.url, name=f"{prefix}-{name}", labels=labels))
           for name, labels in (("a", {"team": "pay", "tier": "1"}), ("b", {"team": "pay"}),
                                ("c", {"team": "ops"}))}
    paused = c.api("n2", "POST", f"/v1/jobs/{ids['b']}:pause", {"note": "waiting for a fix"})
    assert paused.status == 200, paused
    assert (paused.body["pause_note"], paused.body["labels"]) == ("waiting for a fix",
                                                                 {"team": "pay"})
    assert paused.body["paused_at"] is not None

    def names(query: str) -> list[str]:
        out, token = [], None
        for _ in range(100):
            page = c.api("n3", "GET", f"/v1/jobs?{query}&limit=1&consistent=true"
                                      + (f"&page_token={token}" if token else "")).body
            out += [j["name"].removeprefix(prefix + "-") for j in page["jobs"]]
            token = page["next_page_token"]
            if token is None:
                return sorted(out)
        raise AssertionError("no last page")

    assert names(f"name_prefix={prefix}") == ["a", "b", "c"]
    assert names(f"name_prefix={prefix}&label=team:pay") == ["a", "b"]
    assert names(f"name_prefix={prefix}&label=team:pay&label=tier:1") == ["a"]
    assert names(f"name_prefix={prefix}&status=paused") == ["b"]
    assert names(f"name_prefix={prefix}&label=team:nobody") == []
    shown = c.api("n1", "GET", f"/v1/jobs/{ids['b']}?consistent=true").body
    assert shown["pause_note"] == "waiting for a fix"
    resumed = c.api("n1", "POST", f"/v1/jobs/{ids['b']}:resume").body
    assert resumed["pause_note"] is None
    relabelled = c.api("n1", "PATCH", f"/v1/jobs/{ids['c']}", {"labels": {"team": "pay"}})
    assert relabelled.body["labels"] == {"team": "pay"}
    assert names(f"name_prefix={prefix}&label=team:pay") == ["a", "b", "c"]
    bad = c.api("n1", "POST", "/v1/jobs", job_body(sink.url, labels={"a:b": "x"}))
    assert (bad.status, bad.body["field"]) == (400, "labels.a:b")


def test_hashed_schedules_resolve_from_the_job_id(shared_cluster, sink):
    c = shared_cluster
    job = c.api("n1", "POST", "/v1/jobs", job_body(
        sink.url, schedule={"cron": "H H(2-4) * * *", "timezone": "Australia/Lord_Howe"}))
    assert job.status == 201, job
    job_id = job.body["job_id"]
    resolved = resolve_hashed("H H(2-4) * * *", job_id)
    assert job.body["schedule"] == {"cron": "H H(2-4) * * *", "timezone": "Australia/Lord_Howe",
                                    "resolved": resolved}
    minute, hour = (int(f) for f in resolved.split(" ")[:2])
    preview = c.api("n2", "GET", f"/v1/jobs/{job_id}/preview?count=5&consistent=true").body
    assert preview["resolved"] == resolved
    for text in preview["fire_times"]:
        local = dt.datetime.fromisoformat(text)
        assert local.minute == minute
        assert local.hour in (hour, 2, 3)   # 02:xx in the spring gap fires at 02:30
    same = c.api("n3", "POST", "/v1/schedules:preview", {
        "schedule": {"cron": "H H(2-4) * * *", "timezone": "Australia/Lord_Howe"},
        "job_id": job_id, "count": 5})
    assert same.body["resolved"] == resolved
    plain = c.api("n3", "POST", "/v1/schedules:preview", {"schedule": {"every": "1h"}})
    assert plain.status == 200 and "resolved" not in plain.body, plain
    bad = c.api("n3", "POST", "/v1/schedules:preview", {"schedule": {"cron": "H(5-1) * * * *"}})
    assert (bad.status, bad.body["field"]) == (400, "schedule.cron")


def test_jitter_delays_each_occurrence_by_its_stable_amount(shared_cluster, sink):
    c = shared_cluster
    job_id = create(c, **job_body(sink.url + "/jitter", schedule={"every": "2s"},
                                  jitter_s=1.5))
    calls = wait_until(lambda: (x := sink.by_job().get(job_id, [])) and len(x) >= 3 and x,
                       20, "three jittered runs")
    assert c.api("n1", "DELETE", f"/v1/jobs/{job_id}").status == 204
    for call in calls[:3]:
        scheduled_ms = round(call.scheduled_s * 1000)
        delay_ms = fire_delay_ms(job_id, scheduled_ms, 1500)
        # Never before its delay; after it by no more than the usual lateness.
        assert call.lateness_s >= delay_ms / 1000 - 0.05, (call.lateness_s, delay_ms)
        assert call.lateness_s <= delay_ms / 1000 + 2.0, (call.lateness_s, delay_ms)
    runs, _ = list_runs(c, "n2", job_id=job_id)
    views = [run_of(c, run_id) for run_id in runs]
    assert any(v["jitter_ms"] > 0 for v in views)
    for view in views:
        scheduled = instant(view["scheduled_for"])
        assert view["jitter_ms"] == fire_delay_ms(job_id, round(scheduled.timestamp() * 1000),
                                                  1500)


def test_a_schedule_ends_at_not_after(shared_cluster, sink):
    c = shared_cluster
    end = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=3)
    job_id = create(c, **job_body(sink.url, schedule={"every": "1s"},
                                  not_after=end.isoformat()))
    done = wait_until(lambda: (j := c.api("n1", "GET", f"/v1/jobs/{job_id}?consistent=true")
                               .body)["status"] == "completed" and j, 15, "the job to complete")
    assert done["next_run_at"] is None
    assert done["not_after"] is not None
    runs, _ = list_runs(c, "n1", job_id=job_id)
    last = max(run_of(c, r)["scheduled_for"] for r in runs)
    assert instant(last) <= end
    past = c.api("n1", "POST", "/v1/jobs", job_body(
        sink.url, schedule={"every": "1s"}, not_after="2020-01-01T00:00:00Z"))
    assert (past.status, past.body["field"]) == (400, "not_after")
