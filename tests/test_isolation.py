"""Tenants stay apart at the API's edges: a hand-made page token or cursor is a 400 problem naming it on every route that pages (never a 500) and another tenant's shows nothing of that tenant; the node's metrics and cluster views, which count and name every tenant's work, need an operator's or admin's token; and admin and operator tokens are the cluster's, made for the default tenant only."""

from __future__ import annotations

import base64
import json
import secrets

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer

from raftsched.api import auth
from raftsched.api.app import make_app
from raftsched.api.history import encode_token, filters_digest
from raftsched.core import commands
from raftsched.testing.inprocess import ReplicaPort
from raftsched.testing.replica import Replica

ADMIN_TEXT = "bootstrap-admin-token-" + "x" * 24
NOW_MS = 1_796_000_000_000   # late 2026


class _Port(ReplicaPort):
    """A node port over a replica, with authentication on: proposals are
    applied at once."""

    def __init__(self, log: Replica) -> None:
        super().__init__(log, quota={"jobs_max": 1000, "creates_per_s": 1000},
                         insecure_no_auth=False,
                         admin_token_sha256=auth.token_sha256(ADMIN_TEXT))
        self.log = log

    def wall_us(self) -> int:
        return NOW_MS * 1000

    def metrics_text(self) -> bytes:
        return b'raftsched_dispatch_queue_depth{tenant="t2"} 7.0\n'


def _mint(log: Replica, tenant: str, role: str) -> str:
    token_id, text = auth.new_token()
    result = log.run(commands.create_token(token_id=token_id, tenant=tenant, role=role,
                                           name="test", sha256=auth.token_sha256(text),
                                           actor=None, at_ms=NOW_MS))
    assert result["ok"], result
    return text


def _bearer(text: str) -> dict:
    return {"Authorization": f"Bearer {text}"}


@pytest.fixture
async def api():
    """(client, port, tokens by name): tenants t1 and t2, each with a job."""
    log = Replica()
    port = _Port(log)
    tokens = {"admin": ADMIN_TEXT}
    for tenant in ("t1", "t2"):
        for role in ("reader", "writer", "worker"):
            tokens[f"{tenant}_{role}"] = _mint(log, tenant, role)
    tokens["operator"] = _mint(log, "default", "operator")
    async with TestClient(TestServer(make_app(port))) as client:
        for tenant in ("t1", "t2"):
            for _ in range(3):
                created = await client.post("/v1/jobs", headers=_bearer(tokens[f"{tenant}_writer"]),
                                            json={"run_at": "2030-01-01T00:00:00Z",
                                                  "target": {"type": "http",
                                                             "url": "https://h.example/x"}})
                assert created.status == 201, await created.text()
        yield client, port, tokens


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _json_token(*items: object) -> str:
    return _b64(json.dumps(list(items)).encode())


def hostile_tokens(kind: str, filters: dict) -> dict[str, str]:
    """Page tokens this API never gave out, by what is wrong with them."""
    digest = filters_digest(filters)
    return {
        "random base64": _b64(secrets.token_bytes(48)),
        "not base64": "!!not*base64!!",
        "non-ascii": "\u00e9t\u00e9",
        "one char": "A",
        "too long": "A" * 4096,
        "msgpack garbage": _b64(msgpack.packb({"v": 1, "after": [1, 2, 3]})),
        "json object": _b64(b'{"position": 1}'),
        "json string": _b64(b'"jobs"'),
        "json number": _b64(b"1e999"),
        "nested deep": _b64(b"[" * 300 + b"]" * 300),
        "version 2": _json_token(2, kind, digest, "x"),
        "other kind": _json_token(1, "runs" if kind == "jobs" else "jobs", digest, "x"),
        "other filters": _json_token(1, kind, "0" * 16, "x"),
        "no position": _json_token(1, kind, digest),
        "null position": _json_token(1, kind, digest, None),
        "object position": _json_token(1, kind, digest, {"a": 1}),
        "bool position": _json_token(1, kind, digest, True, "job_x"),
        "huge int": _json_token(1, kind, digest, 10 ** 40, "run_x"),
        "negative int": _json_token(1, kind, digest, -1, "run_x"),
        "float": _json_token(1, kind, digest, 1.5, "run_x"),
        "big float": _json_token(1, kind, digest, 1e300, "run_x"),
        "long string": _json_token(1, kind, digest, "j" * 300),
        "nul in string": _json_token(1, kind, digest, "job_\u0000"),
        "surrogate": _b64(b'[1, "' + kind.encode() + b'", "' + digest.encode()
                          + b'", "\\ud800"]'),
        "ints for strings": _json_token(1, kind, digest, 5, 5),
        "too many": _json_token(1, kind, digest, 5, "run_x", "extra"),
    }


PAGED_ROUTES = [("/v1/jobs", "jobs", "page_token"), ("/v1/runs", "runs", "page_token")]


async def _assert_problem_400(response, field: str, what: str) -> None:
    body = await response.text()
    assert response.status == 400, f"{what}: {response.status} {body[:300]}"
    assert response.headers["Content-Type"].startswith("application/problem+json"), what
    problem = json.loads(body)
    assert problem["field"] == field, what
    assert "Traceback" not in body, what


@pytest.mark.parametrize("path, kind, param", PAGED_ROUTES)
async def test_a_hand_made_page_token_is_a_400_naming_it_on_every_paged_route(api, path, kind,
                                                                           param):
    client, _, tokens = api
    wrong = []
    for name, token in hostile_tokens(kind, {}).items():
        response = await client.get(path, params={param: token},
                                    headers=_bearer(tokens["t1_reader"]))
        try:
            await _assert_problem_400(response, param, f"{path} {name}")
        except AssertionError as exc:
            wrong.append(str(exc).splitlines()[0])
    assert not wrong, "\n".join(wrong)


async def test_the_other_cursors_refuse_hand_made_values_with_a_400(api):
    client, _, tokens = api
    cases = [("/v1/jobs", "cursor", tokens["t1_reader"]),
             ("/v1/audit", "after", tokens["admin"]),
             ("/v1/topics/t/messages", "after", tokens["t1_reader"])]
    for path, param, token in cases:
        for value in ("-1", "1e3", "abc", "9" * 40, "\u0661", "0x10", " 1", "", "1.5"):
            response = await client.get(path, params={param: value}, headers=_bearer(token))
            if param == "cursor" and value == "":
                assert response.status == 200   # an empty cursor is no cursor
                continue
            await _assert_problem_400(response, param, f"{path} {param}={value!r}")


async def test_another_tenants_page_token_shows_nothing_of_that_tenant(api):
    client, port, tokens = api
    first = await client.get("/v1/jobs", params={"limit": "1"},
                             headers=_bearer(tokens["t2_reader"]))
    page = await first.json()
    assert page["next_page_token"]
    theirs = {j["job_id"] for j in (await (await client.get(
        "/v1/jobs", headers=_bearer(tokens["t2_reader"]))).json())["jobs"]}
    mine = await client.get("/v1/jobs", params={"page_token": page["next_page_token"]},
                            headers=_bearer(tokens["t1_reader"]))
    assert mine.status == 200
    assert not {j["job_id"] for j in (await mine.json())["jobs"]} & theirs
    # A valid-looking position naming the other tenant's job is just a place to start.
    after = encode_token("jobs", {}, [sorted(theirs)[0]])
    mine = await client.get("/v1/jobs", params={"page_token": after},
                            headers=_bearer(tokens["t1_reader"]))
    assert mine.status == 200
    assert not {j["job_id"] for j in (await mine.json())["jobs"]} & theirs


# --- metrics and cluster views -------------------------------------------------------------

CLUSTER_VIEWS = ("/metrics", "/v1/cluster", "/v1/cluster/shards", "/v1/node")


@pytest.mark.parametrize("path", CLUSTER_VIEWS)
async def test_a_tenants_tokens_may_not_read_the_metrics_or_cluster_views(api, path):
    client, _, tokens = api
    for name in ("t1_reader", "t1_writer", "t1_worker"):
        response = await client.get(path, headers=_bearer(tokens[name]))
        assert response.status == 403, (path, name, response.status)
        assert response.headers["Content-Type"].startswith("application/problem+json")
        assert "t2" not in await response.text()


async def test_an_operator_reads_the_metrics_and_nothing_of_any_tenant(api):
    client, port, tokens = api
    response = await client.get("/metrics", headers=_bearer(tokens["operator"]))
    assert response.status == 200
    assert 'tenant="t2"' in await response.text()
    for path in ("/v1/jobs", "/v1/runs", "/v1/tokens", "/v1/audit"):
        response = await client.get(path, headers=_bearer(tokens["operator"]))
        assert response.status == 403, path
    response = await client.get("/v1/jobs", params={"tenant": "t1"},
                                headers=_bearer(tokens["operator"]))
    assert response.status == 403
    # The node's clock holds nothing of any tenant: any token reads it (peers do),
    # with the Raft role and commit index a follower's consistent read asks for.
    response = await client.get("/v1/node/clock", headers=_bearer(tokens["t1_reader"]))
    assert response.status == 200
    clock = await response.json()
    assert clock["role"] == "leader" and clock["commit_index"] == port.applied_index()


# --- admin tokens are the cluster's ------------------------------------------------------------

@pytest.mark.parametrize("role", ["admin", "operator"])
async def test_a_cluster_role_token_for_a_tenant_is_refused_naming_the_role(api, role):
    client, port, tokens = api
    before = len(port.tokens())
    response = await client.post("/v1/tokens", headers=_bearer(tokens["admin"]),
                                 json={"tenant": "t1", "role": role, "name": "t1-admin"})
    await _assert_problem_400(response, "role", f"{role} for t1")
    assert len(port.tokens()) == before
    made = await client.post("/v1/tokens", headers=_bearer(tokens["admin"]),
                             json={"tenant": "default", "role": role, "name": "ops"})
    assert made.status == 201
    # Acting for t1 (?tenant=t1) makes the token t1's: refused alike.
    response = await client.post("/v1/tokens", params={"tenant": "t1"},
                                 headers=_bearer(tokens["admin"]),
                                 json={"role": role, "name": "t1-admin"})
    await _assert_problem_400(response, "role", f"{role} acting for t1")


async def test_an_admin_token_made_for_a_tenant_before_the_rule_acts_for_no_tenant(api):
    client, port, tokens = api
    stale = _mint(port.log, "t1", "admin")
    for path, params in [("/v1/jobs", {"tenant": "t2"}), ("/v1/jobs", {}), ("/v1/tokens", {}),
                         ("/v1/tenants", {}), ("/metrics", {})]:
        response = await client.get(path, params=params, headers=_bearer(stale))
        assert response.status == 403, (path, params, response.status)
        assert "default" in (await response.json())["detail"]
    # Revoking it is how the operator clears it.
    token_id = next(t["id"] for t in port.tokens() if t["role"] == "admin")
    assert (await client.delete(f"/v1/tokens/{token_id}",
                                headers=_bearer(tokens["admin"]))).status == 204


# --- secrets through the API ----------------------------------------------------------------

SECRET = "Bearer s3cret-value-123"


async def test_a_patch_that_would_reveal_or_move_a_secret_is_a_400_naming_the_member(api):
    client, _, tokens = api
    writer = _bearer(tokens["t1_writer"])
    created = await client.post("/v1/jobs", headers=writer, json={
        "run_at": "2030-01-01T00:00:00Z", "secret_keys": ["X-Key"],
        "target": {"type": "http", "url": "https://h.example/x",
                   "headers": {"Authorization": SECRET, "X-Key": "key-value-456"}}})
    job = await created.json()
    path = f"/v1/jobs/{job['job_id']}"
    read = job["target"]
    cases = [
        ({"secret_keys": []}, "secret_keys"),
        ({"target": read, "secret_keys": []}, "target.headers.X-Key"),
        ({"target": dict(read, url="https://attacker.example/x")},
         "target.headers.Authorization"),
        ({"target": dict(read, url="https://h.example:8443/x")}, "target.headers.Authorization"),
    ]
    for body, field in cases:
        response = await client.patch(path, headers=writer, json=body)
        await _assert_problem_400(response, field, json.dumps(body))
        assert SECRET not in await response.text()
    for reader in (tokens["t1_reader"], tokens["t1_writer"]):
        text = await (await client.get(path, headers=_bearer(reader))).text()
        assert "s3cret" not in text and "key-value" not in text
    # The same origin, another path: the secrets stay, still masked.
    moved = await client.patch(path, headers=writer,
                               json={"target": dict(read, url="https://h.example/y")})
    assert moved.status == 200
    assert (await moved.json())["target"]["headers"] == {"Authorization": "***",
                                                         "X-Key": "***"}
