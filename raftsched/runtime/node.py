"""A node: one asyncio process wiring storage, Raft, firing and execution.

    HTTP API -> propose(command) -> Replicator (pysyncobj thread)
                                         | apply_command(bytes, index)
                                         v
                 ApplyBridge.on_apply (runtime/apply_bridge.py): decode, core.apply,
                 store.commit (one LMDB txn a tick's entries share), effects -> loop
                 -> dispatcher / trigger loop

The HTTP API is not imported here: raftsched/server.py builds the application
over this node's NodePort (runtime/port.py) and passes it to start().
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.core import commands, keys
from raftsched.core.apply import (NODES, SHARDS, TENANTS, DueArmed, NodeRenewed, RunCancelled,
                                  RunQueued, ShardsAssigned, TopicAppended)
from raftsched.core.tx import BackfillOpened, RunsPurged
from raftsched.errors import Unavailable
from raftsched.executors.breaker import Breaker
from raftsched.executors.command import CommandExecutor, RunAs
from raftsched.executors.http import HttpExecutor
from raftsched.executors.netguard import policy_for
from raftsched.replication.raft import Replicator
from raftsched.runtime.admission import Admission, ClientProposals, create_form
from raftsched.runtime.apply_bridge import EXIT_INVARIANT, ApplyBridge
from raftsched.runtime.armed import ArmedRuns
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.clock import ClusterClock
from raftsched.runtime.context import Replicated
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.dispatcher import Calls, Dispatcher, recorded_level
from raftsched.runtime.effects import Effects, SnapshotInstalled
from raftsched.runtime.horizon import CallHorizon
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.runtime import gcpolicy, peer
from raftsched.runtime.threadcpu import ThreadCpu
from raftsched.runtime.metrics import AppliedCounts, exposition, make_registry
from raftsched.runtime.purger import Purger, Retention
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.storage_guard import StorageGuard
from raftsched.runtime.trigger import TriggerLoop
from raftsched.runtime.waiters import Waiters
from raftsched.runtime.workers import WorkerService
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.output_store import OutputStore

log = logging.getLogger("raftsched.node")


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    node_id: str
    http_host: str
    http_port: int
    raft_addr: str
    peers: tuple[str, ...]
    data_dir: str
    raft_secret: str | None
    shard_count: int = limits.shard_count_default
    advertise_http: str | None = None   # URL other nodes and clients use for this node
    raft_snapshot_entries: int = limits.log_compaction_entries_default
    # A remote worker's running attempt's lease, and how often it extends it
    # (a node-executed run is held under its node's shard lease instead).
    run_lease_ms: int = limits.run_lease_ms_default
    run_heartbeat_ms: int = limits.run_heartbeat_ms_default
    # Where alerts of jobs without alert.webhook_url go (None: logged only).
    alert_webhook_url: str | None = None
    # --fsync: `periodic` flushes the Raft journal and LMDB once a second;
    # `always` also flushes the journal before an entry counts towards commit
    # and syncs each LMDB commit (docs/operations.md, Durability).
    fsync: str = "periodic"
    # Storage: the LMDB map size, and the free disk below which writes that add
    # state are refused (runtime/storage_guard.py).
    max_data_bytes: int = limits.max_data_bytes_default
    min_free_disk_bytes: int = limits.min_free_disk_bytes_default
    # Retention defaults the leader's purger applies (runtime/purger.py); give
    # every node the same, as any node may lead.
    history_max_runs: int = limits.history_max_runs_default
    history_max_age_s: float = limits.history_max_age_s_default
    finished_job_retention_s: float = limits.finished_job_retention_s_default
    idempotency_ttl_s: float = limits.idempotency_ttl_s_default
    # --allow-target-cidr: ranges HTTP targets and alert webhooks may reach
    # although they are not public (executors/netguard.py); () allows none.
    allow_target_cidrs: tuple[str, ...] = ()
    # --allow-commands: this node runs command targets of the default queue
    # (its embedded worker). Off, such jobs are refused at create and update
    # (api/policy.py), and a run handed to this node anyway fails, not retried.
    allow_commands: bool = False
    # --command-user: the identity those commands run with (None: this node's
    # own user, --command-user=self). Required with allow_commands (cli.py).
    command_run_as: RunAs | None = None
    # The bootstrap admin token (docs/security.md); None only with insecure_no_auth.
    admin_token: str | None = None
    insecure_no_auth: bool = False
    # Quotas of a tenant that has none of its own (PUT /v1/tenants/{tenant}).
    tenant_jobs_max: int = limits.tenant_jobs_max_default
    tenant_creates_per_s: int = limits.tenant_creates_per_s_default
    tenant_runs_concurrent_max: int = limits.tenant_runs_concurrent_max_default
    tenant_weight: int = limits.tenant_weight_default
    # --max-clock-skew-ms: a node whose wall clock is further than this from the
    # cluster's time (the median of the nodes' clocks) owns no shards
    # (runtime/clock.py). Positive; give every node the same.
    max_clock_skew_ms: int = limits.max_clock_skew_ms_default
    # --arm-ahead-s: fire armable occurrences this far ahead of their second
    # and call them at it (runtime/armed.py); 0 fires at the second.
    arm_ahead_ms: int = int(limits.arm_ahead_s_default * 1000)
    # --tls-cert / --tls-key: serve the API over TLS (both or neither);
    # --tls-ca: the CAs a node verifies the other nodes' certificates by (None:
    # the system's). Give every node the same CA (docs/security.md).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    @property
    def admin_token_sha256(self) -> str | None:
        if self.admin_token is None:
            return None
        return hashlib.sha256(self.admin_token.encode()).hexdigest()

    @functools.cached_property
    def node_credential(self) -> str | None:
        """What nodes send each other (runtime/peer.py), derived from the Raft
        secret, else from the admin token; None when there is neither (then
        the API takes no tokens or there are no peers to call)."""
        secret = self.raft_secret or self.admin_token
        return peer.node_credential(secret) if secret else None

    @functools.cached_property
    def node_credential_sha256(self) -> str | None:
        if self.node_credential is None:
            return None
        return hashlib.sha256(self.node_credential.encode()).hexdigest()

    def peer_headers(self) -> dict[str, str]:
        """What a node sends when it calls another node's API: never the admin token."""
        return {"Authorization": f"Bearer {self.node_credential}"} if self.node_credential else {}

    @functools.cached_property
    def peer_ssl(self) -> ssl.SSLContext | None:
        return peer.client_ssl_context(self.tls_ca)

    def retention(self) -> Retention:
        return Retention(history_max_runs=self.history_max_runs,
                         history_max_age_s=self.history_max_age_s,
                         finished_job_retention_s=self.finished_job_retention_s,
                         idempotency_ttl_s=self.idempotency_ttl_s)

    def quota_defaults(self) -> dict[str, int]:
        return {"jobs_max": self.tenant_jobs_max, "creates_per_s": self.tenant_creates_per_s,
                "runs_concurrent_max": self.tenant_runs_concurrent_max,
                "weight": self.tenant_weight}

    @property
    def http_url(self) -> str:
        scheme = "https" if self.tls_cert else "http"
        return self.advertise_http or f"{scheme}://{self.http_host}:{self.http_port}"


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.shard_count = config.shard_count
        # First: everything below may read the time (now_ms).
        self.clock = ClusterClock(node_id=config.node_id, cluster_size=len(config.peers) + 1,
                                  max_skew_ms=config.max_clock_skew_ms, data_dir=config.data_dir)
        self.store = LmdbStore(os.path.join(config.data_dir, "state"),
                               map_size=config.max_data_bytes,
                               durable_commits=config.fsync == "always")
        self.outputs = OutputStore(os.path.join(config.data_dir, "output"))
        self.http_executor = HttpExecutor(policy_for(config.allow_target_cidrs), now_ms=self.now_ms)
        # Every call this node makes to another node's API (runtime/peer.py).
        self.peers = peer.PeerClient(headers=config.peer_headers(), ssl_context=config.peer_ssl)
        self.storage = StorageGuard(node_id=config.node_id, store=self.store, peers=self.peers,
                                    min_free_disk_bytes=config.min_free_disk_bytes)
        self.command_executor = CommandExecutor(now_ms=self.now_ms,
                                                run_as=config.command_run_as)
        self.breaker = Breaker(window=limits.breaker_window,
                               failure_ratio=limits.breaker_failure_ratio,
                               cooloff_s=limits.breaker_cooloff_s, clock=self.monotonic)
        self.replicator: Replicator  # set in start(), once the loop runs
        # What the loops see of the replicated state (runtime/context.py).
        self.replicated = Replicated(node_id=config.node_id, store=self.store,
                                     propose=self.propose, now_ms=self.now_ms,
                                     is_leader=lambda: self.replicator.is_leader())
        self.reporter = Reporter(propose=self.propose, spawn=self.spawn,
                                 weight_of=self.weight_of,
                                 calls_waiting=lambda: self.dispatcher.calls_waiting())
        self.coordinator = Coordinator(
            self.replicated, shard_count=config.shard_count, spawn=self.spawn,
            term=lambda: self.replicator.term(),
            peer_liveness=lambda: self.replicator.peer_liveness(), clocks=self.clock,
            draining=lambda: self.draining, monotonic=self.monotonic,
            cluster_applies=self.clock.cluster_applies)
        # Runs fired ahead, held until their second (runtime/armed.py).
        self.armed = ArmedRuns(node_id=config.node_id, now_ms=self.now_ms,
                               synced=self.clock.synced,
                               call=lambda run: self.dispatcher.enqueue(run))
        # First calls of scheduled runs, against when they were due (runtime/dispatcher.py).
        self.trigger_lateness = LatenessHistogram()
        # A time no run this node called was due after (runtime/horizon.py).
        self.call_horizon = CallHorizon(config.data_dir)
        self.dispatcher = Dispatcher(
            self.replicated,
            calls=Calls(http=self.http_executor,
                        command=self.command_executor if config.allow_commands else None,
                        breaker=self.breaker, outputs=self.outputs,
                        storage_past_mark=self.storage.past_mark,
                        lateness=self.trigger_lateness,
                        horizon=self.call_horizon),
            lease=self.coordinator, armed=self.armed, report=self.reporter.send,
            spawn=self.spawn, quota_of=self.quota_of,
            cluster_applies=self.clock.cluster_applies, monotonic=self.monotonic,
            take_over_applies=lambda: self.clock.cluster_applies(
                unheard=lambda peer: recorded_level(self.store, peer)))
        self.workers = WorkerService(
            self.replicated, report=self.reporter.send, outputs=self.outputs,
            wait_caught_up=self.wait_caught_up, run_lease_ms=config.run_lease_ms,
            run_heartbeat_ms=config.run_heartbeat_ms)
        self.reaper = Reaper(self.replicated, spawn=self.spawn, send=self.http_executor.send,
                             alert_webhook_url=config.alert_webhook_url)
        self.purger = Purger(self.replicated, config.retention(),
                             watch=lambda touched: setattr(self.bridge, "touched", touched))
        self.backfiller = Backfiller(self.replicated)
        # Long-polling topic readers by topic (tenant-scoped), bounded and freed.
        self.topic_waiters = Waiters(names_max=limits.waited_names_max,
                                     names_per_tenant_max=limits.waited_names_per_tenant_max,
                                     names_limit="waited_names_max",
                                     per_tenant_limit="waited_names_per_tenant_max",
                                     what="topics")
        self.trigger = TriggerLoop(
            self.replicated, arm_ahead_ms=config.arm_ahead_ms,
            propose_entry=lambda data: self.replicator.propose_wait(data), spawn=self.spawn,
            synced=self.clock.synced, armed_room=self.armed.room, weight_of=self.weight_of)
        # A node that just learnt the cluster's time may fire what is due at once.
        self.clock.on_synced = self.trigger.ownership_changed
        # Stopping: handing shards and runs to the others first (drain).
        self.draining = False
        # Every background task of the node runs under it (runtime/supervise.py).
        self.supervisor = Supervisor(f"node {config.node_id}", exit_code=EXIT_INVARIANT)
        self._runner: web.AppRunner | None = None
        self.started_ms = self.now_ms()
        self._quotas: dict[str, tuple[float, dict[str, int]]] = {}
        # How long before its due instant each run this node fired was queued
        # here (0 for one fired at or after it: runtime/apply_bridge.py).
        self.arming_lead = LatenessHistogram()
        # What apply did on this replica (Transition.tallies), and GET /metrics,
        # which reads these and the rest of the node at each scrape.
        self.applied_counts = AppliedCounts()
        # The process's cyclic garbage collections, timed (runtime/gcpolicy.py).
        self.gc_times = gcpolicy.times()
        # CPU seconds of the node's threads by what each does (runtime/threadcpu.py).
        self._loop_thread_id: int | None = None
        self.thread_cpu = ThreadCpu(self._thread_ids)
        self._metrics = make_registry(self)
        # What clients propose: admitted against the node's bounds, single
        # creates group-committed (runtime/admission.py).
        self.client_proposals = ClientProposals(
            functools.partial(self.propose, wait_max_s=limits.propose_wait_max_s),
            admission=Admission(log_latency_s=self.coordinator.log_latency_s),
            create_form=lambda: create_form(self.clock.cluster_applies()))
        # What applied entries did, handed to the loops that act on it.
        self.effects = Effects()
        self._subscribe(self.effects)
        # Committed entries reach the store and this node through it.
        self.bridge = ApplyBridge(store=self.store, node_id=self.node_id, now_ms=self.now_ms,
                                  effects=self.effects, applied_counts=self.applied_counts,
                                  arming_lead=self.arming_lead,
                                  renewal_applied=self.coordinator.renewal_applied)
        self.bridge.start_digest_thread()

    def _subscribe(self, effects: Effects) -> None:
        """Who acts on what an applied entry did (runtime/effects.py)."""
        me = self.node_id
        dispatcher, trigger, reporter = self.dispatcher, self.trigger, self.reporter

        def run_queued(effect: RunQueued) -> None:
            run = effect.run
            if run.get("queue"):
                self.workers.queued(keys.scoped(run["tenant"], run["queue"]))
            elif run["node"] == me:
                dispatcher.submit(run)

        def run_cancelled(effect: RunCancelled) -> None:
            if effect.holder == me:
                dispatcher.cancelled(effect.run_id, effect.attempt)

        lost: set[int] = set()

        def shard_assigned(effect: ShardsAssigned) -> None:
            trigger.ownership_changed()
            if effect.owner == me:
                dispatcher.shard_gained(effect.shard)
            else:
                reporter.release_held()   # perhaps a shard of ours
                lost.add(effect.shard)

        def shards_lost() -> None:
            if lost:
                dispatcher.shards_lost(set(lost))   # those of them that were ours
                lost.clear()

        def node_renewed(effect: NodeRenewed) -> None:
            self.coordinator.renewed(effect.node, effect.at_ms)
            dispatcher.renewal_applied()

        def snapshot_installed(effect: SnapshotInstalled) -> None:
            dispatcher.request_rescan()
            trigger.ownership_changed()
            self.backfiller.opened()

        effects.subscribe(RunQueued, run_queued)
        effects.subscribe(RunCancelled, run_cancelled)
        effects.subscribe(TopicAppended, lambda effect: self.topic_waiters.wake(effect.topic))
        effects.subscribe(DueArmed, lambda effect: trigger.wake(effect.shard, effect.due_ms))
        effects.subscribe(ShardsAssigned, shard_assigned, after=shards_lost)
        effects.subscribe(NodeRenewed, node_renewed)
        effects.subscribe(RunsPurged, lambda effect: self.spawn(
            "outputs.drop", self._drop_outputs(effect.run_ids)))
        effects.subscribe(BackfillOpened, lambda effect: self.backfiller.opened())
        effects.subscribe(SnapshotInstalled, snapshot_installed)
        # AlertPending: the leader's alerter scans the pending alerts each pass.

    async def _drop_outputs(self, run_ids: tuple[str, ...]) -> None:
        """The output this node keeps of runs that were purged goes with them."""
        await asyncio.get_running_loop().run_in_executor(
            None, self.outputs.delete_runs, list(run_ids))

    def quota_of(self, tenant: str) -> dict[str, int]:
        """The quotas in force for `tenant`: its own where an admin set them,
        else the node flags' defaults. Cached for a second: the dispatcher and
        the trigger ask per run."""
        now = time.monotonic()
        cached = self._quotas.get(tenant)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        quota = self.config.quota_defaults()
        record = self.store.get(TENANTS, tenant.encode())
        if record is not None:
            quota.update({k: v for k, v in record["quota"].items() if v is not None})
        if len(self._quotas) > limits.tenants_max:
            self._quotas.clear()
        self._quotas[tenant] = (now, quota)
        return quota

    def spawn(self, name: str, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """A one-shot background task under the node's supervisor (runtime/context.py Spawn)."""
        return self.supervisor.spawn(name, coroutine)

    def weight_of(self, tenant: str) -> int:
        """A tenant's share where several wait (its quota's weight)."""
        return self.quota_of(tenant)["weight"]

    def forget_quota(self, tenant: str) -> None:
        self._quotas.pop(tenant, None)

    def now_ms(self) -> int:
        """The cluster's time (runtime/clock.py): what every proposal is dated by."""
        return self.clock.now_ms()

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    def metrics_text(self) -> bytes:
        """This node's metrics in the Prometheus text format (runtime/metrics.py)."""
        return exposition(self._metrics)

    # --- the loop side ---------------------------------------------------------------

    async def propose(self, command: dict, wait_max_s: float | None = None) -> dict:
        """`wait_max_s`: wait past propose_timeout_s, up to this, while the
        cluster visibly commits (Replicator.propose_wait); clients' writes do,
        which admission keeps from queueing long."""
        await self.wait_for_leader()
        result = await self.replicator.propose_wait(commands.encode(command),
                                                    wait_max_s=wait_max_s)
        if isinstance(result, dict) and result.get("replayed"):
            # The entry's index was already covered by a snapshot this node
            # installed, so its own result is not known here.
            raise Unavailable("the command was committed, but its result is not known on this "
                              "node (it installed a snapshot covering it); retry with the same "
                              "idempotency_key", reason="unknown_outcome")
        return result

    async def wait_for_leader(self, timeout_s: float = limits.leader_wait_s) -> None:
        """Return once a leader is reachable from this node (at once unless an
        election is under way); raise Unavailable (no_leader, 503 with Retry-After) if none
        is within timeout_s. Writes call it before they propose, so a command
        is proposed once, to a leader, or not at all."""
        deadline = time.monotonic() + timeout_s
        while not self.replicator.leader_reachable():
            if time.monotonic() >= deadline:
                raise Unavailable(f"no Raft leader was reachable from this node within "
                                  f"{timeout_s:g} s (leader_wait_s); the command was not "
                                  "proposed: retry", reason="no_leader")
            await asyncio.sleep(limits.leader_wait_poll_s)

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        """Read-your-writes: wait until this node has applied everything the
        leader had committed when the call began. A follower asks the leader for
        its commit index (what it learns from heartbeats may be a tick old).
        During an election it first waits for the new leader, up to
        limits.leader_wait_s, as a write does."""
        deadline = time.monotonic() + timeout_s
        target = await self._commit_index_to_reach(timeout_s)
        while self.store.applied_index() < target:
            if time.monotonic() > deadline:
                raise Unavailable(f"this node did not catch up with the leader's commit index "
                                  f"{target} within {timeout_s:g} s", reason="timeout")
            await asyncio.sleep(limits.consistent_read_poll_s)

    async def _commit_index_to_reach(self, timeout_s: float) -> int:
        """The leader's commit index now. A leader that cannot be asked (none
        known, its connection or HTTP port gone, or no longer leader) is looked
        for again until limits.leader_wait_s has passed."""
        leader_deadline = time.monotonic() + limits.leader_wait_s
        while True:
            await self.wait_for_leader(max(0.0, leader_deadline - time.monotonic()))
            status = self.replicator.status()
            if status.role == "leader":
                return status.commit_index
            try:
                return await self._leader_commit_index(status.leader, timeout_s)
            except Unavailable as exc:
                if exc.reason not in ("no_leader", "leader_changed") \
                        or time.monotonic() >= leader_deadline:
                    raise
            await asyncio.sleep(limits.leader_wait_poll_s)

    async def _leader_commit_index(self, leader_raft: str | None, timeout_s: float) -> int:
        leader = next((rec for _, rec in self.store.scan(NODES)
                       if leader_raft is not None and rec["raft"] == leader_raft), None)
        if leader is None:
            raise Unavailable("no leader known, cannot read consistently; retry",
                              reason="no_leader")
        try:
            # The clock answer carries the role and commit index, and costs the
            # leader far less than its whole status; a leader of a release
            # before that answers without them, and is asked for its status.
            body = await self.peers.get_json(leader["http"] + "/v1/node/clock",
                                             timeout_s=timeout_s)
            if not isinstance(body, dict) or "commit_index" not in body:
                body = await self.peers.get_json(leader["http"] + "/v1/node",
                                                 timeout_s=timeout_s)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise Unavailable(f"cannot ask the leader {leader['id']} for its commit index: "
                              f"{exc!r}", reason="no_leader") from None
        if not isinstance(body, dict) or body.get("role") != "leader":
            raise Unavailable(f"{leader['id']} is no longer the leader; retry",
                              reason="leader_changed")
        return int(body["commit_index"])

    async def start(self, make_app: Callable[["Node"], web.Application],
                    make_runner: Callable[..., web.AppRunner] = web.AppRunner) -> None:
        """Start Raft, serve the application make_app builds for this node
        with the runner make_runner builds (raftsched/server.py composes
        them), then start the node's loops."""
        loop = asyncio.get_running_loop()
        self.bridge.loop = loop
        self._loop_thread_id = threading.get_native_id()
        cfg = self.config
        bridge = self.bridge
        self.replicator = Replicator(
            self_addr=cfg.raft_addr, peers=list(cfg.peers), data_dir=cfg.data_dir,
            secret=cfg.raft_secret, loop=loop, on_apply=bridge.on_apply,
            snapshot_pin=bridge.snapshot_pin, snapshot_install=bridge.snapshot_install,
            snapshot_install_items=bridge.snapshot_install_items,
            snapshot_entries=cfg.raft_snapshot_entries, fsync=cfg.fsync,
            apply_batch=(bridge.begin_batch, bridge.end_batch),
            after_commit=bridge.after_commit)
        await self.http_executor.start()
        await self.peers.start()
        app = make_app(self)
        self._runner = make_runner(app, access_log=None, handle_signals=False,
                                   shutdown_timeout=limits.http_stop_grace_s)
        await self._runner.setup()
        server_ssl = peer.server_ssl_context(cfg.tls_cert, cfg.tls_key) \
            if cfg.tls_cert and cfg.tls_key else None
        site = web.TCPSite(self._runner, cfg.http_host, cfg.http_port,
                           reuse_address=True, backlog=1024, ssl_context=server_ssl)
        await site.start()
        self._start_loops()
        log.info("node %s serving HTTP on %s, Raft on %s, peers %s", self.node_id,
                 cfg.http_url, cfg.raft_addr, ",".join(cfg.peers) or "-")

    def _thread_ids(self) -> dict[str, int | None]:
        digest = self.bridge.digest_thread
        ids = {"event_loop": self._loop_thread_id,
               "digest": digest.native_id if digest is not None else None}
        replicator = getattr(self, "replicator", None)
        if replicator is not None:
            ids.update(replicator.thread_ids())
        return ids

    def _start_loops(self) -> None:
        """Each loop restarts when it fails, and the node exits when one cannot
        go on (runtime/supervise.py). Leader-only loops run on every node and
        act while this node leads."""
        loops = {"trigger": self.trigger.run, "armed": self.armed.run,
                 "dispatcher": self.dispatcher.run,
                 "dispatcher.takeover": self.dispatcher.takeover_loop,
                 "reporter": self.reporter.run, "reaper": self.reaper.run,
                 "coordinator": self.coordinator.run, "renew": self.coordinator.renew_loop,
                 "sync": self._sync_loop, "prune_outputs": self._prune_outputs_loop,
                 "purger": self.purger.run, "storage": self.storage.run,
                 "backfiller": self.backfiller.run,
                 "clock": lambda: self.clock.run(self._peer_urls, self.peers)}
        for name, loop in loops.items():
            self.supervisor.start(name, loop)
        self.supervisor.start("register", self._register_loop, finite=True)

    def _peer_urls(self) -> dict[str, str]:
        """The HTTP address of every other registered node, by node id."""
        return {rec["id"]: rec["http"] for _, rec in self.store.scan(NODES)
                if rec["id"] != self.node_id}

    async def _register_loop(self) -> None:
        """Record this node's id and addresses in the replicated state, once."""
        cfg = self.config
        while True:
            current = self.store.get(NODES, self.node_id.encode())
            if current and current["http"] == cfg.http_url and current["raft"] == cfg.raft_addr:
                return
            try:
                result = await self.propose(commands.register_node(
                    node=self.node_id, http=cfg.http_url, raft=cfg.raft_addr,
                    at_ms=self.now_ms()))
                if not result.get("ok"):
                    # Deterministic (a node id or address apply will not store):
                    # proposing it again would be refused again.
                    log.error("registration of node %s refused (%s): %s", self.node_id,
                              result.get("error"), result.get("detail"))
                    return
            except Unavailable:
                await asyncio.sleep(limits.node_register_retry_s)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.store_sync_period_s)
            await asyncio.get_running_loop().run_in_executor(None, self.store.sync)

    async def _prune_outputs_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.output_prune_period_s)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.outputs.prune(now_ms=self.now_ms()))

    async def drain(self, timeout_s: float = limits.stop_drain_max_s) -> bool:
        """Before a stop: leave nothing for the others to call again. With
        other nodes live, ask to be given no shards (`draining` in this
        node's clock answers; the leader, if this node, leaves itself out),
        so that the shards move while this node is alive and hands what it
        holds there and has not called to the new owners as the same
        attempts (Dispatcher.shards_lost and hand-overs at a call); let the
        calls in flight end, and send every finish. Say whether it got there
        within timeout_s; the node keeps renewing and serving meanwhile."""
        others = self._drain_to()
        self.draining = bool(others)
        deadline = self.monotonic() + timeout_s
        settled_ms = self.now_ms() + round(limits.drain_settle_s * 1000)
        log.info("node %s draining%s, for at most %.0f s (stop_drain_max_s; a second SIGTERM "
                 "stops it at once)", self.node_id,
                 f": its shards go to {','.join(others)}" if others else
                 " (no other live node to take its shards)", timeout_s)
        while True:
            self.reporter.release_held()
            moving = bool(self._drain_to())
            left = self._drain_left(moving)
            if moving and not self.coordinator.renewed_since(settled_ms):
                left.append("no renewal of this node proposed drain_settle_s after it began "
                            "draining applied yet (the leader may still give it shards)")
            if not left:
                log.info("node %s drained", self.node_id)
                return True
            if self.monotonic() >= deadline:
                log.warning("node %s stops before it drained (stop_drain_max_s, %.0f s): %s; "
                            "the shards' new owners call those runs again", self.node_id,
                            timeout_s, "; ".join(left))
                return False
            await asyncio.sleep(limits.stop_drain_poll_s)

    def _drain_to(self) -> list[str]:
        """The live nodes that may take this node's shards: not itself, nor
        any that drains too (with every node stopping, no shard can move)."""
        draining = self.clock.draining()
        return [nid for nid in self.coordinator.live_nodes()
                if nid != self.node_id and nid not in draining]

    def _drain_left(self, others: bool) -> list[str]:
        """What a draining node still has to do, said for an operator."""
        left = []
        if others:
            owned = sum(1 for _, state in self.store.scan(SHARDS)
                        if state["owner"] == self.node_id)
            if owned:
                left.append(f"{owned} shards still owned")
            if len(self.armed):
                left.append(f"{len(self.armed)} armed runs held")
            if self.dispatcher.waiting():
                left.append(f"{self.dispatcher.waiting()} runs waiting for a call slot")
            if self.dispatcher.waiting_for_host():
                left.append(f"{self.dispatcher.waiting_for_host()} runs waiting for a call to "
                            f"their target host to end")
            if self.dispatcher.handing_over():
                left.append(f"{self.dispatcher.handing_over()} runs to hand over")
        if self.dispatcher.running():
            left.append(f"{self.dispatcher.running()} calls in flight")
        if not self.reporter.idle():
            left.append(f"{self.reporter.pending()} run reports to send")
        return left

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.dispatcher.close()
        # Long polls answer now; what else is in flight has http_stop_grace_s.
        self.workers.end_waits()
        self.topic_waiters.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http_executor.close()
        await self.peers.close()
        self.replicator.destroy()
        await asyncio.sleep(0.05)   # let pysyncobj's thread leave its tick
        self.store.close()
        self.outputs.close()
        log.info("node %s stopped", self.node_id)
