"""DAG jobs on a live cluster: the seed's workflow with fx failing once, a cleanup (all_done) and an alert task (one_failed) on success and on failure, the DAG run's alert, cancel, a cycle refused, and a node SIGKILLed mid-workflow."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from raftsched.testing.http import expect, wait_until
from raftsched.testing.sink import Call, Sink

pytestmark = pytest.mark.integration

TASK_IDS = ("ingest", "fx", "reconcile", "settle", "report", "cleanup", "alert")


def soon(seconds: float) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def seed_workflow(url: str, fx_attempts: int) -> dict:
    """ingest and fx -> reconcile -> settle -> report, then cleanup whatever
    happened and alert only if something failed. Each task calls url/<id>."""
    def task(tid: str, *deps: str, **extra) -> dict:
        return {"id": tid, "target": {"type": "http", "url": f"{url}/{tid}"},
                "depends_on": list(deps), **extra}
    return {"name": "settlement", "alert": {"webhook_url": f"{url}/alert-webhook"},
            "retry": {"max_attempts": 1},
            "dag": {"tasks": [
                task("ingest"),
                task("fx", retry={"max_attempts": fx_attempts, "base_s": 0.1, "max_s": 0.2}),
                task("reconcile", "ingest", "fx"), task("settle", "reconcile"),
                task("report", "settle"), task("cleanup", "report", trigger_rule="all_done"),
                task("alert", "ingest", "fx", "reconcile", "settle", "report",
                     trigger_rule="one_failed")]}}


def by_task(sink: Sink) -> dict[str, list[Call]]:
    out: dict[str, list[Call]] = {}
    for call in sink.snapshot():
        out.setdefault(call.path.rsplit("/", 1)[-1], []).append(call)
    return out


def run_of(cluster, run_id: str, nid: str = "n2") -> dict:
    """The run, read consistently. A 503 (an election after a kill) raises
    ServiceUnavailable, which the wait_until of a caller asks again."""
    return expect(cluster.api(nid, "GET", f"/v1/runs/{run_id}?consistent=true"), 200).body


def ended(cluster, run_id: str, timeout_s: float, nid: str = "n2") -> dict:
    return wait_until(lambda: (lambda r: r if r["state"] in ("succeeded", "failed", "cancelled")
                               else None)(run_of(cluster, run_id, nid)),
                      timeout_s, f"DAG run {run_id} to end")


def trigger(cluster, body: dict) -> tuple[str, dict]:
    created = cluster.api("n1", "POST", "/v1/jobs", body)
    assert created.status == 201, created
    job = created.body
    assert (job["target"], job["schedule"], job["next_run_at"]) == (None, None, None)
    assert [t["id"] for t in job["dag"]["tasks"]] == [t["id"] for t in body["dag"]["tasks"]]
    run = cluster.api("n3", "POST", f"/v1/jobs/{job['job_id']}:trigger")
    assert run.status == 201, run
    return job["job_id"], run.body


def test_the_seed_workflow_runs_in_order_with_fx_failing_once(shared_cluster):
    fx_calls = []

    def status(call: Call) -> int:
        if call.path.endswith("/fx"):
            fx_calls.append(call)
            return 503 if len(fx_calls) == 1 else 200
        return 200

    with Sink(status_for=status) as sink:
        job_id, run = trigger(shared_cluster, seed_workflow(sink.url, fx_attempts=3))
        # The roots are released at once: held by the shard's owner (running),
        # or queued for its first owner while the young cluster has placed no shard.
        roots = [t["state"] for t in run["tasks"]][:3]
        assert roots in (["running", "running", "pending"], ["queued", "queued", "pending"])
        run = ended(shared_cluster, run["run_id"], 30)
        calls = by_task(sink)
    assert run["state"] == "succeeded", run
    states = {t["id"]: (t["state"], t["attempt"]) for t in run["tasks"]}
    assert states == {"ingest": ("succeeded", 1), "fx": ("succeeded", 2),
                      "reconcile": ("succeeded", 1), "settle": ("succeeded", 1),
                      "report": ("succeeded", 1), "cleanup": ("succeeded", 1),
                      "alert": ("skipped", 0)}
    assert {tid: len(c) for tid, c in calls.items()} == {
        "ingest": 1, "fx": 2, "reconcile": 1, "settle": 1, "report": 1, "cleanup": 1}
    # fx's attempts share its execution id; every task has its own.
    assert len({c.headers["Idempotency-Key"] for c in calls["fx"]}) == 1
    keys = {tid: c[0].headers["Idempotency-Key"] for tid, c in calls.items()}
    assert len(set(keys.values())) == 6
    # Each task was called after every task it depends on had answered.
    first = {tid: c[0].received_s for tid, c in calls.items()}
    assert first["reconcile"] > max(first["ingest"], calls["fx"][1].received_s)
    assert first["reconcile"] < first["settle"] < first["report"] < first["cleanup"]
    fx = next(t for t in run["tasks"] if t["id"] == "fx")
    task_run = run_of(shared_cluster, fx["run_id"])
    assert (task_run["dag_run_id"], task_run["task_id"], task_run["job_id"]) == \
        (run["run_id"], "fx", job_id)
    assert task_run["execution_id"] == keys["fx"]
    assert [a["http_status"] for a in task_run["attempts"]] == [503, 200]
    assert run["alert"] is None


def test_a_failing_task_runs_cleanup_and_the_alert_task_and_alerts_once(shared_cluster):
    def status(call: Call) -> int:
        return 500 if call.path.endswith("/fx") else 200

    with Sink(status_for=status) as sink:
        _, run = trigger(shared_cluster, seed_workflow(sink.url, fx_attempts=2))
        run = ended(shared_cluster, run["run_id"], 30)
        wait_until(lambda: "alert-webhook" in by_task(sink), 20, "the DAG run's failure alert")
        calls = by_task(sink)
    assert run["state"] == "failed", run
    assert {t["id"]: t["state"] for t in run["tasks"]} == {
        "ingest": "succeeded", "fx": "failed", "reconcile": "upstream_failed",
        "settle": "upstream_failed", "report": "upstream_failed", "cleanup": "succeeded",
        "alert": "succeeded"}
    assert {tid: len(c) for tid, c in calls.items()} == {
        "ingest": 1, "fx": 2, "cleanup": 1, "alert": 1, "alert-webhook": 1}
    assert "task fx failed: HTTP 500" in run["error"]
    assert calls["alert-webhook"][0].headers["Idempotency-Key"] == "alert_" + run["run_id"]


def test_a_failed_dag_run_redriven_runs_fx_again_and_what_it_held_back(shared_cluster):
    fx_fails = [True]

    def status(call: Call) -> int:
        return 500 if call.path.endswith("/fx") and fx_fails[0] else 200

    with Sink(status_for=status) as sink:
        _, run = trigger(shared_cluster, seed_workflow(sink.url, fx_attempts=1))
        assert ended(shared_cluster, run["run_id"], 30)["state"] == "failed"
        wait_until(lambda: "alert-webhook" in by_task(sink), 20, "the DAG run's failure alert")
        fx = next(t for t in run["tasks"] if t["id"] == "fx")
        alone = shared_cluster.api("n1", "POST", f"/v1/runs/{fx['run_id']}:retry")
        assert alone.status == 409, alone
        fx_fails[0] = False
        again = shared_cluster.api("n1", "POST", f"/v1/runs/{run['run_id']}:retry")
        assert again.status == 200, again
        run = ended(shared_cluster, run["run_id"], 30)
        calls = by_task(sink)
    assert (run["state"], run["trigger"], run["attempt"]) == ("succeeded", "retry", 2), run
    assert {t["id"]: (t["state"], t["attempt"]) for t in run["tasks"]} == {
        "ingest": ("succeeded", 1), "fx": ("succeeded", 2), "reconcile": ("succeeded", 1),
        "settle": ("succeeded", 1), "report": ("succeeded", 1), "cleanup": ("succeeded", 1),
        "alert": ("succeeded", 1)}
    # What succeeded before ran once; fx's two attempts share its execution id.
    assert {tid: len(c) for tid, c in calls.items()} == {
        "ingest": 1, "fx": 2, "reconcile": 1, "settle": 1, "report": 1, "cleanup": 1,
        "alert": 1, "alert-webhook": 1}
    assert len({c.headers["Idempotency-Key"] for c in calls["fx"]}) == 1


def test_cancelling_a_dag_run_cancels_the_tasks_not_finished(shared_cluster):
    def delay(call: Call) -> float:
        return 20.0 if call.path.endswith("/fx") else 0.0

    with Sink(delay_for=delay) as sink:
        _, run = trigger(shared_cluster, seed_workflow(sink.url, fx_attempts=1))
        wait_until(lambda: "fx" in by_task(sink) and "ingest" in by_task(sink), 20,
                   "fx to be called")
        wait_until(lambda: {t["id"]: t["state"] for t in run_of(
            shared_cluster, run["run_id"])["tasks"]}["ingest"] == "succeeded", 20,
            "ingest to succeed")
        answer = shared_cluster.api("n2", "POST", f"/v1/runs/{run['run_id']}:cancel",
                                    {"reason": "not today"})
        assert answer.status == 200, answer
        run = run_of(shared_cluster, run["run_id"])
        fx = run_of(shared_cluster, next(t["run_id"] for t in run["tasks"] if t["id"] == "fx"))
    assert (run["state"], run["reason"]) == ("cancelled", "not today")
    assert {t["id"]: t["state"] for t in run["tasks"]} == {
        "ingest": "succeeded", "fx": "cancelled", "reconcile": "cancelled",
        "settle": "cancelled", "report": "cancelled", "cleanup": "cancelled",
        "alert": "cancelled"}
    assert fx["state"] == "cancelled"
    refused = shared_cluster.api("n1", "POST", f"/v1/runs/{fx['run_id']}:cancel")
    assert refused.status == 409


def test_a_cycle_is_refused_naming_its_tasks(shared_cluster):
    target = {"type": "http", "url": "http://127.0.0.1:9/x"}
    answer = shared_cluster.api("n1", "POST", "/v1/jobs", {"dag": {"tasks": [
        {"id": "extract", "target": target},
        {"id": "load", "target": target, "depends_on": ["extract", "verify"]},
        {"id": "verify", "target": target, "depends_on": ["load"]}]}})
    assert answer.status == 400, answer
    assert answer.body["field"] == "dag.tasks[1].depends_on"
    assert "load, verify" in answer.body["detail"]
    assert "load -> verify -> load" in answer.body["detail"]
    unknown = shared_cluster.api("n2", "POST", "/v1/jobs", {"dag": {"tasks": [
        {"id": "load", "target": target, "depends_on": ["extract"]}]}})
    assert (unknown.status, unknown.body["field"]) == (400, "dag.tasks[0].depends_on")
    listed = shared_cluster.api("n1", "GET", "/v1/jobs?limit=500").body["jobs"]
    assert not any(job.get("dag") and job["name"].startswith("dag extract") for job in listed)


def test_a_node_killed_mid_workflow_the_workflow_finishes_each_task_succeeding_once(
        fresh_cluster):
    cluster = fresh_cluster

    def delay(call: Call) -> float:
        # b's first attempt hangs: its node is killed while it calls.
        if call.path.endswith("/b") and call.headers["X-Raftsched-Attempt"] == "1":
            return 30.0
        return 0.0

    with Sink(delay_for=delay) as sink:
        target = {"type": "http", "timeout_s": 60}
        body = {"run_at": soon(1.0), "retry": {"max_attempts": 3, "base_s": 0.2, "max_s": 1},
                "dag": {"tasks": [
                    {"id": tid, "target": dict(target, url=f"{sink.url}/{tid}"),
                     "depends_on": deps}
                    for tid, deps in (("a", []), ("b", ["a"]), ("c", ["b"]))]}}
        created = cluster.api("n1", "POST", "/v1/jobs", body)
        assert created.status == 201, created
        job_id = created.body["job_id"]
        wait_until(lambda: "b" in by_task(sink), 20, "task b to be called")
        run = cluster.api("n2", "GET", f"/v1/jobs/{job_id}/runs?consistent=true").body["runs"][0]
        b_run = next(t["run_id"] for t in run["tasks"] if t["id"] == "b")
        victim = wait_until(lambda: run_of(cluster, b_run)["holder"], 10, "b's holder")
        killed_at = time.monotonic()
        cluster.kill(victim)
        survivor = next(n for n in cluster.ids if n != victim)
        run = ended(cluster, run["run_id"], 40, survivor)
        took_s = time.monotonic() - killed_at
        calls = by_task(sink)
        b = wait_until(lambda: run_of(cluster, b_run, survivor), 10, "b's run record")
    assert run["state"] == "succeeded", run
    assert [(t["id"], t["state"]) for t in run["tasks"]] == [
        ("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded")]
    # a succeeded before the kill and is not run again; b's first attempt died
    # with its node and the second, elsewhere, succeeded under the same key.
    assert {tid: len(c) for tid, c in calls.items()} == {"a": 1, "b": 2, "c": 1}
    assert [c.headers["X-Raftsched-Attempt"] for c in calls["b"]] == ["1", "2"]
    assert len({c.headers["Idempotency-Key"] for c in calls["b"]}) == 1
    assert [a["holder"] == victim for a in b["attempts"]] == [True, False]
    # The shard's new owner took the held task run over (its next attempt).
    assert f"{victim} no longer holds shard" in b["attempts"][0]["error"]
    assert b["attempts"][1]["holder"] in b["attempts"][0]["error"]
    print(f"workflow finished {took_s:.1f} s after its node was killed")
    cluster.start(victim)
    cluster.ensure_same()
