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
import logging
import os
import signal
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from raftsched import limits
from raftsched.core import commands
from raftsched.core.apply import (NODES, AlertPending, DueArmed, NodeRenewed, RunCancelled,
                                  RunQueued, ShardsAssigned, TopicAppended, apply)
from raftsched.errors import InvariantBroken, Unavailable
from raftsched.executors.breaker import Breaker
from raftsched.executors.command import CommandExecutor
from raftsched.executors.http import HttpExecutor
from raftsched.replication.raft import Replicator, log_compaction_entries_default
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.dispatcher import Dispatcher
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.trigger import TriggerLoop
from raftsched.runtime.workers import WorkerService
from raftsched.storage.base import digest
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.output_store import OutputStore

log = logging.getLogger("raftsched.node")

# How often LMDB is fsynced (see storage/lmdb_store.py on durability).
store_sync_period_s = 1.0
# How often old run output is pruned (it is also bounded in size at each put).
output_prune_period_s = 600.0
# How many recorded digest checks a node keeps (see _record_digest).
checked_digests_kept = 64
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

    @property
    def http_url(self) -> str:
        return self.advertise_http or f"http://{self.http_host}:{self.http_port}"


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.shard_count = config.shard_count
        self.store = LmdbStore(os.path.join(config.data_dir, "state"))
        self.outputs = OutputStore(os.path.join(config.data_dir, "output"))
        self.http_executor = HttpExecutor()
        self.command_executor = CommandExecutor()
        self.breaker = Breaker(window=limits.breaker_window,
                               failure_ratio=limits.breaker_failure_ratio,
                               cooloff_s=limits.breaker_cooloff_s, clock=self.monotonic)
        self.replicator: Replicator  # set in start(), once the loop runs
        self.reporter: Reporter      # set in start(): it makes loop objects
        self.dispatcher = Dispatcher(self)
        self.workers = WorkerService(self)
        self.reaper = Reaper(self)
        self.topic_events: dict[str, asyncio.Event] = {}
        self.trigger = TriggerLoop(self)
        self.coordinator = Coordinator(self)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self.started_ms = self.now_ms()
        # index -> state digest recorded when a check_digest entry was applied here.
        self.checked_digests: collections.OrderedDict[int, str] = collections.OrderedDict()

    @staticmethod
    def now_ms() -> int:
        return time.time_ns() // 1_000_000

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    # --- the Raft thread side --------------------------------------------------------

    def _on_apply(self, data: bytes, index: int) -> dict | None:
        """Runs on pysyncobj's thread. Never touches asyncio objects directly."""
        try:
            if index <= self.store.applied_index():
                return {"ok": True, "replayed": True}   # persisted before a restart
            command = commands.decode(data)
            transition = apply(self.store, command, index)
            self.store.commit(transition, index)
            if command["t"] == "check_digest":
                return self._record_digest(index, transition.result)
        except InvariantBroken as exc:
            self._die(f"raft entry {index}: {exc}")
        except Exception as exc:
            self._die(f"raft entry {index}: apply failed: {exc!r}")
        if transition.effects:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._handle_effects, transition.effects)
        return transition.result

    def _record_digest(self, index: int, result: dict) -> dict:
        """Raft thread: the state is exactly as of `index` here, on every replica."""
        at, value = digest(self.store)
        assert at == index, (at, index)
        self.checked_digests[index] = value
        while len(self.checked_digests) > checked_digests_kept:
            self.checked_digests.popitem(last=False)
        return dict(result, index=index, digest=value)

    def _die(self, why: str) -> None:
        # Applying the rest of the log after a failed entry would make this
        # replica diverge silently; stopping is the only safe answer.
        log.critical("stopping node %s: %s", self.node_id, why, exc_info=True)
        logging.shutdown()
        os._exit(EXIT_INVARIANT)

    def _snapshot_items(self) -> tuple[int, list]:
        index, items = self.store.raw_items()
        return index, [list(item) for item in items]

    def _snapshot_install(self, applied_index: int, items: list) -> None:
        if applied_index <= self.store.applied_index():
            return   # our own state is at least as new: keep it
        log.info("installing a snapshot at applied_index %d (%d records)",
                 applied_index, len(items))
        self.store.replace_all(applied_index, [tuple(item) for item in items])
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.dispatcher.request_rescan)
            self._loop.call_soon_threadsafe(self.trigger.ownership_changed)

    # --- the loop side ---------------------------------------------------------------

    def _handle_effects(self, effects: tuple) -> None:
        for effect in effects:
            if isinstance(effect, RunQueued):
                if effect.run.get("queue"):
                    self.workers.queued(effect.run["queue"])
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

    async def propose(self, command: dict) -> dict:
        return await self.replicator.propose_wait(commands.encode(command))

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
            async with aiohttp.ClientSession(timeout=timeout) as session:
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
            snapshot_items=self._snapshot_items, snapshot_install=self._snapshot_install,
            snapshot_entries=cfg.raft_snapshot_entries)
        self.reporter = Reporter(self)
        await self.http_executor.start()
        app = make_app(self)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, cfg.http_host, cfg.http_port,
                           reuse_address=True, backlog=1024)
        await site.start()
        for coro in (self.trigger.run(), self.dispatcher.run(), self.dispatcher.heartbeat_loop(),
                     self.reporter.run(), self.reaper.run(), self.coordinator.run(),
                     self.coordinator.renew_loop(), self._register_loop(), self._sync_loop(),
                     self._prune_outputs_loop()):
            self._tasks.append(asyncio.ensure_future(coro))
        log.info("node %s serving HTTP on %s, Raft on %s, peers %s", self.node_id,
                 cfg.http_url, cfg.raft_addr, ",".join(cfg.peers) or "-")

    async def _register_loop(self) -> None:
        """Record this node's id and addresses in the replicated state, once."""
        cfg = self.config
        while True:
            current = self.store.get(NODES, self.node_id.encode())
            if current and current["http"] == cfg.http_url and current["raft"] == cfg.raft_addr:
                return
            try:
                await self.propose(commands.register_node(node=self.node_id, http=cfg.http_url,
                                                          raft=cfg.raft_addr, at_ms=self.now_ms()))
            except Unavailable:
                await asyncio.sleep(0.5)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(store_sync_period_s)
            await asyncio.get_running_loop().run_in_executor(None, self.store.sync)

    async def _prune_outputs_loop(self) -> None:
        while True:
            await asyncio.sleep(output_prune_period_s)
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.outputs.prune(now_ms=self.now_ms()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
