"""A fixed corpus of hostile requests against a live cluster: each is a 4xx problem naming the field or the limit, nothing is written, and every node stays alive with equal state."""

from __future__ import annotations

import http.client
import json

import pytest

from raftsched import limits
from raftsched.testing.http import auth_headers, wait_until

pytestmark = pytest.mark.integration

JSON = {"Content-Type": "application/json"}
TARGETS = {
    "http": {"type": "http", "url": "http://127.0.0.1:9/x", "method": "POST",
             "headers": {"X-Team": "payments"}, "body": "payload", "timeout_s": 5},
    "command": {"type": "command", "argv": ["true", "--flag"], "env": {"MODE": "full"},
                "cwd": "/tmp", "queue": "backups"},
    "publish": {"type": "publish", "topic": "orders", "message": {"text": "hello"},
                "key": "k1"},
}


def full_job(target: str) -> dict:
    """A job body with a string in every member that takes one."""
    return {"name": "hostile", "schedule": {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
            "target": json.loads(json.dumps(TARGETS[target])),
            "retry": {"backoff": "fixed"}, "concurrency": "skip_if_running",
            "misfire": {"policy": "skip"}, "alert": {"webhook_url": "http://127.0.0.1:9/a"},
            "idempotency_key": "hostile-key", "metadata": {"team": "payments"}}


def string_paths(value: object, path: str = "") -> list[tuple[str, list]]:
    """(dotted path, key path) of every string value in a JSON value."""
    if isinstance(value, str):
        return [(path, [])]
    children = (value.items() if isinstance(value, dict) else
                enumerate(value) if isinstance(value, list) else [])
    found = []
    for key, member in children:
        child = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else key
        found += [(p, [key] + keys) for p, keys in string_paths(member, child)]
    return found


def with_string(body: dict, keys: list, text: str) -> dict:
    body = json.loads(json.dumps(body))
    node = body
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] += text
    return body


def bad_string_cases() -> list:
    cases = []
    for target in TARGETS:
        body = full_job(target)
        for path, keys in string_paths(body):
            if target != "http" and path == "name":
                continue   # once is enough for the members every target shares
            for label, text in (("surrogate", "\ud800"), ("nul", "\x00")):
                raw = json.dumps(with_string(body, keys, text)).encode()
                cases.append(pytest.param("POST", "/v1/jobs", raw, JSON, 400, path, None,
                                          id=f"{label}-{target}-{path}"))
    return cases


def case(name, method, path, raw, status, field=None, limit=None, headers=JSON):
    if not isinstance(raw, bytes):
        raw = json.dumps(raw).encode()
    return pytest.param(method, path, raw, headers, status, field, limit, id=name)


ONE_OFF = {"run_at": "2031-01-01T00:00:00Z", "target": TARGETS["http"]}
DEEP = b"[" * 100_000 + b"]" * 100_000
RESULT = {"run_id": "run_" + "0" * 24, "attempt": 1, "ok": True}
CORPUS = [
    case("deep-100000-create", "POST", "/v1/jobs", DEEP, 413, "body", "request_body_bytes_max"),
    case("deep-100000-complete", "POST", "/v1/workers/w/complete", DEEP, 400, "body",
         "json_depth_max"),
    case("deep-1000-create", "POST", "/v1/jobs", b"[" * 1000 + b"]" * 1000, 400, "body",
         "json_depth_max"),
    case("int-2^64-metadata", "POST", "/v1/jobs",
         dict(ONE_OFF, metadata={"n": 2 ** 64}), 400, "metadata.n", "json_int_max"),
    case("int-10^5000-metadata", "POST", "/v1/jobs",
         b'{"run_at": "2031-01-01T00:00:00Z", "metadata": {"n": 1' + b"0" * 5000 + b"}}",
         400, "metadata.n", "json_int_max"),
    case("int-minus-2^64", "PUT", "/v1/topics/t/groups/g", b'{"offset": -18446744073709551616}',
         400, "offset", "json_int_min"),
    case("nan-retry", "POST", "/v1/jobs",
         b'{"run_at": "2031-01-01T00:00:00Z", "retry": {"base_s": NaN}}', 400, "retry.base_s"),
    case("infinity-offset", "PUT", "/v1/topics/t/groups/g", b'{"offset": Infinity}', 400,
         "offset"),
    case("surrogate-in-a-member-name", "POST", "/v1/jobs",
         b'{"run_at": "2031-01-01T00:00:00Z", "metadata": {"\\ud800": 1}}', 400, "metadata"),
    case("nul-in-a-header-name", "POST", "/v1/jobs",
         b'{"run_at": "2031-01-01T00:00:00Z", "target": {"type": "http", "url": '
         b'"http://127.0.0.1:9/", "headers": {"X\\u0000": "v"}}}', 400, "target.headers"),
    case("utf8-bom", "POST", "/v1/jobs", b"\xef\xbb\xbf" + json.dumps(ONE_OFF).encode(), 400,
         "body"),
    case("not-utf8", "POST", "/v1/jobs", json.dumps(ONE_OFF).encode("utf-16"), 400, "body"),
    case("10mb-create", "POST", "/v1/jobs", b" " * 10_000_000, 413, "body",
         "request_body_bytes_max"),
    case("10mb-complete", "POST", "/v1/workers/w/complete", b" " * 10_000_000, 413, "body",
         "worker_complete_body_bytes_max"),
    case("text-plain", "POST", "/v1/jobs", ONE_OFF, 415, "Content-Type",
         headers={"Content-Type": "text/plain"}),
    case("form-urlencoded", "PATCH", "/v1/jobs/job_" + "0" * 20, ONE_OFF, 415, "Content-Type",
         headers={"Content-Type": "application/x-www-form-urlencoded"}),
    case("latin-1-charset", "POST", "/v1/schedules:preview", ONE_OFF, 415, "Content-Type",
         headers={"Content-Type": "application/json; charset=latin-1"}),
    case("idempotency-key-200-multibyte", "POST", "/v1/jobs",
         dict(ONE_OFF, idempotency_key="\u20ac" * 200), 400, "idempotency_key",
         "idempotency_key_bytes_max"),
    case("group-600", "PUT", "/v1/topics/t/groups/" + "g" * 600, {"offset": 0}, 400, "group",
         "group_bytes_max"),
    case("topic-600", "PUT", f"/v1/topics/{'t' * 600}/groups/g", {"offset": 0}, 400, "topic",
         "topic_bytes_max"),
    case("worker-600", "POST", f"/v1/workers/{'w' * 600}/heartbeat", {"runs": []}, 400,
         "worker_id", "worker_id_bytes_max"),
    case("queue-600", "POST", "/v1/workers/w/claim", {"queue": "q" * 600}, 400, "queue",
         "queue_bytes_max"),
    case("heartbeat-empty-run-id", "POST", "/v1/workers/w/heartbeat",
         {"runs": [{"run_id": "", "attempt": 1}]}, 400, "runs[0].run_id"),
    case("heartbeat-attempt-2^64", "POST", "/v1/workers/w/heartbeat",
         {"runs": [{"run_id": "run_" + "0" * 24, "attempt": 2 ** 64}]}, 400, "runs[0].attempt",
         "json_int_max"),
    case("complete-attempt-2^64", "POST", "/v1/workers/w/complete",
         {"results": [dict(RESULT, attempt=2 ** 64)]}, 400, "results[0].attempt", "json_int_max"),
    case("complete-attempt-2^62", "POST", "/v1/workers/w/complete",
         {"results": [dict(RESULT, attempt=2 ** 62)]}, 400, "results[0].attempt",
         "run_attempts_max"),
    case("complete-surrogate-run-id", "POST", "/v1/workers/w/complete",
         {"results": [dict(RESULT, run_id="run_\ud800")]}, 400, "results[0].run_id"),
    case("heartbeat-surrogate-run-id", "POST", "/v1/workers/w/heartbeat",
         {"runs": [{"run_id": "\udc00", "attempt": 1}]}, 400, "runs[0].run_id"),
    case("complete-exit-code-2^40", "POST", "/v1/workers/w/complete",
         {"results": [dict(RESULT, exit_code=2 ** 40)]}, 400, "results[0].exit_code", "exit_code_max"),
    case("preview-after-year-9999", "POST", "/v1/schedules:preview",
         {"schedule": {"cron": "0 3 * * *"}, "after": "9999-12-31T23:59:59Z"}, 400, "after",
         "timestamp_ms_max"),
    case("run-at-year-9999-west", "POST", "/v1/schedules:preview",
         {"run_at": "9999-12-31T23:59:59-12:00"}, 400, "run_at", "timestamp_ms_max"),
    case("every-5000-digits", "POST", "/v1/schedules:preview",
         {"schedule": {"every": "1" * 5000 + "s"}}, 400, "schedule.every"),
    case("topic-after-1e30", "GET", "/v1/topics/t/messages?after=1e30", b"", 400, "after"),
    case("topic-after-10^30", "GET", "/v1/topics/t/messages?after=1" + "0" * 30, b"", 400,
         "after", "json_int_max"),
    case("cursor-600", "GET", "/v1/jobs?cursor=" + "a" * 600, b"", 400, "cursor"),
    case("job-id-600", "GET", "/v1/jobs/job_" + "a" * 600, b"", 404),
    case("run-id-600", "POST", "/v1/runs/run_" + "a" * 600 + ":cancel", b"", 404),
] + bad_string_cases()


def send(cluster, nid: str, method: str, path: str, raw: bytes,
         headers: dict) -> tuple[int, str, object]:
    conn = http.client.HTTPConnection("127.0.0.1", cluster.http_ports[nid], timeout=30)
    try:
        conn.request(method, path, body=raw or None, headers={**auth_headers(), **headers})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), json.loads(response.read())
    finally:
        conn.close()


def all_job_ids(cluster) -> set[str]:
    page = cluster.api("n1", "GET", f"/v1/jobs?limit={limits.list_limit_max}&consistent=true")
    return {job["job_id"] for job in page.body["jobs"]}


@pytest.mark.parametrize("method, path, raw, headers, status, field, limit", CORPUS)
def test_hostile_request_is_a_4xx_naming_the_field_or_limit(shared_cluster, method, path, raw,
                                                            headers, status, field, limit):
    before = all_job_ids(shared_cluster)
    got, content_type, body = send(shared_cluster, "n2", method, path, raw, headers)
    assert (got, body.get("field"), body.get("limit")) == (status, field, limit), body
    assert content_type.startswith("application/problem+json")
    assert body["status"] == status
    assert body["detail"]
    assert all_job_ids(shared_cluster) == before, "a refused request wrote a job"
    assert sorted(shared_cluster.alive()) == shared_cluster.ids


def test_the_seed_one_off_without_a_name_is_created(shared_cluster):
    for headers in (JSON, {}, {"Content-Type": "application/merge-patch+json"},
                    {"Content-Type": "Application/JSON; charset=UTF-8"}):
        status, _, job = send(shared_cluster, "n3", "POST", "/v1/jobs",
                              json.dumps(ONE_OFF).encode(), headers)
        assert status == 201, (headers, job)
        assert job["name"] == "POST 127.0.0.1/x"
        assert job["run_at"] == "2031-01-01T00:00:00Z"


def test_every_node_answers_and_agrees_after_the_corpus(shared_cluster):
    for param in CORPUS:
        method, path, raw, headers, status, _, _ = param.values
        assert send(shared_cluster, "n1", method, path, raw, headers)[0] == status
    assert sorted(shared_cluster.alive()) == shared_cluster.ids
    for nid in shared_cluster.ids:
        wait_until(lambda: shared_cluster.api(nid, "GET", "/v1/node").status == 200, 10,
                   f"{nid} answering /v1/node")
    shared_cluster.ensure_same()
