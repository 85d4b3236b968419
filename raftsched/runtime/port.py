"""The node as the HTTP API sees it: raftsched.nodeport.NodePort over a Node.

Every call is a thin delegation to the part of the node that owns the answer
(the store, the replicator, the trigger loop, the worker service...), so the
API depends on this one surface instead of on the node's insides. The
queries of the committed state are core.queries' functions over the node's
store (StoreQueries, which a test can build over any store).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, ContextManager

from raftsched import limits
from raftsched.core import keys, queries
from raftsched.runtime.waiters import Waiting
from raftsched.storage.base import digest

if TYPE_CHECKING:
    from raftsched.runtime.node import Node, NodeConfig
    from raftsched.runtime.peer import PeerClient


class StoreQueries:
    """The queries of raftsched.nodeport.NodePort over one store (or any
    core.queries.Reader): each is core.queries' function of the same name."""

    def __init__(self, reader: queries.Reader) -> None:
        self._reader_of = reader

    def _reader(self) -> queries.Reader:
        return self._reader_of

    def job(self, job_id: str) -> dict | None:
        return queries.job(self._reader(), job_id)

    def jobs_page(self, tenant: str, filters: dict, limit: int,
                  after: str | None) -> tuple[list[dict], str | None, bool]:
        return queries.jobs_page(self._reader(), tenant, filters, limit, after)

    def run(self, run_id: str) -> dict | None:
        return queries.run(self._reader(), run_id)

    def run_states(self, run_ids: list[str]) -> list[str | None]:
        return queries.run_states(self._reader(), run_ids)

    def job_runs(self, job_id: str, limit: int) -> list[dict]:
        return queries.job_runs(self._reader(), job_id, limit)

    def runs_page(self, tenant: str, filters: dict, limit: int,
                  after: tuple[int, str] | None,
                  now_ms: int | None = None) -> tuple[list[dict], tuple[int, str] | None]:
        return queries.runs_page(self._reader(), tenant, filters, limit, after, now_ms)

    def occurrences_with_a_run(self, job_id: str, scheduled_ms: list[int]) -> int:
        return queries.occurrences_with_a_run(self._reader(), job_id, scheduled_ms)

    def backfill(self, backfill_id: str) -> dict | None:
        return queries.backfill(self._reader(), backfill_id)

    def topic_bounds(self, topic: str) -> tuple[int, int]:
        return queries.topic_bounds(self._reader(), topic)

    def topic_messages(self, topic: str, start: int, limit: int) -> list[dict]:
        return queries.topic_messages(self._reader(), topic, start, limit)

    def group_offset(self, topic: str, group: str) -> dict | None:
        return queries.group_offset(self._reader(), topic, group)

    def registered_node(self, node_id: str) -> dict | None:
        return queries.registered_node(self._reader(), node_id)

    def registered_nodes(self) -> list[dict]:
        return queries.registered_nodes(self._reader())

    def shards(self) -> list[tuple[int, dict]]:
        return queries.shards(self._reader())

    def token(self, token_id: str) -> dict | None:
        return queries.token(self._reader(), token_id)

    def tokens(self) -> list[dict]:
        return queries.tokens(self._reader())

    def tenant(self, name: str) -> dict | None:
        return queries.tenant(self._reader(), name)

    def tenants(self) -> list[tuple[str, dict]]:
        return queries.tenants(self._reader())

    def audit_after(self, after: int, limit: int) -> list[dict]:
        return queries.audit_after(self._reader(), after, limit)


class NodeAdapter(StoreQueries):
    """Implements raftsched.nodeport.NodePort for one running Node."""

    def __init__(self, node: "Node") -> None:
        self._node = node

    def _reader(self) -> queries.Reader:
        return self._node.store

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

    @property
    def peers(self) -> "PeerClient":
        return self._node.peers

    def shard_of(self, job_id: str) -> int:
        return keys.shard_of(job_id, self._node.shard_count)

    def now_ms(self) -> int:
        return self._node.now_ms()

    # --- writes ----------------------------------------------------------------------

    async def propose(self, command: dict) -> dict:
        return await self._node.client_proposals.write(command)

    def admit(self, jobs: int, tenant: str) -> ContextManager[None]:
        return self._node.client_proposals.admit(jobs, tenant)

    async def propose_create(self, command: Any, body_bytes: int) -> dict:
        return await self._node.client_proposals.create(command, body_bytes)

    async def propose_batch(self, entries: list) -> list:
        return await self._node.client_proposals.batch(entries)

    def check_room(self) -> None:
        self._node.storage.check_room()

    # --- consistent reads and the state's digest ------------------------------------

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        await self._node.wait_caught_up(timeout_s)

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
                # Stopping: handing its shards and runs over (Node.drain).
                "draining": node.draining,
                # This node's wall clock judged against the cluster's (runtime/clock.py).
                "clock": node.clock.status(),
                "fired_total": node.trigger.fired_total,
                # The first call of every scheduled run this node made: call start
                # minus its due time; and how long before that each run its fires
                # queued was armed (runtime/lateness.py, runtime/armed.py).
                "trigger_lateness": node.trigger_lateness.snapshot(),
                "arming_lead": node.arming_lead.snapshot(),
                "armed_runs": len(node.armed),
                "refused_fires_total": node.trigger.refused_fires_total,
                # This node's shard lease lapsed (a renewal came back applied too
                # late), and how far its applied log trails its proposals now
                # (runtime/coordinator.py log_latency_s; creates wait past
                # create_log_latency_max_s).
                "shard_lease_lapses_total": node.coordinator.lease_lapses_total,
                "log_latency_ms": round(node.coordinator.log_latency_s() * 1000, 1),
                # Finishes held back while runs waited here for a call slot
                # (runtime/reporter.py, finish_hold_max_s): now, and since start.
                "finishes_held": node.reporter.held(),
                "finishes_held_total": node.reporter.held_total,
                # Tenants' circuit breakers open on this node: their runs for
                # the host are held here, not called (executors/breaker.py).
                "breakers": node.breaker.status(),
                # The most CPU one Raft entry's apply took on this node since
                # start, and that entry's tag (runtime/apply_bridge.py).
                "apply_entry_ms_max": round(node.bridge.apply_entry_s_max * 1000, 1),
                "apply_entry_slowest": node.bridge.apply_entry_slowest,
                # The process's cyclic garbage collector: collections and their
                # seconds by generation since start (runtime/gcpolicy.py).
                "gc": node.gc_times.status(),
                # CPU seconds of the process's threads since start, by what each
                # does (runtime/threadcpu.py); null where not measured.
                "threads_cpu_s": node.thread_cpu.seconds(),
                # Durability (docs/operations.md): the --fsync mode, and how often the
                # Raft journal was flushed to disk since start.
                "fsync": node.replicator.fsync,
                "journal_flushes_total": node.replicator.journal_flushes_total,
                # LMDB transactions apply committed: several entries may share one.
                "state_commits_total": node.store.commits_total,
                "snapshots_written_total": node.replicator.snapshots_written_total,
                "snapshot_installs_total": node.replicator.snapshot_installs_total,
                # Connections to the Raft port closed for an oversized frame header.
                "raft_frames_refused_total": node.replicator.frames_refused_total,
                "raft_handshakes_refused_total": node.replicator.handshakes_refused_total,
                # Failures of each background task since start (runtime/supervise.py).
                "task_failures": dict(node.supervisor.failures),
                # Peers read `storage.full` to refuse writes while this node is past its mark.
                "storage": node.storage.status(),
                # Client writes awaiting commit here, refusals as busy, group
                # commit of single creates (runtime/admission.py).
                "admission": node.client_proposals.status(),
                "purged": {"runs_total": node.purger.purged_runs_total,
                           "jobs_total": node.purger.purged_jobs_total,
                           "idempotency_keys_total": node.purger.purged_idem_total,
                           "backfills_total": node.purger.purged_backfills_total}}

    def clock_offsets_ms(self) -> dict[str, int]:
        return self._node.clock.offsets_ms()

    def wall_us(self) -> int:
        return self._node.clock.wall_us()

    def raft_position(self) -> tuple[str, int]:
        status = self._node.replicator.status()
        return status.role, status.commit_index

    def draining(self) -> bool:
        return self._node.draining

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

    def topic_waiting(self, topic: str) -> ContextManager[Waiting]:
        return self._node.topic_waiters.waiting(topic)

    async def claim_runs(self, worker_id: str, queue: str, max_runs: int,
                         wait_s: float, gone: Callable[[], bool]) -> list[dict]:
        return await self._node.workers.claim(worker_id, queue, max_runs, wait_s, gone)

    async def heartbeat_runs(self, worker_id: str, beats: list[dict],
                             tenant: str | None) -> list[str]:
        return await self._node.workers.heartbeat(worker_id, beats, tenant)

    async def complete_runs(self, worker_id: str, results: list[dict],
                            tenant: str | None) -> list[bool]:
        return await self._node.workers.complete(worker_id, results, tenant)
