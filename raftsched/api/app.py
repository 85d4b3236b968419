"""Routes of the HTTP API. Writes go through Raft; reads come from the local
store (add `?consistent=true` to wait until this node has applied everything
the leader had committed when the request arrived)."""

from __future__ import annotations

import asyncio
import logging
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.api import admin, backfills, execution, history, metrics, openapi, policy
from raftsched.api.auth import actor_of, auth_middleware, tenant_of
from raftsched.api.common import (NODE_KEY, int_param, job_secrets, json_body, json_size,
                                  json_response, maybe_consistent, node_of, raise_refusal)
from raftsched.api.ids import new_job_id, new_job_ids
from raftsched.api.problems import problem, problem_body
from raftsched.api.views import format_in_job_zone, job_view, run_view
from raftsched.core import commands, compact, cost, tenancy
from raftsched.core.jobspec import (JOB_ID_PATTERN, validate_create,
                                    validate_patch)
from raftsched.core.schedule import next_fire_ms, parse_instant, parse_schedule, preview_ms
from raftsched.core.spec import PauseNote, SchedulePreview, check_shape, members
from raftsched.core.timeutil import format_ms
from raftsched.errors import (Busy, Conflict, Forbidden, InvalidInput, NotFound,
                              QuotaExceeded, Unauthorized, Unavailable)

if TYPE_CHECKING:
    from raftsched.nodeport import NodePort

log = logging.getLogger("raftsched.api")
JOB_ID = "{job_id:%s}" % JOB_ID_PATTERN
PREVIEW_FIELDS = members(SchedulePreview)


@web.middleware
async def problems_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except QuotaExceeded as exc:
        return problem(exc.status, exc.type, exc.detail, field=exc.field, limit=exc.limit,
                       headers={"Retry-After": str(exc.retry_after_s)})
    except Unauthorized as exc:
        return problem(exc.status, exc.type, exc.detail, field=exc.field,
                       headers={"WWW-Authenticate": 'Bearer realm="raftsched"'})
    except InvalidInput as exc:
        return problem(exc.status, exc.type, exc.detail, field=exc.field, limit=exc.limit)
    except Busy as exc:
        return problem(503, "busy", exc.detail, reason=exc.reason, limit=exc.limit,
                       headers={"Retry-After": str(exc.retry_after_s)})
    except Unavailable as exc:
        return problem(503, "unavailable", exc.detail, reason=exc.reason,
                       headers={"Retry-After": "1"})
    except web.HTTPRequestEntityTooLarge:
        return problem(413, "too-large", f"the request body is larger than "
                       f"{limits.request_body_bytes_max} bytes", field="body",
                       limit="request_body_bytes_max")
    except web.HTTPNotFound:
        return problem(404, "not-found", f"no route {request.method} {request.path}")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        return problem(405, "method-not-allowed",
                       f"{request.method} is not allowed on {request.path}; allowed: {allowed}",
                       headers={"Allow": allowed})
    except web.HTTPException:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return problem(500, "internal", "an internal error occurred; see the node's log")


def _live_job(node: "NodePort", job_id: str, tenant: str) -> dict:
    """The job, if it is not deleted and belongs to `tenant` (another tenant's
    job is answered exactly as a missing one)."""
    job = node.job(job_id)
    if job is None or job["status"] == "deleted" or job["tenant"] != tenant:
        raise NotFound(f"job {job_id} not found", field="job_id")
    return job


def _create_quota(node: "NodePort", tenant: str) -> dict:
    quota = node.quota_of(tenant)
    return {"jobs_max": quota["jobs_max"], "creates_per_s": quota["creates_per_s"]}


# --- jobs ------------------------------------------------------------------------------

async def create_job(request: web.Request) -> web.Response:
    node = node_of(request)
    # The id comes first: `H` in a cron schedule is hashed from it.
    job_id = new_job_id()
    parsed = validate_create(await json_body(request), job_id)
    spec, idem = parsed["spec"], parsed["idempotency_key"]
    policy.check_spec(node.config, spec)
    tenant = tenant_of(request)
    await _refuse_ungranted_commands(node, tenant, spec)
    now = node.now_ms()
    _check_run_at(spec["schedule"], now)
    node.check_room()
    quota = _create_quota(node, tenant)
    if idem is None:   # a key's replay answers the job it made, whatever the quota
        await _refuse_over_quota(node, tenant, quota)
    cmd = commands.create_job(job_id=job_id, tenant=tenant, spec=spec, idempotency_key=idem,
                              shard=node.shard_of(job_id),
                              next_ms=next_fire_ms(spec["schedule"], now), at_ms=now,
                              quota=quota, actor=actor_of(request))
    # The node may commit it with other creates of the tenant (group commit).
    with node.admit(1, tenant):
        result = await node.propose_create(cmd, len(await request.read()))
    if result.get("error") == "idempotency_key_reserved":
        raise _key_reserved(node, result)
    raise_refusal(result)
    return json_response(job_view(compact.created_job(result["job"])),
                         status=200 if result["existing"] else 201)


async def _commands_granted(node: "NodePort", tenant: str) -> bool:
    """Whether `tenant` may have command targets. This node's state may be
    behind: before it says no, it catches up with the leader (a grant just
    given). A grant just withdrawn is caught by apply, which judges again."""
    if tenancy.commands_granted(node.tenant(tenant)):
        return True
    await node.wait_caught_up()
    return tenancy.commands_granted(node.tenant(tenant))


def _command_forbidden(tenant: str, spec: dict) -> Forbidden | None:
    refusal = tenancy.command_refusal(None, tenant, spec)
    return None if refusal is None else Forbidden(refusal["detail"], field=refusal["field"])


async def _refuse_ungranted_commands(node: "NodePort", tenant: str, spec: dict) -> None:
    """403, naming the command target, for a tenant an admin did not grant commands."""
    if tenancy.command_field(spec) is not None and not await _commands_granted(node, tenant):
        forbidden = _command_forbidden(tenant, spec)
        assert forbidden is not None
        raise forbidden


async def _refuse_over_quota(node: "NodePort", tenant: str, quota: dict) -> None:
    """Answer a create over the tenant's quota without a Raft entry: when this
    node's state says it is over, judge again once caught up with the leader
    (a delete or a refill this node has not applied yet would let it through),
    and refuse as apply would. Otherwise apply judges, as always."""
    if tenancy.create_refusal(node.tenant(tenant), quota, tenant, node.now_ms()) is None:
        return
    await node.wait_caught_up()
    refusal = tenancy.create_refusal(node.tenant(tenant), quota, tenant, node.now_ms())
    if refusal is not None:
        raise_refusal(refusal)


async def batch_create_jobs(request: web.Request) -> web.Response:
    """POST /v1/jobs:batchCreate {"jobs": [job bodies]}: one result per job, in
    order. An invalid job gets its problem in its place and does not hold back
    the others; a job whose body is larger than POST /v1/jobs takes is one.
    The body is decoded off the event loop and the jobs are checked in slices
    of loop_slice_s, so a maximal batch does not stall the node. The valid ones
    are proposed as create_jobs entries of at most batch_entry_jobs_max jobs
    and batch_entry_bytes_max bytes, in order; an entry that is not committed
    gives its jobs a 503 problem (the whole answer is a 503 when none is).
    The node admits the batch whole before its jobs are checked: a busy node
    refuses it (503 busy) without spending more on it."""
    node = node_of(request)
    bodies = _batch_bodies(await json_body(request, limits.batch_request_body_bytes_max,
                                           "batch_request_body_bytes_max", off_loop=True))
    with node.admit(len(bodies), tenant_of(request)):
        return await _batch_create(request, node, bodies)


async def _batch_create(request: web.Request, node: "NodePort", bodies: list) -> web.Response:
    now = node.now_ms()
    node.check_room()
    results, checked = await _batch_items(node, bodies, now)
    tenant, actor = tenant_of(request), actor_of(request)
    _, kept = await _drop_ungranted_commands(node, tenant, [item for _, item, _ in checked],
                                             [position for position, _, _ in checked], results)
    kept_positions = set(kept)
    parts = batch_entries([c for c in checked if c[0] in kept_positions])
    # Proposed together, in order: pysyncobj keeps that order, so a job sees
    # the jobs before it in the batch (an idempotency key used twice).
    quota = _create_quota(node, tenant)
    answers = await node.propose_batch(
        [commands.create_jobs(tenant=tenant, at_ms=now, items=part, quota=quota, actor=actor)
         for _, part in parts]) if parts else []
    unavailable = [a for a in answers if isinstance(a, Unavailable)]
    if unavailable and len(unavailable) == len(answers):
        raise unavailable[0]
    for (where, _), answer in zip(parts, answers):
        for position, outcome in zip(where, _entry_results(node, answer, len(where))):
            results[position] = outcome
    return json_response({"results": results})


async def _drop_ungranted_commands(
        node: "NodePort", tenant: str, items: list[commands.CreateJobItem], positions: list[int],
        results: list[dict]) -> tuple[list[commands.CreateJobItem], list[int]]:
    """The items a tenant without the command grant may create: each job with
    a command target gets its 403 problem in its place."""
    if all(tenancy.command_field(item.spec) is None for item in items):
        return items, positions
    if await _commands_granted(node, tenant):
        return items, positions
    kept_items, kept_positions = [], []
    for item, position in zip(items, positions):
        forbidden = _command_forbidden(tenant, item.spec)
        if forbidden is not None:
            results[position] = {"error": _problem_of(forbidden)}
        else:
            kept_items.append(item)
            kept_positions.append(position)
    return kept_items, kept_positions


def _entry_results(node: "NodePort", answer: object, count: int) -> list[dict]:
    """The API results of the `count` jobs of one create_jobs entry."""
    if isinstance(answer, Unavailable):
        return [{"error": problem_body(503, "unavailable", answer.detail,
                                       reason=answer.reason)}] * count
    if isinstance(answer, BaseException):
        raise answer
    assert isinstance(answer, dict)
    if not answer.get("ok"):   # refused whole (a bug, logged by every replica)
        return [_batch_result(node, answer)] * count
    return [_batch_result(node, outcome) for outcome in answer["results"]]


def _batch_bodies(body: object) -> list:
    if not isinstance(body, dict) or set(body) != {"jobs"}:
        raise InvalidInput('the body must be {"jobs": [job, ...]}', field="jobs")
    jobs = body["jobs"]
    if not isinstance(jobs, list) or not jobs:
        raise InvalidInput("`jobs` must be a non-empty list of job bodies", field="jobs")
    if len(jobs) > limits.batch_create_jobs_max:
        raise InvalidInput(f"`jobs` holds {len(jobs)} jobs; a batch holds at most "
                           f"{limits.batch_create_jobs_max}", field="jobs",
                           limit="batch_create_jobs_max")
    return jobs


async def _batch_items(
        node: "NodePort", bodies: list,
        now: int) -> tuple[list[dict], list[tuple[int, commands.CreateJobItem, int]]]:
    """Each job body checked as POST /v1/jobs checks it: (a result per job, a
    problem where it was refused; (position, create_jobs item, body bytes) of
    the others). The loop gets its turn every loop_slice_s."""
    results: list[dict] = [{} for _ in bodies]
    checked = []
    ids = new_job_ids(len(bodies))   # in one block; a refused job's id goes unused
    slice_end = time.monotonic() + limits.loop_slice_s
    for position, body in enumerate(bodies):
        if time.monotonic() >= slice_end:
            await asyncio.sleep(0)
            slice_end = time.monotonic() + limits.loop_slice_s
        try:
            size = _job_body_bytes(body, position)
            checked.append((position, _batch_item(node, body, now, ids[position]), size))
        except InvalidInput as exc:
            results[position] = {"error": _problem_of(exc)}
    return results, checked


def batch_entries(checked: list[tuple[int, commands.CreateJobItem, int]]
                  ) -> list[tuple[list[int], list[commands.CreateJobItem]]]:
    """The checked jobs, in order, as create_jobs entries of at most
    batch_entry_jobs_max jobs and batch_entry_bytes_max bytes of job bodies
    (a larger job alone): (positions in the batch, items) per entry."""
    parts, start = [], 0
    for count in cost.pack([size for _, _, size in checked], limits.batch_entry_bytes_max,
                           limits.batch_entry_jobs_max):
        part = checked[start:start + count]
        parts.append(([position for position, _, _ in part], [item for _, item, _ in part]))
        start += count
    return parts


def _job_body_bytes(body: object, position: int) -> int:
    """The job body's size as compact JSON: a job of a batch is held to the
    bound of POST /v1/jobs's body (413 naming request_body_bytes_max)."""
    size = json_size(body)
    if size > limits.request_body_bytes_max:
        raise InvalidInput(f"job {position} of the batch is {size} bytes of JSON; a job is at "
                           f"most {limits.request_body_bytes_max}", field=f"jobs[{position}]",
                           status=413, type_="too-large", limit="request_body_bytes_max")
    return size


def _batch_item(node: "NodePort", body: object, now: int,
                job_id: str) -> commands.CreateJobItem:
    """A job body, checked as POST /v1/jobs checks it, as a create_jobs item."""
    parsed = validate_create(body, job_id)
    spec = parsed["spec"]
    policy.check_spec(node.config, spec)
    _check_run_at(spec["schedule"], now)
    return commands.create_job_item(job_id=job_id, spec=spec,
                                    idempotency_key=parsed["idempotency_key"],
                                    shard=node.shard_of(job_id),
                                    next_ms=next_fire_ms(spec["schedule"], now))


def _batch_result(node: "NodePort", outcome: dict) -> dict:
    """One item's result of create_jobs as the API answers it."""
    try:
        if outcome.get("error") == "idempotency_key_reserved":
            raise _key_reserved(node, outcome)
        raise_refusal(outcome)
    except InvalidInput as exc:
        return {"error": _problem_of(exc)}
    job = outcome["job"]
    if isinstance(job, compact.CreatedJob):   # a one-off in UTC, not read whole for this
        return {"job_id": job.job_id, "next_run_at": format_ms(job.next_ms), "created": True}
    return {"job_id": job["id"], "next_run_at": format_in_job_zone(job["spec"], job["next_ms"]),
            "created": not outcome["existing"]}


def _problem_of(exc: InvalidInput) -> dict:
    # A job of a batch over a quota has no Retry-After header of its own: its
    # problem says when to try it again.
    extra = {"retry_after_s": exc.retry_after_s} if isinstance(exc, QuotaExceeded) else {}
    return problem_body(exc.status, exc.type, exc.detail, field=exc.field, limit=exc.limit,
                        **extra)


def _key_reserved(node: "NodePort", result: dict) -> Conflict:
    """The key's job was deleted (or deleted and removed): the key stays
    reserved until its TTL, which this node's --idempotency-ttl-s dates."""
    since_ms = result["reserved_ms"]
    if since_ms is None:
        until = "until it is removed, within seconds (its TTL has passed)"
    else:
        until = f"until {format_ms(since_ms + int(node.config.idempotency_ttl_s * 1000))}"
    return Conflict(f"{result['detail']} {until}; use another key", field="idempotency_key")


def _check_run_at(schedule: dict, now: int) -> None:
    """A one-off not too far ahead; a bounded schedule with an occurrence left."""
    if schedule["kind"] == "once" and schedule["run_at_ms"] - now > limits.run_at_ahead_ms_max:
        raise InvalidInput("`run_at` is more than 10 years ahead", field="run_at",
                           limit="run_at_ahead_ms_max")
    if "not_after_ms" in schedule and next_fire_ms(schedule, now) is None:
        raise InvalidInput("the schedule has no occurrence left before `not_after`",
                           field="not_after")


async def get_job(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    job = _live_job(node, request.match_info["job_id"], tenant_of(request))
    return json_response(job_view(job))


async def patch_job(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_body(request)
    # A write that reads first must read the latest state: a job created a
    # moment ago through another node may not be applied here yet.
    await node.wait_caught_up()
    job = _live_job(node, request.match_info["job_id"], tenant_of(request))
    spec = validate_patch(body, job["spec"], job["id"])
    policy.check_spec(node.config, spec)
    await _refuse_ungranted_commands(node, job["tenant"], spec)
    now = node.now_ms()
    _check_run_at(spec["schedule"], now)
    next_ms = None if job["status"] == "paused" else next_fire_ms(spec["schedule"], now)
    node.check_room()
    result = await node.propose(_scoped(request, commands.update_job(
        job_id=job["id"], spec=spec, expected_version=job["version"], next_ms=next_ms,
        at_ms=now)))
    raise_refusal(result)
    return json_response(job_view(result["job"]))


async def delete_job(request: web.Request) -> web.Response:
    node = node_of(request)
    result = await node.propose(_scoped(request, commands.delete_job(
        job_id=request.match_info["job_id"], at_ms=node.now_ms())))
    raise_refusal(result)
    return web.Response(status=204)


async def pause_job(request: web.Request) -> web.Response:
    """Optional body {"note": "..."}: why, kept and shown until the job resumes."""
    node = node_of(request)
    note = _pause_note(await json_body(request, empty_ok=True))
    result = await node.propose(_scoped(request, commands.pause_job(
        job_id=request.match_info["job_id"], at_ms=node.now_ms(), note=note)))
    raise_refusal(result)
    return json_response(job_view(result["job"]))


def _pause_note(body: object) -> str | None:
    if body is None:
        return None
    note = check_shape(body, PauseNote).note
    if note is not None and len(note.encode("utf-8")) > limits.pause_note_bytes_max:
        raise InvalidInput(f"`note` is longer than {limits.pause_note_bytes_max} bytes of "
                           "UTF-8", field="note", limit="pause_note_bytes_max")
    return note


async def resume_job(request: web.Request) -> web.Response:
    node = node_of(request)
    await node.wait_caught_up()
    job = _live_job(node, request.match_info["job_id"], tenant_of(request))
    now = node.now_ms()
    # From now: no catch-up of what was missed while paused (a one-off whose
    # time passed while paused runs once, now).
    node.check_room()
    result = await node.propose(_scoped(request, commands.resume_job(
        job_id=job["id"], next_ms=next_fire_ms(job["spec"]["schedule"], now), at_ms=now)))
    raise_refusal(result)
    return json_response(job_view(result["job"]))


async def trigger_job(request: web.Request) -> web.Response:
    """Optional body {"overlap": "allow"}: this run is admitted whatever the
    job's concurrency policy (api/history.py parse_overlap)."""
    node = node_of(request)
    overlap = history.parse_overlap(await json_body(request, empty_ok=True))
    now = node.now_ms()
    node.check_room()
    result = await node.propose(_scoped(request, commands.trigger_job(
        job_id=request.match_info["job_id"], scheduled_ms=now, node=node.node_id, at_ms=now,
        overlap=overlap)))
    raise_refusal(result)
    run = result["run"]
    return json_response(run_view(run, job_secrets(node, run["job_id"]), node.now_ms()),
                         status=201 if result["created"] else 200)


async def job_runs(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    job_id = request.match_info["job_id"]
    job = node.job(job_id)
    if job is None or job["tenant"] != tenant_of(request):
        raise NotFound(f"job {job_id} not found", field="job_id")
    limit = int_param(request, "limit", limits.list_limit_default, limits.list_limit_max)
    runs = node.job_runs(job_id, limit)
    hidden = job_secrets(node, job_id)
    now = node.now_ms()
    return json_response({"runs": [run_view(r, hidden, now) for r in runs]})


async def get_run(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    run = node.run(request.match_info["run_id"])
    if run is None or run["tenant"] != tenant_of(request):
        raise NotFound(f"run {request.match_info['run_id']} not found", field="run_id")
    return json_response(run_view(run, job_secrets(node, run["job_id"]), node.now_ms()))


async def job_preview(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    job = _live_job(node, request.match_info["job_id"], tenant_of(request))
    count = int_param(request, "count", limits.preview_count_default, limits.preview_count_max,
                      limit="preview_count_max")
    schedule = job["spec"]["schedule"]
    times = preview_ms(schedule, node.now_ms(), count)
    answer = {"fire_times": [format_in_job_zone(job["spec"], t) for t in times]}
    if schedule["kind"] == "cron" and "text" in schedule:
        answer["resolved"] = schedule["cron"]
    return json_response(answer)


async def schedules_preview(request: web.Request) -> web.Response:
    body = await json_body(request)
    preview = check_shape(body, SchedulePreview)
    # `H` is hashed from `job_id` when one is given, as it would be for that job.
    schedule = parse_schedule(body.get("schedule"), preview.run_at,
                              hash_key=preview.job_id or "")
    after = node_of(request).now_ms()
    if preview.after is not None:
        after = parse_instant(preview.after, "after")[0]
    spec = {"schedule": schedule}
    times = preview_ms(schedule, after, preview.count)
    answer = {"fire_times": [format_in_job_zone(spec, t) for t in times]}
    if schedule["kind"] == "cron" and "text" in schedule:
        answer["resolved"] = schedule["cron"]
    return json_response(answer)


# --- cluster ---------------------------------------------------------------------------

async def node_status(request: web.Request) -> web.Response:
    return json_response(node_of(request).status())


async def node_clock(request: web.Request) -> web.Response:
    """This node's own wall clock, in microseconds since the epoch: what its
    peers measure it by (runtime/clock.py), so it is read as late as possible."""
    node = node_of(request)
    answer = {"node": node.node_id, "wall_us": node.wall_us(), "draining": node.draining(),
              "applies": commands.APPLY_LEVEL}
    # What a follower's consistent read asks the leader (runtime/node.py), after
    # the wall clock, which is read as late as possible.
    answer["role"], answer["commit_index"] = node.raft_position()
    return json_response(answer)


async def cluster(request: web.Request) -> web.Response:
    node = node_of(request)
    me = node.status()
    registered = {rec["id"]: rec for rec in node.registered_nodes()}
    registered.setdefault(node.node_id, {"id": node.node_id, "http": me["http"],
                                         "raft": me["raft"]})

    async def fetch(rec: dict) -> dict:
        if rec["id"] == node.node_id:
            return me
        try:
            return await node.peers.get_json(rec["http"] + "/v1/node",
                                             timeout_s=limits.cluster_peer_status_timeout_s)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return {"id": rec["id"], "http": rec["http"], "raft": rec["raft"],
                    "role": "unreachable"}

    statuses = await asyncio.gather(*(fetch(rec) for rec in registered.values()))
    by_raft = {rec["raft"]: rec["id"] for rec in registered.values()}
    leader = by_raft.get(me["leader_raft"]) if me["leader_raft"] else None
    if me["role"] == "leader":
        leader = node.node_id
    offsets = node.clock_offsets_ms()
    nodes = {s["id"]: {**{k: s.get(k) for k in ("http", "raft", "role", "term", "commit_index",
                                                 "applied_index", "shards_owned")},
                       # As this node last judged it: that node's wall clock
                       # minus the cluster's time (null: not measured yet).
                       "clock_offset_ms": offsets.get(s["id"]),
                       # Tenants' circuit breakers open there: runs held, not called.
                       "breakers_open": (s.get("breakers") or {}).get("open"),
                       # CPU seconds of its threads since it started (null: not known).
                       "threads_cpu_s": s.get("threads_cpu_s")}
             for s in statuses}
    shards = [state for _, state in node.shards()]
    return json_response({"leader": leader, "self": node.node_id, "shard_count": node.shard_count,
                  "nodes": nodes,
                  # Fires refused by apply for a stale fencing token, cluster-wide
                  # (replicated, so every node reports the same count).
                  "stale_fires_total": sum(s["stale_fires"] for s in shards)})


async def cluster_shards(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    shards = [{"shard": shard, "owner": state["owner"],
               "token": state["token"], "checkpoint": format_ms(state["checkpoint_ms"] or None),
               "stale_fires": state["stale_fires"]}
              for shard, state in node.shards()]
    return json_response({"shards": shards})


async def state_digest(request: web.Request) -> web.Response:
    """This node's digest now, or with ?index=N the digest it recorded when it
    applied the check_digest entry at N (waiting briefly until it gets there)."""
    node = node_of(request)
    if "index" not in request.query:
        index, value = await node.digest()
        return json_response({"node": node.node_id, "applied_index": index,
                              "digest": "sha256:" + value})
    try:
        index = int(request.query["index"])
    except ValueError:
        raise InvalidInput("index must be an integer log index", field="index") from None
    value = await node.digest_at(index, limits.propose_timeout_s)
    if value is None:
        applied = node.applied_index()
        why = (f"this node has applied only up to {applied}" if applied < index else
               "no digest check was recorded here at that index (not a check_digest entry, "
               "older than the checks kept, too many at once, or passed over by a snapshot "
               "install or restart)")
        return problem(404, "not-found", f"no digest recorded at index {index}: {why}",
                       field="index")
    return json_response({"node": node.node_id, "applied_index": index,
                          "digest": "sha256:" + value})


async def check_digest(request: web.Request) -> web.Response:
    """Commit a check_digest entry: every replica records its digest at its index."""
    node = node_of(request)
    result = await node.propose(commands.check_digest(node=node.node_id, at_ms=node.now_ms()))
    raise_refusal(result, field="node")
    try:
        value = await node.digest_at(result["index"], limits.propose_timeout_s)
    except Unavailable as exc:
        # Still being computed (a large state takes minutes): the check's index,
        # so that a caller asks GET /v1/state/digest?index= rather than checking
        # again (each check is one more digest to compute on every node).
        return problem(503, "unavailable", exc.detail, reason=exc.reason,
                       index=result["index"], headers={"Retry-After": "1"})
    if value is None:
        raise Unavailable(f"the digest at index {result['index']} was not computed here; retry",
                          reason="digest_unavailable")
    return json_response({"node": node.node_id, "index": result["index"],
                          "digest": "sha256:" + value})


def _scoped(request: web.Request, command: dict) -> dict:
    return commands.scoped(command, tenant=tenant_of(request), actor=actor_of(request))


async def healthz(request: web.Request) -> web.Response:
    return json_response({"ok": True, "node": node_of(request).node_id})


async def openapi_document(request: web.Request) -> web.Response:
    return json_response(openapi.document())


async def ui(request: web.Request) -> web.Response:
    page = resources.files("raftsched.api").joinpath("static/index.html").read_text()
    return web.Response(text=page, content_type="text/html")


# The UI's modules and stylesheet (api/static/), public like the page that loads
# them: they hold no data. The pattern admits no "..", so only static/ is served.
UI_FILE = r"{file:(?:views/)?[a-z_]+\.(?:js|css)}"
UI_TYPES = {"js": "text/javascript", "css": "text/css"}


async def ui_file(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    path = resources.files("raftsched.api").joinpath(f"static/{name}")
    if not path.is_file():
        raise NotFound(f"no UI file {name}", field="file")
    return web.Response(text=path.read_text(), content_type=UI_TYPES[name.rsplit(".", 1)[1]],
                        charset="utf-8")


def make_app(node: "NodePort") -> web.Application:
    # The largest body any route takes; json_body holds each route to its own
    # limit and names it in the 413.
    app = web.Application(middlewares=[problems_middleware, auth_middleware],
                          client_max_size=max(limits.request_body_bytes_max,
                                              limits.worker_complete_body_bytes_max,
                                              limits.batch_request_body_bytes_max))
    app[NODE_KEY] = node
    r = app.router
    r.add_get("/", ui)
    r.add_get(f"/ui/{UI_FILE}", ui_file)
    r.add_get("/healthz", healthz)
    r.add_get("/v1/healthz", healthz)
    r.add_get("/v1/openapi.json", openapi_document)
    r.add_post("/v1/jobs", create_job)
    r.add_post("/v1/jobs:batchCreate", batch_create_jobs)
    r.add_get(f"/v1/jobs/{JOB_ID}", get_job)
    r.add_patch(f"/v1/jobs/{JOB_ID}", patch_job)
    r.add_delete(f"/v1/jobs/{JOB_ID}", delete_job)
    r.add_post(f"/v1/jobs/{JOB_ID}:pause", pause_job)
    r.add_post(f"/v1/jobs/{JOB_ID}:resume", resume_job)
    r.add_post(f"/v1/jobs/{JOB_ID}:trigger", trigger_job)
    r.add_get(f"/v1/jobs/{JOB_ID}/runs", job_runs)
    r.add_get(f"/v1/jobs/{JOB_ID}/preview", job_preview)
    r.add_get(f"/v1/runs/{execution.RUN_ID}", get_run)
    history.add_routes(r, execution.RUN_ID)
    r.add_post("/v1/schedules:preview", schedules_preview)
    r.add_get("/v1/cluster", cluster)
    r.add_get("/v1/cluster/shards", cluster_shards)
    r.add_get("/v1/node", node_status)
    r.add_get("/v1/node/clock", node_clock)
    r.add_get("/v1/state/digest", state_digest)
    r.add_post("/v1/state/digest:check", check_digest)
    execution.add_routes(r)
    admin.add_routes(r)
    backfills.add_routes(r)
    metrics.add_routes(r)
    return app
