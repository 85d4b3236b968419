"""An idle node's periodic loops do only the work their job needs: the coordinator reads the shards only when the term or the candidates changed (or at its recheck period), renewals are spaced a third of the lease apart, the storage guard keeps one session for its peers, the backfiller wakes no thread with nothing open and does not pass until a backfill begins, and the trigger does not tick with nothing due."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace
from typing import AsyncIterator

import pytest

from raftsched import limits
from raftsched.core import commands, jobspec
from raftsched.core.apply import NODES, SHARDS, DueArmed
from raftsched.core.schedule import next_fire_ms
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.context import Replicated
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.storage_guard import StorageGuard
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.trigger import TriggerLoop
from raftsched.testing.replica import Replica

SHARD_COUNT = 8


class _Store:
    """Three registered nodes and SHARD_COUNT shards, counting shard reads."""

    def __init__(self, owners: dict[int, str]) -> None:
        self.owners = owners
        self.scans: dict[str, int] = {}

    def scan(self, table: str, **_kw):
        self.scans[table] = self.scans.get(table, 0) + 1
        if table == NODES:
            return [(nid.encode(), {"id": nid, "raft": f"r-{nid}", "http": f"h-{nid}"})
                    for nid in ("n1", "n2", "n3")]
        if table == SHARDS:
            return [(shard.to_bytes(2, "big"), {"owner": owner})
                    for shard, owner in self.owners.items()]
        return []


def _coordinator(owners: dict[int, str]) -> tuple[Coordinator, SimpleNamespace]:
    proposed: list[dict] = []

    async def propose(command: dict) -> dict:
        proposed.append(command)
        return {"ok": True}

    # What the test changes as it goes: the term, who drains, the clock, propose.
    node = SimpleNamespace(store=_Store(owners), proposed=proposed, term=1, draining=False,
                           peers_draining=set(), monotonic=time.monotonic, propose=propose,
                           now_ms=lambda: 0)
    coordinator = Coordinator(
        Replicated(node_id="n1", store=node.store, propose=lambda c: node.propose(c),
                   now_ms=lambda: node.now_ms(), is_leader=lambda: True),
        shard_count=SHARD_COUNT, spawn=_spawn, term=lambda: node.term,
        peer_liveness=lambda: {"r-n2": 0.0, "r-n3": 0.0},
        clocks=SimpleNamespace(out_of_bound=lambda: set(), draining=lambda: node.peers_draining),
        draining=lambda: node.draining, monotonic=lambda: node.monotonic())
    for nid in ("n1", "n2", "n3"):
        coordinator.renewed(nid, 10_000)
    return coordinator, node


BALANCED = {s: ("n1", "n2", "n3")[s % 3] for s in range(SHARD_COUNT)}


async def test_a_settled_placement_is_not_read_again_in_the_same_term():
    coordinator, node = _coordinator(dict(BALANCED))
    for _ in range(5):
        assert await coordinator.maybe_rebalance() is False
    assert node.store.scans[SHARDS] == 1
    assert coordinator.placement_reads_total == 1
    node.term = 2   # another leader may have assigned shards meanwhile
    assert await coordinator.maybe_rebalance() is False
    assert node.store.scans[SHARDS] == 2


async def test_a_changed_candidate_set_is_planned_at_once():
    coordinator, node = _coordinator(dict(BALANCED))
    assert await coordinator.maybe_rebalance() is False
    for at_ms in (11_000, 12_000):   # n1 and n2 renew on; n3 does not: it lapses
        coordinator.renewed("n1", at_ms)
        coordinator.renewed("n2", at_ms)
    assert await coordinator.maybe_rebalance() is True
    assert node.proposed and all(a.node != "n3" for a in
                                 node.proposed[-1].assignments)


@pytest.mark.parametrize("leader_drains", [False, True])
async def test_a_draining_node_is_given_no_shards(leader_drains):
    """A node stopping (its clock answers say it drains, or the leader's own
    flag) is left out of the placement: its shards move to the others while
    it is alive to hand its runs over."""
    coordinator, node = _coordinator(dict(BALANCED))
    assert await coordinator.maybe_rebalance() is False
    if leader_drains:
        node.draining = True
    else:
        node.peers_draining = {"n3"}
    gone = "n1" if leader_drains else "n3"
    assert await coordinator.maybe_rebalance() is True
    moved = node.proposed[-1].assignments
    assert sorted(a.shard for a in moved) == sorted(s for s, o in BALANCED.items() if o == gone)
    assert {a.node for a in moved} == {"n1", "n2", "n3"} - {gone}


async def test_the_placement_is_read_again_at_the_recheck_period(monkeypatch):
    coordinator, node = _coordinator(dict(BALANCED))
    monkeypatch.setattr(limits, "placement_recheck_period_s", 0.0)
    for _ in range(3):
        assert await coordinator.maybe_rebalance() is False
    assert node.store.scans[SHARDS] == 3


def _spawn(name: str, coroutine) -> asyncio.Task:
    """The supervisor's spawn, as the renew loop uses it (one task a renewal)."""
    return asyncio.ensure_future(coroutine)


def _renewing(now_ms, propose) -> Coordinator:
    """A coordinator of n1 for its renew loop, in Raft term 1."""
    return Coordinator(Replicated(node_id="n1", store=None, propose=propose, now_ms=now_ms,
                                  is_leader=lambda: True),
                       shard_count=SHARD_COUNT, spawn=_spawn, term=lambda: 1,
                       peer_liveness=dict, clocks=None, draining=lambda: False)


async def test_renewals_are_spaced_a_third_of_the_lease_apart(monkeypatch):
    # When the loop sends each renewal (spawns its proposal): when that task
    # then starts is the event loop's, and on a loaded machine one start late
    # and the next on time would look like renewals too close together.
    proposed_at: list[float] = []

    async def propose(command: dict) -> dict:
        return {"ok": True}

    def spawn(name: str, coroutine) -> asyncio.Task:
        proposed_at.append(time.monotonic())
        return _spawn(name, coroutine)

    monkeypatch.setattr(limits, "renew_period_s", limits.node_lease_s / 3 / 20)
    coordinator = _renewing(lambda: 0, propose)
    coordinator._spawn = spawn
    task = asyncio.ensure_future(coordinator.renew_loop())
    try:
        deadline = time.monotonic() + 10
        while len(proposed_at) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
    gaps = [b - a for a, b in zip(proposed_at, proposed_at[1:])]
    assert len(gaps) >= 5
    assert min(gaps) >= 0.9 * limits.renew_period_s, gaps


async def test_renewals_fall_on_multiples_of_the_period_on_the_cluster_time(monkeypatch):
    monkeypatch.setattr(limits, "renew_period_s", 0.2)
    at_ms: list[int] = []
    started_ms = time.monotonic_ns() // 1_000_000

    def now_ms() -> int:   # a cluster time half a period off this process's clock
        return time.monotonic_ns() // 1_000_000 - started_ms + 100

    async def propose(command) -> dict:
        at_ms.append(command.at_ms)
        return {"ok": True}

    task = asyncio.ensure_future(_renewing(now_ms, propose).renew_loop())
    try:
        deadline = time.monotonic() + 10
        while len(at_ms) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
    # The first renews at once; the others on the period's multiples, so the
    # nodes' renewals share a Raft round (a loaded machine may add a little).
    phases = sorted(t % 200 for t in at_ms[1:])
    assert len(phases) >= 4
    assert phases[len(phases) // 2] < 50, at_ms


def test_a_renewal_period_is_a_third_of_the_lease():
    # Renewing more often moves no shard sooner and costs every replica an
    # apply: an idle cluster's Raft traffic was mostly renewals at 0.25 s.
    assert limits.renew_period_s == pytest.approx(limits.node_lease_s / 3)


class _Peers:
    """A stand-in for the node's peer client (runtime/peer.py): answers every
    GET /v1/node with the storage status given, and counts the asks."""

    def __init__(self, storage: dict | None = None) -> None:
        self.asked = 0
        self.storage = storage if storage is not None else {"full": None}

    async def get_json(self, url: str, *, timeout_s: float, params=None) -> dict:
        self.asked += 1
        return {"storage": self.storage}


async def test_the_backfiller_wakes_no_thread_while_no_backfill_is_open(monkeypatch):
    backfiller = Backfiller(Replica().replicated())

    def plan() -> list:
        raise AssertionError("planned with no backfill open")

    monkeypatch.setattr(backfiller, "plan", plan)
    assert await backfiller.maybe_step() is False


async def _until(condition, deadline_s: float = 5.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met within the deadline"
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def _running(loop_run) -> AsyncIterator[None]:
    """A loop's run() as a task for the block, cancelled and awaited after it."""
    task = asyncio.ensure_future(loop_run)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _counting(monkeypatch, loop: object, name: str) -> list[int]:
    """Count the calls of `loop.name` (the real method still runs)."""
    calls = [0]
    real = getattr(loop, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, name, counted)
    return calls


def _backfiller(monkeypatch, recheck_s: float) -> tuple[Backfiller, list[int]]:
    """A leader's backfiller over an empty replica, passing every 10 ms while
    it passes, and the count of its passes."""
    monkeypatch.setattr(limits, "backfill_period_ms", 10)
    monkeypatch.setattr(limits, "backfill_idle_recheck_s", recheck_s)
    backfiller = Backfiller(Replica().replicated())
    return backfiller, _counting(monkeypatch, backfiller, "maybe_step")


async def test_the_backfiller_waits_for_a_backfill_to_begin(monkeypatch):
    """Once a pass found nothing open, the leader's backfiller passes again
    only when apply says a backfill began (or at its recheck period): at a
    period of 10 ms it would otherwise pass 30 times in the 0.3 s below."""
    backfiller, passes = _backfiller(monkeypatch, 60.0)
    async with _running(backfiller.run()):
        await _until(lambda: passes[0] >= 1)
        await asyncio.sleep(0.3)
        assert passes[0] == 1
        backfiller.opened()   # a BackfillOpened effect
        await _until(lambda: passes[0] >= 2)


async def test_the_backfiller_looks_again_at_its_recheck_period(monkeypatch):
    backfiller, passes = _backfiller(monkeypatch, 0.05)
    async with _running(backfiller.run()):
        await _until(lambda: passes[0] >= 4)


def _trigger(replica: Replica, synced: list[bool]) -> TriggerLoop:
    async def propose_entry(data: bytes) -> dict:
        return replica.run_entry(data)
    return TriggerLoop(replica.replicated(node_id="n1", now_ms=lambda: int(time.time() * 1000)),
                       arm_ahead_ms=30_000, propose_entry=propose_entry,
                       spawn=Supervisor("test").spawn, synced=lambda: synced[0],
                       armed_room=lambda: 100)


async def test_the_trigger_does_not_tick_with_nothing_due(monkeypatch):
    """With no due entry in the shards it holds, the trigger waits for one
    (or for its resync) instead of passing every tick; a due entry within the
    wait wakes it, and so does a change of the shards held. At a tick of 10 ms
    it would otherwise pass 30 times in the 0.3 s below."""
    monkeypatch.setattr(limits, "trigger_tick_ms_max", 10)
    monkeypatch.setattr(limits, "due_resync_period_s", 60.0)
    replica = Replica()
    replica.run(commands.assign_shards(assignments=[(0, "n1")], at_ms=1))
    trigger = _trigger(replica, [True])
    passes = _counting(monkeypatch, trigger, "maybe_fire_due")
    async with _running(trigger.run()):
        await _until(lambda: passes[0] >= 1)
        await asyncio.sleep(0.3)
        assert passes[0] == 1
        assert trigger.owned() == {0: 1}
        trigger.wake(0, int(time.time() * 1000) + 60_000)   # due within the wait
        await _until(lambda: passes[0] >= 2)
        trigger.ownership_changed()
        await _until(lambda: passes[0] >= 3)


async def test_a_shard_passed_is_looked_at_again_when_its_next_entry_is_due(monkeypatch):
    """After a pass fires a shard's due entry, the shard's next one (here
    the next second of a job that may not be armed ahead) is the loop's next
    wake-up, though no other shard has anything due: the loop rests only
    until the soonest entry of any shard it holds."""
    monkeypatch.setattr(limits, "due_resync_period_s", 60.0)
    replica = Replica()
    replica.run(commands.assign_shards(assignments=[(0, "n1")], at_ms=1))
    spec = jobspec.validate_create({"schedule": {"every": "1s"},
                                    "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
                                    "concurrency": {"policy": "skip_if_running"}})["spec"]
    now_ms = int(time.time() * 1000)
    assert replica.run(commands.create_job(
        job_id="job_e1", tenant="default", spec=spec, idempotency_key=None, shard=0,
        next_ms=next_fire_ms(spec["schedule"], now_ms), at_ms=now_ms))["ok"]
    trigger = _trigger(replica, [True])
    # Apply's DueArmed effects, as a node delivers them (runtime/node.py).
    replica_run_entry = replica.run_entry

    def run_entry(data: bytes) -> dict:
        before = len(replica.effects)
        result = replica_run_entry(data)
        for effect in replica.effects[before:]:
            if isinstance(effect, DueArmed):
                trigger.wake(effect.shard, effect.due_ms)
        return result

    monkeypatch.setattr(replica, "run_entry", run_entry)
    async with _running(trigger.run()):
        await _until(lambda: replica.job("job_e1").get("runs_count", 0) >= 3, 10.0)


async def test_the_trigger_ticks_until_it_knows_the_cluster_time(monkeypatch):
    """A node that does not know the cluster's time yet fires nothing, and
    looks again every tick, so it fires soon after it learns it."""
    monkeypatch.setattr(limits, "trigger_tick_ms_max", 10)
    monkeypatch.setattr(limits, "due_resync_period_s", 60.0)
    trigger = _trigger(Replica(), [False])
    passes = _counting(monkeypatch, trigger, "maybe_fire_due")
    async with _running(trigger.run()):
        await _until(lambda: passes[0] >= 5)


def test_a_log_that_lags_behind_judges_no_node_dead():
    """Liveness follows the log's progress: renewals applied late alike (a
    backlog of fires and finishes ahead of them) lapse no one, however late
    by this node's clock; a node whose renewals stop while the others' go on
    lapses once the others' are node_lease_s (and the margin) ahead."""
    coordinator, node = _coordinator(dict(BALANCED))
    node.now_ms = lambda: 10_000 + 10_000   # every renewal applied 10 s after it was proposed
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]
    lease_ms = int((limits.node_lease_s + limits.shard_lease_margin_s) * 1000)
    coordinator.renewed("n1", 10_000 + lease_ms - 1)
    coordinator.renewed("n2", 10_000 + lease_ms - 1)
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]
    coordinator.renewed("n2", 10_000 + lease_ms)
    assert coordinator.live_nodes() == ["n1", "n2"]


def _restarted_coordinator(started_ms: int) -> Coordinator:
    """A coordinator of n1 started at `started_ms` on the cluster's time, with
    every peer's Raft link up (the leader's view)."""
    return Coordinator(
        Replicated(node_id="n1", store=_Store(dict(BALANCED)), propose=None,
                   now_ms=lambda: started_ms, is_leader=lambda: True),
        shard_count=SHARD_COUNT, spawn=_spawn, term=lambda: 1,
        peer_liveness=lambda: {"r-n2": 0.0, "r-n3": 0.0},
        clocks=SimpleNamespace(out_of_bound=set, draining=set),
        draining=lambda: False, monotonic=time.monotonic)


def test_a_renewal_from_before_this_start_is_no_evidence():
    """A cluster restarted whole applies its nodes' last renewals from before
    the stop. The slowest node to start is judged by its renewals since this
    start, not by those: live until renewals a lease, its margin and
    start_liveness_grace_s past this start are applied here, then dead unless
    one of its own came."""
    grace_ms = int((limits.node_lease_s + limits.shard_lease_margin_s
                    + limits.start_liveness_grace_s) * 1000)
    coordinator = _restarted_coordinator(50_000)
    coordinator.renewed("n3", 10_000)             # before the stop, applied after the start
    coordinator.renewed("n1", 50_500)
    coordinator.renewed("n2", 50_500)
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]
    coordinator.renewed("n1", 50_000 + grace_ms - 1)
    coordinator.renewed("n2", 50_000 + grace_ms - 1)
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]
    coordinator.renewed("n1", 50_000 + grace_ms)
    coordinator.renewed("n2", 50_000 + grace_ms)
    assert coordinator.live_nodes() == ["n1", "n2"]
    coordinator.renewed("n3", 50_000 + grace_ms + 100)
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]


def test_no_renewal_applied_since_a_restart_judges_no_node_dead_however_long_it_takes(
        monkeypatch):
    """Restarted, then an election: no renewal is committed for seconds. By
    this node's clock its peers have not renewed since its start; by the log,
    no one has, so no one lapses (a live holder judged dead has its runs
    taken over at once and called again, as next attempts)."""
    coordinator = _restarted_coordinator(50_000)
    for node_id in ("n1", "n2", "n3"):
        coordinator.renewed(node_id, 49_500)      # the renewals of before the stop
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]
    later = time.monotonic() + 60
    monkeypatch.setattr(time, "monotonic", lambda: later)   # a minute on, nothing new
    assert coordinator.live_nodes() == ["n1", "n2", "n3"]


async def test_the_log_latency_is_the_latest_renewals_round_trip_within_a_term():
    coordinator, node = _coordinator(dict(BALANCED))
    now = [100.0]
    node.monotonic = lambda: now[0]
    applied = asyncio.Event()

    async def propose(command) -> dict:
        await applied.wait()
        return {"ok": True}

    node.propose = propose

    async def round_trip(took_s: float, term_after: int | None = None) -> None:
        applied.clear()
        task = asyncio.ensure_future(coordinator._renew(
            commands.renew(node="n1", at_ms=int(now[0] * 1000)), now[0]))
        await asyncio.sleep(0)
        now[0] += took_s
        if term_after is not None:
            node.term = term_after
        applied.set()
        await task

    assert coordinator.log_latency_s() == 0.0
    await round_trip(0.3)
    assert coordinator.log_latency_s() == pytest.approx(0.3)
    await round_trip(0.9)
    assert coordinator.log_latency_s() == pytest.approx(0.9)
    await round_trip(2.5, term_after=2)   # across an election: not the log's
    assert coordinator.log_latency_s() == pytest.approx(0.9)
    await round_trip(0.02)
    assert coordinator.log_latency_s() == pytest.approx(0.02)


def _guard(tmp_path, peers: _Peers, used: int, map_size: int = 1 << 30) -> StorageGuard:
    store = SimpleNamespace(
        path=str(tmp_path), map_size=map_size, used_bytes=lambda: used, file_bytes=lambda: used,
        scan=lambda table, **kw: [(b"n", {"id": nid, "http": f"http://{nid}"})
                                  for nid in ("n1", "n2")])
    guard = StorageGuard(node_id="n1", store=store, peers=peers, min_free_disk_bytes=0)
    guard._measure = lambda: (used, used, 1 << 50)   # a disk with room to spare
    return guard


def _peer_storage(room: int, full: str | None = None) -> dict:
    high_water = 1 << 40
    return {"used_bytes": high_water - room, "high_water_bytes": high_water,
            "free_disk_bytes": None, "min_free_disk_bytes": 0, "full": full}


async def _checked(guard: StorageGuard, peers: _Peers) -> float:
    asked = peers.asked
    await guard.check()
    assert peers.asked > asked   # the check asked its peers
    return guard.next_check_s()


async def test_an_idle_cluster_with_room_is_checked_at_the_longest_period(tmp_path):
    peers = _Peers(_peer_storage(room=100 * limits.storage_fill_rate_bytes_per_s))
    guard = _guard(tmp_path, peers, used=0)
    assert guard.next_check_s() == limits.storage_check_period_s   # nothing known yet
    assert await _checked(guard, peers) == limits.storage_check_period_max_s


@pytest.mark.parametrize("room_s", [0, 0.5, 3])
async def test_a_peer_near_its_mark_is_asked_again_before_it_could_reach_it(tmp_path, room_s):
    peers = _Peers(_peer_storage(room=int(room_s * limits.storage_fill_rate_bytes_per_s)))
    guard = _guard(tmp_path, peers, used=0)
    period = await _checked(guard, peers)
    assert period == pytest.approx(max(limits.storage_check_period_s, room_s))
    assert period < limits.storage_check_period_max_s


async def test_a_full_peer_or_a_node_near_its_own_mark_is_checked_every_period(tmp_path):
    full = _Peers(_peer_storage(room=1 << 40, full="max_data_bytes"))
    assert await _checked(_guard(tmp_path, full, used=0), full) == limits.storage_check_period_s
    roomy = _Peers(_peer_storage(room=1 << 40))
    map_size = 1 << 30
    near = int(map_size * limits.data_bytes_high_water_ratio) - limits.storage_fill_rate_bytes_per_s
    guard = _guard(tmp_path, roomy, used=near, map_size=map_size)
    assert await _checked(guard, roomy) == limits.storage_check_period_s


async def test_a_peer_whose_disk_is_near_its_minimum_free_is_asked_again_soon(tmp_path):
    storage = _peer_storage(room=1 << 40)
    storage.update(free_disk_bytes=(1 << 30) + limits.storage_fill_rate_bytes_per_s,
                   min_free_disk_bytes=1 << 30)   # a second's writes from its minimum
    peers = _Peers(storage)
    assert await _checked(_guard(tmp_path, peers, used=0), peers) == \
        limits.storage_check_period_s


async def test_a_node_whose_state_changes_size_is_measured_every_second(tmp_path):
    """What GET /v1/node shows of the state's size (the footprint benchmark
    reads it) is then at most a second old."""
    peers = _Peers(_peer_storage(room=1 << 40))
    guard = _guard(tmp_path, peers, used=0)
    assert await _checked(guard, peers) == limits.storage_check_period_max_s
    guard._measure = lambda: (1 << 20, 1 << 20, 1 << 50)   # writes since
    assert await _checked(guard, peers) == limits.storage_check_period_s
    assert await _checked(guard, peers) == limits.storage_check_period_max_s   # it stopped


def test_a_draining_node_settles_on_a_renewal_of_its_own_proposed_after_the_settle_time():
    """Node.drain is done only once a renewal of its own proposed
    drain_settle_s after it began draining is applied here: renewals of
    other nodes, or its own from before, do not count."""
    coordinator = _restarted_coordinator(50_000)
    settled_ms = 50_000 + round(limits.drain_settle_s * 1000)
    coordinator.renewed("n1", settled_ms - 1)
    coordinator.renewed("n2", settled_ms + 500)
    assert not coordinator.renewed_since(settled_ms)
    coordinator.renewed("n1", settled_ms)
    assert coordinator.renewed_since(settled_ms)


async def test_a_drain_with_nothing_left_waits_for_its_settling_renewal(monkeypatch):
    """Node.drain: with no shard, run or report left, the node is drained
    only once a renewal of its own proposed drain_settle_s after the drain
    began is applied (the leader may still give it shards until then); with
    none, it stops at stop_drain_max_s and says so."""
    from raftsched.runtime.node import Node

    monkeypatch.setattr(limits, "stop_drain_poll_s", 0.001)
    coordinator = _restarted_coordinator(50_000)
    clock = {"ms": 50_000, "s": 0.0}

    def tick() -> float:
        clock["s"] += 0.01
        return clock["s"]

    node = SimpleNamespace(node_id="n1", draining=False, coordinator=coordinator,
                           now_ms=lambda: clock["ms"], monotonic=tick,
                           reporter=SimpleNamespace(release_held=lambda: None),
                           _drain_to=lambda: ["n2", "n3"], _drain_left=lambda moving: [])
    drained = asyncio.get_running_loop().create_task(Node.drain(node, timeout_s=10))
    await asyncio.sleep(0.05)
    assert not drained.done() and node.draining   # nothing left, but not settled
    coordinator.renewed("n1", 50_000 + round(limits.drain_settle_s * 1000) - 1)
    await asyncio.sleep(0.05)
    assert not drained.done()
    coordinator.renewed("n1", 50_000 + round(limits.drain_settle_s * 1000))
    assert await asyncio.wait_for(drained, 5) is True
    # No settling renewal ever: the drain ends at its bound, not drained.
    late = _restarted_coordinator(50_000)
    node.coordinator = late
    assert await asyncio.wait_for(Node.drain(node, timeout_s=0.5), 5) is False
