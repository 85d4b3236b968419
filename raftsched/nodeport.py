"""The one interface the HTTP API uses to talk to its node.

The api package receives an object of this shape (raftsched/runtime/port.py
builds it around a running Node; raftsched/server.py hands it to make_app)
and nothing else: it never sees the store, the Raft replicator, the trigger
loop or the coordinator. Keeping the interface here, outside both packages,
lets the import contract in pyproject.toml forbid api -> runtime and
runtime -> api while each side still type-checks against the other.

Reads are named queries (raftsched.core.queries) that return decoded
records: the API never learns which table or index holds them or how their
keys are built. They read this node's local state, which may be a few entries
behind the leader; `wait_caught_up` is the barrier a handler awaits first when
it must see every write the cluster committed before the request arrived.

This module may import only raftsched.core, raftsched.errors and
raftsched.limits (the contract checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol

from raftsched import limits

if TYPE_CHECKING:
    import asyncio


class Waiting(Protocol):
    """A waiter's hold on a name it long-polls (runtime/waiters.py)."""

    def event(self) -> "asyncio.Event":
        """The event the name's next wake sets: take it before looking."""


class Settings(Protocol):
    """The node flags the API reads (runtime/node.py NodeConfig has them all)."""

    @property
    def http_url(self) -> str: ...
    @property
    def idempotency_ttl_s(self) -> float: ...
    @property
    def allow_target_cidrs(self) -> tuple[str, ...]: ...
    @property
    def allow_commands(self) -> bool: ...
    @property
    def insecure_no_auth(self) -> bool: ...
    @property
    def admin_token_sha256(self) -> str | None: ...

    @property
    def node_credential_sha256(self) -> str | None:
        """The SHA-256 of the credential nodes call each other with (None: none)."""


class Peers(Protocol):
    """How a handler calls another node's API (runtime/peer.py PeerClient):
    with the node credential (never the admin token), the nodes' TLS
    certificates verified by the cluster's CA, on the node's kept-alive
    connections. Raises what aiohttp raises, and ValueError for a body that is
    not JSON."""

    async def get_json(self, url: str, *, timeout_s: float,
                       params: dict[str, str] | None = None) -> Any: ...


class NodePort(Protocol):
    """What a request handler may ask of its node."""

    # --- identity, flags and time ---------------------------------------------------

    @property
    def node_id(self) -> str: ...
    @property
    def shard_count(self) -> int: ...
    @property
    def config(self) -> Settings: ...
    @property
    def peers(self) -> Peers: ...

    def shard_of(self, job_id: str) -> int:
        """The shard a job id belongs to in this cluster (what a create carries)."""

    def now_ms(self) -> int:
        """The cluster's time: what every proposal is dated by."""

    # --- writes ----------------------------------------------------------------------

    async def propose(self, command: dict) -> dict:
        """Replicate one command (raftsched.core.commands) and return apply's
        result once it is committed and applied here. Raises Busy (an
        Unavailable: nothing was proposed) when the node already has
        writes_inflight_max requests awaiting commit, Unavailable when the
        outcome is not known (no leader, timeout)."""

    def admit(self, jobs: int, tenant: str) -> ContextManager[None]:
        """Hold one create request and its `jobs` jobs of `tenant` as awaiting
        commit on this node until the block ends; raise Busy (holding nothing)
        when the node already has writes_inflight_max requests, or would pass
        create_jobs_inflight_max jobs, or create_jobs_inflight_per_tenant_max
        of the tenant's. A create handler enters it before it checks its
        jobs, and calls propose_create or propose_batch inside it."""

    async def propose_create(self, command: Any, body_bytes: int) -> dict:
        """propose for a create_job command (`body_bytes`: its request body's
        size), within admit(1): the node may send it in one create_jobs entry
        with other creates of the same tenant, actor and quota (group commit);
        the result is this job's alone, as create_job's would be."""

    async def propose_batch(self, entries: list) -> list:
        """Replicate the create_jobs entries of one batch, in order, within
        admit(jobs of them all): each entry's result or the exception
        (Unavailable) it met, in order."""

    def check_room(self) -> None:
        """Raise InsufficientStorage while a write that adds state must wait."""

    # --- consistent reads ------------------------------------------------------------

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        """Return once this node has applied everything the leader had
        committed when the call began (read-your-writes); raise Unavailable
        if that takes longer than timeout_s."""

    # --- queries of the committed state (local, read-only) ---------------------------

    def job(self, job_id: str) -> dict | None:
        """The job (a deleted one's too, until it is purged), or None."""

    def jobs_page(self, tenant: str, filters: dict, limit: int,
                  after: str | None) -> tuple[list[dict], str | None, bool]:
        """(jobs, last id read, whether more may follow): core.queries.jobs_page."""

    def run(self, run_id: str) -> dict | None:
        """The run, or None."""

    def run_states(self, run_ids: list[str]) -> list[str | None]:
        """Each run's state, in order; None for a run that is gone."""

    def job_runs(self, job_id: str, limit: int) -> list[dict]:
        """Up to `limit` of the job's runs, the latest scheduled first."""

    def runs_page(self, tenant: str, filters: dict, limit: int,
                  after: tuple[int, str] | None,
                  now_ms: int | None = None) -> tuple[list[dict], tuple[int, str] | None]:
        """A page of the tenant's runs, newest first: core.queries.runs_page."""

    def occurrences_with_a_run(self, job_id: str, scheduled_ms: list[int]) -> int:
        """How many of the job's occurrences at `scheduled_ms` already have a run."""

    def backfill(self, backfill_id: str) -> dict | None:
        """The backfill's record, or None."""

    def topic_bounds(self, topic: str) -> tuple[int, int]:
        """(first, next) offsets of a tenant-scoped topic."""

    def topic_messages(self, topic: str, start: int, limit: int) -> list[dict]:
        """Up to `limit` messages of a tenant-scoped topic from offset `start`."""

    def group_offset(self, topic: str, group: str) -> dict | None:
        """The offset a consumer group committed and when, or None."""

    def registered_node(self, node_id: str) -> dict | None:
        """A node's registration (its HTTP and Raft addresses), or None."""

    def registered_nodes(self) -> list[dict]:
        """Every registered node, in id order."""

    def shards(self) -> list[tuple[int, dict]]:
        """(shard, state) of every shard assigned so far, in shard order."""

    def token(self, token_id: str) -> dict | None:
        """A token's record (tenant, role, name, sha256 of its text), or None."""

    def tokens(self) -> list[dict]:
        """Every token's record, in id order."""

    def tenant(self, name: str) -> dict | None:
        """A tenant's record (its own quotas, jobs counted), or None."""

    def tenants(self) -> list[tuple[str, dict]]:
        """(name, record) of every tenant that has a record."""

    def audit_after(self, after: int, limit: int) -> list[dict]:
        """Up to `limit` audit records with seq > `after`, oldest first."""

    def applied_index(self) -> int:
        """The Raft index of the last entry applied to this node's state."""

    async def digest(self) -> tuple[int, str]:
        """(applied_index, hex sha256) of this node's whole state now."""

    async def digest_at(self, index: int, timeout_s: float) -> str | None:
        """The digest recorded here when the check_digest entry at `index`
        was applied (waiting at most timeout_s); None if there is none."""

    # --- node and cluster status -----------------------------------------------------

    def status(self) -> dict:
        """This node as GET /v1/node shows it: Raft role, term and indexes,
        shards owned, clock, and the counters kept since start."""

    def clock_offsets_ms(self) -> dict[str, int]:
        """Each node's wall clock minus the cluster's time, as last measured here."""

    def wall_us(self) -> int:
        """This node's own wall clock, in microseconds since the epoch."""

    def raft_position(self) -> tuple[str, int]:
        """This node's Raft role and commit index: what a follower asks the
        leader for before a consistent read (GET /v1/node/clock)."""

    def draining(self) -> bool:
        """Whether this node is stopping and handing its shards and runs over
        (runtime/node.py Node.drain)."""

    def metrics_text(self) -> bytes:
        """This node's metrics in the Prometheus text exposition format."""

    # --- tenancy ---------------------------------------------------------------------

    def quota_of(self, tenant: str) -> dict[str, int]:
        """The quotas in force for `tenant` (its own, else the node's defaults)."""

    def forget_quota(self, tenant: str) -> None:
        """Drop the cached quotas of `tenant` (after they were changed)."""

    # --- execution -------------------------------------------------------------------

    def run_output(self, run_id: str) -> list[dict]:
        """The output records this node keeps of the attempts it ran of `run_id`."""

    def topic_waiting(self, topic: str) -> "ContextManager[Waiting]":
        """Hold `topic` while waiting for its next message: the held Waiting's
        event() is set when one is appended. The topic's entry is freed when
        its last waiter leaves; a new topic past waited_names_per_tenant_max
        or waited_names_max raises QuotaExceeded."""

    async def claim_runs(self, worker_id: str, queue: str, max_runs: int,
                         wait_s: float, gone: Callable[[], bool]) -> list[dict]:
        """Lease up to max_runs queued runs of `queue` (tenant-scoped) to a
        worker, waiting at most wait_s for one; none once `gone()` says the
        worker stopped waiting for the answer."""

    async def heartbeat_runs(self, worker_id: str, beats: list[dict],
                             tenant: str | None) -> list[str]:
        """Extend a worker's leases; the run ids whose lease is gone."""

    async def complete_runs(self, worker_id: str, results: list[dict],
                            tenant: str | None) -> list[bool]:
        """Record a worker's results; whether each was accepted."""
