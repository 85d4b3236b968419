"""The shapes of job bodies and of the main answers (docs/api.md has every
member). Members are optional here (total=False) because a node may add
members and older nodes may lack newer ones; the API's own schemas are in GET
/v1/openapi.json. tests/test_client_types.py keeps these members equal to the
server's: the job bodies to their Structs (raftsched/core/spec.py), the
answers to the document's schemas."""

from __future__ import annotations

from typing import Any, TypedDict

JSON = dict[str, Any]


class Problem(TypedDict, total=False):
    type: str
    title: str
    status: int
    detail: str
    field: str
    limit: str
    reason: str
    retry_after_s: int
    index: int   # 503 digest_pending of a digest check: the check's log index


class JobPatchBody(TypedDict, total=False):
    """What PATCH /v1/jobs/{job_id} may change."""
    name: str | None
    schedule: dict[str, str] | None
    run_at: str | None
    target: JSON | None
    dag: JSON | None
    retry: JSON | None
    concurrency: str | JSON | None
    misfire: str | JSON | None
    alert: JSON | None
    history: JSON | None
    secret_keys: list[str] | None
    priority: str | None
    labels: dict[str, str] | None
    jitter_s: float | None
    not_before: str | None
    not_after: str | None


class JobBody(JobPatchBody, total=False):
    """A job to create (POST /v1/jobs)."""
    idempotency_key: str | None
    metadata: JSON | None


class Job(TypedDict, total=False):
    job_id: str
    name: str
    status: str
    schedule: dict[str, str] | None
    run_at: str
    next_run_at: str | None
    target: JSON | None
    dag: JSON
    retry: JSON
    concurrency: JSON
    misfire: JSON
    metadata: JSON
    labels: dict[str, str]
    priority: str
    alert: JSON
    history: JSON
    secret_keys: list[str]
    jitter_s: float
    not_before: str | None
    not_after: str | None
    misfires_omitted: int
    paused_at: str | None
    pause_note: str | None
    idempotency_key: str | None
    shard: int
    version: int
    last_run_id: str | None
    created_at: str
    updated_at: str


class JobPage(TypedDict, total=False):
    jobs: list[Job]
    next_page_token: str | None
    next_cursor: str | None


class Attempt(TypedDict, total=False):
    attempt: int
    holder: str | None
    started_at: str | None
    finished_at: str | None
    http_status: int | None
    exit_code: int | None
    error: str | None
    retry_delay_ms: int | None


class Run(TypedDict, total=False):
    run_id: str
    job_id: str
    scheduled_for: str
    attempt: int
    state: str
    trigger: str
    first_trigger: str
    redrives: int
    execution_id: str
    node: str | None
    started_at: str | None
    finished_at: str | None
    http_status: int | None
    exit_code: int | None
    error: str | None
    reason: str | None
    attempts: list[Attempt]
    tasks: list[JSON]
    task_id: str
    dag_run_id: str
    alert: str | None
    queue: str | None
    holder: str | None
    fencing_token: int
    jitter_ms: int
    armed_at: str | None
    lease_expires_at: str | None
    next_attempt_at: str | None
    created_at: str | None


class RunPage(TypedDict, total=False):
    runs: list[Run]
    next_page_token: str | None


class RunLogs(TypedDict, total=False):
    run_id: str
    attempts: list[JSON]
    unavailable: list[JSON]
    node: str


class FireTimes(TypedDict, total=False):
    fire_times: list[str]
    resolved: str


class BackfillStarted(TypedDict, total=False):
    backfill_id: str | None
    occurrences: int
    dry_run: bool
    state: str
    existing: int
    scheduled_for: list[str]


class Backfill(TypedDict, total=False):
    backfill_id: str
    job_id: str
    state: str
    reason: str | None
    total: int
    done: int
    succeeded: int
    failed: int
    skipped: int
    running: int
    existing: int
    launched: int
    start: str
    end: str
    overlap: str
    max_concurrent: int
    created_at: str
    updated_at: str
    finished_at: str | None


class ClusterMember(TypedDict, total=False):
    http: str | None
    raft: str | None
    role: str | None
    term: int | None
    commit_index: int | None
    applied_index: int | None
    shards_owned: int | None
    clock_offset_ms: int | None


class Cluster(TypedDict, total=False):
    leader: str | None
    self: str
    shard_count: int
    nodes: dict[str, ClusterMember]
    stale_fires_total: int


class Token(TypedDict, total=False):
    token_id: str
    tenant: str
    role: str
    name: str
    created_at: str
    created_by: str | None
    token: str   # only in the answer to a create
