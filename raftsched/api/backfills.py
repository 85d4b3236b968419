"""Routes for backfills: start one over a past range of a job's schedule, read
its progress, cancel it (core/backfill.py has the rules, runtime/backfiller.py
the pacing)."""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING

from aiohttp import web

from raftsched import limits
from raftsched.api.auth import actor_of, tenant_of
from raftsched.api.common import (json_body, json_response, maybe_consistent, node_of,
                                  optional_reason, raise_refusal)
from raftsched.api.views import format_in_job_zone
from raftsched.core import backfill, commands
from raftsched.core.jobspec import JOB_ID_PATTERN
from raftsched.core.timeutil import format_ms
from raftsched.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from raftsched.nodeport import NodePort

JOB_ID = "{job_id:%s}" % JOB_ID_PATTERN
BACKFILL_ID = "{backfill_id:%s}" % backfill.ID_PATTERN


def _job(node: "NodePort", job_id: str, tenant: str) -> dict:
    job = node.job(job_id)
    if job is None or job["status"] == "deleted" or job["tenant"] != tenant:
        raise NotFound(f"job {job_id} not found", field="job_id")
    return job


def _schedule(job: dict) -> dict:
    schedule = job["spec"].get("schedule")
    if not schedule or schedule.get("kind") not in backfill.SCHEDULE_KINDS:
        raise InvalidInput(f"job {job['id']} has no schedule to backfill", field="job_id")
    return schedule


async def create_backfill(request: web.Request) -> web.Response:
    """POST /v1/jobs/{id}:backfill: 202 with the backfill's id and its number
    of occurrences; with dry_run, 200 with the occurrences and nothing run."""
    node = node_of(request)
    body = await json_body(request)
    # The schedule and version read here are what the backfill copies; read the latest.
    await node.wait_caught_up()
    tenant = tenant_of(request)
    job = _job(node, request.match_info["job_id"], tenant)
    asked = backfill.parse_request(body, node.now_ms())
    schedule = _schedule(job)
    found = await asyncio.get_running_loop().run_in_executor(
        None, backfill.range_occurrences, schedule, asked["start_ms"], asked["end_ms"],
        limits.backfill_occurrences_max + 1)
    if len(found) > limits.backfill_occurrences_max:
        raise InvalidInput(f"the range holds more than {limits.backfill_occurrences_max} "
                           f"occurrences of the job's schedule; split it",
                           field="end", limit="backfill_occurrences_max")
    if asked["dry_run"]:
        return json_response(_dry_run(node, job, found))
    if not found:
        raise InvalidInput("the job's schedule has no occurrence in [start, end)", field="start")
    node.check_room()
    backfill_id = backfill.ID_PREFIX + secrets.token_hex(10)
    result = await node.propose(commands.create_backfill(
        backfill_id=backfill_id, job_id=job["id"], tenant=tenant,
        expected_version=job["version"], start_ms=asked["start_ms"], end_ms=asked["end_ms"],
        overlap=asked["overlap"], max_concurrent=asked["max_concurrent"], total=len(found),
        at_ms=node.now_ms(), actor=actor_of(request)))
    raise_refusal(result)
    response = json_response({"backfill_id": backfill_id, "occurrences": len(found),
                              "dry_run": False, "state": backfill.RUNNING}, status=202)
    response.headers["Location"] = f"/v1/backfills/{backfill_id}"
    return response


def _dry_run(node: "NodePort", job: dict, found: list[int]) -> dict:
    """The occurrences, in the job's zone, and how many already have a run
    (those a backfill would not run again)."""
    existing = node.occurrences_with_a_run(job["id"], found)
    return {"backfill_id": None, "dry_run": True, "occurrences": len(found),
            "existing": existing,
            "scheduled_for": [format_in_job_zone(job["spec"], ms) for ms in found]}


def _record(node: "NodePort", backfill_id: str, tenant: str) -> dict:
    record = node.backfill(backfill_id)
    if record is None or record["tenant"] != tenant:
        raise NotFound(f"backfill {backfill_id} not found", field="backfill_id")
    return record


def backfill_view(node: "NodePort", record: dict) -> dict:
    """The record with its progress as of now: its open runs' states are read."""
    states = node.run_states([run_id for run_id, _ in record["open"]])
    return {"backfill_id": record["id"], "job_id": record["job_id"], "state": record["state"],
            "reason": record["reason"], **backfill.progress(record, states),
            "start": format_ms(record["start_ms"]), "end": format_ms(record["end_ms"]),
            "overlap": record["overlap"], "max_concurrent": record["max_concurrent"],
            "created_at": format_ms(record["created_ms"]),
            "updated_at": format_ms(record["updated_ms"]),
            "finished_at": format_ms(record["finished_ms"])}


async def get_backfill(request: web.Request) -> web.Response:
    node = node_of(request)
    await maybe_consistent(request)
    record = _record(node, request.match_info["backfill_id"], tenant_of(request))
    return json_response(backfill_view(node, record))


async def cancel_backfill(request: web.Request) -> web.Response:
    node = node_of(request)
    reason = await optional_reason(request, None)
    result = await node.propose(commands.scoped(commands.cancel_backfill(
        backfill_id=request.match_info["backfill_id"], reason=reason, at_ms=node.now_ms()),
        tenant=tenant_of(request), actor=actor_of(request)))
    raise_refusal(result, field="backfill_id")
    return json_response(backfill_view(node, result["backfill"]))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post(f"/v1/jobs/{JOB_ID}:backfill", create_backfill)
    router.add_get(f"/v1/backfills/{BACKFILL_ID}", get_backfill)
    router.add_post(f"/v1/backfills/{BACKFILL_ID}:cancel", cancel_backfill)
