"""Tokens, roles and tenants on a real cluster: every route answers each kind of caller as its role allows, tokens are shown once and revoked everywhere, tenants never meet, quotas answer 429, and the audit table records who did what."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time

import pytest

from raftsched.api import app as api_app
from raftsched.api import auth
from raftsched.testing.http import ADMIN_TOKEN, Response, wait_until

pytestmark = pytest.mark.integration

NODES = ("n1", "n2", "n3")
UNKNOWN_TOKEN = f"rst_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"
# The roles that hold each permission, written out apart from auth.GRANTS so
# that a change to either shows here: an admin may do everything, a writer read
# and write its tenant's jobs and runs, a reader read them, a worker work its
# tenant's queues; an operator (and an admin) reads the metrics and the
# cluster's status; any valid token reads the node's clock.
ALLOWED = {"any": {"reader", "writer", "worker", "operator", "admin"},
           "read": {"reader", "writer", "admin"},
           "write": {"writer", "admin"},
           "work": {"worker", "admin"},
           "operate": {"operator", "admin"},
           "admin": {"admin"}}
# The callers of the matrix: (name, role, tenant); "none" sends no token and
# "unknown" a well-formed token the cluster never made.
CALLERS = [("none", None, None), ("unknown", None, None), ("reader", "reader", "t1"),
           ("writer", "writer", "t1"), ("worker", "worker", "t1"), ("admin", "admin", "default"),
           ("operator", "operator", "default"),
           ("other_writer", "writer", "t2")]


def job_body(**over) -> dict:
    # Port 9 of 127.0.0.1 is closed: an attempt fails at once, and a fixed
    # minute's backoff keeps the run open (retry_wait) for the whole module.
    body = {"name": "auth", "schedule": {"cron": "0 3 * * *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/auth"},
            "retry": {"max_attempts": 5, "backoff": "fixed", "base_s": 60}}
    body.update(over)
    return body


# Two past occurrences of job_body()'s daily schedule.
BACKFILL_BODY = {"start": "2025-01-01T00:00:00Z", "end": "2025-01-03T00:00:00Z"}


# (method, route) -> (permission, the statuses of a caller that may, the body).
# Every route the app has must be here (test_the_matrix_covers_every_route).
REQUESTS: dict[tuple[str, str], tuple[str, set[int], object]] = {
    ("GET", "/"): ("public", {200}, None),
    ("GET", "/ui/{file}"): ("public", {200}, None),
    ("GET", "/healthz"): ("public", {200}, None),
    ("GET", "/v1/healthz"): ("public", {200}, None),
    ("GET", "/v1/openapi.json"): ("any", {200}, None),
    ("POST", "/v1/jobs"): ("write", {201}, job_body()),
    ("POST", "/v1/jobs:batchCreate"): ("write", {200}, {"jobs": [job_body()]}),
    ("GET", "/v1/jobs"): ("read", {200}, None),
    ("GET", "/v1/jobs/{job_id}"): ("read", {200}, None),
    ("PATCH", "/v1/jobs/{job_id}"): ("write", {200}, {"name": "patched"}),
    ("DELETE", "/v1/jobs/{job_id}"): ("write", {204}, None),
    ("POST", "/v1/jobs/{job_id}:pause"): ("write", {200}, None),
    ("POST", "/v1/jobs/{job_id}:resume"): ("write", {200}, None),
    ("POST", "/v1/jobs/{job_id}:trigger"): ("write", {201}, None),
    ("GET", "/v1/jobs/{job_id}/runs"): ("read", {200}, None),
    ("GET", "/v1/jobs/{job_id}/preview"): ("read", {200}, None),
    ("POST", "/v1/jobs/{job_id}:backfill"): ("write", {202}, BACKFILL_BODY),
    ("GET", "/v1/backfills/{backfill_id}"): ("read", {200}, None),
    ("POST", "/v1/backfills/{backfill_id}:cancel"): ("write", {200}, None),
    ("GET", "/v1/runs/{run_id}"): ("read", {200}, None),
    ("POST", "/v1/runs/{run_id}:cancel"): ("write", {200}, None),
    # The run is open (retry_wait), not failed: the handler's answer is a 409.
    ("POST", "/v1/runs/{run_id}:retry"): ("write", {409}, None),
    ("GET", "/v1/runs"): ("read", {200}, None),
    ("GET", "/v1/runs/{run_id}/logs"): ("read", {200}, None),
    ("POST", "/v1/schedules:preview"): ("read", {200}, {"schedule": {"every": "1h"}}),
    ("GET", "/v1/topics/{topic}/messages"): ("read", {200}, None),
    ("GET", "/v1/topics/{topic}/groups/{group}"): ("read", {200}, None),
    ("PUT", "/v1/topics/{topic}/groups/{group}"): ("write", {200}, {"offset": 0}),
    ("POST", "/v1/workers/{worker_id}/claim"): ("work", {200},
                                                {"queue": "matrix", "max": 1, "wait_s": 0}),
    ("POST", "/v1/workers/{worker_id}/heartbeat"): ("work", {200}, {"runs": []}),
    ("POST", "/v1/workers/{worker_id}/complete"): ("work", {200}, {"results": []}),
    ("GET", "/v1/cluster"): ("operate", {200}, None),
    ("GET", "/v1/cluster/shards"): ("operate", {200}, None),
    ("GET", "/v1/node"): ("operate", {200}, None),
    ("GET", "/v1/node/clock"): ("any", {200}, None),
    ("GET", "/metrics"): ("operate", {200}, None),
    ("GET", "/v1/state/digest"): ("admin", {200}, None),
    ("POST", "/v1/state/digest:check"): ("admin", {200}, None),
    ("POST", "/v1/tokens"): ("admin", {201}, {"role": "reader", "name": "matrix"}),
    ("GET", "/v1/tokens"): ("admin", {200}, None),
    ("DELETE", "/v1/tokens/{token_id}"): ("admin", {204}, None),
    ("GET", "/v1/tenants"): ("admin", {200}, None),
    ("GET", "/v1/tenants/{tenant}"): ("admin", {200}, None),
    ("PUT", "/v1/tenants/{tenant}"): ("admin", {200}, {}),
    ("DELETE", "/v1/tenants/{tenant}"): ("admin", {204, 404}, None),
    ("GET", "/v1/audit"): ("admin", {200}, None),
}
# Path parameters that name a tenant's object: another tenant's caller gets 404.
TENANT_IDS = ("{job_id}", "{run_id}", "{backfill_id}")
# Path parameters that name nothing of a tenant's (or name it by its own name).
PLAIN_IDS = {"topic": "matrix", "group": "g1", "worker_id": "w1", "tenant": "t9",
             "file": "app.js"}


def router_routes() -> set[tuple[str, str]]:
    app = api_app.make_app(object())   # type: ignore[arg-type]
    return {(route.method, route.resource.canonical) for route in app.router.routes()
            if route.method != "HEAD"}


def test_the_matrix_covers_every_route_and_agrees_with_the_permissions():
    routes = router_routes()
    assert set(REQUESTS) == routes, "a route without a row here, or a row of no route"
    assert set(auth.PERMISSIONS) == routes
    assert {route: row[0] for route, row in REQUESTS.items()} == auth.PERMISSIONS


# --- helpers --------------------------------------------------------------------------

def header(response: Response, name: str) -> str | None:
    return {k.lower(): v for k, v in response.headers.items()}.get(name.lower())


def assert_problem(response: Response, status: int, what: str) -> None:
    assert response.status == status, (what, response)
    assert header(response, "Content-Type").startswith("application/problem+json"), what
    assert response.body["status"] == status, what
    if status == 401:
        assert header(response, "WWW-Authenticate").startswith("Bearer "), what


def new_token(cluster, tenant: str, role: str, name: str = "test", *, nid: str = "n1",
              token=ADMIN_TOKEN) -> dict:
    created = cluster.api(nid, "POST", "/v1/tokens", {"tenant": tenant, "role": role,
                                                      "name": name}, token=token)
    assert created.status == 201, created
    return created.body


def wait_known_everywhere(cluster, text: str) -> None:
    """A new token is known on a node once that node applied its create."""
    for nid in NODES:
        wait_until(lambda nid=nid: cluster.api(nid, "GET", "/v1/node/clock", token=text).status
                   == 200, 10, f"the token to be known on {nid}")


def create_job(cluster, nid: str, token: str, **over) -> dict:
    created = cluster.api(nid, "POST", "/v1/jobs", job_body(**over), token=token)
    assert created.status == 201, created
    return created.body


def trigger(cluster, nid: str, token: str, job_id: str) -> dict:
    run = cluster.api(nid, "POST", f"/v1/jobs/{job_id}:trigger", token=token)
    assert run.status == 201, run
    return run.body


def all_audit(cluster, after: int = 0, limit: int = 1000) -> list[dict]:
    records: list[dict] = []
    while True:
        page = cluster.api("n1", "GET", f"/v1/audit?after={after}&limit={limit}"
                                        "&consistent=true")
        assert page.status == 200, page
        records += page.body["records"]
        if not page.body["records"]:
            return records
        after = page.body["next_after"]


@pytest.fixture(scope="module")
def tokens(shared_cluster) -> dict[str, str | None]:
    """The matrix's callers, plus a reader of t2: name -> token text."""
    texts = {name: new_token(shared_cluster, tenant, role, name)["token"]
             for name, role, tenant in CALLERS if role is not None}
    texts["other_reader"] = new_token(shared_cluster, "t2", "reader", "other_reader")["token"]
    for text in texts.values():
        wait_known_everywhere(shared_cluster, text)
    texts["unknown"] = UNKNOWN_TOKEN
    texts["none"] = None
    return texts


# --- the matrix -------------------------------------------------------------------------

def expected_status(need: str, caller: str, role: str | None, template: str,
                    ok: set[int]) -> set[int]:
    if need == "public":
        return ok
    if role is None:
        return {401}
    if role not in ALLOWED[need]:
        return {403}
    if caller == "other_writer" and any(name in template for name in TENANT_IDS):
        return {404}    # t1's ids, as t2 sees them: not there
    return ok


def fresh_ids(cluster, nid: str, writer: str, template: str) -> dict[str, str]:
    """Ids of t1 that nobody has touched, for one call that reaches its handler
    (a delete, a cancel or a revocation must find what it names)."""
    ids = dict(PLAIN_IDS)
    if any(name in template for name in TENANT_IDS):
        ids["job_id"] = create_job(cluster, nid, writer)["job_id"]
    if "{backfill_id}" in template:
        started = cluster.api(nid, "POST", f"/v1/jobs/{ids['job_id']}:backfill", BACKFILL_BODY,
                              token=writer)
        assert started.status == 202, started
        ids["backfill_id"] = started.body["backfill_id"]
    if "{run_id}" in template:
        ids["run_id"] = trigger(cluster, nid, writer, ids["job_id"])["run_id"]
    if "{token_id}" in template:
        ids["token_id"] = new_token(cluster, "t1", "reader", "to-revoke", nid=nid)["token_id"]
    return ids


# Ids of the right shape for the calls refused before any handler runs.
UNREACHED_IDS = dict(PLAIN_IDS, job_id="job_" + "0" * 20, run_id="run_" + "0" * 24,
                     token_id="tok_" + "0" * 16, backfill_id="bf_" + "0" * 20)


@pytest.mark.parametrize("route", sorted(REQUESTS), ids=lambda r: f"{r[0]} {r[1]}")
def test_every_route_answers_each_caller_as_its_role_allows(shared_cluster, tokens, route):
    method, template = route
    need, ok, body = REQUESTS[route]
    nid = NODES[sorted(REQUESTS).index(route) % len(NODES)]
    for caller, role, _ in CALLERS:
        expected = expected_status(need, caller, role, template, ok)
        reaches = expected.isdisjoint({401, 403})
        ids = fresh_ids(shared_cluster, nid, tokens["writer"], template) if reaches \
            else UNREACHED_IDS
        # An admin acts for t1 (its own tenant is another): it reaches t1's ids.
        query = "?tenant=t1" if caller == "admin" else ""
        response = shared_cluster.api(nid, method, template.format(**ids) + query, body,
                                      token=tokens[caller])
        what = f"{caller} {method} {template}: {response}"
        assert response.status in expected, what
        if response.status >= 400:
            assert_problem(response, response.status, what)


# --- tokens -----------------------------------------------------------------------------

def test_a_token_is_shown_once_with_128_bits_at_least(shared_cluster, tokens):
    created = new_token(shared_cluster, "t1", "reader", "shown-once")
    assert re.fullmatch(r"tok_[0-9a-f]{16}", created["token_id"])
    assert (created["tenant"], created["role"], created["name"]) == ("t1", "reader",
                                                                    "shown-once")
    match = re.fullmatch(r"rst_([0-9a-f]{16})_([A-Za-z0-9_-]+)", created["token"])
    assert match, created["token"]
    assert "tok_" + match.group(1) == created["token_id"]
    # URL-safe base64: 6 bits a character, so 22 characters carry 132 bits.
    assert len(match.group(2)) * 6 >= 128
    other = new_token(shared_cluster, "t1", "reader", "shown-once")
    assert other["token"] != created["token"]

    listed = shared_cluster.api("n2", "GET", "/v1/tokens?consistent=true")
    assert listed.status == 200
    mine = [t for t in listed.body["tokens"] if t["token_id"] == created["token_id"]]
    assert mine == [{k: v for k, v in created.items() if k != "token"}]
    raw = json.dumps(listed.body)
    assert created["token"] not in raw and match.group(2) not in raw
    assert hashlib.sha256(created["token"].encode()).hexdigest() not in raw
    assert all(set(t) == set(mine[0]) for t in listed.body["tokens"])


def test_a_forged_or_malformed_credential_is_401(shared_cluster, tokens):
    real = new_token(shared_cluster, "default", "admin", "forged")
    # The real token's id with another secret: the id is not the credential.
    forged = real["token"].rsplit("_", 1)[0] + "_" + secrets.token_urlsafe(32)
    for headers in ({"Authorization": f"Bearer {forged}"},
                    {"Authorization": f"Basic {real['token']}"},
                    {"Authorization": "Bearer "},
                    {"Authorization": f"Bearer {ADMIN_TOKEN}x"}):
        answer = shared_cluster.api("n1", "GET", "/v1/tokens", token=None, headers=headers)
        assert_problem(answer, 401, str(headers))
    assert shared_cluster.api("n1", "GET", "/v1/tokens", token=real["token"]).status == 200


def refused(answer: Response) -> Response | None:
    """The answer once it is a 401; until then it must be the ordinary 200."""
    assert answer.status in (200, 401), answer
    return answer if answer.status == 401 else None


def test_a_revoked_token_is_refused_on_every_node_within_a_second(shared_cluster):
    created = new_token(shared_cluster, "t1", "writer", "revoked")
    wait_known_everywhere(shared_cluster, created["token"])
    revoked = shared_cluster.api("n2", "DELETE", f"/v1/tokens/{created['token_id']}")
    assert revoked.status == 204, revoked
    deadline = time.monotonic() + 1.0
    for nid in NODES:
        answer = wait_until(lambda nid=nid: refused(shared_cluster.api(
            nid, "GET", "/v1/jobs", token=created["token"])),
            max(0.0, deadline - time.monotonic()), f"{nid} to refuse the revoked token", 0.02)
        assert_problem(answer, 401, f"the revoked token on {nid}")
    again = shared_cluster.api("n3", "DELETE", f"/v1/tokens/{created['token_id']}")
    assert_problem(again, 404, "a second revocation")
    listed = shared_cluster.api("n2", "GET", "/v1/tokens?consistent=true").body["tokens"]
    assert created["token_id"] not in {t["token_id"] for t in listed}


# --- tenants ----------------------------------------------------------------------------

def test_a_tenant_never_sees_or_touches_another_tenants_jobs(shared_cluster, tokens):
    c = shared_cluster
    job = create_job(c, "n1", tokens["writer"], name="t1-private")
    run = trigger(c, "n1", tokens["writer"], job["job_id"])
    other = tokens["other_writer"]
    wait_until(lambda: c.api("n2", "GET", f"/v1/jobs/{job['job_id']}",
                             token=tokens["writer"]).status == 200, 10, "the job on n2")
    listed = c.api("n2", "GET", "/v1/jobs?limit=500&consistent=true", token=other)
    assert listed.status == 200
    assert job["job_id"] not in {j["job_id"] for j in listed.body["jobs"]}
    for method, path in [("GET", f"/v1/jobs/{job['job_id']}"),
                         ("GET", f"/v1/runs/{run['run_id']}"),
                         ("GET", f"/v1/runs/{run['run_id']}/logs"),
                         ("POST", f"/v1/jobs/{job['job_id']}:pause"),
                         ("DELETE", f"/v1/jobs/{job['job_id']}")]:
        assert_problem(c.api("n2", method, path, token=other), 404, f"t2 {method} {path}")
    # Nothing happened to it, and the admin reaches it acting for t1 only.
    assert c.api("n2", "GET", f"/v1/jobs/{job['job_id']}", token=tokens["writer"]) \
        .body["status"] == "active"
    assert c.api("n3", "GET", f"/v1/jobs/{job['job_id']}?tenant=t1&consistent=true",
                 token=tokens["admin"]).status == 200
    assert_problem(c.api("n3", "GET", f"/v1/jobs/{job['job_id']}", token=tokens["admin"]),
                   404, "admin acting for its own tenant")
    reader = tokens["reader"]
    assert c.api("n3", "GET", "/v1/jobs?tenant=t1", token=reader).status == 200
    refused = c.api("n3", "GET", "/v1/jobs?tenant=t2", token=reader)
    assert_problem(refused, 403, "a reader naming another tenant")
    assert refused.body["field"] == "tenant"


def test_idempotency_keys_are_per_tenant(shared_cluster, tokens):
    key = "same-key-" + secrets.token_hex(4)
    in_t1 = create_job(shared_cluster, "n1", tokens["writer"], idempotency_key=key)
    in_t2 = create_job(shared_cluster, "n1", tokens["other_writer"], idempotency_key=key)
    assert in_t1["job_id"] != in_t2["job_id"]
    again = shared_cluster.api("n1", "POST", "/v1/jobs", job_body(idempotency_key=key),
                               token=tokens["writer"])
    assert (again.status, again.body["job_id"]) == (200, in_t1["job_id"])


def test_topics_are_per_tenant(shared_cluster, tokens):
    topic = "shared-" + secrets.token_hex(4)
    job = create_job(shared_cluster, "n1", tokens["writer"],
                     target={"type": "publish", "topic": topic, "message": {"from": "t1"}})
    trigger(shared_cluster, "n1", tokens["writer"], job["job_id"])
    path = f"/v1/topics/{topic}/messages?consistent=true"
    seen = wait_until(lambda: shared_cluster.api("n2", "GET", path, token=tokens["reader"])
                      .body["messages"], 15, "t1's message on its topic")
    assert [m["message"] for m in seen] == [{"from": "t1"}]
    theirs = shared_cluster.api("n2", "GET", path, token=tokens["other_reader"])
    assert theirs.status == 200
    assert theirs.body["messages"] == []


# --- quotas -----------------------------------------------------------------------------

def put_quota(cluster, tenant: str, nid: str, **quota) -> None:
    answer = cluster.api(nid, "PUT", f"/v1/tenants/{tenant}", quota)
    assert answer.status == 200, answer
    assert {k: answer.body["quota"][k] for k in quota} == quota
    assert {k: answer.body["in_force"][k] for k in quota} == quota


def assert_quota_refusal(response: Response, limit: str) -> None:
    assert_problem(response, 429, f"over {limit}")
    assert response.body["limit"] == limit
    assert int(header(response, "Retry-After")) >= 1


def test_jobs_max_refuses_the_job_over_it_until_one_is_deleted(shared_cluster):
    c = shared_cluster
    writer = new_token(c, "t3", "writer")["token"]
    wait_known_everywhere(c, writer)
    put_quota(c, "t3", "n2", jobs_max=2)
    first = create_job(c, "n2", writer)
    create_job(c, "n2", writer)
    assert_quota_refusal(c.api("n2", "POST", "/v1/jobs", job_body(), token=writer), "jobs_max")
    assert c.api("n2", "GET", "/v1/tenants/t3").body["jobs"] == 2
    deleted = c.api("n2", "DELETE", f"/v1/jobs/{first['job_id']}", token=writer)
    assert deleted.status == 204
    create_job(c, "n2", writer)
    assert_quota_refusal(c.api("n2", "POST", "/v1/jobs", job_body(), token=writer), "jobs_max")


def test_a_tenant_without_jobs_can_be_deleted_freeing_its_place(shared_cluster):
    c = shared_cluster
    writer = new_token(c, "t10", "writer", "tenant-to-go")["token"]
    wait_known_everywhere(c, writer)
    put_quota(c, "t10", "n1", jobs_max=5)
    job = create_job(c, "n2", writer)
    count = len(c.api("n1", "GET", "/v1/tenants?consistent=true").body["tenants"])
    busy = c.api("n1", "DELETE", "/v1/tenants/t10")
    assert_problem(busy, 409, "has 1 jobs")
    assert c.api("n2", "DELETE", f"/v1/jobs/{job['job_id']}", token=writer).status == 204
    assert c.api("n3", "DELETE", "/v1/tenants/t10").status == 204
    listed = c.api("n1", "GET", "/v1/tenants?consistent=true").body["tenants"]
    assert len(listed) == count - 1 and "t10" not in {t["tenant"] for t in listed}
    assert c.api("n1", "DELETE", "/v1/tenants/t10").status == 404
    # Its token still works; a create makes a new record under the flags' quotas.
    create_job(c, "n2", writer)
    again = c.api("n1", "GET", "/v1/tenants/t10?consistent=true").body
    assert (again["jobs"], again["quota"]["jobs_max"]) == (1, None)


def test_creates_per_s_refuses_a_burst_and_lets_creates_through_later(shared_cluster):
    c = shared_cluster
    writer = new_token(c, "t4", "writer")["token"]
    wait_known_everywhere(c, writer)
    put_quota(c, "t4", "n3", creates_per_s=1)
    answers = [c.api("n3", "POST", "/v1/jobs", job_body(), token=writer) for _ in range(4)]
    assert answers[0].status == 201, answers[0]
    refused = [a for a in answers if a.status != 201]
    assert refused, "a burst of four creates at one a second all passed"
    for answer in refused:
        assert_quota_refusal(answer, "creates_per_s")
    wait_until(lambda: c.api("n3", "POST", "/v1/jobs", job_body(), token=writer).status == 201,
               5, "a create to pass again once the bucket refilled")


def test_a_batch_over_a_quota_refuses_only_the_jobs_over_it(shared_cluster):
    c = shared_cluster
    writer = new_token(c, "t5", "writer")["token"]
    wait_known_everywhere(c, writer)
    put_quota(c, "t5", "n1", jobs_max=2)
    answer = c.api("n1", "POST", "/v1/jobs:batchCreate", {"jobs": [job_body()] * 4},
                   token=writer)
    assert answer.status == 200, answer
    results = answer.body["results"]
    assert [r.get("created") for r in results[:2]] == [True, True]
    for result in results[2:]:
        problem = result["error"]
        assert (problem["status"], problem["limit"]) == (429, "jobs_max"), result
        assert problem["retry_after_s"] >= 1


# --- audit ------------------------------------------------------------------------------

def test_the_audit_table_names_who_did_what(shared_cluster, tokens):
    c = shared_cluster
    start = all_audit(c)[-1]["seq"]
    admin = new_token(c, "default", "admin", "auditor")
    wait_known_everywhere(c, admin["token"])
    writer = new_token(c, "t6", "writer", "audited", token=admin["token"])
    wait_known_everywhere(c, writer["token"])
    assert c.api("n1", "PUT", "/v1/tenants/t6", {"jobs_max": 50},
                 token=admin["token"]).status == 200
    job_id = create_job(c, "n1", writer["token"])["job_id"]
    for method, path, body in [("PATCH", f"/v1/jobs/{job_id}", {"name": "renamed"}),
                               ("POST", f"/v1/jobs/{job_id}:pause", None),
                               ("POST", f"/v1/jobs/{job_id}:resume", None),
                               ("DELETE", f"/v1/jobs/{job_id}", None)]:
        assert c.api("n1", method, path, body, token=writer["token"]).status in (200, 204)
    assert c.api("n1", "DELETE", f"/v1/tokens/{writer['token_id']}",
                 token=admin["token"]).status == 204

    seen = [(r["action"], r["subject"], r["actor"]) for r in all_audit(c, after=start)]
    assert ("token.create", admin["token_id"], "bootstrap") in seen
    assert ("token.create", writer["token_id"], admin["token_id"]) in seen
    assert ("tenant.put", "t6", admin["token_id"]) in seen
    for action in ("create", "update", "pause", "resume", "delete"):
        assert (f"job.{action}", job_id, writer["token_id"]) in seen, action
    assert ("token.revoke", writer["token_id"], admin["token_id"]) in seen
    assert {r["tenant"] for r in all_audit(c, after=start) if r["subject"] == job_id} == {"t6"}
    for caller in ("writer", "reader", "worker", "other_writer"):
        assert_problem(c.api("n1", "GET", "/v1/audit", token=tokens[caller]), 403,
                       f"{caller} reading the audit table")


def test_audit_pages_follow_after_and_limit(shared_cluster):
    c = shared_cluster
    start = all_audit(c)[-1]["seq"]
    for jobs_max in range(1, 6):
        assert c.api("n1", "PUT", "/v1/tenants/t7", {"jobs_max": jobs_max}).status == 200
    whole = all_audit(c, after=start)
    assert [r["detail"]["quota"]["jobs_max"] for r in whole] == [1, 2, 3, 4, 5]
    paged, after = [], start
    while True:
        page = c.api("n2", "GET", f"/v1/audit?after={after}&limit=2&consistent=true").body
        assert len(page["records"]) <= 2
        if not page["records"]:
            assert page["next_after"] == after
            break
        paged += page["records"]
        after = page["next_after"]
    assert [r["seq"] for r in paged] == list(range(start + 1, start + 6))
    assert paged == whole
    assert_problem(c.api("n1", "GET", "/v1/audit?limit=0"), 400, "limit 0")
