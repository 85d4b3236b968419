"""Routes for execution: cancel a run, read its logs, topics and consumer
groups, and the remote-worker protocol (claim, heartbeat, complete)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.api.auth import NODE_ROLE, actor_of, principal, tenant_of
from raftsched.api.common import (float_param, int_param, job_secrets, json_body,
                                  json_response, maybe_consistent, node_of, optional_reason,
                                  raise_refusal)
from raftsched.api.views import run_view
from raftsched.core import commands, keys, spec
from raftsched.core.jobspec import RUN_ID_PATTERN, validate_name_token
from raftsched.core.redact import redact_output, redact_text
from raftsched.core.timeutil import format_ms
from raftsched.errors import Forbidden, InvalidInput, NotFound

if TYPE_CHECKING:
    from raftsched.nodeport import NodePort

RUN_ID = "{run_id:%s}" % RUN_ID_PATTERN
# Names in URLs match any length here, so that a name that is too long is a
# 400 naming its limit (checked in the handler) rather than a bare 404.
TOPIC = "{topic:[A-Za-z0-9._-]+}"
GROUP = "{group:[A-Za-z0-9._-]+}"
WORKER = "{worker_id:[A-Za-z0-9._-]+}"


def _topic(request: web.Request) -> tuple[str, str]:
    """(the topic's name, the name the state keys it by: scoped by tenant)."""
    name = validate_name_token(request.match_info["topic"], "topic")
    return name, keys.scoped(tenant_of(request), name)


def _group(value: str) -> str:
    return validate_name_token(value, "group", max_bytes=limits.group_bytes_max,
                               limit="group_bytes_max")


def _worker(request: web.Request) -> str:
    return validate_name_token(request.match_info["worker_id"], "worker_id",
                               max_bytes=limits.worker_id_bytes_max,
                               limit="worker_id_bytes_max")


def _run(node: "NodePort", run_id: str, tenant: str) -> dict:
    run = node.run(run_id)
    if run is None or run["tenant"] != tenant:
        raise NotFound(f"run {run_id} not found", field="run_id")
    return run


# --- runs ------------------------------------------------------------------------------

async def cancel_run(request: web.Request) -> web.Response:
    node = node_of(request)
    reason = await optional_reason(request, "cancelled through the API")
    result = await node.propose(commands.scoped(commands.cancel_run(
        run_id=request.match_info["run_id"], reason=reason,
        at_ms=node.now_ms()), tenant=tenant_of(request), actor=actor_of(request)))
    raise_refusal(result, field="run_id")
    return json_response(run_view(result["run"], job_secrets(node, result["run"]["job_id"]),
                                  node.now_ms()))


async def run_logs(request: web.Request) -> web.Response:
    """Every attempt's output, from whichever node keeps it. `?local=true`
    answers from this node's store only (what nodes ask each other).

    The job's secrets were masked before the output was stored and the errors
    recorded; both answers mask them again, for a name the job has listed in
    secret_keys since."""
    node = node_of(request)
    run_id = request.match_info["run_id"]
    if request.query.get("local") == "true":
        if principal(request).role not in ("admin", NODE_ROLE):
            raise Forbidden("`local=true` is how nodes ask each other; it needs the node "
                            "credential or an admin token", field="local")
        return json_response({"node": node.node_id, "attempts": _local_logs(node, run_id)})
    await maybe_consistent(request)
    run = _run(node, run_id, tenant_of(request))
    hidden = job_secrets(node, run["job_id"])
    holders = sorted({a["output_node"] for a in run.get("attempts", []) if a.get("output_node")})
    stored: dict[int, dict] = {}
    missing: list[dict] = []
    for holder in holders:
        found, error = await _logs_from(node, holder, run_id)
        if error is not None:
            missing.append({"node": holder, "error": error})
        for record in found:
            stored[record["attempt"]] = dict(redact_output(record, hidden), node=holder)
    attempts = []
    for summary in run.get("attempts", []):
        record = stored.get(summary["attempt"], {})
        attempts.append({"attempt": summary["attempt"], "holder": summary["holder"],
                         "started_at": format_ms(summary["started_ms"]),
                         "finished_at": format_ms(summary["finished_ms"]),
                         "http_status": summary["http_status"],
                         "exit_code": summary["exit_code"],
                         "error": summary["error"] and redact_text(summary["error"], hidden),
                         "output_node": summary.get("output_node"),
                         **{k: record[k] for k in ("stdout", "stderr", "http_body", "published",
                                                   "truncated") if k in record}})
    return json_response({"run_id": run_id, "attempts": attempts, "unavailable": missing})


def _local_logs(node: "NodePort", run_id: str) -> list[dict]:
    records = node.run_output(run_id)
    if not records:
        return records
    run = node.run(run_id)
    hidden = job_secrets(node, run["job_id"]) if run is not None else ()
    return [redact_output(record, hidden) for record in records]


async def _logs_from(node: "NodePort", holder: str, run_id: str) -> tuple[list[dict], str | None]:
    if holder == node.node_id:
        return node.run_output(run_id), None
    rec = node.registered_node(holder)
    if rec is None:
        return [], f"node {holder} is not registered"
    try:
        body = await node.peers.get_json(f"{rec['http']}/v1/runs/{run_id}/logs",
                                         timeout_s=limits.logs_fetch_timeout_s,
                                         params={"local": "true"})
        return body["attempts"], None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError,
            TypeError) as exc:
        return [], f"node {holder} did not answer: {type(exc).__name__}"


# --- topics ----------------------------------------------------------------------------

async def topic_messages(request: web.Request) -> web.Response:
    """Messages with offset > after, oldest first; waits up to wait_s for one.
    Without `after`, a `group` starts from its committed offset (else 0)."""
    node = node_of(request)
    await maybe_consistent(request)
    name, topic = _topic(request)
    limit = int_param(request, "limit", limits.topic_read_limit_default,
                      limits.topic_read_limit_max, limit="topic_read_limit_max")
    wait_s = float_param(request, "wait_s", 0.0, limits.topic_wait_s_max,
                         limit="topic_wait_s_max")
    after = _offset_param(request, node, topic)
    first, next_offset = node.topic_bounds(topic)
    rows = node.topic_messages(topic, max(after + 1, first), limit)
    if not rows and wait_s > 0:
        first, next_offset, rows = await _wait_for_messages(node, topic, after, limit, wait_s)
    messages = [{"offset": m["offset"], "key": m["key"], "message": m["message"],
                 "execution_id": m["execution_id"], "job_id": m["job_id"],
                 "published_at": format_ms(m["published_ms"])} for m in rows]
    return json_response({"topic": name, "messages": messages,
                          "next_after": messages[-1]["offset"] if messages else after,
                          "first_offset": first, "last_offset": next_offset - 1})


async def _wait_for_messages(node: "NodePort", topic: str, after: int, limit: int,
                             wait_s: float) -> tuple[int, int, list[dict]]:
    """(first offset, next offset, messages after `after`), waiting up to
    wait_s for one; the topic is held (bounded, node.topic_waiting) meanwhile."""
    deadline = time.monotonic() + wait_s
    with node.topic_waiting(topic) as waiting:
        while True:
            event = waiting.event()
            first, next_offset = node.topic_bounds(topic)
            rows = node.topic_messages(topic, max(after + 1, first), limit)
            remaining = deadline - time.monotonic()
            if rows or remaining <= 0 or waiting.ended:
                return first, next_offset, rows
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass


def _offset_param(request: web.Request, node: "NodePort", topic: str) -> int:
    if "after" in request.query:
        text = request.query["after"]
        # ASCII digits only: int() would also take " 1", "1_0" and other scripts' digits.
        if not (text.isascii() and text.isdigit()):
            raise InvalidInput("`after` must be an integer offset", field="after")
        # More than 19 digits is over the bound whatever they say (and not parsed).
        after = int(text) if len(text) <= 19 else limits.json_int_max
        if not 0 <= after <= limits.json_int_max - 1:
            raise InvalidInput(f"`after` must be from 0 to {limits.json_int_max - 1}",
                               field="after", limit="json_int_max")
        return after
    group = request.query.get("group")
    if group is None:
        return 0
    _group(group)
    committed = node.group_offset(topic, group)
    return committed["offset"] if committed else 0


async def get_group(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    (name, topic), group = _topic(request), _group(request.match_info["group"])
    committed = node.group_offset(topic, group)
    return json_response({"topic": name, "group": group,
                          "offset": committed["offset"] if committed else 0,
                          "committed_at": format_ms(committed["committed_ms"]) if committed
                          else None})


async def commit_group(request: web.Request) -> web.Response:
    node = node_of(request)
    offset = spec.check_shape(await json_body(request), spec.GroupOffset).offset
    (name, topic), group = _topic(request), _group(request.match_info["group"])
    if node.group_offset(topic, group) is None:
        node.check_room()   # a new group adds state; moving an offset does not
    result = await node.propose(commands.commit_offset(topic=topic, group=group, offset=offset,
                                                       at_ms=node.now_ms()))
    if not result["ok"] and result.get("limit"):
        raise InvalidInput(result["detail"], field="group", status=409, type_="conflict",
                           limit=result["limit"])
    if not result["ok"]:
        raise InvalidInput(result["detail"], field="offset")
    return json_response({"topic": name, "group": group, "offset": offset})


# --- workers ---------------------------------------------------------------------------

# Members of a worker's claim, heartbeat item and completion result.
CLAIM_FIELDS = spec.members(spec.WorkerClaim)
HEARTBEAT_FIELDS = spec.members(spec.RunHeld)
RESULT_FIELDS = spec.members(spec.RunResult)
OUTPUT_FIELDS = spec.members(spec.RunOutput)


async def worker_claim(request: web.Request) -> web.Response:
    node = node_of(request)
    claim = spec.check_shape(await json_body(request), spec.WorkerClaim)
    queue = claim.queue
    if queue == "default":
        raise InvalidInput("the default queue is served by the nodes' embedded workers; give "
                           "command targets a queue name and run workers for that",
                           field="queue")
    runs = await node.claim_runs(_worker(request), keys.scoped(tenant_of(request), queue),
                                 claim.max, claim.wait_s, lambda: _gone(request))
    return json_response({"runs": runs, "node": node.node_id})


def _gone(request: web.Request) -> bool:
    """Whether the caller closed its connection (aiohttp lets the handler
    run on, without its transport)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def worker_heartbeat(request: web.Request) -> web.Response:
    node = node_of(request)
    worker = _worker(request)
    body = await json_body(request)
    spec.check_shape(body, spec.WorkerHeartbeat)
    beats = body["runs"]
    lost = await node.heartbeat_runs(worker, beats, tenant_of(request))
    return json_response({"lost": lost})


async def worker_complete(request: web.Request) -> web.Response:
    node = node_of(request)
    worker = _worker(request)
    body = await json_body(request, limits.worker_complete_body_bytes_max,
                           "worker_complete_body_bytes_max")
    spec.check_shape(body, spec.WorkerComplete)
    results = body["results"]
    for result in results:
        # It goes into the replicated run record.
        if result.get("error"):
            result["error"] = result["error"][:limits.run_error_chars_max]
    accepted = await node.complete_runs(worker, results, tenant_of(request))
    return json_response({"accepted": accepted})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(f"/v1/runs/{RUN_ID}:cancel", cancel_run)
    router.add_get(f"/v1/runs/{RUN_ID}/logs", run_logs)
    router.add_get(f"/v1/topics/{TOPIC}/messages", topic_messages)
    router.add_get(f"/v1/topics/{TOPIC}/groups/{GROUP}", get_group)
    router.add_put(f"/v1/topics/{TOPIC}/groups/{GROUP}", commit_group)
    router.add_post(f"/v1/workers/{WORKER}/claim", worker_claim)
    router.add_post(f"/v1/workers/{WORKER}/heartbeat", worker_heartbeat)
    router.add_post(f"/v1/workers/{WORKER}/complete", worker_complete)
