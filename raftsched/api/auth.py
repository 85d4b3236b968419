"""Who is calling, and what they may do: bearer tokens, roles and tenants.

Every route names the permission it needs (PERMISSIONS, kept equal to the
router by tests/test_auth.py). A request without a token, or with one the
cluster does not know (never created, or revoked), is a 401; a token whose
role does not grant the permission is a 403.

    public  no token: GET /v1/healthz, the UI's static shell
    any     any valid token: the node's clock, the OpenAPI document
    read    reader, writer, admin: jobs, runs, logs and topics of the tenant
    write   writer, admin: create, change and delete jobs; cancel and retry runs;
            commit offsets
    work    worker, admin: claim, heartbeat and complete runs of the tenant's queues
    operate operator, admin: the node's metrics and the cluster and node views,
            which count and name every tenant's work
    admin   admin: tokens, tenants and quotas, the audit table, cluster operations

Admin and operator tokens are the cluster's: they are made for the default
tenant only (POST /v1/tokens refuses another), and one of another tenant made
before that rule is refused (403) rather than acting for every tenant.

A token belongs to one tenant and acts for it. An admin acts for any tenant
with `?tenant=NAME` (its own when not given); any other role giving another
tenant's name is a 403.

The admin token the nodes were started with (RAFTSCHED_ADMIN_TOKEN or
--admin-token-file) is not in the replicated state: it is the way in to a new
cluster and acts as token id `bootstrap` of tenant `default`. Nodes never send
it to each other: they call with the node credential (runtime/peer.py, derived
from the Raft secret), whose `node` role may call only PEER_ROUTES, each with
the query it needs. `--insecure-no-auth` turns all of this off: every request
is an admin's.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from raftsched import limits
from raftsched.api.common import node_of
from raftsched.core.tenancy import CLUSTER_ROLES, CLUSTER_TENANT
from raftsched.errors import Forbidden, InvalidInput, Unauthorized

log = logging.getLogger(__name__)

PRINCIPAL_KEY = web.RequestKey("principal", object)
BOOTSTRAP_ID = "bootstrap"
NODE_ID = "node"
NODE_ROLE = "node"
INSECURE_ID = "insecure"
DEFAULT_TENANT = CLUSTER_TENANT
TENANT_RE = re.compile(limits.tenant_name_pattern)
TOKEN_RE = re.compile(r"rst_([0-9a-f]{16})_([A-Za-z0-9_-]{20,100})")

GRANTS = {
    "admin": {"any", "read", "write", "work", "operate", "admin"},
    "writer": {"any", "read", "write"},
    "reader": {"any", "read"},
    "worker": {"any", "work"},
    "operator": {"any", "operate"},
}


@dataclass(frozen=True)
class Principal:
    token_id: str
    tenant: str          # the tenant the request acts for
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def principal(request: web.Request) -> Principal:
    return request[PRINCIPAL_KEY]  # type: ignore[return-value]


def tenant_of(request: web.Request) -> str:
    return principal(request).tenant


def actor_of(request: web.Request) -> str:
    return principal(request).token_id


def token_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(token_id, token text): 64 random bits of id, token_secret_bytes of secret."""
    token_id = secrets.token_hex(8)
    return "tok_" + token_id, f"rst_{token_id}_{secrets.token_urlsafe(limits.token_secret_bytes)}"


def validate_tenant(value: object, field: str = "tenant") -> str:
    if not isinstance(value, str) or not TENANT_RE.fullmatch(value):
        raise InvalidInput(f"`{field}` must be 1-63 of a-z, 0-9, _ and -, starting with a "
                           f"letter or digit", field=field, limit="tenant_bytes_max")
    return value


def _bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization")
    if header is None:
        raise Unauthorized("this route needs Authorization: Bearer <token>")
    scheme, _, text = header.partition(" ")
    if scheme.lower() != "bearer" or not text.strip():
        raise Unauthorized("the Authorization header must be `Bearer <token>`")
    return text.strip()


def authenticate(request: web.Request) -> tuple[str, str, str]:
    """(token_id, tenant, role) of the request's token, or Unauthorized."""
    node = node_of(request)
    text = _bearer(request)
    digest = token_sha256(text)
    bootstrap = node.config.admin_token_sha256
    if bootstrap is not None and hmac.compare_digest(digest, bootstrap):
        return BOOTSTRAP_ID, DEFAULT_TENANT, "admin"
    peer = node.config.node_credential_sha256
    if peer is not None and hmac.compare_digest(digest, peer):
        return NODE_ID, DEFAULT_TENANT, NODE_ROLE
    match = TOKEN_RE.fullmatch(text)
    record = node.token("tok_" + match.group(1)) if match else None
    if record is None or not hmac.compare_digest(digest, record["sha256"]):
        raise Unauthorized("the bearer token is not known to this cluster (never created, "
                           "or revoked)")
    if record["role"] in CLUSTER_ROLES and record["tenant"] != CLUSTER_TENANT:
        # Made before such tokens were refused: it would act for every tenant.
        log.warning("refused %s token %s of tenant %r: such a token is the cluster's and is "
                    "made for tenant %r only; revoke it (DELETE /v1/tokens/%s)",
                    record["role"], record["id"], record["tenant"], CLUSTER_TENANT,
                    record["id"])
        raise Forbidden(f"an {record['role']} token made for tenant {record['tenant']!r} acts "
                        f"for no tenant: {record['role']} tokens are the cluster's and are "
                        f"made for tenant {CLUSTER_TENANT!r} only")
    return record["id"], record["tenant"], record["role"]


def _acting_tenant(request: web.Request, own: str, role: str) -> str:
    asked = request.query.get("tenant")
    if asked is None or asked == own:
        return own
    validate_tenant(asked)
    if role != "admin":
        raise Forbidden(f"a {role} token acts only for its tenant {own!r}", field="tenant")
    return asked


@web.middleware
async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    route = request.match_info.route
    resource = route.resource
    method = "GET" if route.method == "HEAD" else route.method
    need = PERMISSIONS.get((method, resource.canonical)) if resource is not None else None
    if need == "public" or resource is None:
        return await handler(request)   # public, or no such route (the 404/405 follows)
    if need is None:
        raise Forbidden(f"{request.method} {resource.canonical} has no permission set; "
                        f"refused")
    node = node_of(request)
    if node.config.insecure_no_auth:
        token_id, own, role = INSECURE_ID, DEFAULT_TENANT, "admin"
    else:
        token_id, own, role = authenticate(request)
    if role == NODE_ROLE:
        _check_peer_call(request, method, resource.canonical)
    elif need not in GRANTS[role]:
        raise Forbidden(f"a {role} token may not {request.method} {resource.canonical} "
                        f"(needs {need})")
    request[PRINCIPAL_KEY] = Principal(token_id, _acting_tenant(request, own, role), role)
    return await handler(request)


def _check_peer_call(request: web.Request, method: str, template: str) -> None:
    """A node credential may call a peer route, with that route's query, only."""
    query = PEER_ROUTES.get((method, template))
    if query is None:
        raise Forbidden(f"the node credential may not {request.method} {template} (it may "
                        f"call only the routes nodes call on each other)")
    for name, value in query.items():
        if request.query.get(name) != value:
            raise Forbidden(f"with the node credential, {template} needs `{name}={value}`",
                            field=name)
    if "tenant" in request.query:
        raise Forbidden("the node credential acts for no tenant", field="tenant")


# What nodes call on each other (runtime/peer.py), with the query each call
# must carry: a node's status (commit index, storage; GET /v1/cluster), its
# clock (runtime/clock.py), and the run output it keeps (only its own store:
# the node that asked checked the caller's tenant).
PEER_ROUTES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/v1/node"): {},
    ("GET", "/v1/node/clock"): {},
    ("GET", "/v1/runs/{run_id}/logs"): {"local": "true"},
}

# (method, route template) -> permission. Every route the app adds is here.
PERMISSIONS: dict[tuple[str, str], str] = {
    ("GET", "/"): "public",
    ("GET", "/ui/{file}"): "public",
    ("GET", "/healthz"): "public",
    ("GET", "/v1/healthz"): "public",
    ("GET", "/v1/openapi.json"): "any",
    ("POST", "/v1/jobs"): "write",
    ("POST", "/v1/jobs:batchCreate"): "write",
    ("GET", "/v1/jobs"): "read",
    ("GET", "/v1/jobs/{job_id}"): "read",
    ("PATCH", "/v1/jobs/{job_id}"): "write",
    ("DELETE", "/v1/jobs/{job_id}"): "write",
    ("POST", "/v1/jobs/{job_id}:pause"): "write",
    ("POST", "/v1/jobs/{job_id}:resume"): "write",
    ("POST", "/v1/jobs/{job_id}:trigger"): "write",
    ("GET", "/v1/jobs/{job_id}/runs"): "read",
    ("GET", "/v1/jobs/{job_id}/preview"): "read",
    ("POST", "/v1/jobs/{job_id}:backfill"): "write",
    ("GET", "/v1/backfills/{backfill_id}"): "read",
    ("POST", "/v1/backfills/{backfill_id}:cancel"): "write",
    ("GET", "/v1/runs/{run_id}"): "read",
    ("POST", "/v1/runs/{run_id}:cancel"): "write",
    ("POST", "/v1/runs/{run_id}:retry"): "write",
    ("GET", "/v1/runs"): "read",
    ("GET", "/v1/runs/{run_id}/logs"): "read",
    ("POST", "/v1/schedules:preview"): "read",
    ("GET", "/v1/topics/{topic}/messages"): "read",
    ("GET", "/v1/topics/{topic}/groups/{group}"): "read",
    ("PUT", "/v1/topics/{topic}/groups/{group}"): "write",
    ("POST", "/v1/workers/{worker_id}/claim"): "work",
    ("POST", "/v1/workers/{worker_id}/heartbeat"): "work",
    ("POST", "/v1/workers/{worker_id}/complete"): "work",
    ("GET", "/v1/cluster"): "operate",
    ("GET", "/v1/cluster/shards"): "operate",
    ("GET", "/v1/node"): "operate",
    ("GET", "/v1/node/clock"): "any",
    ("GET", "/metrics"): "operate",
    ("GET", "/v1/state/digest"): "admin",
    ("POST", "/v1/state/digest:check"): "admin",
    ("POST", "/v1/tokens"): "admin",
    ("GET", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin",
    ("GET", "/v1/tenants"): "admin",
    ("GET", "/v1/tenants/{tenant}"): "admin",
    ("PUT", "/v1/tenants/{tenant}"): "admin",
    ("DELETE", "/v1/tenants/{tenant}"): "admin",
    ("GET", "/v1/audit"): "admin",
}
