"""The node as the HTTP API sees it: raftsched.nodeport.NodePort over a Node.

Every call is a thin delegation to the part of the node that owns the answer
(the store, the replicator, the trigger loop, the worker service...), so the
API depends on this one surface instead of on the node's insides.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from raftsched import limits
from raftsched.storage.base import digest

if TYPE_CHECKING:
    from raftsched.runtime.node import Node, NodeConfig


class NodeAdapter:
    """Implements raftsched.nodeport.NodePort for one running Node."""

    def __init__(self, node: "Node") -> None:
        self._node = node

    # --- identity, flags and time ---------------------------------------------------

    @property
    def node_id(self) -> str:
        return self._node.node_id

    @property
    def shard_count(self) -> int:
        return self._node.shard_count

    @property
    def config(self) -> "NodeConfig":
        return self._node.config

    def now_ms(self) -> int:
        return self._node.now_ms()

    # --- writes ----------------------------------------------------------------------

    async def propose(self, command: dict) -> dict:
        return await self._node.propose(command)

    def check_room(self) -> None:
        self._node.storage.check_room()

    # --- consistent reads and queries ------------------------------------------------

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        await self._node.wait_caught_up(timeout_s)

    def get(self, table: str, key: bytes) -> Any | None:
        return self._node.store.get(table, key)

    def scan(self, table: str, *, start: bytes = b"", stop: bytes | None = None,
             reverse: bool = False, limit: int | None = None) -> list[tuple[bytes, Any]]:
        return self._node.store.scan(table, start=start, stop=stop, reverse=reverse,
                                     limit=limit)

    def applied_index(self) -> int:
        return self._node.store.applied_index()

    async def digest(self) -> tuple[int, str]:
        # Hashing the whole state takes long: off the loop, on a pinned read.
        return await asyncio.get_running_loop().run_in_executor(None, digest, self._node.store)

    async def digest_at(self, index: int, timeout_s: float) -> str | None:
        return await self._node.bridge.digest_at(index, timeout_s)

    # --- node and cluster status -----------------------------------------------------

    def status(self) -> dict:
        node = self._node
        raft = node.replicator.status()
        return {"id": node.node_id, "http": node.config.http_url, "raft": node.config.raft_addr,
                "role": raft.role, "term": raft.term, "commit_index": raft.commit_index,
                "applied_index": node.store.applied_index(), "leader_raft": raft.leader,
                "has_quorum": raft.has_quorum, "shards_owned": len(node.trigger.owned()),
                # This node's wall clock judged against the cluster's (runtime/clock.py).
                "clock": node.clock.status(),
                "fired_total": node.trigger.fired_total,
                # Every run this node's fires queued: applied here minus scheduled
                # (runtime/lateness.py).
                "trigger_lateness": node.trigger_lateness.snapshot(),
                "refused_fires_total": node.trigger.refused_fires_total,
                # Durability (docs/operations.md): the --fsync mode, and how often the
                # Raft journal was flushed to disk since start.
                "fsync": node.replicator.fsync,
                "journal_flushes_total": node.replicator.journal_flushes_total,
                "snapshots_written_total": node.replicator.snapshots_written_total,
                "snapshot_installs_total": node.replicator.snapshot_installs_total,
                # Connections to the Raft port closed for an oversized frame header.
                "raft_frames_refused_total": node.replicator.frames_refused_total,
                # Failures of each background task since start (runtime/supervise.py).
                "task_failures": dict(node.supervisor.failures),
                # Peers read `storage.full` to refuse writes while this node is past its mark.
                "storage": node.storage.status(),
                "purged": {"runs_total": node.purger.purged_runs_total,
                           "jobs_total": node.purger.purged_jobs_total,
                           "idempotency_keys_total": node.purger.purged_idem_total,
                           "backfills_total": node.purger.purged_backfills_total}}

    def clock_offsets_ms(self) -> dict[str, int]:
        return self._node.clock.offsets_ms()

    def wall_us(self) -> int:
        return self._node.clock.wall_us()

    def metrics_text(self) -> bytes:
        return self._node.metrics_text()

    # --- tenancy ---------------------------------------------------------------------

    def quota_of(self, tenant: str) -> dict[str, int]:
        return self._node.quota_of(tenant)

    def forget_quota(self, tenant: str) -> None:
        self._node.forget_quota(tenant)

    # --- execution -------------------------------------------------------------------

    def run_output(self, run_id: str) -> list[dict]:
        return self._node.outputs.get(run_id)

    def topic_event(self, topic: str) -> asyncio.Event:
        return self._node.topic_events.setdefault(topic, asyncio.Event())

    async def claim_runs(self, worker_id: str, queue: str, max_runs: int,
                         wait_s: float) -> list[dict]:
        return await self._node.workers.claim(worker_id, queue, max_runs, wait_s)

    async def heartbeat_runs(self, worker_id: str, beats: list[dict],
                             tenant: str | None) -> list[str]:
        return await self._node.workers.heartbeat(worker_id, beats, tenant)

    async def complete_runs(self, worker_id: str, results: list[dict],
                            tenant: str | None) -> list[bool]:
        return await self._node.workers.complete(worker_id, results, tenant)
