"""The shapes of the API's request bodies, declared once as msgspec Structs:
a job (create, PATCH), a schedule preview, a backfill, a worker's claim,
heartbeat and completion, a token, a tenant's quotas, and the small bodies of
actions.

One declaration gives the API's shape check (`check_shape`: types, unknown
members, bounds named from raftsched.limits, in one C call) and the OpenAPI
schemas of the request bodies (api/openapi.py generates them from these
classes). What msgspec cannot say (a cron expression parses, a zone exists, a
URL's host and byte length, secrets, a DAG is acyclic) is checked after the
shape, by hooks: core/jobspec.py's for a job, which turn a body into the
stored spec.
Strict JSON (no NaN, no lone surrogates, no NUL, 64-bit integers) is judged
when a request body is parsed (api/strictjson.py), before any shape.

The closed sets of values (priorities, policies, target types...) are the
Literal types below; every other module reads them from here.

Adding a member to a job body: declare it on its Struct here (with its bound
from limits.py), store it in core/jobspec.py, and test both; the OpenAPI
document and the client's check follow from the declaration.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union, get_args

import msgspec
from msgspec import Meta, Struct

from raftsched import limits
from raftsched.core import dag
from raftsched.errors import InvalidInput

# --- closed sets -------------------------------------------------------------------------
# A job's rank among its tenant's runs where a backlog forms (firing, dispatch,
# worker claims); tenants share by weight first, whatever their jobs' priority.
Priority = Literal["high", "normal", "low"]
MisfirePolicy = Literal["fire_once", "skip", "fire_all"]
ConcurrencyPolicy = Literal["allow", "skip_if_running", "queue", "replace"]
Backoff = Literal["exponential", "fixed"]
TriggerRule = Literal[dag.RULES]   # type: ignore[valid-type]
TargetType = Literal["http", "command", "publish"]
# An HTTP target's method, as stored (a body may give it in any case).
HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]

PRIORITIES: tuple[str, ...] = get_args(Priority)
MISFIRE_POLICIES: tuple[str, ...] = get_args(MisfirePolicy)
CONCURRENCY_POLICIES: tuple[str, ...] = get_args(ConcurrencyPolicy)
BACKOFFS: tuple[str, ...] = get_args(Backoff)
TARGET_TYPES: tuple[str, ...] = get_args(TargetType)
HTTP_METHODS: tuple[str, ...] = get_args(HttpMethod)

# What a token may do (core/tenancy.py GRANTS).
Role = Literal["admin", "writer", "reader", "worker", "operator"]
# Whether a backfill's runs go through the job's concurrency policy.
BackfillOverlap = Literal["allow", "job"]
# The shapes of the ids raftsched makes: what a URL, a cursor or a worker's
# report may name. Anything else cannot exist, so it is refused unread.
JOB_ID_PATTERN = "job_[0-9a-f]{20}"
# A job's run: its job's 20 digits and its time's 12 (keys.run_id); a DAG
# task's run: 24 digits of a hash (keys.task_run_id).
RUN_ID_PATTERN = "run_[0-9a-f]{24}(?:[0-9a-f]{8})?"

# Names of queues, topics and DAG tasks: they appear in URLs and keys (ASCII,
# so characters are bytes).
NAME_TOKEN_PATTERN = "^[A-Za-z0-9._-]+$"


# --- member types ------------------------------------------------------------------------
# `limit` names the bound in raftsched.limits: a refusal names it, and the
# OpenAPI document shows it as x-limit.

def _meta(limit: str | None, description: str | None, pattern: str | None = None,
          **bounds: Any) -> Meta:
    extra = {"x-limit": limit} if limit else None
    if pattern is not None and pattern.endswith("$"):
        # Python's `$` also matches before a final newline ("queue\n"): the
        # check ends the match with \Z (json_schemas writes `$` back for JSON Schema).
        pattern = pattern[:-1] + r"\Z"
    return Meta(description=description, extra_json_schema=extra, pattern=pattern, **bounds)


def Text(max_chars: int, limit: str | None = None, *, description: str | None = None,
         nonempty: bool = False, pattern: str | None = None) -> Any:
    """A string of at most max_chars characters, at least one if `nonempty`
    (a byte bound, where there is one, is a hook's: msgspec counts characters)."""
    return Annotated[str, _meta(limit, description, min_length=1 if nonempty else None,
                                max_length=max_chars, pattern=pattern)]


def Name(max_bytes: int, limit: str) -> Any:
    """A queue, topic or task name: 1 to max_bytes of [A-Za-z0-9._-]."""
    return Text(max_bytes, limit, nonempty=True, pattern=NAME_TOKEN_PATTERN)


def Int(lo: int, hi: int, limit: str | None = None) -> Any:
    return Annotated[int, _meta(limit, None, ge=lo, le=hi)]


def Seconds(lo: float, hi: float, limit: str | None = None) -> Any:
    """A number of seconds (an integer or a float) from lo to hi."""
    return Annotated[float, _meta(limit, None, ge=lo, le=hi)]


def Many(item: Any, max_items: int, limit: str | None = None, *, nonempty: bool = False) -> Any:
    return Annotated[list[item], _meta(limit, None, min_length=1 if nonempty else None,
                                       max_length=max_items)]


def Map(value: Any, max_members: int, limit: str | None = None) -> Any:
    return Annotated[dict[str, value], _meta(limit, None, max_length=max_members)]


Time = Text(64, description="RFC 3339 with an offset, from 1970 to 9999-12-30")
TimeoutS = Seconds(limits.target_timeout_s_min, limits.target_timeout_s_max,
                   "target_timeout_s_max")
DelayS = Seconds(0, limits.retry_delay_s_max, "retry_delay_s_max")


class _Body(Struct, kw_only=True, forbid_unknown_fields=True):
    """A request object: a member it does not declare is refused by name.
    None stands for a member left out (or given as null)."""


# --- schedules and targets ---------------------------------------------------------------

class Schedule(_Body):
    """{cron, timezone} or {every}: exactly one of cron and every."""
    cron: Union[Text(limits.cron_expression_bytes_max, "cron_expression_bytes_max",
                     nonempty=True), None] = None
    timezone: Union[Text(limits.command_text_bytes_max, "command_text_bytes_max",
                         description="an IANA zone name; default UTC"), None] = None
    every: Union[Text(64, description="d/h/m/s units, 1s to 366d",
                      pattern=r"^\s*(\d{1,9}d)?(\d{1,9}h)?(\d{1,9}m)?(\d{1,9}s)?\s*$"),
                 None] = None


class HttpTarget(_Body, tag="http", tag_field="type"):
    url: Text(limits.target_url_bytes_max, "target_url_bytes_max",
              description="an http or https URL with a host")
    method: Union[Text(16, description=f"one of {', '.join(HTTP_METHODS)}, in any case"),
                  None] = None
    headers: Union[Map(Text(limits.target_header_value_chars_max,
                            "target_header_value_chars_max"),
                       limits.target_headers_max, "target_headers_max"), None] = None
    body: Union[str, dict[str, Any], list[Any], None] = None
    timeout_s: Union[TimeoutS, None] = None


class CommandTarget(_Body, tag="command", tag_field="type"):
    """No shell unless `shell: true`; then argv is one script for /bin/sh -c."""
    argv: Many(Text(limits.target_body_bytes_max, "target_body_bytes_max", nonempty=True),
               limits.command_argv_max, "command_argv_max", nonempty=True)
    # The target's encoded size (target_body_bytes_max) bounds the variables;
    # this bound only keeps the map finite before that check.
    env: Union[Map(str, limits.target_body_bytes_max, "target_body_bytes_max"), None] = None
    cwd: Union[Text(limits.command_text_bytes_max, "command_text_bytes_max",
                    pattern="^/"), None] = None
    timeout_s: Union[TimeoutS, None] = None
    queue: Union[Name(limits.queue_bytes_max, "queue_bytes_max"), None] = None
    shell: bool = False


class PublishTarget(_Body, tag="publish", tag_field="type"):
    topic: Name(limits.topic_bytes_max, "topic_bytes_max")
    message: Any
    key: Union[Text(limits.topic_name_chars_max, "topic_name_chars_max"), None] = None


Target = Union[HttpTarget, CommandTarget, PublishTarget]
Labels = Map(Text(limits.label_value_bytes_max, "label_value_bytes_max"),
             limits.job_labels_max, "job_labels_max")


# --- policies ----------------------------------------------------------------------------

class Retry(_Body):
    max_attempts: Union[Int(1, limits.retry_max_attempts_max, "retry_max_attempts_max"),
                        None] = None
    backoff: Union[Backoff, None] = None
    base_s: Union[DelayS, None] = None
    max_s: Union[DelayS, None] = None
    # Earlier names of base_s and max_s, still taken (and stored under the new names).
    initial_delay_s: Union[DelayS, None] = None
    max_delay_s: Union[DelayS, None] = None
    # A process's exit status is one byte.
    non_retryable_exit_codes: Union[Many(Int(0, 255), limits.non_retryable_exit_codes_max,
                                         "non_retryable_exit_codes_max"), None] = None


class Concurrency(_Body):
    policy: ConcurrencyPolicy
    queue_max: Union[Int(1, limits.concurrency_queue_max_max, "concurrency_queue_max_max"),
                     None] = None


class Misfire(_Body):
    """What a fire does with occurrences it is late for (docs/schedules.md)."""
    policy: MisfirePolicy = "fire_once"
    misfire_tolerance_s: Union[Seconds(0, limits.misfire_tolerance_s_max,
                                       "misfire_tolerance_s_max"), None] = None
    catchup_max: Union[Int(1, limits.catchup_max_max, "catchup_max_max"), None] = None
    # A late fire runs no occurrence older than this (they are recorded missed).
    catchup_window_s: Union[Seconds(1, limits.catchup_window_s_max, "catchup_window_s_max"),
                            None] = None


class Alert(_Body):
    """Where a run that failed for good is reported (else the cluster default)."""
    webhook_url: Union[Text(limits.target_url_bytes_max, "target_url_bytes_max"), None] = None


class History(_Body):
    """The finished runs kept; a member left out takes the cluster's default."""
    max_runs: Union[Int(1, limits.history_max_runs_max, "history_max_runs_max"), None] = None
    max_age_s: Union[Seconds(1, limits.history_max_age_s_max, "history_max_age_s_max"),
                     None] = None


TaskId = Name(limits.dag_task_id_bytes_max, "dag_task_id_bytes_max")


class DagTask(_Body):
    id: TaskId
    target: Target
    depends_on: Union[Many(TaskId, limits.dag_tasks_max, "dag_tasks_max"), None] = None
    trigger_rule: Union[TriggerRule, None] = None
    retry: Union[Retry, None] = None
    # The task's timeout is its target's: each attempt is abandoned after it.
    timeout_s: Union[TimeoutS, None] = None


class Dag(_Body):
    """Tasks whose graph is acyclic, with unique ids and known dependencies."""
    tasks: Many(DagTask, limits.dag_tasks_max, "dag_tasks_max", nonempty=True)


# --- job bodies --------------------------------------------------------------------------

class JobPatch(_Body):
    """The members a PATCH may change; null resets one to its default."""
    name: Union[Text(limits.job_name_chars_max, "job_name_chars_max"), None] = None
    schedule: Union[Schedule, None] = None
    run_at: Union[Time, None] = None
    target: Union[Target, None] = None
    dag: Union[Dag, None] = None
    retry: Union[Retry, None] = None
    concurrency: Union[ConcurrencyPolicy, Concurrency, None] = None   # a policy's name or more
    misfire: Union[MisfirePolicy, Misfire, None] = None
    alert: Union[Alert, None] = None
    history: Union[History, None] = None
    # Names of headers or env variables whose values are secret (write-only).
    secret_keys: Union[Many(Text(limits.secret_key_bytes_max, "secret_key_bytes_max",
                                 nonempty=True), limits.secret_keys_max, "secret_keys_max"),
                       None] = None
    priority: Union[Priority, None] = None
    labels: Union[Labels, None] = None
    # The most a stable per-occurrence delay adds to each fire.
    jitter_s: Union[Seconds(0, limits.jitter_s_max, "jitter_s_max"), None] = None
    # A recurring schedule's bounds (inclusive); null clears one.
    not_before: Union[Time, None] = None
    not_after: Union[Time, None] = None


class JobCreate(JobPatch):
    """A new job: a schedule (or run_at) and one target, or a DAG of tasks."""
    idempotency_key: Union[Text(limits.idempotency_key_bytes_max,
                                "idempotency_key_bytes_max", nonempty=True), None] = None
    metadata: Union[dict[str, Any], None] = None


# --- other requests about jobs ----------------------------------------------------------

class SchedulePreview(_Body):
    """The next fire times of a schedule (or run_at) after `after` (default: now)."""
    schedule: Union[Schedule, None] = None
    run_at: Union[Time, None] = None
    after: Union[Time, None] = None
    job_id: Union[Text(24, description="the job `H` is hashed from (default: an empty id)",
                       pattern=f"^{JOB_ID_PATTERN}$"), None] = None
    count: Int(1, limits.preview_count_max, "preview_count_max") = limits.preview_count_default


class BackfillCreate(_Body):
    """Runs of a job's past occurrences in [start, end)."""
    start: Text(64, description="RFC 3339: the first instant of the range (included)")
    end: Text(64, description="RFC 3339: the end of the range (excluded); not in the future")
    overlap: Annotated[BackfillOverlap, Meta(description=(
        "allow: the backfill's runs neither wait for nor hold back the job's own; job: each "
        "goes through the job's concurrency policy, one at a time unless that policy is allow"
    ))] = "allow"
    # The backfill's runs open at once.
    max_concurrent: Int(1, limits.backfill_concurrent_max,
                        "backfill_concurrent_max") = limits.backfill_concurrent_default
    # List the occurrences, run nothing.
    dry_run: bool = False


# --- workers ----------------------------------------------------------------------------
# What a remote worker sends (api/execution.py): its claim, its heartbeats and its results.

RunId = Text(len("run_") + 32, description="a run id", pattern=f"^{RUN_ID_PATTERN}$")
RunAttempt = Int(1, limits.run_attempts_max, "run_attempts_max")


class WorkerClaim(_Body):
    queue: Name(limits.queue_bytes_max, "queue_bytes_max")
    max: Int(1, limits.worker_claim_max, "worker_claim_max") = 1
    wait_s: Seconds(0, limits.worker_claim_wait_s_max, "worker_claim_wait_s_max") = 0.0


class RunHeld(_Body):
    """A run a worker holds, and the attempt it works on."""
    run_id: RunId
    attempt: RunAttempt


class WorkerHeartbeat(_Body):
    runs: Many(RunHeld, limits.run_update_batch_max, "run_update_batch_max")


class RunOutput(_Body):
    """What an attempt printed or answered; `truncated`: bytes dropped, by stream."""
    stdout: Union[str, msgspec.UnsetType] = msgspec.UNSET
    stderr: Union[str, msgspec.UnsetType] = msgspec.UNSET
    http_body: Union[str, msgspec.UnsetType] = msgspec.UNSET
    published: Union[str, msgspec.UnsetType] = msgspec.UNSET
    truncated: Union[Map(Int(0, limits.command_int_max, "command_int_max"),
                         limits.command_int_max), msgspec.UnsetType] = msgspec.UNSET


class RunResult(RunHeld):
    """An attempt's end. A long `error` is cut to run_error_chars_max."""
    ok: bool
    retryable: bool = True
    exit_code: Union[Int(limits.exit_code_min, limits.exit_code_max, "exit_code_max"),
                     None] = None
    error: Union[str, None] = None
    output: Union[RunOutput, None] = None
    duration_ms: Annotated[float, Meta(ge=0)] = 0.0


class WorkerComplete(_Body):
    results: Many(RunResult, limits.worker_claim_max, "worker_claim_max")


# --- admin ------------------------------------------------------------------------------

class TokenCreate(_Body):
    role: Role
    tenant: Union[Text(limits.tenant_bytes_max, "tenant_bytes_max",
                       description="default: the tenant the admin acts for",
                       pattern=f"^{limits.tenant_name_pattern}$"), None] = None
    # At most token_name_bytes_max bytes of UTF-8 (a hook counts the bytes).
    name: Text(limits.token_name_bytes_max, "token_name_bytes_max") = ""


QuotaJobs = Union[Int(1, limits.quota_jobs_max_max, "quota_jobs_max_max"), None]


class TenantQuota(_Body):
    """A tenant's quotas: a quota left out or null follows the node flags'
    default (--tenant-jobs-max, ...)."""
    jobs_max: QuotaJobs = None
    creates_per_s: Union[Int(1, limits.quota_creates_per_s_max, "quota_creates_per_s_max"),
                         None] = None
    runs_concurrent_max: QuotaJobs = None
    weight: Union[Int(1, limits.tenant_weight_max, "tenant_weight_max"), None] = None
    commands: Union[Annotated[bool, Meta(description=(
        "true grants the tenant command targets (on the nodes and on worker queues), false "
        "withdraws them; left out or null: unchanged"))], None] = None


# --- small bodies of actions ----------------------------------------------------------

class PauseNote(_Body):
    """Why a job is paused: kept and shown until it resumes."""
    note: Union[Text(limits.pause_note_bytes_max, "pause_note_bytes_max"), None] = None


class RunOverlap(_Body):
    """A trigger's or retry's one run: "allow" admits it whatever the job's
    concurrency policy (left out: the policy decides)."""
    overlap: Union[Literal["allow"], None] = None


class CancelReason(_Body):
    """Why: kept in the record, cut to run_error_chars_max characters."""
    reason: Union[str, None] = None


class GroupOffset(_Body):
    """The last offset a consumer group processed."""
    offset: Int(0, limits.command_int_max, "command_int_max")


def json_schemas(shapes: list[Any], ref_template: str) -> dict[str, dict]:
    """The JSON Schemas of `shapes` and of every Struct they hold, by class name:
    what the OpenAPI document's components are generated from."""
    return _json_patterns(msgspec.json.schema_components(shapes, ref_template=ref_template)[1])


def _json_patterns(schema: Any) -> Any:
    """`schema` with each pattern's \\Z (Python's end of text) written as JSON
    Schema's `$`."""
    if isinstance(schema, list):
        return [_json_patterns(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {name: _json_patterns(value) for name, value in schema.items()}
    if isinstance(out.get("pattern"), str) and out["pattern"].endswith(r"\Z"):
        out["pattern"] = out["pattern"][:-2] + "$"
    return out


def members(shape: type[Struct]) -> frozenset[str]:
    """The members a body of `shape` may hold."""
    return frozenset(shape.__struct_fields__) | (
        {shape.__struct_config__.tag_field} if shape.__struct_config__.tag else set())


# --- the check ---------------------------------------------------------------------------

_PATH_RE = re.compile(r"^(?P<why>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD_RE = re.compile(r"(?:unknown|required) field `([^`]*)`")
# A step of msgspec's path: `.name`, `[3]` (a list item) or `[...]` (a map's value).
_STEP_RE = re.compile(r"\.([^.\[]+)|\[(?:\d+|\.\.\.)\]")


def check_shape(value: object, shape: Any, prefix: str = "") -> Any:
    """`value` as `shape`, or InvalidInput (400) naming the offending member as
    a dotted path under `prefix` (and the limit, for a bound)."""
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        raise _refusal(str(exc), shape, prefix) from None


def _refusal(message: str, shape: Any, prefix: str) -> InvalidInput:
    match = _PATH_RE.match(message)
    assert match is not None   # the pattern matches any text
    why, path = match["why"], match["path"] or ""
    if why.startswith("Expected `object`") and not path and not prefix:
        return InvalidInput("the request body must be a JSON object", field="body")
    named = _FIELD_RE.search(why)   # an unknown or missing member: name it
    field = (prefix + path.replace("[...]", "")
             + ("." + named[1] if named else "")).lstrip(".") or "body"
    if named:
        return InvalidInput(f"{why.split(' `')[0].lower()} `{field}`", field=field)
    leaf, limit = _member_at(msgspec.inspect.type_info(shape), _STEP_RE.findall(path))
    why, limit = _sentence(why, leaf, limit)
    return InvalidInput(f"`{field}` {why}", field=field, limit=limit)


def _sentence(why: str, leaf: Any, limit: str | None) -> tuple[str, str | None]:
    """(what a member must be, as the end of a sentence; the limit it breaks or None)."""
    kinds = msgspec.inspect
    if isinstance(leaf, (kinds.IntType, kinds.FloatType)):
        lo, hi = leaf.ge, leaf.le
        if lo is not None and hi is not None:
            noun = "an integer" if isinstance(leaf, kinds.IntType) else "a number"
            return f"must be {noun} from {lo:g} to {hi:g}", limit
    if isinstance(leaf, kinds.LiteralType):
        return f"must be one of {', '.join(map(str, leaf.values))}", None
    if "length <=" in why:
        bound = why.rsplit(" ", 1)[-1]
        unit = "characters" if why.startswith("Expected `str`") else "items"
        return f"is over {bound} {unit} long: at most {bound}", limit
    if "length >=" in why:
        return "must be non-empty", None
    if "matching regex" in why and leaf.pattern == NAME_TOKEN_PATTERN[:-1] + r"\Z":
        return "must be letters, digits, '.', '_' or '-'", None
    return f"must be {why[:1].lower()}{why[1:]}".replace("must be expected ", "must be "), None


def _member_at(info: Any, steps: list[str], limit: str | None = None) -> tuple[Any, str | None]:
    """(the type of the member at `steps` (member names; "" for the item of a
    list or the value of a map) of the type `info` describes, the limit named on it)."""
    kinds = msgspec.inspect
    if isinstance(info, kinds.Metadata):
        here = (info.extra_json_schema or {}).get("x-limit")
        return _member_at(info.type, steps, here if not steps else limit)
    if isinstance(info, kinds.UnionType):
        found = [_member_at(t, steps, limit) for t in info.types
                 if not isinstance(t, kinds.NoneType)]
        return next((f for f in found if f[0] is not None), (None, None))
    if not steps:
        return info, limit
    step, rest = steps[0], steps[1:]
    if isinstance(info, kinds.StructType):
        field = next((f for f in info.fields if f.encode_name == step), None)
        return _member_at(field.type, rest) if field else (None, None)
    if isinstance(info, kinds.ListType) and not step:
        return _member_at(info.item_type, rest)
    if isinstance(info, kinds.DictType) and not step:
        return _member_at(info.value_type, rest)
    return None, None
