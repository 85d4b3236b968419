"""The OpenAPI 3.1 description of the HTTP API, served at GET /v1/openapi.json.

The schemas are generated (msgspec.json.schema_components) from the Structs
that declare the bodies: the requests' in core/spec.py, which the handlers
check bodies against, and the answers' in api/answers.py, which the views'
output is tested against. What is written here is the route table: each
path and method, its parameters, which Struct is its request and its
answers, and its error statuses (problem+json). tests/test_openapi.py keeps
the paths and methods equal to the aiohttp router. Who may call an operation
comes from api/auth.py's PERMISSIONS: every operation but the public ones
takes a bearer token and may answer 401 and 403.

Request schemas describe the shape; the hooks also check what a schema
cannot say (a cron expression's syntax, a time zone's existence, a byte length
of UTF-8), and answer 400 naming the field when it is wrong.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from raftsched import limits
from raftsched.api import answers, auth, history
from raftsched.core import backfill, jobspec, spec
from raftsched.core.tenancy import ROLES

Schema = dict[str, Any]

NAME_TOKEN_PATTERN = "^[A-Za-z0-9._-]+$"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), *,
         closed: bool = True, **extra: Any) -> Schema:
    """An object schema. `closed`: members not listed are refused (the validators
    answer 400 naming them), so additionalProperties is false."""
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


_STR: Schema = {"type": "string"}
_INT: Schema = {"type": "integer"}
_BOOL: Schema = {"type": "boolean"}
_ANY: Schema = {}
_TIME: Schema = {"type": "string", "description": "RFC 3339 with an offset"}
# A time a request gives: from 1970 to timestamp_ms_max (9999-12-30T00:00:00Z).
_TIME_IN: Schema = {"type": "string", "format": "date-time",
                    "description": "RFC 3339 with an offset, from 1970 to 9999-12-30"}
_TIME_OR_NULL: Schema = {"type": ["string", "null"]}
_STR_OR_NULL: Schema = {"type": ["string", "null"]}
_INT_OR_NULL: Schema = {"type": ["integer", "null"]}


def _token(max_bytes: int) -> Schema:
    return {"type": "string", "pattern": NAME_TOKEN_PATTERN, "minLength": 1,
            "maxLength": max_bytes}


# --- request bodies ---------------------------------------------------------------------

JOB_EXAMPLES = [
    {"name": "nightly-settlement",
     "schedule": {"cron": "0 2 * * *", "timezone": "Asia/Kolkata"},
     "target": {"type": "http", "url": "https://payments.example/settle", "method": "POST",
                "headers": {"Authorization": "Bearer ..."}, "body": {"region": "in"},
                "timeout_s": 30},
     "retry": {"max_attempts": 5, "backoff": "exponential"},
     "concurrency": "skip_if_running", "misfire": {"policy": "fire_once"},
     "idempotency_key": "settlement-nightly", "metadata": {"team": "payments"}},
    {"run_at": "2026-10-11T02:00:00+05:30",
     "target": {"type": "http", "url": "https://hooks.example/remind"}},
    {"name": "hourly-backup", "schedule": {"every": "1h"},
     "target": {"type": "command", "argv": ["/usr/local/bin/backup.sh"], "queue": "backups"},
     "history": {"max_runs": 100}},
    {"schedule": {"cron": "*/15 * * * *"},
     "target": {"type": "publish", "topic": "ticks", "message": {"tick": True}}},
    {"name": "settlement-workflow", "dag": {"tasks": [
        {"id": "ingest", "target": {"type": "http", "url": "https://ledger.example/ingest"}},
        {"id": "fx", "target": {"type": "http", "url": "https://rates.example/fx"},
         "retry": {"max_attempts": 5}},
        {"id": "reconcile", "depends_on": ["ingest", "fx"],
         "target": {"type": "http", "url": "https://ledger.example/reconcile"}},
        {"id": "cleanup", "depends_on": ["reconcile"], "trigger_rule": "all_done",
         "target": {"type": "http", "url": "https://ledger.example/cleanup"}}]}},
]


JOB_PATCH_EXAMPLES = [{"name": "renamed"}, {"schedule": {"every": "2h"}},
                      {"concurrency": "skip_if_running", "retry": {"max_attempts": 5}}]
# The request bodies declared as Structs (core/spec.py): their schemas, and
# those of every shape they hold, are generated from the declarations.
GENERATED = {"JobCreate": spec.JobCreate, "JobPatch": spec.JobPatch,
             "SchedulePreview": spec.SchedulePreview, "BackfillCreate": spec.BackfillCreate,
             "WorkerClaim": spec.WorkerClaim, "WorkerHeartbeat": spec.WorkerHeartbeat,
             "WorkerComplete": spec.WorkerComplete, "TokenCreate": spec.TokenCreate,
             "TenantQuota": spec.TenantQuota, "PauseNote": spec.PauseNote,
             "RunOverlap": spec.RunOverlap, "CancelReason": spec.CancelReason,
             "GroupOffset": spec.GroupOffset}
EXAMPLES = {
    "JobCreate": JOB_EXAMPLES, "JobPatch": JOB_PATCH_EXAMPLES,
    "SchedulePreview": [{"schedule": {"cron": "30 2 * * *", "timezone": "Europe/Berlin"},
                         "after": "2026-03-28T00:00:00Z", "count": 3}],
    "BackfillCreate": [{"start": "2026-01-01T00:00:00Z", "end": "2026-02-01T00:00:00Z",
                        "max_concurrent": 4}],
    "WorkerClaim": [{"queue": "backups", "max": 4, "wait_s": 0}],
    "TokenCreate": [{"tenant": "t1", "role": "writer", "name": "ci"}],
    "TenantQuota": [{"jobs_max": 1000, "creates_per_s": 50}]}


def generated_schemas() -> dict[str, Schema]:
    """The components generated from the request Structs (core/spec.py) and the
    answers' (api/answers.py), by class name."""
    schemas = spec.json_schemas([*GENERATED.values(), *answers.ANSWERS],
                                "#/components/schemas/{name}")
    for name, examples in EXAMPLES.items():
        schemas[name]["examples"] = examples
    schemas["JobPatch"]["minProperties"] = 1
    return schemas


# --- responses ----------------------------------------------------------------------------
# The answers are declared in api/answers.py; only these two variants of one
# answer (a backfill started, or its occurrences listed) are written here.

def _backfill_started() -> Schema:
    started = _obj({"backfill_id": _STR, "occurrences": _INT, "dry_run": {"const": False},
                    "state": _STR}, ("backfill_id", "occurrences"), closed=False)
    listed = _obj({"backfill_id": {"type": "null"}, "occurrences": _INT,
                   "dry_run": {"const": True},
                   "existing": {"type": "integer", "description": "occurrences that already "
                                "have a run: a backfill would not run them again"},
                   "scheduled_for": {"type": "array", "items": _TIME}},
                  ("occurrences", "scheduled_for"), closed=False)
    return {"started": started, "listed": listed}


def _components() -> Schema:
    return {"securitySchemes": {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "a token of POST /v1/tokens, or the nodes' bootstrap admin token"}},
        "schemas": generated_schemas()}


# --- operations ---------------------------------------------------------------------------

ERRORS = {
    400: "Bad input: `field` names the member (dotted path), `limit` the bound exceeded",
    401: "No bearer token, or one this cluster does not know (never created, or revoked)",
    403: "The token's role may not do this, or a token other than an admin's named another "
         "tenant in `tenant`",
    404: "No such job, run, token or route (another tenant's ids answer so too)",
    409: "A conflict: the job changed between read and write, the run is finished, the "
         "idempotency key is reserved, or a bound on what exists is reached (`limit`)",
    413: "The body, or a member of it, is over its limit (named in `limit`)",
    415: "The body is declared as something other than JSON",
    429: "Over a quota of the tenant (`limit` names it: jobs_max, creates_per_s); "
         "Retry-After says when to try again",
    500: "A bug: the node logged it",
    503: "No leader, no quorum, or not committed in time (`reason` says which); "
         "the outcome of a write is unknown, retry it",
    507: "Storage is past its mark (`limit` names it): writes that add state wait",
}
READ_ERRORS = (400, 404, 500, 503)
WRITE_ERRORS = (400, 404, 409, 413, 415, 500, 503, 507)
CREATE_ERRORS = (*WRITE_ERRORS, 429)
AUTH_ERRORS = (401, 403)
_SECONDS = {"type": "integer", "minimum": 1}
ERROR_HEADERS = {
    401: {"WWW-Authenticate": {"description": 'Bearer realm="raftsched"', "schema": _STR}},
    429: {"Retry-After": {"description": "seconds", "schema": _SECONDS}},
    503: {"Retry-After": {"description": "seconds", "schema": _SECONDS}},
}


def _error(status: int) -> Schema:
    response: Schema = {"description": ERRORS[status], "content": {
        "application/problem+json": {"schema": _ref("Problem")}}}
    if status in ERROR_HEADERS:
        response["headers"] = ERROR_HEADERS[status]
    return response


def _json(schema: Schema, description: str) -> Schema:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, responses: dict[int, Schema], *, params: list[Schema] | None = None,
        body: Schema | None = None, body_required: bool = True,
        errors: tuple[int, ...] = READ_ERRORS) -> Schema:
    operation: Schema = {"summary": summary, "responses": {
        **{str(status): response for status, response in responses.items()},
        **{str(status): _error(status) for status in errors}}}
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = {"required": body_required,
                                    "content": {"application/json": {"schema": body}}}
    return operation


def _in_path(name: str, schema: Schema) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _in_query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _limit(maximum: int) -> Schema:
    return _in_query("limit", {"type": "integer", "minimum": 1, "maximum": maximum},
                     "page size")


_TENANT = _in_query("tenant", {"type": "string", "pattern": f"^{limits.tenant_name_pattern}$"},
                    "admin only: act for this tenant (default: the token's own); another "
                    "role naming a tenant other than its own is a 403")
_CONSISTENT = _in_query("consistent", {"type": "string", "enum": ["true", "false"]},
                        "true: answer after this node applied what the leader had committed")
_PAGE_TOKEN = _in_query("page_token", {"type": "string",
                                      "maxLength": limits.page_token_chars_max},
                        "next_page_token of the previous page, with the same filters")
_JOB_ID = _in_path("job_id", {"type": "string", "pattern": f"^{jobspec.JOB_ID_PATTERN}$"})
_RUN_ID = _in_path("run_id", {"type": "string", "pattern": f"^{jobspec.RUN_ID_PATTERN}$"})
_TOPIC = _in_path("topic", _token(limits.topic_bytes_max))
_GROUP = _in_path("group", _token(limits.group_bytes_max))
_WORKER = _in_path("worker_id", _token(limits.worker_id_bytes_max))


def _job_paths() -> dict[str, Schema]:
    job = _json(_ref("Job"), "The job")
    run = _json(_ref("Run"), "The run")
    jobs = _obj({"jobs": {"type": "array", "items": _ref("Job")},
                 "next_page_token": _STR_OR_NULL, "next_cursor": _STR_OR_NULL},
                ("jobs", "next_page_token", "next_cursor"), closed=False)
    runs = _obj({"runs": {"type": "array", "items": _ref("Run")}}, ("runs",), closed=False)
    run_page = _obj({"runs": {"type": "array", "items": _ref("Run")},
                     "next_page_token": _STR_OR_NULL}, ("runs", "next_page_token"),
                    closed=False)
    return {
        "/v1/jobs": {
            "post": _op("Create a job", {201: _json(_ref("Job"), "Created"),
                                         200: _json(_ref("Job"), "The job created earlier "
                                                    "with this idempotency_key")},
                        body=_ref("JobCreate"), errors=CREATE_ERRORS),
            "get": _op("List jobs in id order, filtered", {200: _json(jobs, "A page of jobs")},
                       params=[
                _limit(limits.list_limit_max), _CONSISTENT, _PAGE_TOKEN,
                _in_query("cursor", {"type": "string", "pattern": f"^{jobspec.JOB_ID_PATTERN}$"},
                          "next_cursor of the previous page (an older form of page_token)"),
                _in_query("status", {"type": "string", "enum": list(history.JOB_STATUSES)},
                          "only jobs of this status"),
                _in_query("name_prefix", {"type": "string", "minLength": 1,
                                          "maxLength": limits.job_name_chars_max},
                          "only jobs whose name starts with this"),
                dict(_in_query("label", {"type": "array", "maxItems": limits.label_filters_max,
                                         "items": {"type": "string", "pattern": "^[^:]+:"}},
                               "key:value; repeat for more (all must match)"),
                     explode=True)]),
        },
        "/v1/jobs:batchCreate": {"post": _op(
            "Create up to 1000 jobs, proposed as entries of at most 250 jobs",
            {200: _json(_batch_results(), "One result per job, in order. A job over a quota "
                        "of the tenant gets a 429 problem naming the `limit`, with "
                        "`retry_after_s`; the jobs before it are created")},
            body=_obj({"jobs": {"type": "array", "minItems": 1,
                                "maxItems": limits.batch_create_jobs_max,
                                "items": _ref("JobCreate")}}, ("jobs",),
                      description=f"at most {limits.batch_request_body_bytes_max} bytes"),
            errors=WRITE_ERRORS)},
        "/v1/jobs/{job_id}": {
            "get": _op("Get a job", {200: job}, params=[_JOB_ID, _CONSISTENT]),
            "patch": _op("Change a job", {200: job}, params=[_JOB_ID], body=_ref("JobPatch"),
                         errors=WRITE_ERRORS),
            "delete": _op("Delete a job", {204: {"description": "Deleted"}}, params=[_JOB_ID],
                          errors=WRITE_ERRORS),
        },
        "/v1/jobs/{job_id}:pause": {"post": _op(
            "Pause a job", {200: job}, params=[_JOB_ID], errors=WRITE_ERRORS,
            body=_ref("PauseNote"), body_required=False)},
        "/v1/jobs/{job_id}:resume": {"post": _op("Resume a job from now", {200: job},
                                                 params=[_JOB_ID], errors=WRITE_ERRORS)},
        "/v1/jobs/{job_id}:trigger": {"post": _op(
            "Run a job now", {201: _json(_ref("Run"), "The new run"),
                              200: _json(_ref("Run"), "The run of this instant, made before")},
            params=[_JOB_ID], errors=WRITE_ERRORS, body=_ref("RunOverlap"),
            body_required=False)},
        "/v1/jobs/{job_id}/runs": {"get": _op(
            "A job's runs, newest first", {200: _json(runs, "Runs")},
            params=[_JOB_ID, _limit(limits.list_limit_max), _CONSISTENT])},
        "/v1/jobs/{job_id}/preview": {"get": _op(
            "A stored job's next fire times", {200: _json(_fire_times(), "Fire times")},
            params=[_JOB_ID, _in_query("count", {"type": "integer", "minimum": 1, "maximum":
                                                 limits.preview_count_max}, "how many"),
                    _CONSISTENT])},
        "/v1/runs/{run_id}": {"get": _op("Get a run", {200: run},
                                         params=[_RUN_ID, _CONSISTENT])},
        "/v1/runs": {"get": _op(
            "The tenant's runs, newest first, filtered (state=failed: the dead letters)",
            {200: _json(run_page, "A page of runs")}, params=[
                _limit(limits.list_limit_max), _CONSISTENT, _PAGE_TOKEN,
                _in_query("job_id", {"type": "string", "pattern": f"^{jobspec.JOB_ID_PATTERN}$"},
                          "only this job's runs"),
                _in_query("state", {"type": "string", "enum": list(history.RUN_STATES)},
                          "only runs in this state"),
                _in_query("trigger", {"type": "string", "enum": list(history.RUN_TRIGGERS)},
                          "only runs started this way"),
                _in_query("scheduled_after", _TIME_IN, "only runs scheduled at or after this"),
                _in_query("scheduled_before", _TIME_IN, "only runs scheduled before this")])},
        "/v1/runs/{run_id}:retry": {"post": _op(
            "Give a failed run a new attempt under the same execution id", {200: run},
            params=[_RUN_ID], errors=WRITE_ERRORS, body=_ref("RunOverlap"),
            body_required=False)},
        "/v1/runs/{run_id}:cancel": {"post": _op(
            "Cancel a run", {200: run}, params=[_RUN_ID], errors=WRITE_ERRORS,
            body=_ref("CancelReason"), body_required=False)},
        "/v1/runs/{run_id}/logs": {"get": _op(
            "Each attempt's output",
            {200: _json({"anyOf": [_ref("RunLogs"), _ref("NodeRunLogs")]}, "Output")},
            params=[_RUN_ID, _in_query("local", {"type": "string", "enum": ["true", "false"]},
                                       "true: this node's own store only"), _CONSISTENT])},
        "/v1/schedules:preview": {"post": _op(
            "Preview a schedule's fire times", {200: _json(_fire_times(), "Fire times")},
            body=_ref("SchedulePreview"), errors=(400, 413, 415, 500))},
    }


def _batch_results() -> Schema:
    created = _obj({"job_id": _STR, "next_run_at": _TIME_OR_NULL, "created": _BOOL},
                   ("job_id", "created"), closed=False)
    refused = _obj({"error": _ref("Problem")}, ("error",), closed=False)
    return _obj({"results": {"type": "array", "items": {"anyOf": [created, refused]}}},
                ("results",), closed=False)


def _fire_times() -> Schema:
    return _obj({"fire_times": {"type": "array", "items": _TIME},
                 "resolved": {"type": "string", "description": "the cron expression with its "
                              "H terms hashed (only for a schedule that has some)"}},
                ("fire_times",), closed=False)


def _backfill_paths() -> dict[str, Schema]:
    answers = _backfill_started()
    view = _json(_ref("Backfill"), "The backfill and its progress")
    backfill_id = _in_path("backfill_id", {"type": "string",
                                           "pattern": f"^{backfill.ID_PATTERN}$"})
    return {
        "/v1/jobs/{job_id}:backfill": {"post": _op(
            "Run every occurrence of the job's schedule in [start, end)",
            {202: _json(answers["started"], "Started: GET /v1/backfills/{id} (Location) "
                        "follows it"),
             200: _json(answers["listed"], "dry_run: the occurrences; nothing was run")},
            params=[_JOB_ID], body=_ref("BackfillCreate"), errors=WRITE_ERRORS)},
        "/v1/backfills/{backfill_id}": {"get": _op(
            "A backfill's progress", {200: view}, params=[backfill_id, _CONSISTENT])},
        "/v1/backfills/{backfill_id}:cancel": {"post": _op(
            "Cancel a backfill and its runs not finished", {200: view}, params=[backfill_id],
            errors=WRITE_ERRORS, body=_ref("CancelReason"), body_required=False)},
    }


def _topic_paths() -> dict[str, Schema]:
    group = _json(_ref("Group"), "The group's committed offset")
    return {
        "/v1/topics/{topic}/messages": {"get": _op(
            "Read a topic", {200: _json(_ref("Messages"), "Messages after `after`")}, params=[
                _TOPIC, _CONSISTENT, _limit(limits.topic_read_limit_max),
                _in_query("after", {"type": "integer", "minimum": 0,
                                    "maximum": limits.json_int_max - 1}, "an offset"),
                _in_query("group", _token(limits.group_bytes_max),
                          "without `after`: start at this group's offset"),
                _in_query("wait_s", {"type": "number", "minimum": 0,
                                     "maximum": limits.topic_wait_s_max}, "long poll")])},
        "/v1/topics/{topic}/groups/{group}": {
            "get": _op("A consumer group's offset", {200: group},
                       params=[_TOPIC, _GROUP, _CONSISTENT]),
            "put": _op("Commit a consumer group's offset", {200: group},
                       params=[_TOPIC, _GROUP], errors=WRITE_ERRORS,
                       body=_ref("GroupOffset")),
        },
    }


def _worker_paths() -> dict[str, Schema]:
    claimed = _obj({"runs": {"type": "array", "items": {"type": "object"}}, "node": _STR},
                   ("runs", "node"), closed=False)
    lost = _obj({"lost": {"type": "array", "items": _STR}}, ("lost",), closed=False)
    accepted = _obj({"accepted": {"type": "array", "items": _BOOL}}, ("accepted",),
                    closed=False)
    return {
        "/v1/workers/{worker_id}/claim": {"post": _op(
            "Claim runs of a queue", {200: _json(claimed, "Runs granted")},
            params=[_WORKER], body=_ref("WorkerClaim"), errors=WRITE_ERRORS)},
        "/v1/workers/{worker_id}/heartbeat": {"post": _op(
            "Extend leases", {200: _json(lost, "Runs to stop")},
            params=[_WORKER], body=_ref("WorkerHeartbeat"), errors=WRITE_ERRORS)},
        "/v1/workers/{worker_id}/complete": {"post": _op(
            "Finish attempts", {200: _json(accepted, "Accepted, per result")},
            params=[_WORKER], body=_ref("WorkerComplete"), errors=WRITE_ERRORS)},
    }


def _cluster_paths() -> dict[str, Schema]:
    digest = _json(_ref("Digest"), "A digest of the replicated state")
    return {
        "/": {"get": _op("The web UI (docs/ui.md)", {200: {"description": "HTML", "content": {
            "text/html": {"schema": _STR}}}}, errors=(500,))},
        "/ui/{file}": {"get": _op("A module or the stylesheet of the web UI", {200: {
            "description": "JavaScript or CSS", "content": {
                "text/javascript": {"schema": _STR}, "text/css": {"schema": _STR}}}},
            params=[_in_path("file", {"type": "string",
                                      "pattern": r"^(?:views/)?[a-z_]+\.(?:js|css)$"})],
            errors=(404, 500))},
        "/healthz": {"get": _healthz()},
        "/v1/healthz": {"get": _healthz()},
        "/v1/openapi.json": {"get": _op("This document", {200: _json(
            {"type": "object"}, "OpenAPI 3.1")}, errors=(500,))},
        "/v1/cluster": {"get": _op("Leader and members", {200: _json(_ref("Cluster"), "Cluster")},
                                   errors=(500, 503))},
        "/v1/cluster/shards": {"get": _op("Shard owners and tokens", {200: _json(
            _ref("Shards"), "Shards")}, params=[_CONSISTENT])},
        "/v1/node": {"get": _op("This node's status", {200: _json(_ref("NodeStatus"), "Node")},
                                errors=(500,))},
        "/v1/node/clock": {"get": _op("This node's wall clock (its peers measure it)", {
            200: _json(_ref("NodeClock"), "Clock")}, errors=(500,))},
        # 400: a `tenant` parameter that is not a tenant name (api/auth.py reads
        # it on every route of the read permission).
        "/metrics": {"get": _op("This node's metrics (docs/metrics.md)", {200: {
            "description": "Prometheus text format 0.0.4", "content": {
                "text/plain": {"schema": _STR}}}}, errors=(400, 500))},
        "/v1/state/digest": {"get": _op("This node's state digest", {200: digest}, params=[
            _in_query("index", {"type": "integer"},
                      "the digest recorded when the check at this index was applied")])},
        "/v1/state/digest:check": {"post": _op("Commit a digest check", {200: digest},
                                               errors=(500, 503))},
    }


def _healthz() -> Schema:
    return _op("Liveness", {200: _json(_obj({"ok": _BOOL, "node": _STR}, ("ok", "node"),
                                            closed=False), "Serving")}, errors=(500,))


def _admin_paths() -> dict[str, Schema]:
    tenant = _json(_ref("Tenant"), "The tenant's quotas, those in force, and its job count")
    tokens = _obj({"tokens": {"type": "array", "items": _ref("Token")}}, ("tokens",),
                  closed=False)
    tenants = _obj({"tenants": {"type": "array", "items": _ref("Tenant")}}, ("tenants",),
                   closed=False)
    audit = _obj({"records": {"type": "array", "items": _ref("AuditRecord")},
                  "next_after": _INT}, ("records", "next_after"), closed=False)
    token_id = _in_path("token_id", {"type": "string", "pattern": "^tok_[0-9a-f]{16}$"})
    # The route takes any segment, so that a bad name is a 400 naming `tenant`.
    name = _in_path("tenant", {"type": "string", "pattern": "^[^/]+$", "description":
                               f"a tenant name, {limits.tenant_name_pattern}"})
    return {
        "/v1/tokens": {
            "post": _op("Create a token", {201: _json(_ref("TokenCreated"), "Created")},
                        body=_ref("TokenCreate"), errors=(400, 409, 413, 415, 500, 503)),
            "get": _op("List tokens (never their text or hash)",
                       {200: _json(tokens, "Tokens")}, params=[_CONSISTENT]),
        },
        "/v1/tokens/{token_id}": {"delete": _op(
            "Revoke a token: every node refuses it once it applied this",
            {204: {"description": "Revoked"}}, params=[token_id], errors=(404, 500, 503))},
        "/v1/tenants": {"get": _op("Tenants with a record (quotas set, or jobs created)",
                                   {200: _json(tenants, "Tenants")}, params=[_CONSISTENT])},
        "/v1/tenants/{tenant}": {
            "get": _op("A tenant's quotas", {200: tenant}, params=[name, _CONSISTENT]),
            "put": _op("Set a tenant's quotas", {200: tenant}, params=[name],
                       body=_ref("TenantQuota"), errors=(400, 409, 413, 415, 500, 503)),
            "delete": _op("Delete a tenant's record (quotas and counters), freeing its place "
                          "under tenants_max; 409 while it has jobs",
                          {204: {"description": "Deleted"}}, params=[name],
                          errors=(400, 404, 409, 500, 503)),
        },
        "/v1/audit": {"get": _op("Audit records after `after`, oldest first",
                                 {200: _json(audit, "A page of records")}, params=[
            _in_query("after", {"type": "integer", "minimum": 0,
                                "maximum": limits.command_int_max - 1},
                      "a record's seq (0: from the oldest kept)"),
            _limit(limits.audit_list_limit_max), _CONSISTENT])},
    }


# Routes where the tenant an admin acts for matters beyond the jobs, runs,
# topics and queues: a token is made for it, and the list shows only its tokens.
_TENANT_ADMIN_OPERATIONS = {("get", "/v1/tokens"), ("post", "/v1/tokens")}


def _secure(paths: dict[str, Schema]) -> None:
    """Who may call each operation (api/auth.py PERMISSIONS): public ones take
    no token; the others take a bearer token and may answer 401 and 403."""
    for path, item in paths.items():
        for method, operation in item.items():
            need = auth.PERMISSIONS[(method.upper(), path)]
            if need == "public":
                operation["security"] = []
                continue
            operation["security"] = [{"bearer": []}]
            roles = [role for role in ROLES if need in auth.GRANTS[role]]
            who = "any role" if need == "any" else "role " + " or ".join(roles)
            operation["description"] = f"Needs permission `{need}`: a token of {who}."
            operation["responses"].update({str(s): _error(s) for s in AUTH_ERRORS})
            if need in ("read", "write", "work") or (method, path) in _TENANT_ADMIN_OPERATIONS:
                operation.setdefault("parameters", []).append(_TENANT)


def document() -> Schema:
    """The whole OpenAPI document: a copy, which the caller may change."""
    return copy.deepcopy(_document())


@functools.cache
def _document() -> Schema:
    """Built once: it depends on nothing at run time."""
    paths = {**_job_paths(), **_backfill_paths(), **_topic_paths(), **_worker_paths(),
             **_cluster_paths(), **_admin_paths()}
    _secure(paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftsched", "version": "1",
                 "description": "A distributed job scheduler. Every route but the health "
                                "checks and the UI takes `Authorization: Bearer <token>` "
                                "(docs/security.md). Errors are application/problem+json "
                                "(RFC 9457). See docs/api.md."},
        "paths": paths,
        "components": _components(),
    }
