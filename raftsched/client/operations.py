"""Every API operation, once: its method, path and result kind, and a function
that turns typed arguments into a Call. Client and AsyncClient are thin
transports over these (sync.py, aio.py); tests/test_client.py keeps this table
equal to the OpenAPI document.

A builder's positional parameters fill the path placeholders of the same name;
its keyword parameters become the query or the body, as the operation takes
them. Query and body values may be datetimes with a time zone (sent as RFC 3339).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, ParamSpec, TypeVar

from raftsched.client.types import (JSON, Backfill, BackfillStarted, Cluster, FireTimes, Job,
                                    JobBody, JobPatchBody,
                                    JobPage, Run, RunLogs, RunPage, Token)

T = TypeVar("T")
P = ParamSpec("P")
Result = Literal["json", "text", "none"]
# Where a write's idempotency keys go: the body is a job ("body"), or its
# "jobs" are ("jobs"). A keyed write may be sent again to another node.
Keyed = Literal["body", "jobs"]
When = dt.datetime | str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Operation:
    """One (method, path) of the API. `tenant`: it takes ?tenant= (an admin acting
    for a tenant), so the client's `tenant` is sent with it. `keyed`: where
    the write's idempotency keys go (None: it takes none)."""
    name: str
    method: str
    path: str
    result: Result
    tenant: bool
    keyed: Keyed | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Call(Generic[T]):
    """A request ready to send: T is what its answer decodes to. `wait_s`: the
    longest the server may hold it (long polls), added to the client's timeout."""
    op: Operation | None = None
    path: str = ""
    query: tuple[tuple[str, str], ...] = ()
    body: Any = None
    has_body: bool = False
    wait_s: float = 0.0


OPERATIONS: dict[str, Operation] = {}
_PLACEHOLDER = re.compile(r"{(\w+)}")


def operation(method: str, path: str, *, result: Result = "json", tenant: bool = True,
              slashes: tuple[str, ...] = (),
              keyed: Keyed | None = None) -> Callable[[Callable[P, Call[T]]],
                                                      Callable[P, Call[T]]]:
    """Register a builder as the operation (method, path). `slashes`: the path
    parameters whose value may hold a "/" (any other is escaped, so a value
    cannot reach another route)."""
    def register(build: Callable[P, Call[T]]) -> Callable[P, Call[T]]:
        op = Operation(name=build.__name__, method=method, path=path, result=result,
                       tenant=tenant, keyed=keyed)
        signature = inspect.signature(build)
        names = _PLACEHOLDER.findall(path)
        assert all(n in signature.parameters for n in names), (build.__name__, names)
        assert op.name not in OPERATIONS, op.name

        @functools.wraps(build)
        def make(*args: P.args, **kwargs: P.kwargs) -> Call[T]:
            bound = signature.bind(*args, **kwargs).arguments
            filled = path.format(**{n: urllib.parse.quote(str(bound[n]),
                                                          safe="/" if n in slashes else "")
                                    for n in names})
            return dataclasses.replace(build(*args, **kwargs), op=op, path=filled)
        OPERATIONS[op.name] = op
        return make
    return register


def _call(query: Mapping[str, Any] | None = None, *, body: Any = None, has_body: bool = False,
          wait_s: float | None = None) -> Call[Any]:
    return Call(query=encode_query(query or {}), body=body,
                has_body=has_body or body is not None, wait_s=wait_s or 0.0)


def _members(**members: Any) -> dict[str, Any]:
    """A body of the members given (None: left out, so the server's default holds)."""
    return {k: v for k, v in members.items() if v is not None}


def encode_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    return str(value)


def encode_query(query: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """None and False are left out (every flag of the API is off by default);
    a list repeats its name."""
    pairs: list[tuple[str, str]] = []
    for name, value in query.items():
        if value is None or value is False:
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        pairs.extend((name, encode_value(v)) for v in values)
    return tuple(pairs)


def rfc3339(when: dt.datetime) -> str:
    """The API takes times with an offset only: a naive datetime is refused here
    rather than read in some zone the caller did not mean."""
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{when!r} has no time zone: give one (datetime.timezone.utc ...)")
    return when.isoformat()


# --- jobs ---------------------------------------------------------------------------------

@operation("POST", "/v1/jobs", keyed="body")
def create_job(spec: JobBody | Mapping[str, Any]) -> Call[Job]:
    """Create a job (docs/api.md); with an idempotency_key, a repeat answers the same job."""
    return _call(body=spec)


@operation("GET", "/v1/jobs")
def list_jobs(*, limit: int | None = None, page_token: str | None = None,
              status: str | None = None, name_prefix: str | None = None,
              labels: Sequence[str] = (), cursor: str | None = None,
              consistent: bool = False) -> Call[JobPage]:
    """A page of jobs in id order; `labels` are "key:value" filters, all must match."""
    return _call({"limit": limit, "page_token": page_token, "cursor": cursor, "status": status,
                  "name_prefix": name_prefix, "label": list(labels), "consistent": consistent})


@operation("POST", "/v1/jobs:batchCreate", keyed="jobs")
def batch_create_jobs(specs: Sequence[Mapping[str, Any]]) -> Call[JSON]:
    return _call(body={"jobs": list(specs)})


@operation("GET", "/v1/jobs/{job_id}")
def get_job(job_id: str, *, consistent: bool = False) -> Call[Job]:
    return _call({"consistent": consistent})


@operation("PATCH", "/v1/jobs/{job_id}")
def update_job(job_id: str, patch: JobPatchBody | Mapping[str, Any]) -> Call[Job]:
    """Change the members given; the rest stay."""
    return _call(body=patch)


@operation("DELETE", "/v1/jobs/{job_id}", result="none")
def delete_job(job_id: str) -> Call[None]:
    return _call()


@operation("POST", "/v1/jobs/{job_id}:pause")
def pause_job(job_id: str, *, note: str | None = None) -> Call[Job]:
    return _call(body=_members(note=note), has_body=True)


@operation("POST", "/v1/jobs/{job_id}:resume")
def resume_job(job_id: str) -> Call[Job]:
    return _call()


@operation("POST", "/v1/jobs/{job_id}:trigger")
def trigger_job(job_id: str, *, overlap: Literal["allow"] | None = None) -> Call[Run]:
    """Run the job now; overlap="allow" admits this run whatever the concurrency policy."""
    return _call(body=_members(overlap=overlap), has_body=True)


@operation("GET", "/v1/jobs/{job_id}/runs")
def list_job_runs(job_id: str, *, limit: int | None = None,
                  consistent: bool = False) -> Call[RunPage]:
    return _call({"limit": limit, "consistent": consistent})


@operation("GET", "/v1/jobs/{job_id}/preview")
def preview_job(job_id: str, *, count: int | None = None) -> Call[FireTimes]:
    return _call({"count": count})


@operation("POST", "/v1/jobs/{job_id}:backfill")
def backfill_job(job_id: str, *, start: When, end: When, overlap: str | None = None,
                 max_concurrent: int | None = None,
                 dry_run: bool | None = None) -> Call[BackfillStarted]:
    """Run every occurrence of the job's schedule in [start, end); follow it with
    get_backfill(answer["backfill_id"])."""
    return _call(body=_members(start=start, end=end, overlap=overlap,
                               max_concurrent=max_concurrent, dry_run=dry_run))


@operation("GET", "/v1/backfills/{backfill_id}")
def get_backfill(backfill_id: str, *, consistent: bool = False) -> Call[Backfill]:
    return _call({"consistent": consistent})


@operation("POST", "/v1/backfills/{backfill_id}:cancel")
def cancel_backfill(backfill_id: str, *, reason: str | None = None) -> Call[Backfill]:
    return _call(body=_members(reason=reason), has_body=True)


@operation("POST", "/v1/schedules:preview")
def preview_schedule(*, schedule: Mapping[str, Any] | None = None, run_at: When | None = None,
                     after: When | None = None, count: int | None = None,
                     job_id: str | None = None) -> Call[FireTimes]:
    """The next fire times of a schedule ({"cron": ..., "timezone": ...} or
    {"every": ...}) or of a run_at, without creating a job."""
    return _call(body=_members(schedule=schedule, run_at=run_at, after=after, count=count,
                               job_id=job_id), has_body=True)


# --- runs ---------------------------------------------------------------------------------

@operation("GET", "/v1/runs/{run_id}")
def get_run(run_id: str, *, consistent: bool = False) -> Call[Run]:
    return _call({"consistent": consistent})


@operation("GET", "/v1/runs")
def list_runs(*, job_id: str | None = None, state: str | None = None,
              trigger: str | None = None, scheduled_after: When | None = None,
              scheduled_before: When | None = None, limit: int | None = None,
              page_token: str | None = None, consistent: bool = False) -> Call[RunPage]:
    """The tenant's runs, newest first; state="failed" lists the dead letters."""
    return _call({"job_id": job_id, "state": state, "trigger": trigger,
                  "scheduled_after": scheduled_after, "scheduled_before": scheduled_before,
                  "limit": limit, "page_token": page_token, "consistent": consistent})


@operation("POST", "/v1/runs/{run_id}:retry")
def retry_run(run_id: str, *, overlap: Literal["allow"] | None = None) -> Call[Run]:
    """Re-drive a failed run: a new attempt under the same execution id."""
    return _call(body=_members(overlap=overlap), has_body=True)


@operation("POST", "/v1/runs/{run_id}:cancel")
def cancel_run(run_id: str, *, reason: str | None = None) -> Call[Run]:
    return _call(body=_members(reason=reason), has_body=True)


@operation("GET", "/v1/runs/{run_id}/logs")
def run_logs(run_id: str, *, local: bool = False) -> Call[RunLogs]:
    return _call({"local": local})


# --- topics and workers -------------------------------------------------------------------

@operation("GET", "/v1/topics/{topic}/messages")
def read_topic(topic: str, *, after: int | None = None, group: str | None = None,
               limit: int | None = None, wait_s: float | None = None,
               consistent: bool = False) -> Call[JSON]:
    return _call({"after": after, "group": group, "limit": limit, "wait_s": wait_s,
                  "consistent": consistent}, wait_s=wait_s)


@operation("GET", "/v1/topics/{topic}/groups/{group}")
def get_group_offset(topic: str, group: str, *, consistent: bool = False) -> Call[JSON]:
    return _call({"consistent": consistent})


@operation("PUT", "/v1/topics/{topic}/groups/{group}")
def commit_group_offset(topic: str, group: str, offset: int) -> Call[JSON]:
    return _call(body={"offset": offset})


@operation("POST", "/v1/workers/{worker_id}/claim")
def worker_claim(worker_id: str, *, queue: str, max: int | None = None,
                 wait_s: float | None = None) -> Call[JSON]:
    return _call(body=_members(queue=queue, max=max, wait_s=wait_s), wait_s=wait_s)


@operation("POST", "/v1/workers/{worker_id}/heartbeat")
def worker_heartbeat(worker_id: str, runs: Sequence[Mapping[str, Any]]) -> Call[JSON]:
    return _call(body={"runs": list(runs)})


@operation("POST", "/v1/workers/{worker_id}/complete")
def worker_complete(worker_id: str, results: Sequence[Mapping[str, Any]]) -> Call[JSON]:
    return _call(body={"results": list(results)})


# --- cluster and nodes --------------------------------------------------------------------

@operation("GET", "/", result="text", tenant=False)
def ui() -> Call[str]:
    """The web UI's page (HTML)."""
    return _call()


@operation("GET", "/ui/{file}", result="text", tenant=False, slashes=("file",))
def ui_file(file: str) -> Call[str]:
    """A module or the stylesheet of the web UI ("app.js", "views/job.js"...)."""
    return _call()


@operation("GET", "/healthz", tenant=False)
def healthz_unversioned() -> Call[JSON]:
    """The same as healthz(), at the path load balancers probe by default."""
    return _call()


@operation("GET", "/v1/healthz", tenant=False)
def healthz() -> Call[JSON]:
    return _call()


@operation("GET", "/v1/openapi.json", tenant=False)
def openapi() -> Call[JSON]:
    return _call()


@operation("GET", "/metrics", result="text", tenant=False)
def metrics() -> Call[str]:
    """The node's metrics in Prometheus text format (an operator's or admin's token)."""
    return _call()


@operation("GET", "/v1/cluster", tenant=False)
def cluster() -> Call[Cluster]:
    """The leader and every member as the answering node sees them."""
    return _call()


@operation("GET", "/v1/cluster/shards", tenant=False)
def cluster_shards(*, consistent: bool = False) -> Call[JSON]:
    return _call({"consistent": consistent})


@operation("GET", "/v1/node", tenant=False)
def node_status() -> Call[JSON]:
    return _call()


@operation("GET", "/v1/node/clock", tenant=False)
def node_clock() -> Call[JSON]:
    return _call()


@operation("GET", "/v1/state/digest", tenant=False)
def state_digest(*, index: int | None = None) -> Call[JSON]:
    return _call({"index": index})


@operation("POST", "/v1/state/digest:check", tenant=False)
def check_state_digest() -> Call[JSON]:
    return _call()


# --- tokens, tenants, audit (admin) -------------------------------------------------------

@operation("POST", "/v1/tokens")
def create_token(*, role: str, tenant: str | None = None, name: str | None = None) -> Call[Token]:
    """A new token; its text is in this answer only."""
    return _call(body=_members(role=role, tenant=tenant, name=name))


@operation("GET", "/v1/tokens")
def list_tokens(*, consistent: bool = False) -> Call[JSON]:
    return _call({"consistent": consistent})


@operation("DELETE", "/v1/tokens/{token_id}", result="none", tenant=False)
def revoke_token(token_id: str) -> Call[None]:
    return _call()


@operation("GET", "/v1/tenants", tenant=False)
def list_tenants(*, consistent: bool = False) -> Call[JSON]:
    return _call({"consistent": consistent})


@operation("GET", "/v1/tenants/{tenant}", tenant=False)
def get_tenant(tenant: str, *, consistent: bool = False) -> Call[JSON]:
    return _call({"consistent": consistent})


@operation("PUT", "/v1/tenants/{tenant}", tenant=False)
def set_tenant_quota(tenant: str, *, jobs_max: int | None = None,
                     creates_per_s: int | None = None, runs_concurrent_max: int | None = None,
                     weight: int | None = None, commands: bool | None = None) -> Call[JSON]:
    """Set every quota at once: one left None follows the node flags' default.
    `commands`: grant (True) or withdraw (False) command targets; None leaves
    the grant as it is."""
    return _call(body={"jobs_max": jobs_max, "creates_per_s": creates_per_s,
                       "runs_concurrent_max": runs_concurrent_max, "weight": weight,
                       "commands": commands})


@operation("DELETE", "/v1/tenants/{tenant}", tenant=False)
def delete_tenant(tenant: str) -> Call[None]:
    """Drop the tenant's record (quotas and counters); refused while it has jobs."""
    return _call()


@operation("GET", "/v1/audit", tenant=False)
def list_audit(*, after: int | None = None, limit: int | None = None,
               consistent: bool = False) -> Call[JSON]:
    return _call({"after": after, "limit": limit, "consistent": consistent})
