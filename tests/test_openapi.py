"""The OpenAPI document equals the code: every route and method, its permission and security, every request member the validators take, and the path parameters' shapes; it is served and loads as OpenAPI 3.1."""

from __future__ import annotations

import hashlib
import re
from types import SimpleNamespace

import pytest
import schemathesis
from aiohttp.test_utils import TestClient, TestServer

from raftsched.api import admin, answers, auth, execution, openapi
from raftsched.api import app as api_app
from raftsched.core import backfill, dag, jobspec, spec, tenancy
from raftsched.errors import InvalidInput
from raftsched.testing.http import ADMIN_TOKEN, auth_headers

DOC = openapi.document()
SCHEMAS = DOC["components"]["schemas"]
# aiohttp adds HEAD to every GET route by itself; it answers as GET does, headers only.
IMPLICIT_METHODS = {"HEAD"}


def router_operations() -> set[tuple[str, str]]:
    app = api_app.make_app(object())   # type: ignore[arg-type]
    return {(route.method.lower(), route.resource.canonical)
            for route in app.router.routes() if route.method not in IMPLICIT_METHODS}


def document_operations() -> set[tuple[str, str]]:
    return {(method, path) for path, item in DOC["paths"].items() for method in item}


def test_every_route_is_documented_and_every_documented_route_exists():
    in_router, in_document = router_operations(), document_operations()
    assert in_router - in_document == set(), "routes missing from the document"
    assert in_document - in_router == set(), "documented routes the API does not have"


def test_path_parameters_have_the_route_patterns():
    app = api_app.make_app(object())   # type: ignore[arg-type]
    for route in app.router.routes():
        info = route.resource.get_info()
        if "pattern" not in info or route.method in IMPLICIT_METHODS:
            continue
        documented = DOC["paths"][route.resource.canonical][route.method.lower()]
        for param in documented.get("parameters", []):
            if param["in"] != "path":
                continue
            pattern = param["schema"]["pattern"].removeprefix("^").removesuffix("$")
            assert f"(?P<{param['name']}>{pattern})" in info["pattern"].pattern, \
                (route.resource.canonical, param["name"])


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def members(schema: dict) -> set[str]:
    """The members of an object schema (through a $ref and one level of nullable anyOf)."""
    for variant in schema.get("anyOf", [schema]):
        if "$ref" in variant:
            variant = SCHEMAS[variant["$ref"].rsplit("/", 1)[-1]]
        if variant.get("type") == "object":
            return set(variant["properties"])
    raise AssertionError(f"no object schema in {schema}")


def test_job_bodies_are_generated_from_their_structs():
    """Each shape a job body holds is a component whose members are its Struct's."""
    generated = openapi.generated_schemas()
    assert {"JobCreate", "JobPatch", "HttpTarget", "CommandTarget", "PublishTarget", "Schedule",
            "Retry", "Concurrency", "Misfire", "Alert", "History", "Dag", "DagTask"} \
        <= set(generated)
    for name, schema in generated.items():
        assert SCHEMAS[name] == schema, name
        declared = getattr(spec, name, None) or getattr(answers, name)
        assert set(schema["properties"]) == spec.members(declared), name
    assert members(SCHEMAS["JobCreate"]) == jobspec.CREATE_FIELDS
    assert members(SCHEMAS["JobPatch"]) == jobspec.PATCH_FIELDS
    targets = SCHEMAS["JobCreate"]["properties"]["target"]["anyOf"][0]
    assert set(targets["discriminator"]["mapping"]) == set(jobspec.TARGET_TYPES)


def test_a_member_added_to_a_struct_is_documented(monkeypatch):
    """The document follows the declaration: a new member needs no other edit."""
    class JobPatch(spec.JobPatch):
        colour: str | None = None
    monkeypatch.setitem(openapi.GENERATED, "JobPatch", JobPatch)
    assert "colour" in openapi.generated_schemas()["JobPatch"]["properties"]
    assert "colour" not in SCHEMAS["JobPatch"]["properties"]


@pytest.mark.parametrize("member, validate, valid", [
    ("concurrency", jobspec.validate_concurrency, {"policy": "queue"}),
    ("alert", jobspec.validate_alert, {}),
    ("history", jobspec.validate_history, {}),
    ("misfire", jobspec.validate_misfire, {}),
    ("retry", jobspec.validate_retry, {}),
])
def test_nested_members_are_what_the_validators_take(member, validate, valid):
    """Each documented member is taken, and an undocumented one is refused by name."""
    for name in members(SCHEMAS["JobCreate"]["properties"][member]):
        sample = {"policy": "queue"} if name == "policy" else {name: None}
        try:
            validate(dict(valid, **sample))
        except InvalidInput as exc:
            assert "unknown field" not in exc.detail, (member, name)
    with pytest.raises(InvalidInput, match="unknown field") as exc:
        validate(dict(valid, undocumented=1))
    assert exc.value.field == f"{member}.undocumented"


def test_other_request_bodies_are_the_handlers_field_sets():
    assert members(SCHEMAS["SchedulePreview"]) == api_app.PREVIEW_FIELDS
    assert members(SCHEMAS["WorkerClaim"]) == execution.CLAIM_FIELDS
    assert members(SCHEMAS["WorkerHeartbeat"]["properties"]["runs"]["items"]) == \
        execution.HEARTBEAT_FIELDS
    assert members(SCHEMAS["WorkerComplete"]["properties"]["results"]["items"]) == \
        execution.RESULT_FIELDS
    assert members(SCHEMAS["RunResult"]["properties"]["output"]) == execution.OUTPUT_FIELDS


def test_backfill_members_are_the_validators_field_sets():
    assert members(SCHEMAS["BackfillCreate"]) == backfill.REQUEST_FIELDS
    assert set(SCHEMAS["BackfillCreate"]["properties"]["overlap"]["enum"]) == \
        set(backfill.OVERLAPS)
    assert set(SCHEMAS["Backfill"]["properties"]["state"]["enum"]) == set(backfill.STATES)


def test_dag_members_are_the_validators_field_sets():
    assert members(SCHEMAS["Dag"]) == spec.members(spec.Dag)
    task = SCHEMAS["Dag"]["properties"]["tasks"]["items"]
    assert members(task) == spec.members(spec.DagTask)
    (rules,) = [v["enum"] for v in SCHEMAS["DagTask"]["properties"]["trigger_rule"]["anyOf"]
                if "enum" in v]
    assert set(rules) == set(dag.RULES)
    assert SCHEMAS["Run"]["properties"]["tasks"]["items"] == _ref("TaskView")
    assert set(SCHEMAS["TaskView"]["properties"]["state"]["enum"]) == set(dag.TASK_STATES)


def test_every_error_answer_is_a_problem():
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert response["content"] == {"application/problem+json": {
                        "schema": {"$ref": "#/components/schemas/Problem"}}}, (method, path)
    problem = SCHEMAS["Problem"]["properties"]
    assert {"type", "title", "status", "detail", "field", "limit"} <= set(problem)


def test_the_document_loads_as_openapi_3_1():
    schema = schemathesis.openapi.from_dict(DOC)
    loaded = list(schema.get_all_operations())
    assert all(hasattr(result, "ok") for result in loaded), \
        [result.err() for result in loaded if not hasattr(result, "ok")]
    assert len(loaded) == len(document_operations())


def test_ids_match_their_documented_patterns():
    assert re.fullmatch(jobspec.JOB_ID_PATTERN, "job_" + "0a" * 10)
    assert re.fullmatch(jobspec.RUN_ID_PATTERN, "run_" + "0a" * 12)


def test_every_route_has_a_permission_and_no_permission_is_stale():
    in_router = {(method.upper(), path) for method, path in router_operations()}
    assert in_router - set(auth.PERMISSIONS) == set(), "routes without a permission"
    assert set(auth.PERMISSIONS) - in_router == set(), "permissions of no route"
    assert set(auth.PERMISSIONS.values()) <= {"public", *auth.GRANTS["admin"]}


def test_every_operation_but_the_public_ones_takes_a_bearer_token():
    scheme = DOC["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    public = {(m.lower(), p) for (m, p), need in auth.PERMISSIONS.items() if need == "public"}
    assert ("get", "/v1/healthz") in public
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            if (method, path) in public:
                assert operation["security"] == [], (method, path)
                assert "401" not in responses and "403" not in responses, (method, path)
                continue
            assert operation["security"] == [{"bearer": []}], (method, path)
            assert set(responses["401"]["headers"]) == {"WWW-Authenticate"}, (method, path)
            assert "403" in responses, (method, path)


def test_tenant_scoped_operations_take_the_tenant_parameter():
    for (method, path), need in auth.PERMISSIONS.items():
        params = DOC["paths"][path][method.lower()].get("parameters", [])
        tenant = [p for p in params if p["name"] == "tenant" and p["in"] == "query"]
        if need in ("read", "write", "work"):
            assert len(tenant) == 1, (method, path)
            assert tenant[0]["schema"]["pattern"] == f"^{auth.TENANT_RE.pattern}$"
            assert "admin only" in tenant[0]["description"]


def test_creates_document_429_with_retry_after():
    create = DOC["paths"]["/v1/jobs"]["post"]["responses"]["429"]
    assert set(create["headers"]) == {"Retry-After"}
    batch = DOC["paths"]["/v1/jobs:batchCreate"]["post"]["responses"]["200"]
    assert "429" in batch["description"]
    assert "retry_after_s" in SCHEMAS["Problem"]["properties"]


def test_priority_is_documented_with_the_validators_values():
    for name in ("JobCreate", "JobPatch"):
        (values,) = [v["enum"] for v in SCHEMAS[name]["properties"]["priority"]["anyOf"]
                     if "enum" in v]
        assert set(values) == set(jobspec.PRIORITIES)
    assert set(SCHEMAS["Job"]["properties"]["priority"]["enum"]) == set(jobspec.PRIORITIES)


def test_admin_bodies_are_the_handlers_field_sets():
    assert members(SCHEMAS["TokenCreate"]) == admin.TOKEN_FIELDS
    assert set(SCHEMAS["TokenCreate"]["properties"]["role"]["enum"]) == set(tenancy.ROLES)
    assert members(SCHEMAS["TenantQuota"]) == admin.TENANT_FIELDS
    assert admin.TENANT_FIELDS == {*tenancy.QUOTA_NAMES, "commands"}
    assert "token" in SCHEMAS["TokenCreated"]["required"]
    assert "token" not in SCHEMAS["Token"]["properties"]
    assert "sha256" not in SCHEMAS["Token"]["properties"]


def _app_without_a_cluster():
    """The app over a stand-in node that knows only the bootstrap admin token."""
    config = SimpleNamespace(insecure_no_auth=False,
                             admin_token_sha256=hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest())
    return api_app.make_app(SimpleNamespace(config=config))  # type: ignore[arg-type]


async def test_the_document_is_served():
    async with TestClient(TestServer(_app_without_a_cluster())) as client:
        response = await client.get("/v1/openapi.json", headers=auth_headers())
        assert response.status == 200
        assert response.content_type == "application/json"
        assert await response.json() == DOC
        refused = await client.get("/v1/openapi.json")
        assert refused.status == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
