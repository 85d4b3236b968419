"""At-least-once execution on a real cluster: durable retries with one
execution id, non-retryable failures, one alert after the last attempt, the
concurrency policies against a slow target, cancel, command output and its
bound, publish targets and topics."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest

from raftsched import limits
from raftsched.core import retry
from raftsched.testing.http import wait_until
from raftsched.testing.sink import Sink

pytestmark = pytest.mark.integration


def soon(seconds: float = 1.0) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def create(cluster, body: dict, nid: str = "n1") -> str:
    response = cluster.api(nid, "POST", "/v1/jobs", body)
    assert response.status == 201, response
    return response.body["job_id"]


def runs_of(cluster, job_id: str, nid: str = "n2") -> list[dict]:
    return cluster.api(nid, "GET", f"/v1/jobs/{job_id}/runs?consistent=true&limit=500").body["runs"]


def only_run(cluster, job_id: str, states: set[str], timeout_s: float, nid: str = "n2") -> dict:
    def check() -> dict | None:
        runs = runs_of(cluster, job_id, nid)
        return runs[0] if len(runs) == 1 and runs[0]["state"] in states else None
    return wait_until(check, timeout_s, f"the run of {job_id} to be {'/'.join(states)}")


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"   # a zombie is dead
    except FileNotFoundError:
        return True


# --- retries and failure ---------------------------------------------------------------

def test_500_three_times_then_200_is_four_attempts_with_one_execution_id(shared_cluster):
    counts: dict[str, int] = {}

    def status(call) -> int:
        counts[call.job_id] = counts.get(call.job_id, 0) + 1
        return 500 if counts[call.job_id] <= 3 else 200

    policy = {"max_attempts": 5, "backoff": "exponential", "base_s": 0.2, "max_s": 1.0}
    with Sink(status_for=status) as sink:
        job_id = create(shared_cluster, {"name": "flaky", "run_at": soon(),
                                         "target": {"type": "http", "url": sink.url},
                                         "retry": policy})
        run = only_run(shared_cluster, job_id, {"succeeded"}, 30)
        calls = sink.by_job()[job_id]
    # (The run's attempts, with each one's error, say why when these fail.)
    assert len(calls) == 4, run["attempts"]
    assert {c.headers["Idempotency-Key"] for c in calls} == {run["execution_id"]}
    assert [c.headers["X-Raftsched-Attempt"] for c in calls] == ["1", "2", "3", "4"], \
        run["attempts"]
    assert [a["http_status"] for a in run["attempts"]] == [500, 500, 500, 200]
    full = retry.policy_of(policy)
    bounds = [retry.delay_bound_ms(full, k) for k in (1, 2, 3)]
    assert bounds == [400, 800, 1000]          # growing, capped by max_s
    for k, attempt in enumerate(run["attempts"][:3]):
        delay_ms = attempt["retry_delay_ms"]
        assert 0 <= delay_ms <= bounds[k]
        # The next call came no earlier than the drawn delay after this one failed.
        gap_ms = (calls[k + 1].received_s - calls[k].received_s) * 1000
        assert gap_ms >= delay_ms - 50, (k, gap_ms, delay_ms)


def test_a_400_fails_after_one_attempt(shared_cluster):
    with Sink(status_for=lambda call: 400) as sink:
        job_id = create(shared_cluster, {"name": "bad-request", "run_at": soon(),
                                         "target": {"type": "http", "url": sink.url},
                                         "retry": {"max_attempts": 5, "base_s": 0.1}})
        run = only_run(shared_cluster, job_id, {"failed"}, 20)
        assert len(sink.by_job()[job_id]) == 1
    assert len(run["attempts"]) == 1
    assert run["http_status"] == 400
    assert run["next_attempt_at"] is None


def test_503_forever_with_three_attempts_fails_and_alerts_once(shared_cluster):
    with Sink(status_for=lambda call: 503) as sink, Sink() as alerts:
        job_id = create(shared_cluster, {
            "name": "down", "run_at": soon(), "target": {"type": "http", "url": sink.url},
            "retry": {"max_attempts": 3, "base_s": 0.1, "max_s": 0.5},
            "alert": {"webhook_url": alerts.url}})
        run = only_run(shared_cluster, job_id, {"failed"}, 30)
        run = wait_until(lambda: (r := runs_of(shared_cluster, job_id)[0])["alert"] == "sent"
                         and r, 20, "the alert to be recorded as sent")
        assert len(sink.by_job()[job_id]) == 3
        # Sent once: after the outcome is committed, no other node delivers it again.
        time.sleep(2 * limits.reaper_period_ms / 1000)
        received = alerts.snapshot()
    assert len(received) == 1
    payload = json.loads(received[0].body)
    assert payload["run_id"] == run["run_id"]
    assert payload["job_id"] == job_id
    assert payload["attempts"] == 3
    assert "503" in payload["last_error"]
    assert received[0].headers["Idempotency-Key"] == "alert_" + run["run_id"]


# --- concurrency policies --------------------------------------------------------------

def every_second(cluster, sink: Sink, policy: dict | str, timeout_s: float = 10.0) -> str:
    return create(cluster, {"name": f"slow-{policy}", "schedule": {"every": "1s"},
                            "target": {"type": "http", "url": sink.url, "timeout_s": timeout_s},
                            "concurrency": policy, "retry": {"max_attempts": 1}})


def stop(cluster, job_id: str) -> None:
    assert cluster.api("n1", "POST", f"/v1/jobs/{job_id}:pause").status == 200


def test_skip_if_running_records_skipped_and_never_overlaps(shared_cluster):
    with Sink(delay_s=2.5) as sink:
        job_id = every_second(shared_cluster, sink, "skip_if_running")
        wait_until(lambda: sum(r["state"] == "skipped" for r in runs_of(shared_cluster, job_id))
                   >= 2, 20, "two skipped occurrences")
        stop(shared_cluster, job_id)
        assert sink.inflight_max[job_id] == 1
    skipped = [r for r in runs_of(shared_cluster, job_id) if r["state"] == "skipped"]
    assert all("skip_if_running" in r["reason"] for r in skipped)


def test_queue_runs_one_after_another(shared_cluster):
    with Sink(delay_s=1.5) as sink:
        job_id = every_second(shared_cluster, sink, {"policy": "queue", "queue_max": 1})

        def settled() -> bool:
            runs = runs_of(shared_cluster, job_id)
            return sum(r["state"] == "succeeded" for r in runs) >= 3 \
                and any(r["state"] == "skipped" for r in runs)
        # Occurrences come every second and each call takes 1.5 s: the queue
        # fills, and an occurrence beyond its bound is recorded skipped.
        wait_until(settled, 30, "three queued runs to finish and one to be skipped")
        stop(shared_cluster, job_id)
        assert sink.inflight_max[job_id] == 1
    runs = runs_of(shared_cluster, job_id)
    assert any(r["state"] == "skipped" and "queue_max 1" in r["reason"] for r in runs)
    assert any("queue policy" in (r["reason"] or "") for r in runs if r["state"] == "succeeded")


def test_replace_cancels_the_running_call(shared_cluster):
    with Sink(delay_s=30) as sink:
        job_id = every_second(shared_cluster, sink, "replace", timeout_s=60)
        wait_until(lambda: sum(r["state"] == "cancelled" for r in runs_of(shared_cluster, job_id))
                   >= 2, 20, "two replaced runs")
        stop(shared_cluster, job_id)
    runs = runs_of(shared_cluster, job_id)
    cancelled = [r for r in runs if r["state"] == "cancelled"]
    assert all("replace" in r["reason"] for r in cancelled)
    assert sum(r["state"] == "running" for r in runs) <= 1


def test_allow_overlaps(shared_cluster):
    with Sink(delay_s=2.5) as sink:
        job_id = every_second(shared_cluster, sink, "allow")
        wait_until(lambda: sink.inflight_max.get(job_id, 0) >= 2, 20, "two calls at once")
        stop(shared_cluster, job_id)


# --- commands --------------------------------------------------------------------------

def test_cancel_of_a_running_command_kills_its_process_group(shared_cluster, tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}.tmp; echo $$ >> {pids}.tmp; mv {pids}.tmp {pids}; wait"
    job_id = create(shared_cluster, {"name": "long", "run_at": "2031-01-01T00:00:00Z",
                                     "target": {"type": "command", "argv": [script],
                                                "shell": True, "timeout_s": 600}})
    trigger = shared_cluster.api("n3", "POST", f"/v1/jobs/{job_id}:trigger")
    assert trigger.status == 201, trigger
    run_id = trigger.body["run_id"]
    wait_until(pids.exists, 20, "the command to start")
    child, shell = (int(line) for line in pids.read_text().split())
    assert not pid_gone(child)
    cancel = shared_cluster.api("n1", "POST", f"/v1/runs/{run_id}:cancel")
    assert cancel.status == 200, cancel
    assert cancel.body["state"] == "cancelled"
    wait_until(lambda: pid_gone(child) and pid_gone(shell), 10, "the process group to die")
    again = shared_cluster.api("n2", "POST", f"/v1/runs/{run_id}:cancel")
    assert again.status == 409
    assert shared_cluster.api("n2", "POST", "/v1/runs/run_0123:cancel").status == 404


def test_output_over_the_limit_is_truncated_and_says_so_from_any_node(shared_cluster):
    size = limits.output_bytes_max + 5000
    job_id = create(shared_cluster, {
        "name": "chatty", "run_at": soon(0.5),
        "target": {"type": "command", "shell": True,
                   "argv": [f"head -c {size} /dev/zero | tr '\\0' x; echo oops >&2; exit 3"]},
        "retry": {"max_attempts": 1}})
    run = only_run(shared_cluster, job_id, {"failed"}, 20)
    assert run["exit_code"] == 3
    executed_on = run["attempts"][0]["holder"]
    other = next(n for n in shared_cluster.ids if n != executed_on)
    logs = shared_cluster.api(other, "GET", f"/v1/runs/{run['run_id']}/logs")
    assert logs.status == 200, logs
    attempt = logs.body["attempts"][0]
    assert attempt["output_node"] == executed_on
    assert attempt["stdout"].startswith("x" * 1000)
    assert f"{size - limits.output_bytes_max} bytes of stdout dropped" in attempt["stdout"]
    assert "oops" in attempt["stderr"]


def test_a_listed_exit_code_is_not_retried_and_env_names_the_run(shared_cluster, tmp_path):
    out = tmp_path / "env"
    job_id = create(shared_cluster, {
        "name": "env", "run_at": soon(0.5),
        "target": {"type": "command", "shell": True, "env": {"GREETING": "hi"},
                   "argv": [f"env | grep -E '^(RAFTSCHED_|GREETING)' | sort > {out}; exit 4"]},
        "retry": {"max_attempts": 5, "base_s": 0.1, "non_retryable_exit_codes": [4]}})
    run = only_run(shared_cluster, job_id, {"failed"}, 20)
    assert len(run["attempts"]) == 1
    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["GREETING"] == "hi"
    assert env["RAFTSCHED_EXECUTION_ID"] == run["execution_id"]
    assert env["RAFTSCHED_JOB_ID"] == job_id
    assert env["RAFTSCHED_ATTEMPT"] == "1"
    assert env["RAFTSCHED_SCHEDULED_FOR"] == run["scheduled_for"]
    assert env["RAFTSCHED_FENCING_TOKEN"] == str(run["fencing_token"])


# --- publish and topics ----------------------------------------------------------------

def test_publish_target_appends_to_a_topic_read_by_long_poll_and_groups(shared_cluster):
    topic = f"orders-{os.getpid()}-{time.monotonic_ns()}"
    base = f"/v1/topics/{topic}"
    empty = shared_cluster.api("n2", "GET", f"{base}/messages?after=0&wait_s=0")
    assert empty.body["messages"] == []
    job_id = create(shared_cluster, {"name": "pub", "run_at": soon(1.0),
                                     "target": {"type": "publish", "topic": topic,
                                                "key": "k1", "message": {"order": 7}}})
    started = time.monotonic()
    got = shared_cluster.api("n3", "GET", f"{base}/messages?after=0&wait_s=10", timeout_s=15)
    assert got.status == 200
    assert time.monotonic() - started < 9, "the long poll should end when the message lands"
    [message] = got.body["messages"]
    assert message["message"] == {"order": 7}
    assert message["key"] == "k1"
    assert message["job_id"] == job_id
    run = only_run(shared_cluster, job_id, {"succeeded"}, 10)
    assert message["execution_id"] == run["execution_id"]
    commit = shared_cluster.api("n1", "PUT", f"{base}/groups/billing", {"offset": 1})
    assert commit.status == 200, commit
    after_group = shared_cluster.api("n2", "GET", f"{base}/messages?group=billing&wait_s=0"
                                                                  "&consistent=true")
    assert after_group.body["messages"] == []
    bad = shared_cluster.api("n1", "PUT", f"{base}/groups/billing", {"offset": 99})
    assert bad.status == 400
    assert bad.body["field"] == "offset"


def test_worker_api_refuses_bad_claims(shared_cluster):
    bad = shared_cluster.api("n1", "POST", "/v1/workers/w1/claim", {"queue": "default"})
    assert (bad.status, bad.body["field"]) == (400, "queue")
    bad = shared_cluster.api("n1", "POST", "/v1/workers/w1/claim", {"queue": "q", "max": 0})
    assert (bad.status, bad.body["field"]) == (400, "max")
    idle = shared_cluster.api("n1", "POST", "/v1/workers/w1/claim",
                              {"queue": "nobody-publishes-here", "wait_s": 0.2})
    assert idle.status == 200
    assert idle.body["runs"] == []
