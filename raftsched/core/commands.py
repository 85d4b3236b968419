"""Replicated commands: versioned, tagged msgpack maps; nothing pickled.

Every command is computed completely by its proposer: the time it was proposed
(`at_ms`), the next fire time of a recurring job, the node that will execute a
run. apply never has to read a clock or the zone database, so the same log
gives the same state on every node.

Each tag's shape is declared once, below, as a msgspec Struct (tag field `t`):
decode checks an entry against all of them in one C call, on every replica.
What msgspec cannot say is checked after it, in Python and only where it can
matter: the UTF-8 size of key strings (msgspec counts characters) and NUL in
them, rules across members, and the free-form JSON values a job carries
(metadata, bodies, messages).
"""

import contextvars
import math
import re
import typing
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from raftsched import limits
from raftsched.core import codec, dag
from raftsched.core import compact as _compact
from raftsched.core.shape import ShapeError, json_value
from raftsched.core.spec import (BackfillOverlap, Backoff, ConcurrencyPolicy, MisfirePolicy,
                                 Priority, Role, TriggerRule)
from raftsched.errors import CommandRefused, UnknownCommand

VERSION = 1
# The commands this build applies, as a level its clock answers carry (GET
# /v1/node/clock `applies`): 2 added hand_over_runs, 3 miss_uncalled, 4
# renew_recorded and take_over_judged, 5 create_jobs_compact, 6
# create_jobs_stored. A node proposes
# a command of a level only once every other node has said it applies it, so
# that during a rolling upgrade no older node meets a tag it would stop on. A
# change of what apply does gets a tag of its own rather than a member, which
# an older node would skip and so apply otherwise than the others.
APPLY_LEVEL = 6
# The level of a node that does not say (a release before the levels).
APPLY_LEVEL_UNSAID = 1


# --- member types ----------------------------------------------------------------------
# An integer is checked in C by its bounds (a bool is never an integer to
# msgspec); a float bound refuses NaN and the infinities, which fail every
# comparison. A key string also gets a character bound (as many characters as
# bytes at most) that msgspec checks in C; the byte bound itself is checked
# after decode (see _KeyBytes), so a 4-byte character counts as 4.

class _KeyBytes:
    """Marks a str member that is part of a storage key: at most max_bytes
    bytes of UTF-8, and free of NUL (the key separator)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def why_not(self, value: str) -> str | None:
        if value.isascii():   # ids and names: as many bytes as characters
            size = len(value)
        else:
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                return "is not valid UTF-8 (it holds a lone surrogate)"
        if size > self.max_bytes:
            return f"is {size} bytes of UTF-8, over {self.max_bytes}"
        if "\x00" in value:
            return "must not contain NUL"
        return None


def Key(max_bytes: int) -> Any:
    """A string that becomes part of a storage key: 1 to max_bytes bytes, no NUL."""
    return Annotated[str, Meta(min_length=1, max_length=max_bytes), _KeyBytes(max_bytes)]


def Text(max_chars: int) -> Any:
    """A string of at most max_chars characters (at most 4 * max_chars bytes of
    UTF-8): it is not part of a key, so the decoder's character bound suffices."""
    return Annotated[str, Meta(max_length=max_chars)]


def Int(lo: int, hi: int) -> Any:
    return Annotated[int, Meta(ge=lo, le=hi)]


def Num(lo: float, hi: float) -> Any:
    """An integer or a finite float in [lo, hi]."""
    return Union[Annotated[int, Meta(ge=math.ceil(lo), le=math.floor(hi))],
                 Annotated[float, Meta(ge=lo, le=hi)]]


TimeMs = Int(0, limits.command_int_max)            # ms since the epoch
# A retry delay is drawn within the job's retry.max_s, itself at most
# retry_delay_s_max (checked in every spec below), so the due time it makes
# stays a time.
DelayMs = Int(0, int(limits.retry_delay_s_max * 1000))
Token = Int(0, limits.command_int_max)
Shard = Int(0, limits.shard_count_max - 1)
Attempt = Int(1, limits.run_attempt_max)
Count = Int(0, limits.command_int_max)
ExitCode = Int(-(2 ** 31), 2 ** 31 - 1)
JobId = Key(limits.job_id_bytes_max)
RunId = Key(limits.run_id_bytes_max)
NodeId = Key(limits.node_id_bytes_max)
Holder = Key(limits.holder_bytes_max)
# Topics and worker queues are scoped by tenant in the state: "tenant/name".
Topic = Key(limits.tenant_bytes_max + 1 + limits.topic_bytes_max)
Tenant = Key(limits.tenant_bytes_max)
IdemKey = Key(limits.idempotency_key_bytes_max)
TokenId = Key(limits.key_part_bytes_max)
# A backfill's id is its record's whole key (the API makes it bf_ and 20 hex digits).
BackfillId = Key(limits.key_part_bytes_max)
TaskId = Key(limits.dag_task_id_bytes_max)
# Who proposed a change, for the audit table: a token id, "bootstrap" (the
# admin token the nodes were started with) or "insecure" (no authentication).
Actor = Union[Text(limits.key_part_bytes_max), None]
CommandText = Text(limits.command_text_bytes_max)
Tag16 = Text(16)

# The closed sets of values commands carry: each defined once, here or where
# the edge validates it.
AlertOutcome = Literal["sent", "undeliverable", "no_webhook"]
# A job spec's closed sets (Backoff, ConcurrencyPolicy, MisfirePolicy, Priority,
# TriggerRule, BackfillOverlap) and token roles are the API's, imported from core/spec.py.


class _Shape(Struct, kw_only=True, omit_defaults=True):
    """A shape msgspec checks whole. Members a shape does not declare are
    skipped by the decoder and ignored by apply, so a proposer that adds one
    does not turn its commands into refusals."""


class _Checked(_Shape, kw_only=True):
    """A shape with members msgspec cannot check alone: key strings (bounded in
    bytes, free of NUL) or rules across members. Only these pay a Python call
    per instance; a shape with a Key member must be one (checked at import)."""

    def __post_init__(self) -> None:
        if not _CHECKING.get():
            return   # built by a proposer: judged when decoded, as on every replica
        for name, check in _BYTE_CHECKS[type(self)]:
            check(name, getattr(self, name))
        self.check_rules()

    def check_rules(self) -> None:
        """Rules across members: raise _refuse(member, why) when one fails."""


class _Pair(Struct, array_like=True, forbid_unknown_fields=True):
    """A fixed-length record the log carries as a msgpack array."""

    def __post_init__(self) -> None:
        if not _CHECKING.get():
            return   # built by a proposer: judged when decoded, as on every replica
        for name, check in _BYTE_CHECKS[type(self)]:
            check(name, getattr(self, name))
        self.check_rules()

    def check_rules(self) -> None:
        pass


def _refuse(member: str, why: str) -> ValueError:
    """A refusal raised inside a shape's checks: msgspec reports it at the
    shape's own path, and decode appends `member` (empty: the shape itself)."""
    return ValueError(f"{_MEMBER}{member}{_MEMBER}{why}")


_MEMBER = "\x1f"
# Set while decode (or a report's conversion) runs in this thread: only then do
# shapes check themselves, not when a proposer builds one in Python.
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("commands_checking",
                                                                 default=False)


def _ascending(values: list[int]) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


# --- job specs -------------------------------------------------------------------------
# A job spec is stored whole, as the proposer sent it; apply and the loops that
# read it (trigger, dispatcher, reaper) dereference the members typed here.
# decode checks the map against JobSpec and keeps the map (see _check_spec).

class _Bounds(_Shape, kw_only=True):
    # A recurring schedule's bounds (inclusive): no occurrence before or after them.
    not_before_ms: Union[TimeMs, UnsetType] = UNSET
    not_after_ms: Union[TimeMs, UnsetType] = UNSET


class CronSchedule(_Bounds, tag="cron", tag_field="kind", kw_only=True):
    cron: CommandText
    timezone: CommandText
    # The expression as given, when `cron` is its H terms resolved.
    text: Union[CommandText, UnsetType] = UNSET


class EverySchedule(_Bounds, tag="every", tag_field="kind", kw_only=True):
    # Bounded as at the edge, so that a next occurrence (a multiple of every_ms
    # after now) stays a time: a fire carrying one past it would be refused whole.
    every_ms: Int(1, limits.every_ms_max)


class OnceSchedule(_Shape, tag="once", tag_field="kind", kw_only=True):
    run_at_ms: TimeMs
    offset_min: Union[Int(-24 * 60, 24 * 60), UnsetType] = UNSET


class NoSchedule(_Shape, tag="none", tag_field="kind", kw_only=True):
    """A DAG job without a schedule: it runs when triggered."""


Schedule = Union[CronSchedule, EverySchedule, OnceSchedule, NoSchedule]
TimeoutS = Num(0, limits.target_timeout_s_max)


class HttpTarget(_Shape, tag="http", tag_field="type", kw_only=True):
    url: CommandText
    method: Tag16
    timeout_s: TimeoutS
    # As the edge validates them (core/jobspec.py): names to strings.
    headers: Union[Annotated[dict[str, Text(limits.target_header_value_chars_max)],
                             Meta(max_length=limits.target_headers_max)], UnsetType] = UNSET
    body: Any = None


class CommandTarget(_Checked, tag="command", tag_field="type", kw_only=True):
    argv: Annotated[list[Text(limits.target_body_bytes_max)],
                    Meta(min_length=1, max_length=limits.command_argv_max)]
    shell: Union[bool, UnsetType] = UNSET
    cwd: Union[CommandText, None, UnsetType] = UNSET
    queue: Union[Key(limits.queue_bytes_max), UnsetType] = UNSET
    timeout_s: TimeoutS


class PublishTarget(_Checked, tag="publish", tag_field="type", kw_only=True):
    topic: Topic
    key: Union[CommandText, None, UnsetType] = UNSET
    message: Any


Target = Union[HttpTarget, CommandTarget, PublishTarget]


class Retry(_Shape, kw_only=True):
    max_attempts: Union[Attempt, UnsetType] = UNSET
    backoff: Union[Backoff, UnsetType] = UNSET
    base_s: Union[Num(0, limits.retry_delay_s_max), UnsetType] = UNSET
    max_s: Union[Num(0, limits.retry_delay_s_max), UnsetType] = UNSET
    non_retryable_exit_codes: Union[Annotated[list[ExitCode], Meta(max_length=256)],
                                    UnsetType] = UNSET


class Concurrency(_Shape, kw_only=True):
    policy: ConcurrencyPolicy
    queue_max: Union[Count, UnsetType] = UNSET


class Misfire(_Shape, kw_only=True):
    policy: MisfirePolicy
    tolerance_ms: Count
    catchup_max: Int(1, limits.catchup_max_max)
    catchup_window_ms: Union[Int(1, limits.command_int_max), UnsetType] = UNSET


class Alert(_Shape, kw_only=True):
    webhook_url: Union[CommandText, None, UnsetType] = UNSET


class History(_Shape, forbid_unknown_fields=True, kw_only=True):
    max_runs: Union[Int(1, limits.history_max_runs_max), UnsetType] = UNSET
    max_age_ms: Union[Count, UnsetType] = UNSET


class DagTask(_Checked, kw_only=True):
    id: TaskId
    target: Target
    depends_on: Annotated[list[TaskId], Meta(max_length=limits.dag_tasks_max)]
    trigger_rule: TriggerRule
    retry: Union[Retry, None, UnsetType] = UNSET


class Dag(_Shape, kw_only=True):
    # apply keeps a DAG run's task instances by id and counts each task's upstream
    # tasks down to zero: ids must be unique, dependencies known, the graph acyclic
    # (core/dag.py graph_problem, the same check as at the edge; see _check_spec).
    tasks: Annotated[list[DagTask], Meta(min_length=1, max_length=limits.dag_tasks_max)]


class JobSpec(_Checked, kw_only=True):
    """A job spec: the members below, with exactly one of target and dag."""
    name: Union[CommandText, None]
    schedule: Schedule
    # A job calls one target, or runs a DAG of tasks that each call one.
    target: Union[Target, UnsetType] = UNSET
    dag: Union[Dag, UnsetType] = UNSET
    retry: Union[Retry, None]
    concurrency: Union[Concurrency, None]
    misfire: Union[Misfire, UnsetType] = UNSET
    alert: Union[Alert, None, UnsetType] = UNSET
    metadata: Any
    history: Union[History, UnsetType] = UNSET
    priority: Union[Priority, UnsetType] = UNSET
    # Left out by jobs created before secret_keys existed: they have none.
    secret_keys: Union[Annotated[list[Text(limits.secret_key_bytes_max)],
                                 Meta(max_length=limits.secret_keys_max)], UnsetType] = UNSET
    labels: Union[Annotated[dict[Key(limits.label_key_bytes_max),
                                 Text(limits.label_value_bytes_max)],
                            Meta(max_length=limits.job_labels_max)], UnsetType] = UNSET
    # The most a stable per-occurrence delay adds to each fire (core/schedule.py).
    jitter_ms: Union[Int(0, limits.jitter_s_max * 1000), UnsetType] = UNSET

    def check_rules(self) -> None:
        if self.target is not UNSET and self.dag is not UNSET:
            raise _refuse("dag", "a job has a target or a dag, not both")
        if self.target is UNSET and self.dag is UNSET:
            raise _refuse("target", "is required (or dag, for a DAG job)")


_JSON_DEPTH_MAX = limits.command_nesting_max
_SLOW_JSON = json_value(_JSON_DEPTH_MAX)


def _plain_json(value: Any, depth: int = 0) -> bool:
    """Whether `value`, as the decoder made it, is a JSON value nested at most
    _JSON_DEPTH_MAX deep: the fast judgement (a str the decoder made is UTF-8,
    an int fits 64 bits). Bytes, extension types and timestamps are refused.
    Scalars inside a container are judged inline: most members are scalars."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return value - value == 0.0   # NaN and the infinities give NaN
    if depth >= _JSON_DEPTH_MAX:
        return False
    if kind is dict:
        for name, member in value.items():
            if type(name) is not str:
                return False
            inner = type(member)
            if not (inner is str or inner is int or inner is bool or member is None) \
                    and not _plain_json(member, depth + 1):
                return False
        return True
    if kind is list:
        for member in value:
            inner = type(member)
            if not (inner is str or inner is int or inner is bool or member is None) \
                    and not _plain_json(member, depth + 1):
                return False
        return True
    return False


def _check_json(member: str, value: Any) -> None:
    """Raise _refuse(path, why) unless `value` is a bounded JSON value."""
    if _plain_json(value):
        return
    try:
        _SLOW_JSON(value)
    except ShapeError as exc:
        raise _refuse(_join(member, exc.path), exc.why) from None
    raise _refuse(member, "must be a JSON value")   # (a str subclass, say)


def _check_spec(spec: dict, shape: type[JobSpec] = JobSpec) -> None:
    """Check a proposed spec map against `shape` (JobSpec, or CompactJobSpec),
    in C, and what msgspec cannot: the DAG's graph and the free-form JSON
    members (finite numbers, depth)."""
    try:
        typed = msgspec.convert(spec, shape)
    except msgspec.ValidationError as exc:
        why, path = _split(str(exc))
        raise ValueError(f"{_MEMBER}{path}{_MEMBER}{why}") from None
    metadata = spec.get("metadata")   # (a compact spec leaves out metadata {})
    if metadata is not None and not (metadata.__class__ is dict and not metadata):
        _check_json("metadata", metadata)
    # The spec is stored as sent, members no shape declares too (a newer
    # proposer's): those must at least be JSON values the store can hold.
    # (Each map is tested here first: nearly always, every member is declared.)
    declared = _DECLARED
    if not declared[shape].issuperset(spec):
        _check_undeclared("", spec, typed)
    schedule = spec["schedule"]
    if not declared[typed.schedule.__class__].issuperset(schedule):
        _check_undeclared("schedule", schedule, typed.schedule)
    if not _SPEC_MAP_NAMES.isdisjoint(spec):   # (a compact spec has none of them, mostly)
        for name in _SPEC_MAPS:
            member = spec.get(name)
            if member.__class__ is dict:
                _check_undeclared(name, member, getattr(typed, name))
    if typed.dag is not UNSET:
        problem = dag.graph_problem(spec["dag"]["tasks"])
        if problem is not None:
            raise _refuse("dag", "task ids must be unique, dependencies known and listed "
                                 "once, and the graph acyclic with at most "
                                 f"{limits.dag_edges_max} dependencies")
        _check_undeclared("dag", spec["dag"], typed.dag)
        for i, (task, shape) in enumerate(zip(spec["dag"]["tasks"], typed.dag.tasks)):
            _check_undeclared(f"dag.tasks[{i}]", task, shape)
            if task.get("retry").__class__ is dict:
                _check_undeclared(f"dag.tasks[{i}].retry", task["retry"], shape.retry)
            _check_target(f"dag.tasks[{i}].target", task["target"], shape.target)
    else:
        _check_target("target", spec["target"], typed.target)


# Tuples, checked in this order (a refusal names the first member that fails,
# the same on every replica); the sets only say whether any is there.
_SPEC_MAPS = ("retry", "concurrency", "misfire", "alert")
_SPEC_MAP_NAMES = frozenset(_SPEC_MAPS)
_TARGET_JSON = ("body", "message", "env")
_TARGET_JSON_NAMES = frozenset(_TARGET_JSON)


def _check_target(path: str, target: dict, shape: _Shape) -> None:
    if not _DECLARED[shape.__class__].issuperset(target):
        _check_undeclared(path, target, shape)
    if not _TARGET_JSON_NAMES.isdisjoint(target):
        for member in _TARGET_JSON:
            value = target.get(member)
            if value is not None:
                _check_json(_join(path, member), value)


def _check_undeclared(path: str, value: dict, shape: _Shape) -> None:
    """Check as free-form JSON the members of `value` its shape does not declare."""
    declared = _DECLARED[type(shape)]
    if not declared.issuperset(value):
        for name in value.keys() - declared:
            _check_json(_join(path, name), value[name])


# --- commands --------------------------------------------------------------------------
# One Struct per tag in TAGS (a test keeps the two equal), members in the order
# the log has always carried them. `v` and `t` are every command's; decode
# judges an unknown version or tag before anything else (see decode).

class Command(_Checked, tag_field="t", kw_only=True, omit_defaults=False):
    v: Int(VERSION, VERSION) = VERSION


class _Scoped(Command, kw_only=True):
    # What a job or run write carries besides its own members: the tenant the
    # caller acts for (apply answers not_found for another tenant's job) and the actor.
    tenant: Union[Tenant, UnsetType] = UNSET
    actor: Actor = None   # left out or None alike: none


class CreateQuota(_Shape, forbid_unknown_fields=True, kw_only=True):
    """The quota the proposer found in force for the tenant (its own, or the node
    flags' default): apply counts against it, so every replica decides alike."""
    jobs_max: Int(1, limits.quota_jobs_max_max)
    creates_per_s: Int(1, limits.quota_creates_per_s_max)


class CreateJob(Command, tag="create_job", kw_only=True):
    job_id: JobId
    tenant: Tenant
    spec: dict[str, Any]
    idempotency_key: Union[IdemKey, None]
    shard: Shard
    next_ms: Union[TimeMs, None]
    at_ms: TimeMs
    quota: Union[CreateQuota, UnsetType] = UNSET
    actor: Actor = None   # left out or None alike: none

    def check_rules(self) -> None:
        _check_member_spec(self.spec)


def _check_member_spec(spec: dict, shape: type[JobSpec] = JobSpec) -> None:
    try:
        _check_spec(spec, shape)
    except ValueError as exc:
        why, member = _member_of(str(exc))
        raise _refuse(_join("spec", member), why) from None


class CreateJobItem(_Checked, kw_only=True):
    """One job of a create_jobs: what a create_job carries besides tenant and at_ms."""
    job_id: JobId
    spec: dict[str, Any]
    idempotency_key: Union[IdemKey, None]
    shard: Shard
    next_ms: Union[TimeMs, None]

    def check_rules(self) -> None:
        _check_member_spec(self.spec)


class CreateJobs(Command, tag="create_jobs", kw_only=True):
    tenant: Tenant
    at_ms: TimeMs
    quota: Union[CreateQuota, UnsetType] = UNSET
    actor: Actor = None   # left out or None alike: none
    items: Annotated[list[CreateJobItem],
                     Meta(min_length=1, max_length=limits.batch_entry_jobs_max)]


# A create_jobs whose specs are as the stores keep them (core/compact.py): each
# member equal to its default left out, about 60% of a validated spec's bytes.
# Their shapes are JobSpec's with those members optional; apply restores them
# (compact.expand_spec) before it reads the spec, so the jobs stored and the
# results are those of the create_jobs of the whole specs.

class CompactHttpTarget(HttpTarget, tag="http", tag_field="type", kw_only=True):
    method: Union[Tag16, UnsetType] = UNSET
    timeout_s: Union[TimeoutS, UnsetType] = UNSET


class CompactJobSpec(JobSpec, kw_only=True):
    target: Union[CompactHttpTarget, CommandTarget, PublishTarget, UnsetType] = UNSET
    retry: Union[Retry, None, UnsetType] = UNSET
    concurrency: Union[Concurrency, None, UnsetType] = UNSET
    metadata: Any = UNSET


class CompactCreateJobItem(CreateJobItem, kw_only=True):
    def check_rules(self) -> None:
        _check_member_spec(self.spec, CompactJobSpec)


class CreateJobsCompact(CreateJobs, tag="create_jobs_compact", kw_only=True):
    items: Annotated[list[CompactCreateJobItem],
                     Meta(min_length=1, max_length=limits.batch_entry_jobs_max)]


# A create_jobs whose specs are in the very form the stores keep them
# (compact.stored_spec: positional where a form fits, defaults left out, a
# name made from the target left out): apply writes each as it came, rather
# than working the form out again on every replica. The form is read back
# into a map and checked as CompactJobSpec when the entry is decoded, then
# made whole (a StoredSpec), by the functions every read of a job uses, so
# apply reads, and stores, what any later read returns.

class StoredCreateJobItem(CreateJobItem, kw_only=True):
    spec: Any

    def check_rules(self) -> None:
        if not _compact.stored_spec_fits(self.spec):
            raise _refuse("spec", "must be a job spec as the stores keep it (its positional "
                                  "forms no longer than they are, their first member a map)")
        try:
            spec, default_named = _compact.spec_of_stored(self.spec)
        except Exception:   # (an others map with keys no map can hold, say)
            raise _refuse("spec", "must be a job spec as the stores keep it") from None
        if spec.__class__ is not dict:
            raise _refuse("spec", "must be a job spec as the stores keep it")
        _check_member_spec(spec, CompactJobSpec)
        if default_named and (spec.get("target").__class__ is not dict
                              or spec["target"]["type"] != "http"):
            raise _refuse("spec.name", "is left out only for an HTTP target, which names "
                                       "the job")
        lean = _compact.lean_spec(self.spec, default_named)
        try:
            if lean is None:
                self.spec = _compact.whole_stored_spec(spec, self.spec, default_named)
            else:
                # Left as it came (apply reads its time alone), once its name
                # is known to be one a read can make.
                if default_named:
                    _compact.default_http_name(spec["target"])
                self.spec = lean
        except ValueError:   # a URL the name cannot be made from
            raise _refuse("spec.name", "is left out only where the target's URL can name "
                                       "the job") from None


class CreateJobsStored(CreateJobs, tag="create_jobs_stored", kw_only=True):
    items: Annotated[list[StoredCreateJobItem],
                     Meta(min_length=1, max_length=limits.batch_entry_jobs_max)]


class UpdateJob(_Scoped, tag="update_job", kw_only=True):
    job_id: JobId
    spec: dict[str, Any]
    expected_version: Count
    next_ms: Union[TimeMs, None]
    at_ms: TimeMs

    def check_rules(self) -> None:
        _check_member_spec(self.spec)


class DeleteJob(_Scoped, tag="delete_job", kw_only=True):
    job_id: JobId
    at_ms: TimeMs


class PauseJob(_Scoped, tag="pause_job", kw_only=True):
    """`note`: why, kept in the job while it is paused (None: none)."""
    job_id: JobId
    at_ms: TimeMs
    note: Union[Text(limits.pause_note_bytes_max), None] = None


class ResumeJob(_Scoped, tag="resume_job", kw_only=True):
    job_id: JobId
    next_ms: Union[TimeMs, None]
    at_ms: TimeMs


class TriggerJob(_Scoped, tag="trigger_job", kw_only=True):
    job_id: JobId
    scheduled_ms: TimeMs
    node: NodeId
    at_ms: TimeMs
    overlap: Union[Literal["allow"], UnsetType] = UNSET


class RetryRun(_Scoped, tag="retry_run", kw_only=True):
    """A failed run's new attempt (core/redrive.py), run by `node`."""
    run_id: RunId
    node: NodeId
    at_ms: TimeMs
    overlap: Union[Literal["allow"], UnsetType] = UNSET


class FireItem(_Pair):
    """One due occurrence of a fire: the occurrences start with due_ms and
    ascend, and the next one (if any) comes after them all. `omitted`: whether
    occurrences past catchup_max were left out."""
    job_id: JobId
    due_ms: TimeMs
    next_ms: Union[TimeMs, None]
    occurrences: Annotated[list[TimeMs], Meta(min_length=1,
                                              max_length=limits.catchup_max_max + 1)]
    omitted: bool

    def check_rules(self) -> None:
        if self.occurrences[0] != self.due_ms or not _ascending(self.occurrences) or (
                self.next_ms is not None and self.next_ms <= self.occurrences[-1]):
            raise _refuse("", "occurrences must ascend from due_ms, and next_ms (if any) "
                              "must follow them")


class RetryDue(_Pair):
    run_id: RunId
    due_ms: TimeMs


_FireItems = Annotated[list[FireItem], Meta(max_length=limits.fire_batch_max)]
_RetryDues = Annotated[list[RetryDue], Meta(max_length=limits.fire_batch_max)]


class Fire(Command, tag="fire", kw_only=True):
    shard: Shard
    token: Token
    upto_ms: TimeMs
    node: NodeId
    at_ms: TimeMs
    items: _FireItems
    retries: _RetryDues = []

    def check_rules(self) -> None:
        if len(self.items) + len(self.retries) > limits.fire_batch_max:
            raise _refuse("", f"items and retries together must be at most "
                              f"{limits.fire_batch_max}")


class FirePart(_Shape, kw_only=True):
    """One shard's part of a fire_many, as a fire of that shard carries it."""
    shard: Shard
    token: Token
    upto_ms: TimeMs
    items: _FireItems
    retries: _RetryDues


class FireMany(Command, tag="fire_many", kw_only=True):
    """Fires of several shards in one entry, each part checked against its own
    shard's token: a node's due items of many shards cost one entry, not one each."""
    node: NodeId
    at_ms: TimeMs
    parts: Annotated[list[FirePart], Meta(min_length=1, max_length=limits.fire_batch_max)]

    def check_rules(self) -> None:
        if sum(len(p.items) + len(p.retries) for p in self.parts) > limits.fire_batch_max:
            raise _refuse("", f"items and retries of all parts together must be at most "
                              f"{limits.fire_batch_max}")


class Assignment(_Pair):
    shard: Shard
    node: NodeId


class AssignShards(Command, tag="assign_shards", kw_only=True):
    assignments: Annotated[list[Assignment], Meta(max_length=limits.shard_count_max)]
    at_ms: TimeMs


class _RunUpdate(_Checked, tag_field="event", kw_only=True):
    run_id: RunId
    holder: Holder
    attempt: Attempt
    at_ms: TimeMs


class RunStart(_RunUpdate, tag="start", kw_only=True):
    lease_ms: TimeMs


class RunHeartbeat(_RunUpdate, tag="heartbeat", kw_only=True):
    lease_ms: TimeMs


class RunFinish(_RunUpdate, tag="finish", kw_only=True):
    ok: bool
    retryable: Union[bool, UnsetType] = UNSET
    # Left out or None alike: none.
    retry_delay_ms: Union[DelayMs, None] = None
    http_status: Union[Int(0, 999), None] = None
    exit_code: Union[ExitCode, None] = None
    error: Union[CommandText, None] = None
    output_node: Union[NodeId, None] = None
    # When its node began the call (a node-executed run, held from its fire:
    # docs/execution.md); None for a worker's attempt, which starts at its claim.
    called_ms: Union[TimeMs, None] = None

    def check_rules(self) -> None:
        if not self.ok and self.retryable is not False and self.retry_delay_ms is None:
            raise _refuse("", "a retryable failure must carry retry_delay_ms")


RunUpdate = Union[RunStart, RunHeartbeat, RunFinish]


class RunUpdates(Command, tag="run_updates", kw_only=True):
    updates: Annotated[list[RunUpdate], Meta(max_length=limits.run_update_batch_max)]


class RegisterNode(Command, tag="register_node", kw_only=True):
    node: NodeId
    http: CommandText
    raft: CommandText
    at_ms: TimeMs


class Renew(Command, tag="renew", kw_only=True):
    """A node's liveness renewal: every replica notes when it applied the
    latest renewal of each node (see runtime/coordinator.py)."""
    node: NodeId
    at_ms: TimeMs


class RenewRecorded(Renew, tag="renew_recorded", kw_only=True):
    """A renewal (level 4) whose time is kept in the node's record too
    (`renewed_ms`): the node's shard lease ends node_lease_s after its
    latest renewal, so no run it held and fired ahead of a later second was
    called by it (core/runs.lease_bound_ms)."""


class CheckDigest(Command, tag="check_digest", kw_only=True):
    """Ask every replica to record its state digest as of this entry's index, so
    replicas can be compared at one index while the log keeps moving."""
    node: NodeId
    at_ms: TimeMs


class ExpiredLease(_Pair):
    run_id: RunId
    attempt: Attempt
    retry_delay_ms: DelayMs


class ExpireLeases(Command, tag="expire_leases", kw_only=True):
    items: Annotated[list[ExpiredLease], Meta(max_length=limits.reaper_batch_max)]
    at_ms: TimeMs


class Reassignment(_Pair):
    run_id: RunId
    from_node: NodeId
    to_node: NodeId


class ReassignRuns(Command, tag="reassign_runs", kw_only=True):
    items: Annotated[list[Reassignment], Meta(max_length=limits.reaper_batch_max)]
    at_ms: TimeMs


class TakeOverRuns(Command, tag="take_over_runs", kw_only=True):
    """A shard's new owner takes over the shard's open node-executed runs
    (core/runs.take_over), under the shard's current token."""
    node: NodeId
    shard: Shard
    token: Token
    run_ids: Annotated[list[RunId], Meta(max_length=limits.take_over_batch_max)]
    at_ms: TimeMs


class TakeOverJudged(TakeOverRuns, tag="take_over_judged", kw_only=True):
    """take_over_runs, and (level 4) those fired ahead whose holder's shard
    lease ended before their second, so it never called them, move as the
    same attempt, and the late ones among them go to their jobs' misfire
    policies first (core/apply.py _take_over_judged)."""


class HandOverRuns(Command, tag="hand_over_runs", kw_only=True):
    """Proposed by `holder`, which lost the shard before calling these runs:
    the shard's owner `node` takes over under `token` those `holder` still
    holds as the same attempt (core/runs.take_over). A tag of its own, not a
    member of take_over_runs: an older node, which would apply it as a take
    over (a next attempt), stops on it instead of diverging."""
    node: NodeId
    holder: NodeId
    shard: Shard
    token: Token
    run_ids: Annotated[list[RunId], Meta(max_length=limits.take_over_batch_max)]
    at_ms: TimeMs


class MissUncalled(Command, tag="miss_uncalled", kw_only=True):
    """Proposed by `node` at its start: of the runs it holds in `shard` under
    `token`, those fired ahead, due after `uncalled_after_ms` and by `at_ms`
    were never called (runtime/horizon.py), and their jobs' misfire policies
    judge them as late occurrences (core/runs.miss_uncalled)."""
    node: NodeId
    shard: Shard
    token: Token
    uncalled_after_ms: TimeMs
    run_ids: Annotated[list[RunId], Meta(max_length=limits.take_over_batch_max)]
    at_ms: TimeMs


class CancelRun(_Scoped, tag="cancel_run", kw_only=True):
    run_id: RunId
    reason: CommandText
    at_ms: TimeMs


class AlertDone(Command, tag="alert_done", kw_only=True):
    run_id: RunId
    outcome: AlertOutcome   # sent | undeliverable | no_webhook
    error: Union[CommandText, None]
    at_ms: TimeMs


class Publish(Command, tag="publish", kw_only=True):
    topic: Topic
    key: Union[CommandText, None]
    message: Any
    execution_id: Key(limits.execution_id_bytes_max)
    job_id: JobId
    at_ms: TimeMs

    def check_rules(self) -> None:
        _check_json("message", self.message)


class CommitOffset(Command, tag="commit_offset", kw_only=True):
    topic: Topic
    group: Key(limits.group_bytes_max)
    offset: Count
    at_ms: TimeMs


class PurgeRun(_Pair):
    run_id: RunId
    job_id: JobId


class PurgeIdem(_Pair):
    tenant: Tenant
    key: IdemKey


def _batch(item: Any) -> Any:
    return Annotated[list[item], Meta(max_length=limits.purge_batch_max)]


class Purge(Command, tag="purge", kw_only=True):
    at_ms: TimeMs
    history_max_runs: Int(1, limits.history_max_runs_max)
    history_max_age_ms: Count
    finished_job_retention_ms: Count
    idempotency_ttl_ms: Count
    runs: _batch(PurgeRun)
    jobs: _batch(JobId)
    idem: _batch(PurgeIdem)
    # Left out by purges proposed before backfills existed.
    backfills: _batch(BackfillId) = []

    def check_rules(self) -> None:
        if len(self.runs) + len(self.jobs) + len(self.idem) + len(self.backfills) \
                > limits.purge_batch_max:
            raise _refuse("", f"runs, jobs, idem and backfills together must be at most "
                              f"{limits.purge_batch_max}")


class CreateToken(Command, tag="create_token", kw_only=True):
    """A token of `role` for `tenant`; the state keeps only the SHA-256 of its text."""
    token_id: TokenId
    tenant: Tenant
    role: Role
    name: Text(limits.token_name_bytes_max)
    sha256: Text(64)
    actor: Actor
    at_ms: TimeMs


class RevokeToken(Command, tag="revoke_token", kw_only=True):
    token_id: TokenId
    actor: Actor
    at_ms: TimeMs
    tenant: Union[Tenant, UnsetType] = UNSET


_QuotaJobs = Union[Int(1, limits.quota_jobs_max_max), None]


class TenantQuota(_Shape, forbid_unknown_fields=True, kw_only=True):
    """A tenant's quotas, each an integer or None (the node flags' default)."""
    jobs_max: _QuotaJobs = None
    creates_per_s: Union[Int(1, limits.quota_creates_per_s_max), None] = None
    runs_concurrent_max: _QuotaJobs = None
    weight: Union[Int(1, limits.tenant_weight_max), None] = None


class PutTenant(Command, tag="put_tenant", kw_only=True):
    tenant: Tenant
    quota: TenantQuota
    actor: Actor
    at_ms: TimeMs
    # Grant (true) or withdraw (false) command targets; left out or null keeps
    # the grant as it is.
    commands: Union[bool, None] = None


class DeleteTenant(Command, tag="delete_tenant", kw_only=True):
    """Drop `tenant`'s record (its quotas and counters), freeing its place
    under tenants_max; apply refuses while the tenant has jobs."""
    tenant: Tenant
    actor: Actor
    at_ms: TimeMs


class CreateBackfill(Command, tag="create_backfill", kw_only=True):
    """The proposer counted `total` occurrences of the job's schedule (as of
    expected_version) in [start_ms, end_ms); apply copies that schedule."""
    backfill_id: BackfillId
    job_id: JobId
    tenant: Tenant
    actor: Actor = None   # left out or None alike: none
    expected_version: Count
    start_ms: TimeMs
    end_ms: TimeMs
    overlap: BackfillOverlap
    max_concurrent: Int(1, limits.backfill_concurrent_max)
    total: Int(1, limits.backfill_occurrences_max)
    at_ms: TimeMs

    def check_rules(self) -> None:
        if self.start_ms >= self.end_ms:
            raise _refuse("", "start_ms must come before end_ms")


class BackfillStepItem(_Checked, kw_only=True):
    """The next occurrences (ascending) of one backfill and whether none is left after them."""
    backfill_id: BackfillId
    occurrences: Annotated[list[TimeMs], Meta(max_length=limits.backfill_concurrent_max)]
    exhausted: bool

    def check_rules(self) -> None:
        if not _ascending(self.occurrences):
            raise _refuse("", "occurrences must ascend")


class BackfillStep(Command, tag="backfill_step", kw_only=True):
    node: NodeId
    at_ms: TimeMs
    items: Annotated[list[BackfillStepItem],
                     Meta(min_length=1, max_length=limits.backfills_open_max)]

    def check_rules(self) -> None:
        if sum(len(i.occurrences) for i in self.items) > limits.backfill_step_runs_max:
            raise _refuse("", f"occurrences of all items together must be at most "
                              f"{limits.backfill_step_runs_max}")


class CancelBackfill(_Scoped, tag="cancel_backfill", kw_only=True):
    backfill_id: BackfillId
    reason: Union[CommandText, None]
    at_ms: TimeMs


SHAPES: dict[str, type[Command]] = {
    cls.__struct_config__.tag: cls for cls in (
        CreateJob, CreateJobs, CreateJobsCompact, CreateJobsStored, UpdateJob, DeleteJob,
        PauseJob, ResumeJob,
        TriggerJob, RetryRun,
        Fire, FireMany, AssignShards, RunUpdates, RegisterNode, Renew, RenewRecorded,
        CheckDigest, ExpireLeases, ReassignRuns, TakeOverRuns, TakeOverJudged, HandOverRuns,
        MissUncalled, CancelRun, AlertDone, Publish,
        CommitOffset, Purge, CreateToken, RevokeToken, PutTenant, DeleteTenant, CreateBackfill, BackfillStep,
        CancelBackfill)}
TAGS = frozenset(SHAPES)


def _byte_checks(cls: type) -> list:
    """(member, check) for each member of `cls` that holds key strings,
    directly or in a list, an optional or a map (names and values)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for name in cls.__struct_fields__:
        check = _checker(hints[name])
        if check is not None:
            out.append((name, check))
    return out


def _checker(hint: Any):
    """A check(member_path, value) for the key strings `hint` may hold, or None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        bound = next((a for a in hint.__metadata__ if isinstance(a, _KeyBytes)), None)
        if bound is not None:
            def check_text(path: str, value: Any) -> None:
                # ASCII is as many bytes as characters, which msgspec bounded.
                if value.isascii() and "\x00" not in value:
                    return
                why = bound.why_not(value)
                if why is not None:
                    raise _refuse(path, why)
            return check_text
        return _checker(args[0])
    if origin is Union:
        inner = [(c, _value_class(a)) for a in args if (c := _checker(a)) is not None]
        if not inner:
            return None
        ((only, cls),) = inner   # at most one member type with key strings in a union
        def check_union(path: str, value: Any) -> None:
            if value.__class__ is cls:   # (the decoder makes exact strs, lists, dicts)
                only(path, value)
        return check_union
    if origin is list:
        item = _checker(args[0])
        if item is None:
            return None
        def check_list(path: str, value: Any) -> None:
            for i, member in enumerate(value):
                item(f"{path}[{i}]", member)
        return check_list
    if origin is dict:
        key, item = _checker(args[0]), _checker(args[1])
        if key is None and item is None:
            return None
        def check_map(path: str, value: Any) -> None:
            for name, member in value.items():
                if key is not None:
                    key(path, name)
                if item is not None:
                    item(f"{path}.{name}", member)
        return check_map
    return None


def _value_class(hint: Any) -> type:
    """The class a decoded value of type `hint` has: str for a Key, dict for
    a map of them, list for a list."""
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return typing.get_origin(hint) or hint


def _all_shapes(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_shapes(sub))
    return out


# The members each shape declares (its tag member too): a spec's others are
# checked as free-form JSON (see _check_spec).
_DECLARED: dict[type, frozenset[str]] = {
    cls: frozenset(cls.__struct_fields__) | {cls.__struct_config__.tag_field} - {None}
    for cls in _all_shapes(_Shape)}
_BYTE_CHECKS: dict[type, list] = {
    cls: _byte_checks(cls) for base in (_Checked, _Pair) for cls in _all_shapes(base)}
_UNCHECKED_KEYS = [cls.__name__ for cls in _all_shapes(_Shape)
                   if cls not in _BYTE_CHECKS and _byte_checks(cls)]
assert not _UNCHECKED_KEYS, f"shapes with Key members must derive from _Checked: {_UNCHECKED_KEYS}"


# --- the codec -------------------------------------------------------------------------

_COMMAND_TYPE = Union[tuple(SHAPES.values())]   # type: ignore[valid-type]
_DECODER = msgspec.msgpack.Decoder(_COMMAND_TYPE)
_ENCODER = msgspec.msgpack.Encoder()
_RUN_UPDATE_DECODER = msgspec.msgpack.Decoder(RunUpdate)
# msgspec's place of a failure, "$.items[0].job_id", at the end of its message.
_AT = re.compile(r"^(.*) - at `\$(.*)`$", re.S)
_MISSING = re.compile(r"^Object missing required field `(.*)`$")


def _split(message: str) -> tuple[str, str]:
    """(why, dotted member path) of a msgspec ValidationError message."""
    match = _AT.match(message)
    why, path = (match.group(1), match.group(2)) if match else (message, "")
    path = path.lstrip(".")
    missing = _MISSING.match(why)
    if missing:
        why, path = "is required", _join(path, missing.group(1))
    if why.startswith(_MEMBER):
        why, inner = _member_of(why)
        path = _join(path, inner)
    return why, path


def _member_of(message: str) -> tuple[str, str]:
    """(why, member) of a refusal raised by _refuse."""
    _, member, why = message.split(_MEMBER, 2)
    return why, member


def _join(path: str, member: str) -> str:
    if not member:
        return path
    if not path or member.startswith("["):
        return path + member
    return f"{path}.{member}"


def encode(command: Command) -> bytes:
    assert isinstance(command, Command), command
    assert command.v == VERSION, command
    return _ENCODER.encode(command)


def decode(data: bytes) -> Command:
    """The command in a log entry, checked against its shape.

    Raises UnknownCommand (loud: the node must stop rather than guess) for a
    version or tag this build does not know, which is what a newer build's
    log looks like. Raises CommandRefused for anything else that is wrong:
    bytes that are not msgpack (or not UTF-8 where a string is), a value that
    is not a map, a version or tag of the wrong type, or members of the wrong
    shape. A refusal is the same on every replica; the entry writes nothing.
    """
    checking = _CHECKING.set(True)
    try:
        command = _DECODER.decode(data)
    except MemoryError:
        raise   # this node's trouble, not the entry's: refusing it here alone would diverge
    except msgspec.ValidationError as exc:
        _judge_refused(data, str(exc))
    except RecursionError:
        command = _decode_flat(data)
    except Exception as exc:  # not msgpack, not UTF-8
        _judge_refused(data, f"log entry is not msgpack: {type(exc).__name__}: {exc}",
                       shape=False)
    finally:
        _CHECKING.reset(checking)
    return command


def _decode_flat(data: bytes) -> Command:
    """decode, for an entry nested deeper than this thread's stack allows.

    msgspec skips members no shape declares by recursing on the calling
    thread's stack, whose depth differs between replicas (and between replay
    and live apply): an entry nested near Python's recursion limit must not be
    judged by it. msgpack's own unpacker has a fixed stack, and convert does
    not descend into what it skips or into free-form values (whose depth the
    JSON check bounds), so this judgement is the same on every replica, and
    the same as decode's wherever decode had the stack to finish."""
    try:
        value = codec.unpack(data)
    except MemoryError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        _judge_refused(data, f"log entry is not msgpack: {type(exc).__name__}: {exc}",
                       shape=False)
    try:
        return msgspec.convert(value, _COMMAND_TYPE)
    except msgspec.ValidationError as exc:
        _judge_refused(data, str(exc))


def _judge_refused(data: bytes, message: str, *, shape: bool = True) -> None:
    """Raise what an entry the decoder refused is: UnknownCommand for an unknown
    version or tag (judged first, as on an older build), else CommandRefused."""
    try:
        command = codec.unpack(data)
    except MemoryError:
        raise
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
    if not shape:
        raise CommandRefused(message, field="")
    why, path = _split(message)
    raise CommandRefused(f"{tag} command refused: {path or 'command'}: {why}", field=path)


def check(command: Command) -> None:
    """Raise CommandRefused unless `command` has its shape, as every replica
    will judge it."""
    try:
        data = encode(command)
    except (UnicodeEncodeError, OverflowError, TypeError, msgspec.EncodeError) as exc:
        # Nothing the log can carry: a lone surrogate, an integer past 64 bits.
        raise CommandRefused(f"{tag_of(command)} command refused: {exc}", field="") from None
    decode(data)


# --- constructors ----------------------------------------------------------------------
# Every proposer builds its commands here (or with the Struct classes above),
# never as literals. The Structs take keyword members; these functions add the
# conversions a proposer would otherwise repeat (tuples to named records).

def given(value: Any, default: Any = None) -> Any:
    """`value`, or `default` when a member that may be left out was left out."""
    return default if value is UNSET else value


def tag_of(command: Command) -> str:
    return command.__struct_config__.tag


def scoped(command: Command, *, tenant: str | None, actor: str | None) -> Command:
    """`command` (a job or run write) on behalf of `tenant`, by `actor`: apply
    refuses it as not_found when the job or run belongs to another tenant, and
    records the actor in the audit table."""
    if tenant is not None:
        command.tenant = tenant
    if actor is not None:
        command.actor = actor
    return command


def create_job(*, job_id: str, tenant: str, spec: dict, idempotency_key: str | None,
               shard: int, next_ms: int | None, at_ms: int, quota: dict | None = None,
               actor: str | None = None) -> CreateJob:
    """`quota`: {jobs_max, creates_per_s} in force for the tenant (None: not counted)."""
    return CreateJob(job_id=job_id, tenant=tenant, spec=spec, idempotency_key=idempotency_key,
                     shard=shard, next_ms=next_ms, at_ms=at_ms, quota=_create_quota(quota),
                     actor=actor)


def _create_quota(quota: dict | CreateQuota | None) -> CreateQuota | UnsetType:
    if quota is None:
        return UNSET
    if isinstance(quota, CreateQuota):
        return quota
    return CreateQuota(jobs_max=quota["jobs_max"], creates_per_s=quota["creates_per_s"])


def create_jobs(*, tenant: str, at_ms: int, items: list[CreateJobItem], quota: dict | None = None,
                actor: str | None = None, compact: bool = False,
                stored: bool = False) -> CreateJobs:
    """Many creates in one entry (POST /v1/jobs:batchCreate proposes a batch as
    entries of at most batch_entry_jobs_max). items, in order (see
    create_job_item). Each is applied as a create_job of `tenant` at `at_ms`,
    after the ones before it, so a key used twice creates one job.

    `compact` (every node at level 5): a create_jobs_compact, each item's spec
    without the members equal to their defaults (compact.compact_spec), as
    apply stores it; the same jobs, in fewer bytes to carry and decode.
    `stored` (every node at level 6): a create_jobs_stored, each item's spec in
    the form the stores keep it (compact.stored_spec), which apply writes as
    it is."""
    if stored:
        return CreateJobsStored(
            tenant=tenant, at_ms=at_ms, quota=_create_quota(quota), actor=actor,
            items=[StoredCreateJobItem(job_id=i.job_id, spec=_compact.stored_spec(i.spec),
                                       idempotency_key=i.idempotency_key, shard=i.shard,
                                       next_ms=i.next_ms) for i in items])
    if compact:
        items = [CompactCreateJobItem(job_id=i.job_id, spec=_compact.compact_spec(i.spec),
                                      idempotency_key=i.idempotency_key, shard=i.shard,
                                      next_ms=i.next_ms) for i in items]
    return (CreateJobsCompact if compact else CreateJobs)(
        tenant=tenant, at_ms=at_ms, quota=_create_quota(quota), actor=actor, items=list(items))




def trigger_job(*, job_id: str, scheduled_ms: int, node: str, at_ms: int,
                overlap: str | None = None) -> TriggerJob:
    """`overlap="allow"`: admit this one run as the allow policy would,
    whatever the job's concurrency policy."""
    return TriggerJob(job_id=job_id, scheduled_ms=scheduled_ms, node=node, at_ms=at_ms,
                      overlap=UNSET if overlap is None else overlap)


def retry_run(*, run_id: str, node: str, at_ms: int, overlap: str | None = None) -> RetryRun:
    """A new attempt of a failed run, under its execution id (core/redrive.py)."""
    return RetryRun(run_id=run_id, node=node, at_ms=at_ms,
                    overlap=UNSET if overlap is None else overlap)


def fire_item(job_id: str, due_ms: int, next_ms: int | None, occurrences: list[int],
              omitted: bool) -> FireItem:
    return FireItem(job_id, due_ms, next_ms, list(occurrences), omitted)


def _fire_items(items: list) -> list[FireItem]:
    return [i if isinstance(i, FireItem) else FireItem(i[0], i[1], i[2], list(i[3]), i[4])
            for i in items]


def _retry_dues(retries: list) -> list[RetryDue]:
    return [r if isinstance(r, RetryDue) else RetryDue(r[0], r[1]) for r in retries]


def fire(*, shard: int, token: int, upto_ms: int, node: str, at_ms: int,
         items: list[FireItem | tuple[str, int, int | None, list[int], bool]],
         retries: list[RetryDue | tuple[str, int]] = ()) -> Fire:
    """Fire due entries of `shard` under fencing `token`. items, one per due
    occurrence: FireItem (job_id, due_ms, next_ms or None, occurrences covered
    (ascending, starting with due_ms), omitted: whether occurrences past
    catchup_max were left out). retries, one per due retry: (run_id, due_ms)."""
    return Fire(shard=shard, token=token, upto_ms=upto_ms, node=node, at_ms=at_ms,
                items=_fire_items(items), retries=_retry_dues(retries))


def fire_part(*, shard: int, token: int, upto_ms: int, items: list, retries: list) -> FirePart:
    return FirePart(shard=shard, token=token, upto_ms=upto_ms, items=_fire_items(items),
                    retries=_retry_dues(retries))


def fire_many(*, node: str, at_ms: int, parts: list[FirePart | dict]) -> FireMany:
    """Fires of several shards in one entry. parts (see fire_part): each as
    `fire` takes them, applied in order and each checked against its own
    shard's fencing token."""
    return FireMany(node=node, at_ms=at_ms, parts=[
        p if isinstance(p, FirePart) else fire_part(**p) for p in parts])


def assign_shards(*, assignments: list[tuple[int, str]], at_ms: int) -> AssignShards:
    """(shard, node) pairs: each changed owner gets a new fencing token."""
    return AssignShards(assignments=[Assignment(shard, node) for shard, node in assignments],
                        at_ms=at_ms)


def run_start(*, run_id: str, holder: str, attempt: int, at_ms: int, lease_ms: int) -> RunStart:
    """The holder took the run's lease, until lease_ms (the holder's clock)."""
    return RunStart(run_id=run_id, holder=holder, attempt=attempt, at_ms=at_ms, lease_ms=lease_ms)


def run_heartbeat(*, run_id: str, holder: str, attempt: int, at_ms: int,
                  lease_ms: int) -> RunHeartbeat:
    """The holder extends the run's lease to lease_ms."""
    return RunHeartbeat(run_id=run_id, holder=holder, attempt=attempt, at_ms=at_ms,
                        lease_ms=lease_ms)


def run_finish(*, run_id: str, holder: str, attempt: int, at_ms: int, ok: bool,
               retryable: bool | None = None, retry_delay_ms: int | None = None,
               http_status: int | None = None, exit_code: int | None = None,
               error: str | None = None, output_node: str | None = None,
               called_ms: int | None = None) -> RunFinish:
    """The attempt ended: ok, or a failure that is retryable (None: it is) after
    retry_delay_ms (drawn by the proposer); error is short, output_node is where
    the attempt's output is kept, called_ms when a node began its call."""
    return RunFinish(run_id=run_id, holder=holder, attempt=attempt, at_ms=at_ms, ok=ok,
                     retryable=UNSET if retryable is None else retryable,
                     retry_delay_ms=retry_delay_ms, http_status=http_status,
                     exit_code=exit_code, error=error, output_node=output_node,
                     called_ms=called_ms)


def run_update(update: dict | RunStart | RunHeartbeat | RunFinish) -> RunUpdate:
    """A run report, checked as apply's replicas will judge it: a RunUpdate,
    or its map ({run_id, event, holder, attempt, at_ms, ...}). CommandRefused
    names the member that is wrong, so a proposer can keep a bad report out of
    a batch shared with good ones."""
    checking = _CHECKING.set(True)
    try:
        if isinstance(update, _RunUpdate):
            # Judged as a replica will decode it, from its bytes: a third of
            # the work of converting its members (a report a call), and what
            # the log cannot carry (a lone surrogate) is caught here too.
            return _RUN_UPDATE_DECODER.decode(_ENCODER.encode(update))
        return msgspec.convert(update, RunUpdate)
    except msgspec.ValidationError as exc:
        why, path = _split(str(exc))
        path = _join("update", path)
        raise CommandRefused(f"run update refused: {path}: {why}", field=path) from None
    except (UnicodeEncodeError, OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise CommandRefused(f"run update refused: {exc}", field="update") from None
    finally:
        _CHECKING.reset(checking)


def check_run_update(update: object) -> None:
    """Raise CommandRefused unless `update` is one well-formed item of run_updates."""
    run_update(update)   # type: ignore[arg-type]


def run_updates(*, updates: list) -> RunUpdates:
    """Executor reports (run_start, run_heartbeat, run_finish, or their maps)."""
    return RunUpdates(updates=[u if isinstance(u, _RunUpdate) else run_update(u)
                               for u in updates])


def expire_leases(*, items: list[tuple[str, int, int]], at_ms: int) -> ExpireLeases:
    """The reaper's: (run_id, attempt, retry_delay_ms) for leases expired by at_ms."""
    return ExpireLeases(items=[ExpiredLease(*i) for i in items], at_ms=at_ms)


def renew(*, node: str, at_ms: int, record: bool = False) -> Renew:
    """A node's renewal; with `record` (every node at level 4), as renew_recorded."""
    return (RenewRecorded if record else Renew)(node=node, at_ms=at_ms)


def take_over_runs(*, node: str, shard: int, token: int, run_ids: list[str],
                   at_ms: int, judge_uncalled: bool = False) -> TakeOverRuns:
    """A shard's new owner's: the shard's open runs it takes over; with
    `judge_uncalled` (every node at level 4), as take_over_judged."""
    shape = TakeOverJudged if judge_uncalled else TakeOverRuns
    return shape(node=node, shard=shard, token=token, run_ids=list(run_ids), at_ms=at_ms)


def hand_over_runs(*, node: str, holder: str, shard: int, token: int, run_ids: list[str],
                   at_ms: int) -> HandOverRuns:
    """A shard's former holder's: the runs it held there and did not call,
    for the shard's owner `node` to take over as the same attempt."""
    return HandOverRuns(node=node, holder=holder, shard=shard, token=token,
                        run_ids=list(run_ids), at_ms=at_ms)


def miss_uncalled(*, node: str, shard: int, token: int, uncalled_after_ms: int,
                  run_ids: list[str], at_ms: int) -> MissUncalled:
    """A node's at its start: runs it holds that it never called, for their
    jobs' misfire policies to judge."""
    return MissUncalled(node=node, shard=shard, token=token,
                        uncalled_after_ms=uncalled_after_ms, run_ids=list(run_ids), at_ms=at_ms)


def reassign_runs(*, items: list[tuple[str, str, str]], at_ms: int) -> ReassignRuns:
    """(run_id, from_node, to_node): queued runs of a dead node move to a live one."""
    return ReassignRuns(items=[Reassignment(*i) for i in items], at_ms=at_ms)






def purge(*, at_ms: int, history_max_runs: int, history_max_age_ms: int,
          finished_job_retention_ms: int, idempotency_ttl_ms: int,
          runs: list[tuple[str, str]], jobs: list[str], idem: list[tuple[str, str]],
          backfills: list[str] = ()) -> Purge:
    """The leader's purger: remove what is past its bound by at_ms (see
    core/retention.py). runs: (run_id, job_id); jobs: job ids; idem: (tenant,
    key); backfills: ids of ended backfills. The bounds are the proposer's
    cluster defaults; a job's own history members take precedence over the
    history defaults."""
    return Purge(at_ms=at_ms, history_max_runs=history_max_runs,
                 history_max_age_ms=history_max_age_ms,
                 finished_job_retention_ms=finished_job_retention_ms,
                 idempotency_ttl_ms=idempotency_ttl_ms, runs=[PurgeRun(*r) for r in runs],
                 jobs=list(jobs), idem=[PurgeIdem(*i) for i in idem], backfills=list(backfills))








def backfill_step(*, node: str, at_ms: int, items: list[dict]) -> BackfillStep:
    """The leader's backfiller. items: {backfill_id, occurrences (ascending, the
    next ones after the backfill's cursor), exhausted (none is left after them)}."""
    return BackfillStep(node=node, at_ms=at_ms, items=[
        BackfillStepItem(backfill_id=i["backfill_id"], occurrences=list(i["occurrences"]),
                         exhausted=i["exhausted"]) for i in items])




def put_tenant(*, tenant: str, quota: dict, actor: str | None, at_ms: int,
               commands: bool | None = None) -> PutTenant:
    """Set `tenant`'s quotas: {jobs_max, creates_per_s, runs_concurrent_max, weight},
    each an integer or None (the node flags' default); `commands`: grant or
    withdraw command targets (None: leave the grant as it is)."""
    return PutTenant(tenant=tenant, quota=TenantQuota(**quota), actor=actor, at_ms=at_ms,
                     commands=commands)


# The commands whose members a proposer gives as they are: the Struct is the constructor.
update_job = UpdateJob
delete_job = DeleteJob
resume_job = ResumeJob
cancel_run = CancelRun
alert_done = AlertDone
publish = Publish
commit_offset = CommitOffset
register_node = RegisterNode
check_digest = CheckDigest
create_token = CreateToken
revoke_token = RevokeToken
cancel_backfill = CancelBackfill
delete_tenant = DeleteTenant
create_backfill = CreateBackfill
create_job_item = CreateJobItem
pause_job = PauseJob
