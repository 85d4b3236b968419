"""Admin routes: tokens, tenants and their quotas, and the audit table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from raftsched import limits
from raftsched.api.auth import actor_of, new_token, principal, token_sha256, validate_tenant
from raftsched.api.common import (int_param, json_body, json_response, maybe_consistent,
                                  node_of, raise_refusal)
from raftsched.core import commands, spec, tenancy
from raftsched.core.tenancy import CLUSTER_ROLES, CLUSTER_TENANT, QUOTA_NAMES
from raftsched.core.timeutil import format_ms
from raftsched.errors import InvalidInput

if TYPE_CHECKING:
    from raftsched.nodeport import NodePort

TOKEN_ID = "{token_id:tok_[0-9a-f]{16}}"
TENANT = "{tenant:[^/]+}"
TOKEN_FIELDS = spec.members(spec.TokenCreate)
# PUT /v1/tenants/{tenant}: the quotas, and the command grant.
TENANT_FIELDS = spec.members(spec.TenantQuota)


def token_view(record: dict) -> dict:
    return {"token_id": record["id"], "tenant": record["tenant"], "role": record["role"],
            "name": record["name"], "created_at": format_ms(record["created_ms"]),
            "created_by": record["created_by"]}


# --- tokens -----------------------------------------------------------------------------

async def create_token(request: web.Request) -> web.Response:
    node = node_of(request)
    body = spec.check_shape(await json_body(request), spec.TokenCreate)
    tenant = validate_tenant(body.tenant or principal(request).tenant)
    role = body.role
    if role in CLUSTER_ROLES and tenant != CLUSTER_TENANT:
        raise InvalidInput(f"an {role} token is the cluster's, not a tenant's: make it for "
                           f"tenant {CLUSTER_TENANT!r}; a tenant's own tokens are writer, "
                           "reader and worker", field="role")
    name = body.name
    if len(name.encode("utf-8", "surrogatepass")) > limits.token_name_bytes_max:
        raise InvalidInput(f"`name` is a string of at most {limits.token_name_bytes_max} bytes",
                           field="name", limit="token_name_bytes_max")
    token_id, text = new_token()
    result = await node.propose(commands.create_token(
        token_id=token_id, tenant=tenant, role=role, name=name, sha256=token_sha256(text),
        actor=actor_of(request), at_ms=node.now_ms()))
    raise_refusal(result, field="token")
    # The only time the token's text is shown: the state keeps its hash.
    return json_response(dict(token_view(result["token"]), token=text), status=201)


async def list_tokens(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    only = request.query.get("tenant")
    tokens = [token_view(rec) for rec in node.tokens()
              if only is None or rec["tenant"] == only]
    return json_response({"tokens": tokens})


async def revoke_token(request: web.Request) -> web.Response:
    node = node_of(request)
    result = await node.propose(commands.revoke_token(
        token_id=request.match_info["token_id"], actor=actor_of(request), at_ms=node.now_ms()))
    raise_refusal(result, field="token_id")
    return web.Response(status=204)


# --- tenants ----------------------------------------------------------------------------

def tenant_view(node: "NodePort", name: str, record: dict | None) -> dict:
    own = (record or {}).get("quota") or {}
    return {"tenant": name, "quota": {q: own.get(q) for q in QUOTA_NAMES},
            "in_force": node.quota_of(name),
            "jobs": (record or {}).get("jobs", 0),
            "commands": tenancy.commands_granted(record)}


async def put_tenant(request: web.Request) -> web.Response:
    node = node_of(request)
    tenant = validate_tenant(request.match_info["tenant"])
    body = spec.check_shape(await json_body(request), spec.TenantQuota)
    # null: the node's default for this quota.
    quota = {name: getattr(body, name) for name in QUOTA_NAMES}
    result = await node.propose(commands.put_tenant(tenant=tenant, quota=quota,
                                                    actor=actor_of(request),
                                                    at_ms=node.now_ms(), commands=body.commands))
    raise_refusal(result, field="tenant")
    node.forget_quota(tenant)
    return json_response(tenant_view(node, tenant, result["tenant"]))


async def delete_tenant(request: web.Request) -> web.Response:
    node = node_of(request)
    tenant = validate_tenant(request.match_info["tenant"])
    result = await node.propose(commands.delete_tenant(tenant=tenant, actor=actor_of(request),
                                                       at_ms=node.now_ms()))
    raise_refusal(result, field="tenant")
    node.forget_quota(tenant)
    return web.Response(status=204)


async def get_tenant(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    tenant = validate_tenant(request.match_info["tenant"])
    return json_response(tenant_view(node, tenant, node.tenant(tenant)))


async def list_tenants(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    rows = node.tenants()
    return json_response({"tenants": [tenant_view(node, name, rec) for name, rec in rows]})


# --- audit ------------------------------------------------------------------------------

async def list_audit(request: web.Request) -> web.Response:
    """Records after seq `after` (0: from the oldest kept), oldest first."""
    node = node_of(request)
    await maybe_consistent(request)
    limit = int_param(request, "limit", limits.list_limit_default, limits.audit_list_limit_max,
                      limit="audit_list_limit_max")
    after = request.query.get("after", "0")
    if len(after) > 19 or not (after.isascii() and after.isdigit()) \
            or int(after) >= limits.command_int_max:
        raise InvalidInput("`after` is a record's seq, an integer of 0 or more", field="after")
    records = [{"seq": r["seq"], "at": format_ms(r["at_ms"]), "actor": r["actor"],
                "action": r["action"], "tenant": r["tenant"], "subject": r["subject"],
                "detail": r["detail"]} for r in node.audit_after(int(after), limit)]
    return json_response({"records": records,
                          "next_after": records[-1]["seq"] if records else int(after)})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/tokens", create_token)
    router.add_get("/v1/tokens", list_tokens)
    router.add_delete(f"/v1/tokens/{TOKEN_ID}", revoke_token)
    router.add_get("/v1/tenants", list_tenants)
    router.add_get(f"/v1/tenants/{TENANT}", get_tenant)
    router.add_put(f"/v1/tenants/{TENANT}", put_tenant)
    router.add_delete(f"/v1/tenants/{TENANT}", delete_tenant)
    router.add_get("/v1/audit", list_audit)
