"""The shapes of the API's answers, declared once as msgspec Structs.

api/openapi.py generates the document's response schemas from these classes;
tests/test_answers.py converts what the views build (api/views.py,
api/admin.py) into them, and the schemathesis test checks every live answer
against the document, so a view and its declaration cannot drift apart. An
answer may gain members (its schema leaves additionalProperties open); a
member that is not always there is UNSET here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from msgspec import UNSET, Meta, Struct, UnsetType

from raftsched.api import history
from raftsched.core import backfill, dag, spec

When = Annotated[str, Meta(description="RFC 3339 with an offset")]
Maybe = UnsetType   # a member an answer may leave out
Obj = dict[str, Any]


class _Answer(Struct, kw_only=True):
    """An answer: members are what the views build, in no particular order."""


class Problem(_Answer, kw_only=True):
    """An error, as application/problem+json (RFC 9457)."""
    type: str
    title: str
    status: int
    detail: str
    field: Union[Annotated[str, Meta(description="the offending member, dotted path")],
                 Maybe] = UNSET
    limit: Union[Annotated[str, Meta(description="the bound exceeded, by its name in "
                                                 "raftsched.limits")], Maybe] = UNSET
    reason: Union[Annotated[str, Meta(description="503: why the cluster cannot commit")],
                  Maybe] = UNSET
    retry_after_s: Union[Annotated[int, Meta(ge=1, description=(
        "429 in a batchCreate result: when to try that job again (a whole answer's 429 "
        "says it in Retry-After)"))], Maybe] = UNSET
    index: Union[Annotated[int, Meta(description=(
        "503 of POST /v1/state/digest:check whose digest is still being computed: the "
        "check's log index, to ask GET /v1/state/digest?index= for"))], Maybe] = UNSET


class ScheduleView(_Answer, kw_only=True):
    cron: Union[str, Maybe] = UNSET
    timezone: Union[str, Maybe] = UNSET
    every: Union[str, Maybe] = UNSET


class Job(_Answer, kw_only=True):
    job_id: str
    name: str
    status: str
    next_run_at: Union[When, None]
    target: Union[Annotated[Obj, Meta(description=(
        'null for a DAG job. Secret header and env values (see `secret_keys`) show as "***"; '
        'a PATCH that sends "***" keeps the value for the same origin (or queue) and place '
        "only"))], None]
    retry: Obj
    concurrency: Obj
    misfire: Obj
    metadata: Obj
    priority: spec.Priority
    idempotency_key: Union[str, None]
    shard: int
    version: int
    last_run_id: Union[str, None]
    created_at: When
    updated_at: When
    schedule: Union[ScheduleView, None, Maybe] = UNSET
    run_at: Union[When, Maybe] = UNSET
    dag: Union[Annotated[Obj, Meta(description="a DAG job's tasks, their targets' secrets "
                                               'shown as "***"')], Maybe] = UNSET
    alert: Union[Obj, Maybe] = UNSET
    misfires_omitted: Union[int, Maybe] = UNSET
    history: Union[Obj, Maybe] = UNSET
    secret_keys: Union[list[str], Maybe] = UNSET
    labels: Union[dict[str, str], Maybe] = UNSET
    jitter_s: Union[float, Maybe] = UNSET
    not_before: Union[When, None, Maybe] = UNSET
    not_after: Union[When, None, Maybe] = UNSET
    pause_note: Union[str, None, Maybe] = UNSET
    paused_at: Union[When, None, Maybe] = UNSET


class RunAttemptView(_Answer, kw_only=True):
    attempt: int
    holder: Union[str, None, Maybe] = UNSET
    started_at: Union[When, None, Maybe] = UNSET
    finished_at: Union[When, None, Maybe] = UNSET
    http_status: Union[int, None, Maybe] = UNSET
    exit_code: Union[int, None, Maybe] = UNSET
    error: Union[str, None, Maybe] = UNSET
    retry_delay_ms: Union[int, None, Maybe] = UNSET


class TaskView(_Answer, kw_only=True):
    id: str
    state: Literal[dag.TASK_STATES]   # type: ignore[valid-type]
    attempt: int
    started_at: Union[When, None]
    finished_at: Union[When, None]
    error: Union[str, None]
    run_id: Union[str, None, Maybe] = UNSET
    depends_on: Union[list[str], Maybe] = UNSET
    trigger_rule: Union[str, Maybe] = UNSET


class Run(_Answer, kw_only=True):
    run_id: str
    job_id: str
    scheduled_for: When
    attempt: int
    state: str
    execution_id: str
    trigger: Union[Annotated[Literal[history.RUN_TRIGGERS],   # type: ignore[valid-type]
                             Meta(description="how the run started; retry once re-driven")],
                   Maybe] = UNSET
    first_trigger: Union[Annotated[Literal[history.RUN_TRIGGERS[:3]],   # type: ignore
                                   Meta(description="how the run first started")],
                         Maybe] = UNSET
    redrives: Union[int, Maybe] = UNSET
    jitter_ms: Union[int, Maybe] = UNSET
    armed_at: Union[Annotated[When, Meta(description="when the run was fired ahead of its "
                                                      "second; its call starts at "
                                                      "scheduled_for plus jitter_ms")],
                    None, Maybe] = UNSET
    node: Union[str, None, Maybe] = UNSET
    queue: Union[str, None, Maybe] = UNSET
    holder: Union[str, None, Maybe] = UNSET
    lease_expires_at: Union[When, None, Maybe] = UNSET
    next_attempt_at: Union[When, None, Maybe] = UNSET
    created_at: Union[When, None, Maybe] = UNSET
    started_at: Union[When, None, Maybe] = UNSET
    finished_at: Union[When, None, Maybe] = UNSET
    http_status: Union[int, None, Maybe] = UNSET
    exit_code: Union[int, None, Maybe] = UNSET
    error: Union[str, None, Maybe] = UNSET
    reason: Union[str, None, Maybe] = UNSET
    fencing_token: Union[int, Maybe] = UNSET
    attempts: Union[list[RunAttemptView], Maybe] = UNSET
    alert: Union[str, None, Maybe] = UNSET
    tasks: Union[Annotated[list[TaskView], Meta(description="a DAG run's tasks, in the DAG's "
                                                            "order")], Maybe] = UNSET
    dag_run_id: Union[Annotated[str, Meta(description="a task run's DAG run")], Maybe] = UNSET
    task_id: Union[Annotated[str, Meta(description="the task a task run executes")],
                   Maybe] = UNSET


def _count(description: str) -> Any:
    return Annotated[int, Meta(description=description)]


class Backfill(_Answer, kw_only=True):
    backfill_id: str
    job_id: str
    state: Literal[backfill.STATES]   # type: ignore[valid-type]
    total: _count("occurrences in the range")
    done: _count("succeeded + failed + skipped")
    succeeded: int
    failed: int
    running: _count("its runs open now")
    reason: Union[str, None, Maybe] = UNSET
    skipped: Union[_count("ended without running: skipped, missed or cancelled"),
                   Maybe] = UNSET
    existing: Union[_count("occurrences that had a run already (not run again; counted by "
                           "how that run ended)"), Maybe] = UNSET
    launched: Union[_count("occurrences taken so far"), Maybe] = UNSET
    start: Union[When, Maybe] = UNSET
    end: Union[When, Maybe] = UNSET
    overlap: Union[spec.BackfillOverlap, Maybe] = UNSET
    max_concurrent: Union[int, Maybe] = UNSET
    created_at: Union[When, Maybe] = UNSET
    updated_at: Union[When, Maybe] = UNSET
    finished_at: Union[When, None, Maybe] = UNSET


class NodeClockView(_Answer, kw_only=True):
    synced: bool
    offset_ms: Union[float, None]
    in_bound: Union[bool, None]
    max_clock_skew_ms: int
    median_node: Union[str, None, Maybe] = UNSET
    error_ms: Union[float, None, Maybe] = UNSET
    probes_failed_total: Union[int, Maybe] = UNSET


class NodeStatus(_Answer, kw_only=True):
    id: str
    role: str
    http: Union[str, Maybe] = UNSET
    raft: Union[str, Maybe] = UNSET
    term: Union[int, Maybe] = UNSET
    commit_index: Union[int, Maybe] = UNSET
    applied_index: Union[int, Maybe] = UNSET
    leader_raft: Union[str, None, Maybe] = UNSET
    has_quorum: Union[bool, Maybe] = UNSET
    shards_owned: Union[int, Maybe] = UNSET
    draining: Union[bool, Maybe] = UNSET
    clock: Union[NodeClockView, Maybe] = UNSET


class NodeClock(_Answer, kw_only=True):
    node: str
    wall_us: Annotated[int, Meta(description="this node's wall clock, microseconds since the "
                                             "epoch")]
    draining: Annotated[bool, Meta(description="this node is stopping: it hands its shards "
                                               "and runs to the others first")] = False
    applies: Annotated[int, Meta(description="the level of the commands this node applies; "
                                             "its peers propose none above the lowest "
                                             "level of the cluster")] = 1
    role: Union[Annotated[str, Meta(description="this node's Raft role: leader, follower or "
                                                "candidate")], Maybe] = UNSET
    commit_index: Union[Annotated[int, Meta(description="this node's Raft commit index: a "
                                                        "follower's consistent read waits "
                                                        "until it has applied the leader's")],
                        Maybe] = UNSET


class ClusterMember(_Answer, kw_only=True):
    http: Union[str, None, Maybe] = UNSET
    raft: Union[str, None, Maybe] = UNSET
    role: Union[str, None, Maybe] = UNSET
    term: Union[int, None, Maybe] = UNSET
    commit_index: Union[int, None, Maybe] = UNSET
    applied_index: Union[int, None, Maybe] = UNSET
    shards_owned: Union[int, None, Maybe] = UNSET
    clock_offset_ms: Union[Annotated[int, Meta(description=(
        "that node's wall clock minus the cluster's time (the median of the nodes' clocks), "
        "as the answering node last measured it; null: not measured yet"))],
        None, Maybe] = UNSET
    breakers_open: Union[Annotated[int, Meta(description=(
        "tenants' circuit breakers open on that node, whose runs for the host it holds and "
        "does not call (GET /v1/node `breakers` names them); null: not known"))],
        None, Maybe] = UNSET
    threads_cpu_s: Union[Annotated[dict[str, float], Meta(description=(
        "CPU seconds that node's threads used since it started, by what each does: "
        "event_loop, raft, journal, digest, and other (the rest of its process); null: "
        "not known (unreachable, or no per-thread accounting there)"))],
        None, Maybe] = UNSET


class Cluster(_Answer, kw_only=True):
    leader: Union[str, None]
    self: str
    shard_count: int
    nodes: dict[str, ClusterMember]
    stale_fires_total: Union[int, Maybe] = UNSET


class ShardView(_Answer, kw_only=True):
    shard: int
    owner: Union[str, None]
    token: int
    checkpoint: Union[When, None, Maybe] = UNSET
    stale_fires: Union[int, Maybe] = UNSET


class Shards(_Answer, kw_only=True):
    shards: list[ShardView]


class RunLogs(_Answer, kw_only=True):
    """Each attempt's output, merged from the nodes that kept it."""
    run_id: str
    attempts: list[Obj]
    unavailable: list[Obj]


class NodeRunLogs(_Answer, kw_only=True):
    """The attempts' output one node keeps (a node asking another)."""
    node: str
    attempts: list[Obj]


class Message(_Answer, kw_only=True):
    offset: int
    message: Any
    key: Union[str, None, Maybe] = UNSET
    execution_id: Union[str, None, Maybe] = UNSET
    job_id: Union[str, None, Maybe] = UNSET
    published_at: Union[When, None, Maybe] = UNSET


class Messages(_Answer, kw_only=True):
    topic: str
    messages: list[Message]
    next_after: int
    first_offset: Union[int, Maybe] = UNSET
    last_offset: Union[int, Maybe] = UNSET


class Group(_Answer, kw_only=True):
    topic: str
    group: str
    offset: int
    committed_at: Union[When, None, Maybe] = UNSET


class Digest(_Answer, kw_only=True):
    node: str
    digest: str
    applied_index: Union[int, Maybe] = UNSET
    index: Union[int, Maybe] = UNSET


class Token(_Answer, kw_only=True):
    token_id: str
    tenant: str
    role: spec.Role
    name: str
    created_at: When
    created_by: Union[str, None, Maybe] = UNSET


class TokenCreated(Token, kw_only=True):
    token: Annotated[str, Meta(description="the bearer token: shown here only, the cluster "
                                           "keeps its SHA-256")]


class QuotaView(_Answer, kw_only=True):
    """A tenant's own quotas; null: the node flags' default."""
    jobs_max: Union[int, None, Maybe] = UNSET
    creates_per_s: Union[int, None, Maybe] = UNSET
    runs_concurrent_max: Union[int, None, Maybe] = UNSET
    weight: Union[int, None, Maybe] = UNSET


class QuotaInForce(_Answer, kw_only=True):
    jobs_max: Union[int, Maybe] = UNSET
    creates_per_s: Union[int, Maybe] = UNSET
    runs_concurrent_max: Union[int, Maybe] = UNSET
    weight: Union[int, Maybe] = UNSET


class Tenant(_Answer, kw_only=True):
    tenant: str
    quota: QuotaView
    in_force: QuotaInForce
    jobs: _count("jobs counted against jobs_max")
    commands: Annotated[bool, Meta(description="whether an admin granted the tenant command "
                                               "targets")]


class AuditRecord(_Answer, kw_only=True):
    seq: int
    at: When
    actor: Union[str, None]
    action: Annotated[str, Meta(description=(
        "token.create, token.revoke, tenant.put, job.create, job.update, job.delete, "
        "job.pause, job.resume, job.trigger, backfill.create, backfill.cancel"))]
    subject: str
    tenant: Union[str, None, Maybe] = UNSET
    detail: Union[Obj, Maybe] = UNSET


ANSWERS = (Problem, Job, Run, Backfill, NodeStatus, NodeClock, Cluster, Shards, RunLogs,
           NodeRunLogs, Messages, Group, Digest, Token, TokenCreated, Tenant, AuditRecord)
