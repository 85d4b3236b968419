"""Replicated commands: versioned, tagged msgpack maps; nothing pickled.

Every command is computed completely by its proposer: the time it was proposed
(`at_ms`), the next fire time of a recurring job, the node that will execute a
run. apply never has to read a clock or the zone database, so the same log
gives the same state on every node.
"""

from __future__ import annotations

from typing import Any

from raftsched import limits
from raftsched.core import codec, dag
from raftsched.core.shape import Check, ShapeError
from raftsched.core.shape import boolean as _bool
from raftsched.core.shape import by_member as _by
from raftsched.core.shape import integer as _int
from raftsched.core.shape import json_value as _json
from raftsched.core.shape import list_of as _list
from raftsched.core.shape import map_of as _map
from raftsched.core.shape import may_be_absent as _may
from raftsched.core.shape import number as _num
from raftsched.core.shape import one_of as _enum
from raftsched.core.shape import optional as _opt
from raftsched.core.shape import record as _record
from raftsched.core.shape import text as _str
from raftsched.core.shape import tuple_of as _tuple
from raftsched.errors import CommandRefused, UnknownCommand

VERSION = 1

TAGS = frozenset({"create_job", "update_job", "delete_job", "pause_job", "resume_job",
                  "trigger_job", "fire", "assign_shards", "run_updates", "register_node", "renew",
                  "check_digest", "expire_leases", "reassign_runs", "cancel_run", "alert_done",
                  "publish", "commit_offset", "purge", "create_jobs", "create_token",
                  "revoke_token", "put_tenant", "delete_tenant", "fire_many", "retry_run", "create_backfill",
                  "backfill_step", "cancel_backfill"})


def encode(command: dict) -> bytes:
    assert command.get("v") == VERSION, command
    assert command.get("t") in TAGS, command
    return codec.pack(command)


def decode(data: bytes) -> dict:
    """The command in a log entry, checked against its schema.

    Raises UnknownCommand (loud: the node must stop rather than guess) for a
    version or tag this build does not know, which is what a newer build's
    log looks like. Raises CommandRefused for anything else that is wrong:
    bytes that are not msgpack (or not UTF-8 where a string is), a value that
    is not a map, a version or tag of the wrong type, or members of the wrong
    shape. A refusal is the same on every replica; the entry writes nothing.
    """
    try:
        command = codec.unpack(data)
    except MemoryError:
        raise   # this node's trouble, not the entry's: refusing it here alone would diverge
    except Exception as exc:  # msgpack raises several unrelated types
        raise CommandRefused(f"log entry is not msgpack: {type(exc).__name__}: {exc}",
                             field="") from None
    if not isinstance(command, dict):
        raise CommandRefused(f"log entry is a {type(command).__name__}, not a map", field="")
    version, tag = command.get("v"), command.get("t")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CommandRefused("command version `v` must be an integer", field="v")
    if version != VERSION:
        raise UnknownCommand(f"command version {version!r}; this build applies "
                             f"version {VERSION} (upgrade this node)")
    if not isinstance(tag, str):
        raise CommandRefused("command tag `t` must be a string", field="t")
    if tag not in TAGS:
        raise UnknownCommand(f"unknown command tag {tag!r}")
    check(command)
    return command


def check(command: dict) -> None:
    """Raise CommandRefused unless `command` (of a known tag) has its schema's shape."""
    try:
        SCHEMAS[command["t"]](command)
    except ShapeError as exc:
        raise CommandRefused(f"{command['t']} command refused: {exc}", field=exc.path) from None


def check_run_update(update: object) -> None:
    """Raise CommandRefused unless `update` is one well-formed item of run_updates,
    so a proposer can keep a bad report out of a batch shared with good ones."""
    try:
        _RUN_UPDATE(update)
    except ShapeError as exc:
        exc.within("update")
        raise CommandRefused(f"run update refused: {exc}", field=exc.path) from None


# --- schemas ---------------------------------------------------------------------------
# One checker per tag in TAGS (a test keeps the two equal). A new command adds its
# entry here, built from the combinators of core/shape.py: _str(max_bytes, key=...),
# _int(lo, hi), _num(lo, hi), _bool(), _enum(...), _opt(x) (None allowed),
# _may(x) (the member may be left out), _list(item, max_len), _tuple(...),
# _record({...}), _by(member, {...}) and _json() (a free-form JSON value).
# Strings that become part of a storage key use key=True and a bytes limit from
# limits.py; every integer has a range that apply and the key encoders accept.
# Members a schema does not list are accepted as bounded JSON values and ignored
# by apply, so a proposer that adds one does not turn its commands into refusals.

_TIME_MS = _int(0, limits.command_int_max)          # ms since the epoch
_OPT_TIME_MS = _opt(_TIME_MS)
# A retry delay is drawn within the job's retry.max_s, itself at most
# retry_delay_s_max (checked in every spec below), so the due time it makes
# stays a time.
_DELAY_MS = _int(0, int(limits.retry_delay_s_max * 1000))
_TOKEN = _int(0, limits.command_int_max)
_SHARD = _int(0, limits.shard_count_max - 1)
_ATTEMPT = _int(1, limits.run_attempt_max)
_JOB_ID = _str(limits.job_id_bytes_max, key=True)
_RUN_ID = _str(limits.run_id_bytes_max, key=True)
_NODE_ID = _str(limits.node_id_bytes_max, key=True)
_HOLDER = _str(limits.holder_bytes_max, key=True)
# Topics and worker queues are scoped by tenant in the state: "tenant/name".
_TOPIC = _str(limits.tenant_bytes_max + 1 + limits.topic_bytes_max, key=True)
_TENANT = _str(limits.tenant_bytes_max, key=True)
# Who proposed a change, for the audit table: a token id, "bootstrap" (the
# admin token the nodes were started with) or "insecure" (no authentication).
_ACTOR = _opt(_str(limits.key_part_bytes_max))
# What a job write carries besides its own members: the tenant the caller acts
# for (apply answers not_found for another tenant's job) and the actor.
_SCOPE = {"tenant": _may(_TENANT), "actor": _may(_ACTOR)}
# The quota the proposer found in force for the tenant (its own, or the node
# flags' default): apply counts against it, so every replica decides alike.
_CREATE_QUOTA = _may(_record({"jobs_max": _int(1, limits.quota_jobs_max_max),
                              "creates_per_s": _int(1, limits.quota_creates_per_s_max)}))
_QUOTA_VALUE = {"jobs_max": _may(_opt(_int(1, limits.quota_jobs_max_max))),
                "creates_per_s": _may(_opt(_int(1, limits.quota_creates_per_s_max))),
                "runs_concurrent_max": _may(_opt(_int(1, limits.quota_jobs_max_max))),
                "weight": _may(_opt(_int(1, limits.tenant_weight_max)))}
_TEXT = _str(limits.command_text_bytes_max)
_OPT_TEXT = _opt(_TEXT)
# A backfill's id is its record's whole key (the API makes it bf_ and 20 hex digits).
_BACKFILL_ID = _str(limits.key_part_bytes_max, key=True)


def _fields(**members: Check) -> dict[str, Check]:
    """The members every command has (v and t, checked by decode) and its own."""
    return {"v": _int(VERSION, VERSION), "t": _str(64), **members}


def _command(**members: Check) -> Check:
    return _record(_fields(**members), extra=_json())


# A job spec is stored whole; apply and the loops that read it (trigger,
# dispatcher, reaper) dereference the members typed here. Members not listed
# must at least be bounded JSON values.
# A recurring schedule's bounds (inclusive): no occurrence before or after them.
_BOUNDS = {"not_before_ms": _may(_TIME_MS), "not_after_ms": _may(_TIME_MS)}
_SCHEDULE = _by("kind", {
    # `text`: the expression as given, when `cron` is its H terms resolved.
    "cron": _record({"kind": _str(16), "cron": _str(limits.command_text_bytes_max),
                     "timezone": _str(limits.command_text_bytes_max),
                     "text": _may(_str(limits.command_text_bytes_max)), **_BOUNDS},
                    extra=_json()),
    # Bounded as at the edge, so that a next occurrence (a multiple of every_ms
    # after now) stays a time: a fire carrying one past it would be refused whole.
    "every": _record({"kind": _str(16), "every_ms": _int(1, limits.every_ms_max), **_BOUNDS},
                     extra=_json()),
    "once": _record({"kind": _str(16), "run_at_ms": _TIME_MS,
                     "offset_min": _may(_int(-24 * 60, 24 * 60))}, extra=_json()),
    # A DAG job without a schedule: it runs when triggered.
    "none": _record({"kind": _str(16)}, extra=_json()),
})
_TIMEOUT_S = _num(0, limits.target_timeout_s_max)
_TARGET = _by("type", {
    "http": _record({"type": _str(16), "url": _str(limits.command_text_bytes_max),
                     "method": _str(16), "timeout_s": _TIMEOUT_S}, extra=_json()),
    "command": _record({"type": _str(16),
                        "argv": _list(_str(limits.target_body_bytes_max),
                                      limits.command_argv_max, min_len=1),
                        "shell": _may(_bool()), "cwd": _may(_opt(_TEXT)),
                        "queue": _may(_str(limits.queue_bytes_max, key=True)),
                        "timeout_s": _TIMEOUT_S}, extra=_json()),
    "publish": _record({"type": _str(16), "topic": _TOPIC, "key": _may(_opt(_TEXT)),
                        "message": _json()}, extra=_json()),
})
_RETRY = _opt(_record({
    "max_attempts": _may(_int(1, limits.run_attempt_max)),
    "backoff": _may(_enum("exponential", "fixed")),
    "base_s": _may(_num(0, limits.retry_delay_s_max)),
    "max_s": _may(_num(0, limits.retry_delay_s_max)),
    "non_retryable_exit_codes": _may(_list(_int(-(2 ** 31), 2 ** 31 - 1), 256)),
}, extra=_json()))
_CONCURRENCY = _opt(_record({
    "policy": _enum("allow", "skip_if_running", "queue", "replace"),
    "queue_max": _may(_int(0, limits.command_int_max)),
}, extra=_json()))
_MISFIRE = _by("policy", {
    policy: _record({"policy": _str(16), "tolerance_ms": _int(0, limits.command_int_max),
                     "catchup_max": _int(1, limits.catchup_max_max),
                     "catchup_window_ms": _may(_int(1, limits.command_int_max))},
                    extra=_json())
    for policy in ("fire_once", "skip", "fire_all")})
_ALERT = _opt(_record({"webhook_url": _may(_opt(_str(limits.command_text_bytes_max)))},
                      extra=_json()))
_TASK_ID = _str(limits.dag_task_id_bytes_max, key=True)
# apply keeps a DAG run's task instances by id and counts each task's upstream
# tasks down to zero: ids must be unique, dependencies known, the graph acyclic
# (core/dag.py graph_problem, the same check as at the edge).
_DAG = _record({
    "tasks": _list(_record({
        "id": _TASK_ID, "target": _TARGET, "depends_on": _list(_TASK_ID, limits.dag_tasks_max),
        "trigger_rule": _enum(*dag.RULES), "retry": _may(_RETRY)}, extra=_json()),
        limits.dag_tasks_max, min_len=1),
}, extra=_json(), where=lambda d: dag.graph_problem(d["tasks"]) is None,
    why="task ids must be unique, dependencies known and listed once, and the graph acyclic "
        f"with at most {limits.dag_edges_max} dependencies")
_SPEC_MEMBERS = _record({
    "name": _opt(_TEXT),
    "schedule": _SCHEDULE,
    # A job calls one target, or runs a DAG of tasks that each call one.
    "target": _may(_TARGET),
    "dag": _may(_DAG),
    "retry": _RETRY,
    "concurrency": _CONCURRENCY,
    "misfire": _may(_MISFIRE),
    "alert": _may(_ALERT),
    "metadata": _json(),
    "history": _may(_record({"max_runs": _may(_int(1, limits.history_max_runs_max)),
                             "max_age_ms": _may(_int(0, limits.command_int_max))})),
    "priority": _may(_enum("high", "normal", "low")),
    # Left out by jobs created before secret_keys existed: they have none.
    "secret_keys": _may(_list(_str(limits.secret_key_bytes_max), limits.secret_keys_max)),
    "labels": _may(_map(_str(limits.label_key_bytes_max, key=True),
                        _str(limits.label_value_bytes_max), limits.job_labels_max)),
    # The most a stable per-occurrence delay adds to each fire (core/schedule.py).
    "jitter_ms": _may(_int(0, limits.jitter_s_max * 1000)),
}, extra=_json())


def _SPEC(spec: Any) -> None:
    """A job spec: the members above, with exactly one of target and dag."""
    _SPEC_MEMBERS(spec)
    if "target" in spec and "dag" in spec:
        raise ShapeError("a job has a target or a dag, not both").within("dag")
    if "target" not in spec and "dag" not in spec:
        raise ShapeError("is required (or dag, for a DAG job)").within("target")


def _ascending(values: list[int]) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


# (job_id, due_ms, next_ms, occurrences, omitted): the occurrences start with
# due_ms and ascend, and the next one (if any) comes after them all.
_FIRE_ITEM = _tuple(
    _JOB_ID, _TIME_MS, _OPT_TIME_MS,
    _list(_TIME_MS, limits.catchup_max_max + 1, min_len=1), _bool(),
    where=lambda i: i[3][0] == i[1] and _ascending(i[3]) and (i[2] is None or i[2] > i[3][-1]),
    why="occurrences must ascend from due_ms, and next_ms (if any) must follow them")

_RUN_UPDATE_COMMON = {"run_id": _RUN_ID, "event": _str(16), "holder": _HOLDER,
                      "attempt": _ATTEMPT, "at_ms": _TIME_MS}
_LEASE_UPDATE = _record({**_RUN_UPDATE_COMMON, "lease_ms": _TIME_MS}, extra=_json())
_RUN_UPDATE = _by("event", {
    "start": _LEASE_UPDATE,
    "heartbeat": _LEASE_UPDATE,
    "finish": _record(
        {**_RUN_UPDATE_COMMON, "ok": _bool(), "retryable": _may(_bool()),
         "retry_delay_ms": _may(_opt(_DELAY_MS)),
         "http_status": _may(_opt(_int(0, 999))),
         "exit_code": _may(_opt(_int(-(2 ** 31), 2 ** 31 - 1))),
         "error": _may(_OPT_TEXT), "output_node": _may(_opt(_NODE_ID))},
        extra=_json(), where=lambda u: u["ok"] or not u.get("retryable", True)
        or u.get("retry_delay_ms") is not None,
        why="a retryable failure must carry retry_delay_ms"),
})

SCHEMAS: dict[str, Check] = {
    "create_job": _command(
        job_id=_JOB_ID, tenant=_TENANT, spec=_SPEC,
        idempotency_key=_opt(_str(limits.idempotency_key_bytes_max, key=True)),
        shard=_SHARD, next_ms=_OPT_TIME_MS, at_ms=_TIME_MS, quota=_CREATE_QUOTA,
        actor=_may(_ACTOR)),
    # A batch of creates: each item is what a create_job carries besides tenant
    # and at_ms, which the batch shares.
    "create_jobs": _command(
        tenant=_TENANT, at_ms=_TIME_MS, quota=_CREATE_QUOTA, actor=_may(_ACTOR),
        items=_list(_record({
            "job_id": _JOB_ID, "spec": _SPEC,
            "idempotency_key": _opt(_str(limits.idempotency_key_bytes_max, key=True)),
            "shard": _SHARD, "next_ms": _OPT_TIME_MS}, extra=_json()),
            limits.batch_entry_jobs_max, min_len=1)),
    "update_job": _command(
        job_id=_JOB_ID, spec=_SPEC, expected_version=_int(0, limits.command_int_max),
        next_ms=_OPT_TIME_MS, at_ms=_TIME_MS, **_SCOPE),
    "delete_job": _command(job_id=_JOB_ID, at_ms=_TIME_MS, **_SCOPE),
    "pause_job": _command(job_id=_JOB_ID, at_ms=_TIME_MS,
                          note=_may(_opt(_str(limits.pause_note_bytes_max))), **_SCOPE),
    "resume_job": _command(job_id=_JOB_ID, next_ms=_OPT_TIME_MS, at_ms=_TIME_MS, **_SCOPE),
    "trigger_job": _command(job_id=_JOB_ID, scheduled_ms=_TIME_MS, node=_NODE_ID,
                            at_ms=_TIME_MS, overlap=_may(_enum("allow")), **_SCOPE),
    # A failed run's new attempt (core/redrive.py), run by `node`.
    "retry_run": _command(run_id=_RUN_ID, node=_NODE_ID, at_ms=_TIME_MS,
                          overlap=_may(_enum("allow")), **_SCOPE),
    "fire": _record(_fields(
        shard=_SHARD, token=_TOKEN, upto_ms=_TIME_MS, node=_NODE_ID, at_ms=_TIME_MS,
        items=_list(_FIRE_ITEM, limits.fire_batch_max),
        retries=_may(_list(_tuple(_RUN_ID, _TIME_MS), limits.fire_batch_max))),
        extra=_json(),
        where=lambda c: len(c["items"]) + len(c.get("retries", [])) <= limits.fire_batch_max,
        why=f"items and retries together must be at most {limits.fire_batch_max}"),
    # Fires of several shards in one entry, each part checked against its own
    # shard's token: a node's due items of many shards cost one entry, not one each.
    "fire_many": _record(_fields(
        node=_NODE_ID, at_ms=_TIME_MS,
        parts=_list(_record({
            "shard": _SHARD, "token": _TOKEN, "upto_ms": _TIME_MS,
            "items": _list(_FIRE_ITEM, limits.fire_batch_max),
            "retries": _list(_tuple(_RUN_ID, _TIME_MS), limits.fire_batch_max)}, extra=_json()),
            limits.fire_batch_max, min_len=1)),
        extra=_json(),
        where=lambda c: sum(len(p["items"]) + len(p["retries"]) for p in c["parts"])
        <= limits.fire_batch_max,
        why=f"items and retries of all parts together must be at most {limits.fire_batch_max}"),
    "assign_shards": _command(
        assignments=_list(_tuple(_SHARD, _NODE_ID), limits.shard_count_max), at_ms=_TIME_MS),
    "run_updates": _command(updates=_list(_RUN_UPDATE, limits.run_update_batch_max)),
    "register_node": _command(node=_NODE_ID, http=_TEXT, raft=_TEXT, at_ms=_TIME_MS),
    "renew": _command(node=_NODE_ID, at_ms=_TIME_MS),
    "check_digest": _command(node=_NODE_ID, at_ms=_TIME_MS),
    "expire_leases": _command(
        items=_list(_tuple(_RUN_ID, _ATTEMPT, _DELAY_MS), limits.reaper_batch_max),
        at_ms=_TIME_MS),
    "reassign_runs": _command(
        items=_list(_tuple(_RUN_ID, _NODE_ID, _NODE_ID), limits.reaper_batch_max),
        at_ms=_TIME_MS),
    "cancel_run": _command(run_id=_RUN_ID, reason=_TEXT, at_ms=_TIME_MS, **_SCOPE),
    "alert_done": _command(run_id=_RUN_ID, outcome=_enum("sent", "undeliverable", "no_webhook"),
                           error=_OPT_TEXT, at_ms=_TIME_MS),
    "publish": _command(
        topic=_TOPIC, key=_OPT_TEXT, message=_json(),
        execution_id=_str(limits.execution_id_bytes_max, key=True), job_id=_JOB_ID,
        at_ms=_TIME_MS),
    "commit_offset": _command(topic=_TOPIC, group=_str(limits.group_bytes_max, key=True),
                              offset=_int(0, limits.command_int_max), at_ms=_TIME_MS),
    "purge": _record(_fields(
        at_ms=_TIME_MS, history_max_runs=_int(1, limits.history_max_runs_max),
        history_max_age_ms=_int(0, limits.command_int_max),
        finished_job_retention_ms=_int(0, limits.command_int_max),
        idempotency_ttl_ms=_int(0, limits.command_int_max),
        runs=_list(_tuple(_RUN_ID, _JOB_ID), limits.purge_batch_max),
        jobs=_list(_JOB_ID, limits.purge_batch_max),
        idem=_list(_tuple(_str(limits.tenant_bytes_max, key=True),
                          _str(limits.idempotency_key_bytes_max, key=True)),
                   limits.purge_batch_max),
        # Left out by purges proposed before backfills existed.
        backfills=_may(_list(_BACKFILL_ID, limits.purge_batch_max))),
        where=lambda c: len(c["runs"]) + len(c["jobs"]) + len(c["idem"])
        + len(c.get("backfills", ())) <= limits.purge_batch_max,
        why=f"runs, jobs, idem and backfills together must be at most {limits.purge_batch_max}"),
    "create_token": _command(
        token_id=_str(limits.key_part_bytes_max, key=True), tenant=_TENANT,
        role=_enum("admin", "writer", "reader", "worker", "operator"),
        name=_str(limits.token_name_bytes_max), sha256=_str(64), actor=_ACTOR, at_ms=_TIME_MS),
    "revoke_token": _command(token_id=_str(limits.key_part_bytes_max, key=True), actor=_ACTOR,
                             at_ms=_TIME_MS, tenant=_may(_TENANT)),
    # `commands`: grant (true) or withdraw (false) command targets; left out
    # or null keeps the grant as it is.
    "put_tenant": _command(tenant=_TENANT, quota=_record(_QUOTA_VALUE), actor=_ACTOR,
                           at_ms=_TIME_MS, commands=_may(_opt(_bool()))),
    "delete_tenant": _command(tenant=_TENANT, actor=_ACTOR, at_ms=_TIME_MS),
    # The proposer counted `total` occurrences of the job's schedule (as of
    # expected_version) in [start_ms, end_ms); apply copies that schedule.
    "create_backfill": _record(_fields(
        backfill_id=_BACKFILL_ID, job_id=_JOB_ID, tenant=_TENANT, actor=_may(_ACTOR),
        expected_version=_int(0, limits.command_int_max), start_ms=_TIME_MS, end_ms=_TIME_MS,
        overlap=_enum("allow", "job"), max_concurrent=_int(1, limits.backfill_concurrent_max),
        total=_int(1, limits.backfill_occurrences_max), at_ms=_TIME_MS),
        extra=_json(), where=lambda c: c["start_ms"] < c["end_ms"],
        why="start_ms must come before end_ms"),
    # Per backfill, the next occurrences (ascending) and whether none is left after them.
    "backfill_step": _record(_fields(
        node=_NODE_ID, at_ms=_TIME_MS,
        items=_list(_record({"backfill_id": _BACKFILL_ID,
                             "occurrences": _list(_TIME_MS, limits.backfill_concurrent_max),
                             "exhausted": _bool()}, extra=_json(),
                            where=lambda i: _ascending(i["occurrences"]),
                            why="occurrences must ascend"),
                    limits.backfills_open_max, min_len=1)),
        extra=_json(),
        where=lambda c: sum(len(i["occurrences"]) for i in c["items"])
        <= limits.backfill_step_runs_max,
        why=f"occurrences of all items together must be at most {limits.backfill_step_runs_max}"),
    "cancel_backfill": _command(backfill_id=_BACKFILL_ID, reason=_OPT_TEXT, at_ms=_TIME_MS,
                                **_SCOPE),
}


def _cmd(tag: str, **fields: Any) -> dict:
    return {"v": VERSION, "t": tag, **fields}


def scoped(command: dict, *, tenant: str | None, actor: str | None) -> dict:
    """`command` (a job or run write) on behalf of `tenant`, by `actor`: apply
    refuses it as not_found when the job or run belongs to another tenant, and
    records the actor in the audit table."""
    if tenant is not None:
        command["tenant"] = tenant
    if actor is not None:
        command["actor"] = actor
    return command


def create_job(*, job_id: str, tenant: str, spec: dict, idempotency_key: str | None,
               shard: int, next_ms: int | None, at_ms: int, quota: dict | None = None,
               actor: str | None = None) -> dict:
    """`quota`: {jobs_max, creates_per_s} in force for the tenant (None: not counted)."""
    command = _cmd("create_job", job_id=job_id, tenant=tenant, spec=spec,
                   idempotency_key=idempotency_key, shard=shard, next_ms=next_ms, at_ms=at_ms,
                   actor=actor)
    if quota is not None:
        command["quota"] = quota
    return command


def create_jobs(*, tenant: str, at_ms: int, items: list[dict], quota: dict | None = None,
                actor: str | None = None) -> dict:
    """Many creates in one entry (POST /v1/jobs:batchCreate proposes a batch as
    entries of at most batch_entry_jobs_max). items, in order: {job_id, spec,
    idempotency_key, shard, next_ms} (see create_job_item). Each is applied as
    a create_job of `tenant` at `at_ms`, after the ones before it, so a key
    used twice creates one job."""
    command = _cmd("create_jobs", tenant=tenant, at_ms=at_ms, items=list(items), actor=actor)
    if quota is not None:
        command["quota"] = quota
    return command


def create_job_item(*, job_id: str, spec: dict, idempotency_key: str | None, shard: int,
                    next_ms: int | None) -> dict:
    return {"job_id": job_id, "spec": spec, "idempotency_key": idempotency_key,
            "shard": shard, "next_ms": next_ms}


def update_job(*, job_id: str, spec: dict, expected_version: int, next_ms: int | None,
               at_ms: int) -> dict:
    return _cmd("update_job", job_id=job_id, spec=spec, expected_version=expected_version,
                next_ms=next_ms, at_ms=at_ms)


def delete_job(*, job_id: str, at_ms: int) -> dict:
    return _cmd("delete_job", job_id=job_id, at_ms=at_ms)


def pause_job(*, job_id: str, at_ms: int, note: str | None = None) -> dict:
    """`note`: why, kept in the job while it is paused (None: none)."""
    command = _cmd("pause_job", job_id=job_id, at_ms=at_ms)
    if note is not None:
        command["note"] = note
    return command


def resume_job(*, job_id: str, next_ms: int | None, at_ms: int) -> dict:
    return _cmd("resume_job", job_id=job_id, next_ms=next_ms, at_ms=at_ms)


def trigger_job(*, job_id: str, scheduled_ms: int, node: str, at_ms: int,
                overlap: str | None = None) -> dict:
    """`overlap="allow"`: admit this one run as the allow policy would,
    whatever the job's concurrency policy."""
    command = _cmd("trigger_job", job_id=job_id, scheduled_ms=scheduled_ms, node=node,
                   at_ms=at_ms)
    if overlap is not None:
        command["overlap"] = overlap
    return command


def retry_run(*, run_id: str, node: str, at_ms: int, overlap: str | None = None) -> dict:
    """A new attempt of a failed run, under its execution id (core/redrive.py)."""
    command = _cmd("retry_run", run_id=run_id, node=node, at_ms=at_ms)
    if overlap is not None:
        command["overlap"] = overlap
    return command


def fire(*, shard: int, token: int, upto_ms: int, node: str, at_ms: int,
         items: list[tuple[str, int, int | None, list[int], bool]],
         retries: list[tuple[str, int]] = ()) -> dict:
    """Fire due entries of `shard` under fencing `token`. items, one per due
    occurrence: (job_id, due_ms, next_ms or None, occurrences covered
    (ascending, starting with due_ms), omitted: whether occurrences past
    catchup_max were left out). retries, one per due retry: (run_id, due_ms)."""
    return _cmd("fire", shard=shard, token=token, upto_ms=upto_ms, node=node, at_ms=at_ms,
                items=[list(item) for item in items], retries=[list(r) for r in retries])


def fire_many(*, node: str, at_ms: int, parts: list[dict]) -> dict:
    """Fires of several shards in one entry. parts: {shard, token, upto_ms,
    items, retries}, each as `fire` takes them, applied in order and each
    checked against its own shard's fencing token."""
    return _cmd("fire_many", node=node, at_ms=at_ms, parts=[
        {"shard": p["shard"], "token": p["token"], "upto_ms": p["upto_ms"],
         "items": [list(item) for item in p["items"]],
         "retries": [list(r) for r in p["retries"]]} for p in parts])


def assign_shards(*, assignments: list[tuple[int, str]], at_ms: int) -> dict:
    """(shard, node) pairs: each changed owner gets a new fencing token."""
    return _cmd("assign_shards", assignments=[list(a) for a in assignments], at_ms=at_ms)


def run_updates(*, updates: list[dict]) -> dict:
    """Executor reports, each {run_id, event, holder, attempt, at_ms} and:
    start, heartbeat: lease_ms (the new lease expiry, holder's clock);
    finish: ok, retryable, retry_delay_ms (drawn by the proposer), http_status,
    exit_code, error (short), output_node (where the attempt's output is kept)."""
    return _cmd("run_updates", updates=updates)


def expire_leases(*, items: list[tuple[str, int, int]], at_ms: int) -> dict:
    """The reaper's: (run_id, attempt, retry_delay_ms) for leases expired by at_ms."""
    return _cmd("expire_leases", items=[list(i) for i in items], at_ms=at_ms)


def reassign_runs(*, items: list[tuple[str, str, str]], at_ms: int) -> dict:
    """(run_id, from_node, to_node): queued runs of a dead node move to a live one."""
    return _cmd("reassign_runs", items=[list(i) for i in items], at_ms=at_ms)


def cancel_run(*, run_id: str, reason: str, at_ms: int) -> dict:
    return _cmd("cancel_run", run_id=run_id, reason=reason, at_ms=at_ms)


def alert_done(*, run_id: str, outcome: str, error: str | None, at_ms: int) -> dict:
    """outcome: sent | undeliverable | no_webhook."""
    return _cmd("alert_done", run_id=run_id, outcome=outcome, error=error, at_ms=at_ms)


def publish(*, topic: str, key: str | None, message: object, execution_id: str, job_id: str,
            at_ms: int) -> dict:
    return _cmd("publish", topic=topic, key=key, message=message, execution_id=execution_id,
                job_id=job_id, at_ms=at_ms)


def commit_offset(*, topic: str, group: str, offset: int, at_ms: int) -> dict:
    return _cmd("commit_offset", topic=topic, group=group, offset=offset, at_ms=at_ms)


def purge(*, at_ms: int, history_max_runs: int, history_max_age_ms: int,
          finished_job_retention_ms: int, idempotency_ttl_ms: int,
          runs: list[tuple[str, str]], jobs: list[str], idem: list[tuple[str, str]],
          backfills: list[str] = ()) -> dict:
    """The leader's purger: remove what is past its bound by at_ms (see
    core/retention.py). runs: (run_id, job_id); jobs: job ids; idem: (tenant,
    key); backfills: ids of ended backfills. The bounds are the proposer's
    cluster defaults; a job's own history members take precedence over the
    history defaults."""
    return _cmd("purge", at_ms=at_ms, history_max_runs=history_max_runs,
                history_max_age_ms=history_max_age_ms,
                finished_job_retention_ms=finished_job_retention_ms,
                idempotency_ttl_ms=idempotency_ttl_ms, runs=[list(r) for r in runs],
                jobs=list(jobs), idem=[list(i) for i in idem], backfills=list(backfills))


def register_node(*, node: str, http: str, raft: str, at_ms: int) -> dict:
    return _cmd("register_node", node=node, http=http, raft=raft, at_ms=at_ms)


def renew(*, node: str, at_ms: int) -> dict:
    """A node's liveness renewal: writes nothing; every replica notes when it
    applied the latest renewal of each node (see runtime/coordinator.py)."""
    return _cmd("renew", node=node, at_ms=at_ms)


def check_digest(*, node: str, at_ms: int) -> dict:
    """Ask every replica to record its state digest as of this entry's index, so
    replicas can be compared at one index while the log keeps moving."""
    return _cmd("check_digest", node=node, at_ms=at_ms)


def create_token(*, token_id: str, tenant: str, role: str, name: str, sha256: str,
                 actor: str | None, at_ms: int) -> dict:
    """A token of `role` for `tenant`; the state keeps only the SHA-256 of its text."""
    return _cmd("create_token", token_id=token_id, tenant=tenant, role=role, name=name,
                sha256=sha256, actor=actor, at_ms=at_ms)


def revoke_token(*, token_id: str, actor: str | None, at_ms: int) -> dict:
    return _cmd("revoke_token", token_id=token_id, actor=actor, at_ms=at_ms)


def create_backfill(*, backfill_id: str, job_id: str, tenant: str, expected_version: int,
                    start_ms: int, end_ms: int, overlap: str, max_concurrent: int, total: int,
                    at_ms: int, actor: str | None = None) -> dict:
    """A backfill of `job_id`'s schedule in [start_ms, end_ms), of `total`
    occurrences as the proposer counted them (core/backfill.py)."""
    command = _cmd("create_backfill", backfill_id=backfill_id, job_id=job_id, tenant=tenant,
                   expected_version=expected_version, start_ms=start_ms, end_ms=end_ms,
                   overlap=overlap, max_concurrent=max_concurrent, total=total, at_ms=at_ms)
    if actor is not None:
        command["actor"] = actor
    return command


def backfill_step(*, node: str, at_ms: int, items: list[dict]) -> dict:
    """The leader's backfiller. items: {backfill_id, occurrences (ascending, the
    next ones after the backfill's cursor), exhausted (none is left after them)}."""
    return _cmd("backfill_step", node=node, at_ms=at_ms, items=[
        {"backfill_id": i["backfill_id"], "occurrences": list(i["occurrences"]),
         "exhausted": i["exhausted"]} for i in items])


def cancel_backfill(*, backfill_id: str, reason: str | None, at_ms: int) -> dict:
    return _cmd("cancel_backfill", backfill_id=backfill_id, reason=reason, at_ms=at_ms)


def delete_tenant(*, tenant: str, actor: str | None, at_ms: int) -> dict:
    """Drop `tenant`'s record (its quotas and counters), freeing its place
    under tenants_max; apply refuses while the tenant has jobs."""
    return _cmd("delete_tenant", tenant=tenant, actor=actor, at_ms=at_ms)


def put_tenant(*, tenant: str, quota: dict, actor: str | None, at_ms: int,
               commands: bool | None = None) -> dict:
    """Set `tenant`'s quotas: {jobs_max, creates_per_s, runs_concurrent_max, weight},
    each an integer or None (the node flags' default); `commands`: grant or
    withdraw command targets (None: leave the grant as it is)."""
    command = _cmd("put_tenant", tenant=tenant, quota=quota, actor=actor, at_ms=at_ms)
    if commands is not None:
        command["commands"] = commands
    return command
