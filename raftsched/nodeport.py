"""The one interface the HTTP API uses to talk to its node.

The api package receives an object of this shape (raftsched/runtime/port.py
builds it around a running Node; raftsched/server.py hands it to make_app)
and nothing else: it never sees the store, the Raft replicator, the trigger
loop or the coordinator. Keeping the interface here, outside both packages,
lets the import contract in pyproject.toml forbid api -> runtime and
runtime -> api while each side still type-checks against the other.

Reads return committed state in core's own vocabulary: the tables named in
raftsched.core.tx, keys built by raftsched.core.keys, decoded records. They are
this node's local state, which may be a few entries behind the leader;
`wait_caught_up` is the barrier a handler awaits first when it must see every
write the cluster committed before the request arrived.

This module may import only raftsched.core, raftsched.errors and
raftsched.limits (the contract checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from raftsched import limits

if TYPE_CHECKING:
    import asyncio


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

    def peer_headers(self) -> dict[str, str]:
        """What a node sends when it calls another node's API."""


class NodePort(Protocol):
    """What a request handler may ask of its node."""

    # --- identity, flags and time ---------------------------------------------------

    @property
    def node_id(self) -> str: ...
    @property
    def shard_count(self) -> int: ...
    @property
    def config(self) -> Settings: ...

    def now_ms(self) -> int:
        """The cluster's time: what every proposal is dated by."""

    # --- writes ----------------------------------------------------------------------

    async def propose(self, command: dict) -> dict:
        """Replicate one command (raftsched.core.commands) and return apply's
        result once it is committed and applied here. Raises Unavailable when
        the outcome is not known (no leader, timeout). Several proposals may
        be awaited at once (a batch create gathers them)."""

    def check_room(self) -> None:
        """Raise InsufficientStorage while a write that adds state must wait."""

    # --- consistent reads ------------------------------------------------------------

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        """Return once this node has applied everything the leader had
        committed when the call began (read-your-writes); raise Unavailable
        if that takes longer than timeout_s."""

    # --- queries of the committed state (local, read-only) ---------------------------

    def get(self, table: str, key: bytes) -> Any | None:
        """The record under `key` in `table`, or None."""

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        """(key, record) pairs of `table` from start (inclusive) to stop
        (exclusive), in key order or reversed, at most `limit` of them."""

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

    def topic_event(self, topic: str) -> "asyncio.Event":
        """An event set when the next message is appended to `topic`."""

    async def claim_runs(self, worker_id: str, queue: str, max_runs: int,
                         wait_s: float) -> list[dict]:
        """Lease up to max_runs queued runs of `queue` (tenant-scoped) to a
        worker, waiting at most wait_s for one."""

    async def heartbeat_runs(self, worker_id: str, beats: list[dict],
                             tenant: str | None) -> list[str]:
        """Extend a worker's leases; the run ids whose lease is gone."""

    async def complete_runs(self, worker_id: str, results: list[dict],
                            tenant: str | None) -> list[bool]:
        """Record a worker's results; whether each was accepted."""
