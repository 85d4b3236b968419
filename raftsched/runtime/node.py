"""A node: one asyncio process wiring storage, Raft, the API, firing and execution.

    HTTP (aiohttp) -> propose(command) -> Replicator (pysyncobj thread)
                                              | apply_command(bytes, index)
                                              v
                      core.apply(store, command, index) -> Transition
                      store.commit(writes + applied_index)   (one LMDB txn)
                      effects -> loop.call_soon_threadsafe -> dispatcher / trigger loop
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.core import commands, keys
from raftsched.core.tx import RunsPurged
from raftsched.core.apply import (NODES, TENANTS, AlertPending, DueArmed, NodeRenewed, RunCancelled,
                                  RunQueued, ShardsAssigned, TopicAppended, apply_entry)
from raftsched.errors import InvariantBroken, Unavailable
from raftsched.executors.breaker import Breaker
from raftsched.executors.command import CommandExecutor
from raftsched.executors.http import HttpExecutor
from raftsched.executors.netguard import policy_for
from raftsched.replication.raft import Replicator, log_compaction_entries_default
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.clock import ClusterClock
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.dispatcher import Dispatcher
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.runtime.purger import Purger
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.storage_guard import StorageGuard
from raftsched.runtime.trigger import TriggerLoop
from raftsched.runtime.workers import WorkerService
from raftsched.storage.base import digest_pinned
from raftsched.storage.lmdb_store import LmdbStore, PinnedRead, SnapshotAborted
from raftsched.storage.output_store import OutputStore

log = logging.getLogger("raftsched.node")

# How often LMDB is fsynced (see storage/lmdb_store.py on durability).
store_sync_period_s = 1.0
# How often old run output is pruned (it is also bounded in size at each put).
output_prune_period_s = 600.0
# How many recorded digest checks a node keeps (see _record_digest).
checked_digests_kept = 64
# Digests being computed at once (each holds an LMDB read open); a check past
# this records no digest at its index, and the caller asks again.
digests_computing_max = 4
# checked_digests' value while the digest thread hashes the state.
DIGEST_PENDING = "pending"
# Exit code of a node that stopped itself on a broken invariant.
EXIT_INVARIANT = 70


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
    raft_snapshot_entries: int = log_compaction_entries_default
    # A running attempt's lease, and how often its holder extends it.
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

    @property
    def admin_token_sha256(self) -> str | None:
        if self.admin_token is None:
            return None
        return hashlib.sha256(self.admin_token.encode()).hexdigest()

    def peer_headers(self) -> dict[str, str]:
        """What a node sends when it calls another node's API."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def quota_defaults(self) -> dict[str, int]:
        return {"jobs_max": self.tenant_jobs_max, "creates_per_s": self.tenant_creates_per_s,
                "runs_concurrent_max": self.tenant_runs_concurrent_max,
                "weight": self.tenant_weight}

    @property
    def http_url(self) -> str:
        return self.advertise_http or f"http://{self.http_host}:{self.http_port}"


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
        self.storage = StorageGuard(self)
        self.outputs = OutputStore(os.path.join(config.data_dir, "output"))
        self.http_executor = HttpExecutor(policy_for(config.allow_target_cidrs), now_ms=self.now_ms)
        self.command_executor = CommandExecutor(now_ms=self.now_ms)
        self.breaker = Breaker(window=limits.breaker_window,
                               failure_ratio=limits.breaker_failure_ratio,
                               cooloff_s=limits.breaker_cooloff_s, clock=self.monotonic)
        self.replicator: Replicator  # set in start(), once the loop runs
        self.reporter: Reporter      # set in start(): it makes loop objects
        self.dispatcher = Dispatcher(self)
        self.workers = WorkerService(self)
        self.reaper = Reaper(self)
        self.purger = Purger(self)
        self.backfiller = Backfiller(self)
        self.topic_events: dict[str, asyncio.Event] = {}
        self.trigger = TriggerLoop(self)
        # A node that just learnt the cluster's time may fire what is due at once.
        self.clock.on_synced = self.trigger.ownership_changed
        self.coordinator = Coordinator(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        # Every background task of the node runs under it (runtime/supervise.py).
        self.supervisor = Supervisor(f"node {config.node_id}", exit_code=EXIT_INVARIANT)
        self._runner: web.AppRunner | None = None
        self.started_ms = self.now_ms()
        self._quotas: dict[str, tuple[float, dict[str, int]]] = {}
        self.trigger_lateness = LatenessHistogram()
        # index -> state digest recorded when a check_digest entry was applied
        # here (DIGEST_PENDING while the digest thread computes it). Written by
        # the Raft and digest threads, read by the loop: under _digests_lock.
        self.checked_digests: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._digests_lock = threading.Lock()
        self._digest_queue: queue.Queue = queue.Queue(maxsize=digests_computing_max)
        threading.Thread(target=self._digest_worker, name="raftsched-digest",
                         daemon=True).start()

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

    def forget_quota(self, tenant: str) -> None:
        self._quotas.pop(tenant, None)

    def now_ms(self) -> int:
        """The cluster's time (runtime/clock.py): what every proposal is dated by."""
        return self.clock.now_ms()

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    # --- the Raft thread side --------------------------------------------------------

    def _on_apply(self, data: bytes, index: int) -> dict | None:
        """Runs on pysyncobj's thread. Never touches asyncio objects directly.

        A refused entry (malformed, or refused whole by apply) commits no
        writes, only its index, so a replay skips it, and every replica agrees.
        A version or tag this build does not know, or a failed commit, stops
        the node."""
        try:
            if index <= self.store.applied_index():
                return {"ok": True, "replayed": True}   # persisted before a restart
            tag, transition = self.store.apply_commit(index, self._apply_noting(data, index))
            if tag in ("fire", "fire_many") and transition.result.get("node") == self.node_id:
                self._note_trigger_lateness(transition.effects)
            self._log_refusal(index, tag or "malformed", transition.result)
            if tag == "check_digest":
                return self._record_digest(index, transition.result)
        except InvariantBroken as exc:
            self._die(f"raft entry {index}: {exc}")
        except Exception as exc:
            self._die(f"raft entry {index}: apply failed: {exc!r}")
        if transition.effects:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._handle_effects, transition.effects)
        return transition.result

    def _apply_noting(self, data: bytes, index: int) -> Callable[[Any], tuple]:
        def apply_one(view: Any) -> tuple:
            tag, transition = apply_entry(view, data, index)
            if tag == "check_digest":
                # Noted before the index is committed, so a reader that sees
                # the index applied also sees that a digest is on its way.
                self._note_digest(index, DIGEST_PENDING)
            return tag, transition
        return apply_one

    def _note_trigger_lateness(self, effects: tuple) -> None:
        """Raft thread, right after this node's own fire became durable here:
        each run it queued is as late as now minus its scheduled time
        (runtime/lateness.py)."""
        now = self.now_ms()
        for effect in effects:
            if isinstance(effect, RunQueued) and effect.run["attempt"] == 1:
                # A jittered job's run is due at its occurrence plus its delay.
                self.trigger_lateness.record(now - effect.run["scheduled_ms"]
                                             - effect.run.get("jitter_ms", 0))

    @staticmethod
    def _log_refusal(index: int, tag: str, result: dict) -> None:
        """Once per refused entry, on every replica."""
        error = result.get("error")
        if error == "apply_failed":
            log.critical("raft entry %d (%s): apply raised, which is a bug; the entry is "
                         "refused on every replica: %s\n%s", index, tag, result["detail"],
                         result.get("traceback", ""))
        elif error in ("invalid_command", "refused"):
            log.error("raft entry %d (%s) refused (%s): %s", index, tag, error,
                      result["detail"])

    def _record_digest(self, index: int, result: dict) -> dict:
        """Raft thread: the state is exactly as of `index` here, on every replica.
        It is pinned here and hashed on the digest thread: hashing millions of
        records on the Raft thread would hold it past the election timeout."""
        pinned = self.store.pin()
        assert pinned.applied_index == index, (pinned.applied_index, index)
        try:
            self._digest_queue.put_nowait((index, pinned))
        except queue.Full:
            pinned.close()
            self._note_digest(index, None)
            log.warning("digest check at index %d skipped: %d digests are being computed",
                        index, digests_computing_max)
        return dict(result, index=index)

    def _note_digest(self, index: int, value: str | None) -> None:
        """Record (None: forget) the digest at `index`; any thread."""
        with self._digests_lock:
            if value is None:
                self.checked_digests.pop(index, None)
                return
            if value != DIGEST_PENDING and index not in self.checked_digests:
                return   # evicted while it was computed
            self.checked_digests[index] = value
            while len(self.checked_digests) > checked_digests_kept:
                self.checked_digests.popitem(last=False)

    def _digest_worker(self) -> None:
        """The digest thread: hash pinned states, one at a time, forever."""
        while True:
            index, pinned = self._digest_queue.get()
            value = None
            try:
                with pinned:
                    value = digest_pinned(pinned)[1]
            except SnapshotAborted:
                log.info("digest check at index %d passed over by a snapshot install", index)
            except Exception:
                log.exception("digest check at index %d failed", index)
            self._note_digest(index, value)

    async def digest_at(self, index: int, timeout_s: float) -> str | None:
        """The digest this node recorded at the check_digest entry `index`,
        waiting (at most timeout_s) until it applied and hashed it; None if it
        has none there (not such an entry, evicted, or passed over). Raises
        Unavailable if it is still being computed at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            applied = self.store.applied_index() >= index   # read first: see _on_apply
            with self._digests_lock:
                value = self.checked_digests.get(index)
            if value is not None and value != DIGEST_PENDING:
                return value
            if applied and value is None:
                return None
            if time.monotonic() > deadline:
                if value == DIGEST_PENDING:
                    raise Unavailable(f"the digest at index {index} is still being computed "
                                      "here; ask again", reason="digest_pending")
                return None
            await asyncio.sleep(0.01)

    def _die(self, why: str) -> None:
        # Applying the rest of the log after a failed entry would make this
        # replica diverge silently; stopping is the only safe answer.
        log.critical("stopping node %s: %s", self.node_id, why, exc_info=True)
        logging.shutdown()
        os._exit(EXIT_INVARIANT)

    def _snapshot_pin(self) -> PinnedRead:
        """Raft thread: the state a snapshot is written from, exactly as applied
        so far. Its applied_index may be below pysyncobj's last applied index
        (the entries in between were Raft no-ops, which change no state), or
        above it while this node replays its journal after a restart (the
        state was persisted further than pysyncobj's journal position). Both
        are safe: whoever loads the snapshot skips the journal entries at or
        below the state's applied_index (_on_apply), and those entries are
        committed, so the same on every node."""
        return self.store.pin()

    def _snapshot_install(self, path: str, offset: int, length: int,
                          applied_index: int) -> bool:
        """Raft thread: install a snapshot's LMDB image (at start: this node's
        own snapshot; later: one the leader sent), unless the state here is at
        least as new (at start, LMDB is usually ahead of its own snapshot).
        Whether it installed."""
        if applied_index <= self.store.applied_index():
            log.info("keeping the state at applied_index %d; the snapshot is at %d",
                     self.store.applied_index(), applied_index)
            return False
        log.info("installing a snapshot at applied_index %d (%d bytes)", applied_index, length)
        started = time.monotonic()
        installed = self.store.install_image(path, offset, length)
        if installed != applied_index:
            raise InvariantBroken(f"the snapshot's image is at applied_index {installed}, its "
                                  f"header says {applied_index}")
        log.info("installed the snapshot at applied_index %d in %.2f s", applied_index,
                 time.monotonic() - started)
        self._after_install()
        return True

    def _snapshot_install_items(self, applied_index: int, items: list) -> bool:
        """Raft thread: a snapshot written by an earlier release (a list of records)."""
        if applied_index <= self.store.applied_index():
            return False
        log.info("installing a snapshot at applied_index %d (%d records)",
                 applied_index, len(items))
        self.store.replace_all(applied_index, [tuple(item) for item in items])
        self._after_install()
        return True

    def _after_install(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.dispatcher.request_rescan)
            self._loop.call_soon_threadsafe(self.trigger.ownership_changed)

    # --- the loop side ---------------------------------------------------------------

    def _handle_effects(self, effects: tuple) -> None:
        for effect in effects:
            if isinstance(effect, RunQueued):
                if effect.run.get("queue"):
                    self.workers.queued(keys.scoped(effect.run["tenant"], effect.run["queue"]))
                elif effect.run["node"] == self.node_id:
                    self.dispatcher.submit(effect.run)
            elif isinstance(effect, RunCancelled):
                if effect.holder == self.node_id:
                    self.dispatcher.cancelled(effect.run_id, effect.attempt)
            elif isinstance(effect, TopicAppended):
                event = self.topic_events.pop(effect.topic, None)
                if event is not None:
                    event.set()
            elif isinstance(effect, AlertPending):
                pass   # the leader's alerter scans the pending alerts each pass
            elif isinstance(effect, DueArmed):
                self.trigger.wake(effect.shard, effect.due_ms)
            elif isinstance(effect, ShardsAssigned):
                self.trigger.ownership_changed()
            elif isinstance(effect, NodeRenewed):
                self.coordinator.renewed(effect.node, effect.at_ms)
            elif isinstance(effect, RunsPurged):
                self.supervisor.spawn("outputs.drop", self._drop_outputs(effect.run_ids))

    async def propose(self, command: dict) -> dict:
        result = await self.replicator.propose_wait(commands.encode(command))
        if isinstance(result, dict) and result.get("replayed"):
            # The entry's index was already covered by a snapshot this node
            # installed, so its own result is not known here.
            raise Unavailable("the command was committed, but its result is not known on this "
                              "node (it installed a snapshot covering it); retry with the same "
                              "idempotency_key", reason="unknown_outcome")
        return result

    async def wait_caught_up(self, timeout_s: float = limits.propose_timeout_s) -> None:
        """Read-your-writes: wait until this node has applied everything the
        leader had committed when the call began. A follower asks the leader for
        its commit index (what it learns from heartbeats may be a tick old)."""
        deadline = time.monotonic() + timeout_s
        status = self.replicator.status()
        if status.role == "leader":
            target = status.commit_index
        else:
            target = await self._leader_commit_index(status.leader, timeout_s)
        while self.store.applied_index() < target:
            if time.monotonic() > deadline:
                raise Unavailable(f"this node did not catch up with the leader's commit index "
                                  f"{target} within {timeout_s:g} s", reason="timeout")
            await asyncio.sleep(0.002)

    async def _leader_commit_index(self, leader_raft: str | None, timeout_s: float) -> int:
        leader = next((rec for _, rec in self.store.scan(NODES)
                       if leader_raft is not None and rec["raft"] == leader_raft), None)
        if leader is None:
            raise Unavailable("no leader known, cannot read consistently; retry",
                              reason="no_leader")
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with aiohttp.ClientSession(timeout=timeout,
                                             headers=self.config.peer_headers()) as session:
                async with session.get(leader["http"] + "/v1/node") as response:
                    body = await response.json()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise Unavailable(f"cannot ask the leader {leader['id']} for its commit index: "
                              f"{exc!r}", reason="no_leader") from None
        if body.get("role") != "leader":
            raise Unavailable(f"{leader['id']} is no longer the leader; retry",
                              reason="leader_changed")
        return int(body["commit_index"])

    async def start(self) -> None:
        from raftsched.api.app import make_app

        self._loop = asyncio.get_running_loop()
        cfg = self.config
        self.replicator = Replicator(
            self_addr=cfg.raft_addr, peers=list(cfg.peers), data_dir=cfg.data_dir,
            secret=cfg.raft_secret, loop=self._loop, on_apply=self._on_apply,
            snapshot_pin=self._snapshot_pin, snapshot_install=self._snapshot_install,
            snapshot_install_items=self._snapshot_install_items,
            snapshot_entries=cfg.raft_snapshot_entries, fsync=cfg.fsync)
        self.reporter = Reporter(self)
        await self.http_executor.start()
        app = make_app(self)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.http_host, cfg.http_port,
                           reuse_address=True, backlog=1024)
        await site.start()
        self._start_loops()
        log.info("node %s serving HTTP on %s, Raft on %s, peers %s", self.node_id,
                 cfg.http_url, cfg.raft_addr, ",".join(cfg.peers) or "-")

    def _start_loops(self) -> None:
        """Each loop restarts when it fails, and the node exits when one cannot
        go on (runtime/supervise.py). Leader-only loops run on every node and
        act while this node leads."""
        loops = {"trigger": self.trigger.run, "dispatcher": self.dispatcher.run,
                 "dispatcher.heartbeat": self.dispatcher.heartbeat_loop,
                 "reporter": self.reporter.run, "reaper": self.reaper.run,
                 "coordinator": self.coordinator.run, "renew": self.coordinator.renew_loop,
                 "sync": self._sync_loop, "prune_outputs": self._prune_outputs_loop,
                 "purger": self.purger.run, "storage": self.storage.run,
                 "backfiller": self.backfiller.run,
                 "clock": lambda: self.clock.run(self._peer_urls, self.config.peer_headers())}
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
                await asyncio.sleep(0.5)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(store_sync_period_s)
            await asyncio.get_running_loop().run_in_executor(None, self.store.sync)

    async def _drop_outputs(self, run_ids: tuple[str, ...]) -> None:
        """The output this node keeps of runs that were purged goes with them."""
        await asyncio.get_running_loop().run_in_executor(
            None, self.outputs.delete_runs, list(run_ids))

    async def _prune_outputs_loop(self) -> None:
        while True:
            await asyncio.sleep(output_prune_period_s)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.outputs.prune(now_ms=self.now_ms()))

    async def stop(self) -> None:
        await self.supervisor.stop()
        await self.dispatcher.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.http_executor.close()
        self.replicator.destroy()
        await asyncio.sleep(0.05)   # let pysyncobj's thread leave its tick
        self.store.close()
        self.outputs.close()
        log.info("node %s stopped", self.node_id)


async def serve(config: NodeConfig) -> None:
    node = Node(config)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("node %s stopping", node.node_id)
    await node.stop()
