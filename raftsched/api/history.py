"""Routes that query history and re-drive it: GET /v1/runs (every run of the
tenant, filtered, newest first), GET /v1/jobs (filtered by status, name and
labels) and POST /v1/runs/{id}:retry (a failed run's new attempt).

Pages go on from an opaque `page_token` that encodes where the page stopped
reading (core/queries.py pages through the state's indexes) and a digest of
the filters it was read with (a token is refused with other filters). Paging
by key, not by offset, keeps a listing stable while runs are added: a page
starts strictly after the last row shown, so a row is never shown twice and
a row that existed when the listing began is never skipped (unless it was
purged meanwhile). Runs are read newest first, so a run scheduled from now on
lands before the first page rather than among them.

A filter that the index does not order by (state, trigger, status, name,
labels) is checked row by row: a page reads at most list_scan_rows_max rows
and may come back short, with a token to go on from.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import TYPE_CHECKING

from aiohttp import web

from raftsched import limits
from raftsched.api.auth import actor_of, tenant_of
from raftsched.api.common import (int_param, job_secrets, json_body, json_response,
                                  maybe_consistent, node_of, raise_refusal)
from raftsched.api.views import job_view, run_view
from raftsched.core import backfill, commands, lifecycle, redrive, spec
from raftsched.core.jobspec import RUN_ID_PATTERN, validate_job_id
from raftsched.core.schedule import parse_instant
from raftsched.errors import InvalidInput

if TYPE_CHECKING:
    from raftsched.nodeport import NodePort

# How a run started: its first trigger, or "retry" once re-driven.
RUN_TRIGGERS = ("schedule", "manual", backfill.TRIGGER, redrive.TRIGGER)
# What a run's state reads as in an answer: a lifecycle state, or `armed`
# (core/runs.py presented_state).
RUN_STATES = lifecycle.PRESENTED_STATES
# Job statuses a listing can ask for (deleted jobs are not listed).
JOB_STATUSES = ("active", "paused", "completed")
RUN_FILTERS = ("job_id", "state", "trigger", "scheduled_after", "scheduled_before")
JOB_FILTERS = ("status", "name_prefix", "label")
RUN_ID_RE = re.compile(RUN_ID_PATTERN)


# --- page tokens ----------------------------------------------------------------------

def filters_digest(filters: dict) -> str:
    """What a token remembers of the filters it was made under."""
    text = json.dumps(filters, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode_token(kind: str, filters: dict, position: list) -> str:
    raw = json.dumps([1, kind, filters_digest(filters), *position], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(text: str | None, kind: str, filters: dict) -> list | None:
    """The position a token holds, or None for no token; 400 naming
    `page_token` for one this API did not make for these filters."""
    if not text:
        return None
    bad = InvalidInput("`page_token` is not a token this listing gave out", field="page_token")
    if len(text) > limits.page_token_chars_max:
        raise bad
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(value, list) or len(value) < 3 or value[:2] != [1, kind]:
        raise bad
    if value[2] != filters_digest(filters):
        raise InvalidInput("`page_token` was made for other filters; give the same filters "
                           "as the first page, or start again without a token",
                           field="page_token")
    return value[3:]


# --- GET /v1/runs -----------------------------------------------------------------------

def run_filters(request: web.Request) -> dict:
    """The filters of a runs listing, checked; the ones not given are left out."""
    query, out = request.query, {}
    if "job_id" in query:
        out["job_id"] = validate_job_id(query["job_id"])
    if "state" in query:
        out["state"] = _one_of(query["state"], RUN_STATES, "state")
    if "trigger" in query:
        out["trigger"] = _one_of(query["trigger"], RUN_TRIGGERS, "trigger")
    for name in ("scheduled_after", "scheduled_before"):
        if name in query:
            out[name] = parse_instant(query[name], name)[0]
    if out.get("scheduled_after", 0) > out.get("scheduled_before", limits.timestamp_ms_max):
        raise InvalidInput("`scheduled_before` must not come before `scheduled_after`",
                           field="scheduled_before")
    return out


def _one_of(value: str, choices: tuple[str, ...], field: str) -> str:
    if value not in choices:
        raise InvalidInput(f"`{field}` must be one of {', '.join(choices)}", field=field)
    return value


def list_runs_page(node: "NodePort", tenant: str, filters: dict, limit: int,
                   token: list | None,
                   now_ms: int | None = None) -> tuple[list[dict], list | None]:
    """(runs, position to go on from or None): up to `limit` runs matching the
    filters, newest first, from the position a page token held
    (core/queries.py runs_page reads them; `now_ms`, the cluster's time, for
    a state filter of `armed` or `running`)."""
    after = None
    if token is not None:
        # A run's (scheduled_ms, run_id) as encode_token wrote it: anything else
        # was made by hand and would fail to become a key (a 500), or read
        # from a place no page ended at.
        if len(token) != 2 or type(token[0]) is not int \
                or not 0 <= token[0] <= limits.timestamp_ms_max \
                or not isinstance(token[1], str) or not RUN_ID_RE.fullmatch(token[1]):
            raise InvalidInput("`page_token` is not a token this listing gave out",
                               field="page_token")
        after = (token[0], token[1])
    found, position = node.runs_page(tenant, filters, limit, after, now_ms)
    return found, None if position is None else list(position)


async def list_runs(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    filters = run_filters(request)
    limit = int_param(request, "limit", limits.list_limit_default, limits.list_limit_max)
    token = decode_token(request.query.get("page_token"), "runs", filters)
    tenant = tenant_of(request)
    now = node.now_ms()
    runs, position = list_runs_page(node, tenant, filters, limit, token, now)
    secrets: dict[str, tuple[str, ...]] = {}
    views = [run_view(run, secrets.setdefault(run["job_id"], job_secrets(node, run["job_id"])),
                      now)
             for run in runs]
    return json_response({"runs": views, "next_page_token":
                          None if position is None else encode_token("runs", filters, position)})


# --- GET /v1/jobs -----------------------------------------------------------------------

def job_filters(request: web.Request) -> dict:
    query, out = request.query, {}
    if "status" in query:
        out["status"] = _one_of(query["status"], JOB_STATUSES, "status")
    if "name_prefix" in query:
        prefix = query["name_prefix"]
        if not prefix or len(prefix) > limits.job_name_chars_max:
            raise InvalidInput(f"`name_prefix` must be 1 to {limits.job_name_chars_max} "
                               "characters", field="name_prefix", limit="job_name_chars_max")
        out["name_prefix"] = prefix
    labels = query.getall("label", [])
    if len(labels) > limits.label_filters_max:
        raise InvalidInput(f"at most {limits.label_filters_max} `label` filters",
                           field="label", limit="label_filters_max")
    pairs = []
    for text in labels:
        key, colon, value = text.partition(":")
        if not colon or not key:
            raise InvalidInput("a `label` filter is key:value, such as label=team:payments",
                               field="label")
        pairs.append([key, value])
    if pairs:
        out["label"] = sorted(pairs)
    return out


async def list_jobs(request: web.Request) -> web.Response:
    """Jobs in id order. `page_token` (or the older `cursor`, a job id) goes on
    from where the previous page stopped; both are answered."""
    node = node_of(request)
    await maybe_consistent(request)
    limit = int_param(request, "limit", limits.list_limit_default, limits.list_limit_max)
    filters = job_filters(request)
    tenant = tenant_of(request)
    start = None
    position = decode_token(request.query.get("page_token"), "jobs", filters)
    if position is not None:
        if len(position) != 1 or not isinstance(position[0], str):
            raise InvalidInput("`page_token` is not a token this listing gave out",
                               field="page_token")
        start = validate_job_id(position[0], "page_token")
    elif request.query.get("cursor"):
        start = validate_job_id(request.query["cursor"], "cursor")
    jobs, last, more = node.jobs_page(tenant, filters, limit, start)
    after = last if more or len(jobs) == limit else None
    return json_response({
        "jobs": [job_view(job) for job in jobs],
        "next_page_token": None if after is None else encode_token("jobs", filters, [after]),
        "next_cursor": after})


# --- POST /v1/runs/{id}:retry -------------------------------------------------------------

def parse_overlap(body: object) -> str | None:
    """The optional body {"overlap": "allow"} of a trigger or retry: the one run
    is admitted as the allow policy would, whatever the job's policy."""
    if body is None:
        return None
    return spec.check_shape(body, spec.RunOverlap).overlap


async def retry_run(request: web.Request) -> web.Response:
    node = node_of(request)
    overlap = parse_overlap(await json_body(request, empty_ok=True))
    node.check_room()
    result = await node.propose(commands.scoped(commands.retry_run(
        run_id=request.match_info["run_id"], node=node.node_id, at_ms=node.now_ms(),
        overlap=overlap), tenant=tenant_of(request), actor=actor_of(request)))
    raise_refusal(result, field="run_id")
    run = result["run"]
    return json_response(run_view(run, job_secrets(node, run["job_id"]), node.now_ms()))


def add_routes(r: web.UrlDispatcher, run_id_pattern: str) -> None:
    r.add_get("/v1/runs", list_runs)
    r.add_get("/v1/jobs", list_jobs)
    r.add_post(f"/v1/runs/{run_id_pattern}:retry", retry_run)
