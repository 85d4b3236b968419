"""Routes for execution: cancel a run, read its logs, topics and consumer
groups, and the remote-worker protocol (claim, heartbeat, complete)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.api.common import (float_param, int_param, json_body, json_response,
                                  maybe_consistent, node_of, raise_refusal)
from raftsched.api.views import run_view
from raftsched.core import commands, keys
from raftsched.core.apply import GROUPS, NODES, RUNS, TOPICS
from raftsched.core.jobspec import validate_name_token
from raftsched.core.timeutil import format_ms
from raftsched.core.topics import meta as topic_meta
from raftsched.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

RUN_ID = "{run_id:run_[0-9a-f]+}"
TOPIC = "{topic:[A-Za-z0-9._-]+}"
GROUP = "{group:[A-Za-z0-9._-]+}"
WORKER = "{worker_id:[A-Za-z0-9._-]+}"


def _run(node: "Node", run_id: str) -> dict:
    run = node.store.get(RUNS, run_id.encode())
    if run is None:
        raise NotFound(f"run {run_id} not found", field="run_id")
    return run


# --- runs ------------------------------------------------------------------------------

async def cancel_run(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await request.read()
    reason = "cancelled through the API"
    if body:
        parsed = await json_body(request)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("reason", ""), str):
            raise InvalidInput("the body is optional: {\"reason\": \"...\"}", field="reason")
        reason = parsed.get("reason") or reason
    result = await node.propose(commands.cancel_run(
        run_id=request.match_info["run_id"], reason=reason[:limits.run_error_chars_max],
        at_ms=node.now_ms()))
    raise_refusal(result, field="run_id")
    return json_response(run_view(result["run"]))


async def run_logs(request: web.Request) -> web.Response:
    """Every attempt's output, from whichever node keeps it. `?local=true`
    answers from this node's store only (what nodes ask each other)."""
    node = node_of(request)
    run_id = request.match_info["run_id"]
    if request.query.get("local") == "true":
        return json_response({"node": node.node_id, "attempts": node.outputs.get(run_id)})
    run = _run(node, run_id)
    holders = sorted({a["output_node"] for a in run.get("attempts", []) if a.get("output_node")})
    stored: dict[int, dict] = {}
    missing: list[dict] = []
    for holder in holders:
        found, error = await _logs_from(node, holder, run_id)
        if error is not None:
            missing.append({"node": holder, "error": error})
        for record in found:
            stored[record["attempt"]] = dict(record, node=holder)
    attempts = []
    for summary in run.get("attempts", []):
        record = stored.get(summary["attempt"], {})
        attempts.append({"attempt": summary["attempt"], "holder": summary["holder"],
                         "started_at": format_ms(summary["started_ms"]),
                         "finished_at": format_ms(summary["finished_ms"]),
                         "http_status": summary["http_status"],
                         "exit_code": summary["exit_code"], "error": summary["error"],
                         "output_node": summary.get("output_node"),
                         **{k: record[k] for k in ("stdout", "stderr", "http_body", "published",
                                                   "truncated") if k in record}})
    return json_response({"run_id": run_id, "attempts": attempts, "unavailable": missing})


async def _logs_from(node: "Node", holder: str, run_id: str) -> tuple[list[dict], str | None]:
    if holder == node.node_id:
        return node.outputs.get(run_id), None
    rec = node.store.get(NODES, holder.encode())
    if rec is None:
        return [], f"node {holder} is not registered"
    try:
        timeout = aiohttp.ClientTimeout(total=limits.logs_fetch_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{rec['http']}/v1/runs/{run_id}/logs",
                                   params={"local": "true"}) as response:
                body = await response.json()
                return body["attempts"], None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
        return [], f"node {holder} did not answer: {type(exc).__name__}"


# --- topics ----------------------------------------------------------------------------

async def topic_messages(request: web.Request) -> web.Response:
    """Messages with offset > after, oldest first; waits up to wait_s for one.
    Without `after`, a `group` starts from its committed offset (else 0)."""
    node = node_of(request)
    await maybe_consistent(request)
    topic = request.match_info["topic"]
    limit = int_param(request, "limit", 100, limits.topic_read_limit_max)
    wait_s = float_param(request, "wait_s", 0.0, limits.topic_wait_s_max)
    after = _offset_param(request, node, topic)
    deadline = time.monotonic() + wait_s
    while True:
        event = node.topic_events.setdefault(topic, asyncio.Event())
        state = topic_meta(node.store, topic)   # type: ignore[arg-type]
        start = max(after + 1, state["first"])
        rows = node.store.scan(TOPICS, start=keys.topic_key(topic, start),
                               stop=keys.prefix_end(keys.topic_prefix(topic)), limit=limit)
        remaining = deadline - time.monotonic()
        if rows or remaining <= 0:
            break
        try:
            await asyncio.wait_for(event.wait(), remaining)
        except asyncio.TimeoutError:
            pass
    messages = [{"offset": m["offset"], "key": m["key"], "message": m["message"],
                 "execution_id": m["execution_id"], "job_id": m["job_id"],
                 "published_at": format_ms(m["published_ms"])} for _, m in rows]
    return json_response({"topic": topic, "messages": messages,
                          "next_after": messages[-1]["offset"] if messages else after,
                          "first_offset": state["first"], "last_offset": state["next"] - 1})


def _offset_param(request: web.Request, node: "Node", topic: str) -> int:
    if "after" in request.query:
        try:
            after = int(request.query["after"])
        except ValueError:
            raise InvalidInput("`after` must be an integer offset", field="after") from None
        if after < 0:
            raise InvalidInput("`after` must be 0 or more", field="after")
        return after
    group = request.query.get("group")
    if group is None:
        return 0
    validate_name_token(group, "group")
    committed = node.store.get(GROUPS, keys.group_key(topic, group))
    return committed["offset"] if committed else 0


async def get_group(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    topic, group = request.match_info["topic"], request.match_info["group"]
    committed = node.store.get(GROUPS, keys.group_key(topic, group))
    return json_response({"topic": topic, "group": group,
                          "offset": committed["offset"] if committed else 0,
                          "committed_at": format_ms(committed["committed_ms"]) if committed
                          else None})


async def commit_group(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_body(request)
    offset = body.get("offset") if isinstance(body, dict) else None
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidInput("the body must be {\"offset\": N}, the last offset processed",
                           field="offset")
    topic, group = request.match_info["topic"], request.match_info["group"]
    result = await node.propose(commands.commit_offset(topic=topic, group=group, offset=offset,
                                                       at_ms=node.now_ms()))
    if not result["ok"]:
        raise InvalidInput(result["detail"], field="offset")
    return json_response({"topic": topic, "group": group, "offset": offset})


# --- workers ---------------------------------------------------------------------------

def _list_member(body: Any, name: str, maximum: int) -> list[dict]:
    if not isinstance(body, dict) or not isinstance(body.get(name), list) \
            or not all(isinstance(item, dict) for item in body[name]):
        raise InvalidInput(f"the body must be {{\"{name}\": [...]}}", field=name)
    if len(body[name]) > maximum:
        raise InvalidInput(f"at most {maximum} {name} per request", field=name,
                           limit="worker_claim_max")
    for i, item in enumerate(body[name]):
        if not isinstance(item.get("run_id"), str) or isinstance(item.get("attempt"), bool) \
                or not isinstance(item.get("attempt"), int):
            raise InvalidInput("each item needs run_id (string) and attempt (integer)",
                               field=f"{name}[{i}]")
    return body[name]


async def worker_claim(request: web.Request) -> web.Response:
    node = node_of(request)
    body = await json_body(request)
    if not isinstance(body, dict):
        raise InvalidInput("the body must be {\"queue\", \"max\", \"wait_s\"}", field="body")
    queue = validate_name_token(body.get("queue"), "queue")
    if queue == "default":
        raise InvalidInput("the default queue is served by the nodes' embedded workers; give "
                           "command targets a queue name and run workers for that",
                           field="queue")
    max_runs = body.get("max", 1)
    if isinstance(max_runs, bool) or not isinstance(max_runs, int) \
            or not 1 <= max_runs <= limits.worker_claim_max:
        raise InvalidInput(f"`max` must be an integer from 1 to {limits.worker_claim_max}",
                           field="max", limit="worker_claim_max")
    wait_s = body.get("wait_s", 0)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) \
            or not 0 <= wait_s <= limits.worker_claim_wait_s_max:
        raise InvalidInput(f"`wait_s` must be from 0 to {limits.worker_claim_wait_s_max:g}",
                           field="wait_s", limit="worker_claim_wait_s_max")
    runs = await node.workers.claim(request.match_info["worker_id"], queue, max_runs,
                                    float(wait_s))
    return json_response({"runs": runs, "node": node.node_id})


async def worker_heartbeat(request: web.Request) -> web.Response:
    node = node_of(request)
    beats = _list_member(await json_body(request), "runs", limits.run_update_batch_max)
    lost = await node.workers.heartbeat(request.match_info["worker_id"], beats)
    return json_response({"lost": lost})


async def worker_complete(request: web.Request) -> web.Response:
    node = node_of(request)
    results = _list_member(await json_body(request), "results", limits.worker_claim_max)
    for i, result in enumerate(results):
        if not isinstance(result.get("ok"), bool):
            raise InvalidInput("each result needs ok (true or false)", field=f"results[{i}].ok")
    accepted = await node.workers.complete(request.match_info["worker_id"], results)
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
