"""The lease is taken at fire: a node calls the runs it holds with no `start` entry, while it holds their shard and its shard lease is valid by its monotonic clock; a backlog never costs a run its lease; a moved shard's runs are called once, by the new owner."""

from __future__ import annotations

import asyncio
import collections
import types

import pytest

from raftsched import limits
from raftsched.core import commands, keys
from raftsched.core.apply import LEASES, NodeRenewed, RunCancelled, RunQueued, ShardsAssigned
from raftsched.executors.base import Outcome
from raftsched.executors.breaker import Breaker
from raftsched.runtime.armed import ArmedRuns
from raftsched.runtime.context import Replicated
from raftsched.runtime.coordinator import RECORDED_RENEWAL_LEVEL, Coordinator
from raftsched.runtime.dispatcher import Calls, Dispatcher
from raftsched.runtime.horizon import FILE_NAME as HORIZON_FILE
from raftsched.runtime.horizon import CallHorizon
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.reporter import Reporter as BatchingReporter
from raftsched.runtime.supervise import Supervisor
from raftsched.testing.replica import EVERY_2S, HTTP, Replica, no_call

SHARDS = 16
AT_MS = 1_800_000_000_000
JOB = "job_lease"
SHARD = keys.shard_of(JOB, SHARDS)


class Cluster(Replica):
    """One replicated log, seen by the fake nodes below; every command any of
    them proposes is counted by tag (and a run report by its event)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: collections.Counter[str] = collections.Counter()
        self.nodes: dict[str, "FakeNode"] = {}
        self.taken_ids: list[str] = []   # every run id a take-over entry named

    def run(self, command) -> dict:
        tag = commands.tag_of(command)
        self.tags[tag] += 1
        if tag in ("take_over_runs", "take_over_judged"):
            self.taken_ids += command.run_ids
        if tag == "run_updates":
            for update in command.updates:
                self.tags["run_updates." + commands.tag_of(update)] += 1
        before = len(self.effects)
        result = super().run(command)
        for effect in self.effects[before:]:
            for node in self.nodes.values():
                node.handle(effect)
        return result


class Reporter:
    """Applies each report at once, as its own run_updates entry."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def send(self, update, tenant: str = "", cost: int = 1, hold: bool = False) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        result = self.cluster.run(commands.run_updates(updates=[update]))
        future.set_result(result["accepted"][0])
        return future


class Executor:
    """An HTTP target: counts its calls by (node, run) and holds each one
    until `release` is set."""

    def __init__(self, node_id: str, calls: collections.Counter) -> None:
        self.node_id, self.calls = node_id, calls
        self.release = asyncio.Event()
        self.release.set()

    async def run(self, attempt, target: dict, deadline_ms: int) -> Outcome:
        self.calls[(self.node_id, attempt.run_id)] += 1
        await self.release.wait()
        return Outcome(ok=True, http_status=200)


class FakeNode:
    """What the dispatcher and the coordinator's lease use of a node, with a
    monotonic clock and a cluster clock the test moves."""

    def __init__(self, cluster: Cluster, node_id: str, calls: collections.Counter,
                 horizon: CallHorizon | None = None) -> None:
        self.cluster, self.node_id, self.store = cluster, node_id, cluster.store
        self.mono_s = 1000.0
        self.clock_ms = AT_MS
        self.supervisor = Supervisor(f"node {node_id}", exit_hook=lambda code: None)
        self.breaker = Breaker(window=limits.breaker_window,
                               failure_ratio=limits.breaker_failure_ratio,
                               cooloff_s=limits.breaker_cooloff_s, clock=self.monotonic)
        self.reporter = Reporter(cluster)
        self.http_executor = Executor(node_id, calls)
        self.outputs = None   # its HTTP calls have no output to keep
        self.coordinator = Coordinator(
            self.replicated(), shard_count=SHARDS, spawn=self.supervisor.spawn, term=lambda: 1,
            peer_liveness=dict, clocks=types.SimpleNamespace(out_of_bound=set, draining=set),
            draining=lambda: False, monotonic=self.monotonic)
        self.armed = ArmedRuns(node_id=node_id, now_ms=self.now_ms, synced=lambda: True,
                               call=lambda run: self.dispatcher.enqueue(run))
        # Every node of this release: hand-overs keep their attempts.
        self.applies = commands.APPLY_LEVEL
        self.dispatcher = Dispatcher(
            self.replicated(),
            calls=Calls(http=self.http_executor, command=None, breaker=self.breaker,
                        outputs=self.outputs, storage_past_mark=lambda: None,
                        lateness=LatenessHistogram(), horizon=horizon),
            lease=self.coordinator, armed=self.armed,
            # A test swaps the reporter for the batching one.
            report=lambda *report: self.reporter.send(*report),
            spawn=self.supervisor.spawn, quota_of=self.quota_of,
            cluster_applies=lambda: self.applies, monotonic=self.monotonic)
        cluster.nodes[node_id] = self
        cluster.run(commands.register_node(node=node_id, http=f"http://{node_id}",
                                           raft=f"raft-{node_id}", at_ms=AT_MS - 20_000))

    def monotonic(self) -> float:
        return self.mono_s

    def now_ms(self) -> int:
        return self.clock_ms

    def quota_of(self, tenant: str) -> dict:
        return {"weight": 1, "runs_concurrent_max": 10_000}

    async def propose(self, command) -> dict:
        return self.cluster.run(command)

    def replicated(self) -> Replicated:
        # Proposals go through self.propose as it is then: a test slows it down.
        return Replicated(node_id=self.node_id, store=self.store,
                          propose=lambda command, wait_max_s=None: self.propose(command),
                          now_ms=self.now_ms, is_leader=lambda: True)

    def renew(self) -> None:
        """A renewal proposed now and applied (as the coordinator's renew loop)."""
        self.cluster.run(commands.renew(node=self.node_id, at_ms=self.clock_ms,
                                        record=self.applies >= RECORDED_RENEWAL_LEVEL))
        self.coordinator.extend_lease(self.mono_s)

    def handle(self, effect) -> None:
        """What the apply bridge hands this node (runtime/apply_bridge.py)."""
        if isinstance(effect, RunQueued) and effect.run["node"] == self.node_id:
            self.dispatcher.submit(effect.run)
        elif isinstance(effect, RunCancelled) and effect.holder == self.node_id:
            self.dispatcher.cancelled(effect.run_id, effect.attempt)
        elif isinstance(effect, ShardsAssigned) and effect.owner == self.node_id:
            self.dispatcher.shard_gained(effect.shard)
        elif isinstance(effect, ShardsAssigned):
            self.dispatcher.shards_lost({effect.shard})
        elif isinstance(effect, NodeRenewed):
            self.coordinator.renewed(effect.node, effect.at_ms)


def make_job(cluster: Cluster, owner: str = "n1", misfire: str = "fire_all") -> None:
    cluster.run(commands.assign_shards(assignments=[(SHARD, owner)], at_ms=AT_MS - 10_000))
    spec = {"name": "j", "schedule": EVERY_2S, "target": HTTP, "misfire": None, "alert": {},
            "metadata": {}, "concurrency": {"policy": "allow"},
            "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0,
                      "max_s": 60.0, "non_retryable_exit_codes": []}}
    spec["misfire"] = {"policy": misfire, "tolerance_ms": 3_600_000, "catchup_max": 1000}
    cluster.run(commands.create_job(job_id=JOB, tenant="default", spec=spec,
                                    idempotency_key=None, shard=SHARD, next_ms=AT_MS,
                                    at_ms=AT_MS - 10_000))


def fire(cluster: Cluster, owner: str, count: int) -> list[str]:
    """Fire `count` occurrences of the job at once (a backlog): the run ids."""
    occurrences = [AT_MS + 2000 * i for i in range(count)]
    for node in cluster.nodes.values():
        # Fired as due at the last one: by then each node's clock has reached
        # them all (a node holds a run that is not due yet: runtime/armed.py).
        node.clock_ms = max(node.clock_ms, occurrences[-1])
    token = cluster.store.get("shards", keys.shard_key(SHARD))["token"]
    result = cluster.run(commands.fire(
        shard=SHARD, token=token, upto_ms=occurrences[-1], node=owner, at_ms=occurrences[-1],
        items=[(JOB, AT_MS, occurrences[-1] + 2000, occurrences, False)]))
    assert result["fired"] == count, result
    return [keys.run_id(JOB, o) for o in occurrences]


async def until(check, what: str, timeout_s: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def cluster(monkeypatch):
    # A few calls at once, so that a small backlog waits behind them.
    monkeypatch.setattr(limits, "runs_inflight_max", 4)
    cluster = Cluster()
    yield cluster
    for node in cluster.nodes.values():
        await node.dispatcher.close()
        await node.supervisor.stop()


def start(node: FakeNode) -> None:
    node.supervisor.start("dispatcher", node.dispatcher.run)
    node.supervisor.start("dispatcher.takeover", node.dispatcher.takeover_loop)


def take_overs(cluster: Cluster) -> int:
    """Take-over entries applied: take_over_runs, or take_over_judged (level 4)."""
    return cluster.tags["take_over_runs"] + cluster.tags["take_over_judged"]


def state(cluster: Cluster, run_id: str) -> str:
    return cluster.get_run(run_id)["state"]


async def test_a_node_executed_run_is_called_and_finished_with_no_start_entry(cluster):
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    start(n1)
    (run_id,) = fire(cluster, "n1", 1)
    await until(lambda: state(cluster, run_id) == "succeeded", "the run to succeed")
    assert calls == {("n1", run_id): 1}
    assert cluster.tags["run_updates.start"] == 0
    assert cluster.tags["run_updates.heartbeat"] == 0
    assert cluster.tags["run_updates.finish"] == 1
    assert cluster.get_run(run_id)["attempts"][0]["holder"] == "n1"


async def test_an_ended_attempts_start_is_when_its_node_began_the_call(cluster):
    """Held from its fire, a run's start is its fire until the finish brings
    the call's own start (what a user and the lateness checks read)."""
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    n1.http_executor.release.clear()
    (run_id,) = fire(cluster, "n1", 1)
    fired_ms = cluster.get_run(run_id)["started_ms"]
    n1.clock_ms = fired_ms + 700   # the call begins 0.7 s after the fire
    start(n1)
    await until(lambda: len(calls) == 1, "the call to begin")
    n1.http_executor.release.set()
    await until(lambda: state(cluster, run_id) == "succeeded", "the run to succeed")
    run = cluster.get_run(run_id)
    assert run["started_ms"] == run["attempts"][0]["started_ms"] == fired_ms + 700


async def test_a_backlog_held_past_the_run_lease_is_called_once_and_never_reaped(cluster):
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    n1.http_executor.release.clear()   # every call hangs: the rest wait in the queue
    start(n1)
    backlog = limits.runs_inflight_max + 50
    run_ids = fire(cluster, "n1", backlog)
    await until(lambda: len(calls) == limits.runs_inflight_max, "the slots to fill")
    # Far past any per-run lease, the node still renewing: its runs stay held.
    for _ in range(4):
        n1.mono_s += 1.0
        n1.clock_ms += 2 * limits.run_lease_ms_default
        n1.renew()
        reaper = Reaper(n1.replicated(), spawn=n1.supervisor.spawn, send=no_call)
        assert not await reaper.maybe_expire_leases()   # nothing to expire
    assert cluster.store.scan(LEASES) == []
    assert {state(cluster, r) for r in run_ids} == {"running"}
    n1.http_executor.release.set()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "the backlog to drain")
    assert sorted(calls.values()) == [1] * backlog   # each called once, by its holder
    assert all(cluster.get_run(r)["attempt"] == 1 for r in run_ids)
    assert cluster.tags["run_updates.start"] == 0


def batching_node(cluster: Cluster, calls: collections.Counter) -> tuple[FakeNode, list[int]]:
    """n1, started, with the node's batching reporter wired as a node wires
    it, owning the job's shard, its calls held until the test releases them;
    and the runs waiting on n1 for their call as each finish entry is applied."""
    n1 = FakeNode(cluster, "n1", calls)
    n1.reporter = BatchingReporter(propose=n1.propose, spawn=n1.supervisor.spawn,
                                   calls_waiting=n1.dispatcher.calls_waiting)
    n1.supervisor.start("reporter", n1.reporter.run)
    waiting_at_finish: list[int] = []
    run_entry = cluster.run

    def run(command) -> dict:
        if commands.tag_of(command) == "run_updates":
            waiting_at_finish.append(n1.dispatcher.calls_waiting())
        return run_entry(command)

    cluster.run = run
    make_job(cluster)
    n1.renew()
    n1.http_executor.release.clear()
    start(n1)
    return n1, waiting_at_finish


async def test_a_backlogs_finishes_are_applied_after_its_calls_and_none_is_lost(cluster):
    """Calls first: while runs wait for a slot, the finishes of the calls made
    are held (runtime/reporter.py); none is applied until no run waits, and
    then every one is."""
    calls: collections.Counter = collections.Counter()
    n1, waiting_at_finish = batching_node(cluster, calls)
    backlog = 5 * limits.runs_inflight_max
    run_ids = fire(cluster, "n1", backlog)
    await until(lambda: len(calls) == limits.runs_inflight_max, "the slots to fill")
    n1.http_executor.release.set()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every finish to be applied")
    assert sorted(calls.values()) == [1] * backlog
    assert n1.reporter.held_total >= backlog - limits.runs_inflight_max
    assert waiting_at_finish and set(waiting_at_finish) == {0}
    assert n1.reporter.pending() == 0


async def test_the_dispatchers_loop_turns_before_every_take(cluster, monkeypatch):
    """Call slots free and runs ready, the loop still turns before each take:
    what apply tells the node meanwhile (a cancel, a moved shard, another
    tenant's runs released at their second) is handled before the next."""
    monkeypatch.setattr(limits, "runs_inflight_max", 100)
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    n1.http_executor.release.clear()   # every call stays open: each take holds a slot
    start(n1)
    await asyncio.sleep(0.05)   # the dispatcher waits for a run
    loop = asyncio.get_running_loop()
    taken_by_turn: list[int] = []

    def each_turn() -> None:
        taken_by_turn.append(len(n1.dispatcher._active))
        if len(taken_by_turn) < 10_000:
            loop.call_soon(each_turn)

    loop.call_soon(each_turn)
    backlog = 40
    fire(cluster, "n1", backlog)
    await until(lambda: len(calls) == backlog, "every run to be called")
    steps = [b - a for a, b in zip(taken_by_turn, taken_by_turn[1:])]
    assert max(steps) == 1, steps
    n1.http_executor.release.set()


async def test_finishes_are_held_while_runs_wait_for_their_host_too(cluster, monkeypatch):
    """A spike at one host: call slots are free, but runs wait for the host's
    calls to end (http_connections_per_host_max). They wait for a call all
    the same, so the finishes made meanwhile are held until none waits."""
    monkeypatch.setattr(limits, "runs_inflight_max", 100)
    monkeypatch.setattr(limits, "http_connections_per_host_max", 2)
    calls: collections.Counter = collections.Counter()
    n1, waiting_at_finish = batching_node(cluster, calls)
    backlog = 12
    run_ids = fire(cluster, "n1", backlog)
    await until(lambda: n1.dispatcher.waiting_for_host() == backlog - 2,
                "the runs past the host's calls to wait for it")
    assert n1.dispatcher.waiting() == 0 and n1.dispatcher.calls_waiting() == backlog - 2
    n1.http_executor.release.set()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every finish to be applied")
    assert sorted(calls.values()) == [1] * backlog
    assert n1.reporter.held_total >= backlog - 2
    assert waiting_at_finish and set(waiting_at_finish) == {0}


class RefusingReporter(Reporter):
    """Answers the first `refusals` finishes as not applied (a batch apply
    refused, say), then applies each at once; counts every send."""

    def __init__(self, cluster: Cluster, refusals: int) -> None:
        super().__init__(cluster)
        self.refusals, self.sent = refusals, 0

    def send(self, update, tenant: str = "", cost: int = 1, hold: bool = False) -> asyncio.Future:
        self.sent += 1
        if self.sent <= self.refusals:
            future = asyncio.get_running_loop().create_future()
            future.set_result(False)
            return future
        return super().send(update, tenant, cost, hold)


async def test_a_finish_not_applied_is_sent_again_and_its_attempt_settles_once_it_is(
        cluster, monkeypatch):
    monkeypatch.setattr(limits, "finish_resend_s", 0.01)
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    n1.reporter = RefusingReporter(cluster, refusals=2)
    make_job(cluster)
    n1.renew()
    start(n1)
    (run_id,) = fire(cluster, "n1", 1)
    await until(lambda: state(cluster, run_id) == "succeeded", "the run to succeed")
    assert n1.reporter.sent == 3 and calls == {("n1", run_id): 1}
    await until(lambda: not n1.dispatcher._active, "the attempt to settle")


@pytest.mark.parametrize("moved_at", [1, 2])
async def test_a_finish_not_applied_for_a_run_no_longer_held_is_not_sent_again(
        cluster, monkeypatch, moved_at):
    """Refused as it is sent the first time, or the second (after a refusal
    while still held): no more is sent, and the attempt settles."""
    monkeypatch.setattr(limits, "finish_resend_s", 0.01)
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    reporter = n1.reporter = RefusingReporter(cluster, refusals=100)
    refuse = reporter.send

    def moved_on(update, tenant: str = "", cost: int = 1, hold: bool = False):
        if reporter.sent + 1 == moved_at:
            # The run is cancelled as its finish is sent: the finish is
            # refused, and nothing is left to report.
            assert cluster.run(commands.cancel_run(run_id=update.run_id, reason="test",
                                                   at_ms=n1.clock_ms))["ok"]
        return refuse(update, tenant, cost, hold)

    reporter.send = moved_on
    make_job(cluster)
    n1.renew()
    start(n1)
    (run_id,) = fire(cluster, "n1", 1)
    await until(lambda: state(cluster, run_id) == "cancelled", "the run to be cancelled")
    await until(lambda: not n1.dispatcher._active, "the attempt to settle")
    await asyncio.sleep(5 * limits.finish_resend_s)
    assert reporter.sent == moved_at and calls == {("n1", run_id): 1}


async def test_a_retry_queued_before_its_failed_attempts_finish_settled_is_called(cluster):
    """The finish of a failed attempt may bring its retry back to the same
    node (fired ahead as soon as it is due) before the dispatcher has done
    with that finish: the retry is a new attempt of the same run, and is
    called, not taken for the attempt still settling."""
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    outcomes = [Outcome(ok=False, retryable=True, http_status=500, error="HTTP 500")]
    executor_run = n1.http_executor.run

    async def run_once_failing(attempt, target: dict, deadline_ms: int) -> Outcome:
        outcome = await executor_run(attempt, target, deadline_ms)
        return outcomes.pop() if outcomes else outcome

    n1.http_executor.run = run_once_failing
    report = n1.reporter.send

    def send_then_fire_the_retry(update, tenant: str = "", cost: int = 1,
                                 hold: bool = False) -> asyncio.Future:
        applied = report(update, tenant, cost)   # applied at once
        # ... and its answer back a little later, after the retry's fire below.
        answered = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.05, answered.set_result, applied.result())
        run = cluster.get_run(update.run_id)
        if run["retry_due_ms"] is not None:
            # The retry fired right after the finish was applied, as a trigger
            # pass may fire it (its delay is short), before the answer is back.
            n1.clock_ms = max(n1.clock_ms, run["retry_due_ms"])
            token = cluster.store.get("shards", keys.shard_key(SHARD))["token"]
            fired = cluster.run(commands.fire(
                shard=SHARD, token=token, upto_ms=run["retry_due_ms"], node="n1",
                at_ms=run["retry_due_ms"], items=[],
                retries=[(run["id"], run["retry_due_ms"])]))
            assert fired["ok"], fired
        return answered

    n1.reporter.send = send_then_fire_the_retry
    make_job(cluster)
    n1.renew()
    start(n1)
    (run_id,) = fire(cluster, "n1", 1)
    await until(lambda: state(cluster, run_id) == "succeeded", "the retry to be called")
    assert calls == {("n1", run_id): 2}
    assert cluster.get_run(run_id)["attempt"] == 2


async def test_a_node_whose_shard_lease_is_past_does_not_call(cluster):
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    # Frozen: its monotonic clock moved past its lease, no renewal applied since.
    n1.mono_s += limits.node_lease_s
    assert not n1.coordinator.shard_lease_valid()
    start(n1)
    (run_id,) = fire(cluster, "n1", 1)
    await asyncio.sleep(0.3)   # the call step would have run by now: none may
    assert calls == {}
    assert state(cluster, run_id) == "running"
    # Its shard moved meanwhile: when its renewal comes through it drops the run.
    n2 = FakeNode(cluster, "n2", calls)
    n2.renew()
    start(n2)
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=AT_MS + 2000))
    n1.renew()
    await until(lambda: n1.dispatcher.not_called_total == 1, "n1 to drop the run")
    n2.mono_s += limits.take_over_grace_s
    n2.renew()   # n2 renewed all along
    await n2.dispatcher.take_over_pending()
    await until(lambda: state(cluster, run_id) == "succeeded", "the new owner's call")
    assert calls == {("n2", run_id): 1}
    assert n1.dispatcher.not_called_total == 1


async def test_a_dead_holders_runs_are_taken_over_at_once_without_the_grace(cluster):
    """A holder that stopped renewing while the others went on is dead to
    the new owner: its runs are taken over when the shard is gained, not
    take_over_grace_s later."""
    calls: collections.Counter = collections.Counter()
    n1, n2 = FakeNode(cluster, "n1", calls), FakeNode(cluster, "n2", calls)
    make_job(cluster)
    for node in (n1, n2):
        node.renew()
    n1.http_executor.release.clear()   # n1 dies calling
    start(n1)
    start(n2)
    run_ids = fire(cluster, "n1", limits.runs_inflight_max)
    await until(lambda: len(calls) == limits.runs_inflight_max, "n1's calls")
    # n2 renews on, a lease and its margin later by the cluster's time; n1 does not.
    n2.clock_ms += int((limits.node_lease_s + limits.shard_lease_margin_s) * 1000)
    n2.renew()
    assert n2.coordinator.live_nodes() == ["n2"]
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=n2.clock_ms))
    await n2.dispatcher.take_over_pending()   # no time has passed: within the grace
    assert take_overs(cluster) == 1
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "n2 to call every run")
    for run_id in run_ids:
        assert (cluster.get_run(run_id)["attempt"], calls[("n2", run_id)]) == (2, 1)


async def test_a_holder_that_dies_after_its_shard_moved_is_taken_over_within_the_grace(cluster):
    """Liveness is judged again within the grace: a holder alive when its
    shard moved, whose renewals stop then, has its runs taken over once it
    lapses, not take_over_grace_s after the move."""
    calls, n1, n2, run_ids = await moved_while_calling(cluster, waiting=0)
    await n2.dispatcher.take_over_pending()
    assert take_overs(cluster) == 0   # n1 renewed as recently as n2
    n2.clock_ms += int((limits.node_lease_s + limits.shard_lease_margin_s) * 1000)
    n2.renew()   # n2 renews on; n1 does not
    assert n2.coordinator.live_nodes() == ["n2"]
    await n2.dispatcher.take_over_pending()   # no monotonic time passed: in the grace
    assert take_overs(cluster) == 1
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "n2 to call every run")
    assert all(cluster.get_run(r)["attempt"] == 2 for r in run_ids)


async def test_a_live_holders_runs_are_taken_over_after_the_grace_and_its_late_finish_refused(
        cluster):
    calls: collections.Counter = collections.Counter()
    n1, n2 = FakeNode(cluster, "n1", calls), FakeNode(cluster, "n2", calls)
    make_job(cluster)
    for node in (n1, n2):
        node.renew()
    n1.http_executor.release.clear()   # n1's calls never answer: it died calling
    start(n1)
    start(n2)
    run_ids = fire(cluster, "n1", limits.runs_inflight_max + 3)
    await until(lambda: len(calls) == limits.runs_inflight_max, "n1's calls")
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=AT_MS + 5000))
    # Not before the grace: n1 renewed as recently as n2, so its finishes may
    # be on their way.
    await n2.dispatcher.take_over_pending()
    assert take_overs(cluster) == 0
    n2.mono_s += limits.take_over_grace_s
    n2.renew()   # n2 renewed all along
    await n2.dispatcher.take_over_pending()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "n2 to call every run")
    # Each run taken over once: its next attempt, called once by n2; the three
    # n1 had not called yet it never calls.
    assert take_overs(cluster) == 1
    for run_id in run_ids:
        run = cluster.get_run(run_id)
        assert (run["attempt"], run["redeliveries"]) == (2, 1)
        assert calls[("n2", run_id)] == 1
    assert sum(1 for node, _ in calls if node == "n1") == limits.runs_inflight_max
    assert n1.dispatcher.cancelled_total == limits.runs_inflight_max
    # n1's late finish of attempt 1 is refused.
    late = commands.run_finish(run_id=run_ids[0], holder="n1", attempt=1, at_ms=AT_MS + 6000,
                               ok=True)
    assert cluster.run(commands.run_updates(updates=[late]))["accepted"] == [False]


async def test_a_nodes_own_runs_under_an_older_token_are_taken_over_and_its_current_ones_not(
        cluster):
    """A shard that comes back to its owner (a new token) leaves the runs it
    held under the old token to be taken over, by itself, after the grace;
    the runs it holds under the new token are its own and stay as they are."""
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    make_job(cluster)
    n1.renew()
    n1.http_executor.release.clear()   # its calls hang
    start(n1)
    older = fire(cluster, "n1", 2)
    await until(lambda: len(calls) == 2, "n1's calls")
    # Away (to a node that never takes it over) and back.
    for owner in ("n2", "n1"):
        cluster.run(commands.assign_shards(assignments=[(SHARD, owner)], at_ms=AT_MS + 4000))
    token = cluster.store.get("shards", keys.shard_key(SHARD))["token"]
    assert token == 3
    # Two more under the new token, which the takeover must leave alone.
    cluster.run(commands.fire(
        shard=SHARD, token=token, upto_ms=AT_MS + 6000, node="n1", at_ms=AT_MS + 6000,
        items=[(JOB, AT_MS + 4000, AT_MS + 8000, [AT_MS + 4000, AT_MS + 6000], False)]))
    newer = [keys.run_id(JOB, AT_MS + 4000), keys.run_id(JOB, AT_MS + 6000)]
    assert all(cluster.get_run(r)["token"] == token for r in newer)
    n1.mono_s += limits.take_over_grace_s
    n1.renew()
    await n1.dispatcher.take_over_pending()
    assert take_overs(cluster) == 1 and sorted(cluster.taken_ids) == sorted(older)
    assert [cluster.get_run(r)["attempt"] for r in older + newer] == [2, 2, 1, 1]
    assert all(cluster.get_run(r)["token"] == token for r in older + newer)


async def moved_while_calling(cluster: Cluster, waiting: int = 3
                              ) -> tuple[collections.Counter, "FakeNode", "FakeNode", list[str]]:
    """n1 holds a backlog (`waiting` runs beyond its call slots) and is
    calling as many as it may when its shard moves to n2, both alive and
    renewing so far: (calls, n1, n2, the run ids)."""
    calls: collections.Counter = collections.Counter()
    n1, n2 = FakeNode(cluster, "n1", calls), FakeNode(cluster, "n2", calls)
    make_job(cluster)
    for node in (n1, n2):
        node.renew()
    n1.http_executor.release.clear()   # n1 is calling when its shard moves
    start(n1)
    start(n2)
    run_ids = fire(cluster, "n1", limits.runs_inflight_max + waiting)
    await until(lambda: len(calls) == limits.runs_inflight_max, "n1's calls")
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=AT_MS + 5000))
    return calls, n1, n2, run_ids


async def test_a_live_holders_calls_are_not_repeated_when_its_shard_moves(cluster):
    calls, n1, n2, run_ids = await moved_while_calling(cluster)
    n1.http_executor.release.set()   # its calls end and their finishes land in the grace
    called = [r for r in run_ids if ("n1", r) in calls]
    await until(lambda: all(state(cluster, r) == "succeeded" for r in called)
                and n1.dispatcher.not_called_total >= 3, "n1 to finish its calls, drop the rest")
    n2.mono_s += limits.take_over_grace_s
    n2.renew()   # n2 renewed all along
    await n2.dispatcher.take_over_pending()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every run to succeed")
    assert sorted(calls.values()) == [1] * len(run_ids)   # no occurrence called twice
    assert sorted(node for node, _ in calls) == ["n1"] * limits.runs_inflight_max + ["n2"] * 3


async def test_a_live_former_holder_hands_over_the_runs_it_did_not_call(cluster):
    """The runs a live node held in a shard it lost and did not call are
    taken over by the new owner at once, at the former holder's word,
    instead of after take_over_grace_s."""
    calls, n1, n2, run_ids = await moved_while_calling(cluster)
    n1.http_executor.release.set()
    # No clock moves: n2's grace never ends in this test.
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every run to succeed within n2's grace")
    assert n1.dispatcher.handed_over_total == 3
    assert sorted(calls.values()) == [1] * len(run_ids)
    assert sorted(node for node, _ in calls) == ["n1"] * limits.runs_inflight_max + ["n2"] * 3
    # Not called by n1, so not a failed attempt: n2 calls each as attempt 1.
    handed = [cluster.get_run(r) for r in run_ids if ("n2", r) in calls]
    assert [(run["attempt"], run.get("redeliveries", 0)) for run in handed] == [(1, 0)] * 3
    assert all(run["attempts"][0]["holder"] == "n2" for run in handed)


async def test_a_live_holder_hands_its_armed_runs_over_when_its_shard_moves(cluster):
    """An armed run due too soon for the new owner to take it over itself
    (within take_over_armed_margin_ms) is handed over by its live former
    holder as soon as the shard moves, not at its second, and is called once,
    by the new owner, as attempt 1."""
    calls: collections.Counter = collections.Counter()
    n1, n2 = FakeNode(cluster, "n1", calls), FakeNode(cluster, "n2", calls)
    make_job(cluster)
    armed_at = AT_MS - limits.take_over_armed_margin_ms // 2
    for node in (n1, n2):
        node.clock_ms = armed_at
        node.renew()
        start(node)
        node.supervisor.start("armed", node.armed.run)
    token = cluster.store.get("shards", keys.shard_key(SHARD))["token"]
    assert cluster.run(commands.fire(shard=SHARD, token=token, upto_ms=AT_MS, node="n1",
                                     at_ms=armed_at,
                                     items=[(JOB, AT_MS, AT_MS + 2000, [AT_MS], False)]
                                     ))["fired"] == 1
    run_id = keys.run_id(JOB, AT_MS)
    assert len(n1.armed) == 1
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=armed_at + 1))
    # Before its second: n1 hands it over, and n2 holds it armed.
    await until(lambda: cluster.get_run(run_id)["holder"] == "n2", "n1's hand-over")
    assert cluster.tags["hand_over_runs"] == 1 and len(n1.armed) == 0 and len(n2.armed) == 1
    for node in (n1, n2):
        node.clock_ms = AT_MS
    await until(lambda: state(cluster, run_id) == "succeeded", "n2's call at its second")
    run = cluster.get_run(run_id)
    assert (run["attempt"], run.get("redeliveries", 0)) == (1, 0)
    assert dict(calls) == {("n2", run_id): 1}


async def test_a_hand_over_larger_than_an_entry_goes_in_several(cluster, monkeypatch):
    """Every run a node hands over goes, take_over_batch_max to an entry;
    none is left to the grace (and a next attempt)."""
    monkeypatch.setattr(limits, "take_over_batch_max", 2)
    calls, n1, n2, run_ids = await moved_while_calling(cluster)
    waiting = [r for r in run_ids if ("n1", r) not in calls]
    assert len(waiting) == 3
    for run_id in waiting:   # as n1 finds each, before a call (or at the move)
        n1.dispatcher._hand_over(SHARD, run_id)
    assert n1.dispatcher.handing_over() == 3
    await n1.dispatcher.hand_over_pending()
    assert cluster.tags["hand_over_runs"] == 2
    assert [cluster.get_run(r)["holder"] for r in waiting] == ["n2"] * 3
    n1.http_executor.release.set()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every run to succeed within n2's grace")
    assert all(cluster.get_run(r)["attempt"] == 1 for r in run_ids)


async def test_while_an_older_node_is_in_the_cluster_a_hand_over_is_a_take_over(cluster):
    """A node of an earlier release would stop on hand_over_runs: until
    every node says it applies it, the runs go as that release sent them,
    as next attempts."""
    calls, n1, n2, run_ids = await moved_while_calling(cluster)
    n1.applies = commands.APPLY_LEVEL_UNSAID
    n1.http_executor.release.set()
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                "every run to succeed within n2's grace")
    assert cluster.tags["hand_over_runs"] == 0 and take_overs(cluster) >= 1
    assert sorted(cluster.get_run(r)["attempt"] for r in run_ids) == \
        [1] * limits.runs_inflight_max + [2] * 3


async def test_shards_are_taken_over_at_once_up_to_a_bound(monkeypatch):
    """A node that gains many shards proposes their take-overs together (each
    its own entry), take_over_shards_at_once at a time, and a failure of one
    is raised once all have ended."""
    from raftsched.runtime.dispatcher import _each

    monkeypatch.setattr(limits, "take_over_shards_at_once", 4)
    running, most, done = 0, 0, []

    async def work(shard: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        done.append(shard)
        if shard == 3:
            raise RuntimeError("shard 3")

    with pytest.raises(RuntimeError, match="shard 3"):
        await _each(list(range(10)), work)
    assert most == 4 and sorted(done) == list(range(10))


async def test_a_hand_over_on_its_way_through_the_log_is_still_being_handed_over(cluster):
    """A draining node stops only once its hand-overs are committed: until
    then they count as runs it has yet to hand over."""
    calls, n1, n2, run_ids = await moved_while_calling(cluster)
    waiting = [r for r in run_ids if ("n1", r) not in calls]
    gate, propose = asyncio.Event(), n1.propose

    async def slow_propose(command) -> dict:
        await gate.wait()
        return await propose(command)

    n1.propose = slow_propose
    for run_id in waiting:
        n1.dispatcher._hand_over(SHARD, run_id)
    sending = asyncio.ensure_future(n1.dispatcher.hand_over_pending())
    await asyncio.sleep(0.01)
    assert n1.dispatcher.handing_over() == 3   # proposed, not answered
    gate.set()
    await sending
    assert n1.dispatcher.handing_over() == 0
    assert [cluster.get_run(r)["holder"] for r in waiting] == ["n2"] * 3
    n1.http_executor.release.set()


# --- runs armed before a stop, due while the node was down -------------------------------

def arm_three(cluster: Cluster) -> list[str]:
    """Three occurrences of the job (every 2 s from AT_MS) fired ahead by n1,
    as a node does before its stop; its next one, AT_MS + 6 s, not fired."""
    make_job(cluster, misfire="fire_once")
    token = cluster.store.get("shards", keys.shard_key(SHARD))["token"]
    for i in range(3):
        due = AT_MS + 2000 * i
        result = cluster.run(commands.fire(shard=SHARD, token=token, upto_ms=AT_MS - 20_000,
                                           node="n1", at_ms=AT_MS - 20_000,
                                           items=[(JOB, due, due + 2000, [due], False)]))
        assert result["fired"] == 1, result
    return [keys.run_id(JOB, AT_MS + 2000 * i) for i in range(3)]


def restarted_n1(cluster: Cluster, calls: collections.Counter, tmp_path,
                 horizon_ms: int | None) -> FakeNode:
    """n1 started again at AT_MS + 5 s, its data folder's call horizon at
    `horizon_ms` (None: no file, as a folder from an earlier release)."""
    if horizon_ms is not None:
        (tmp_path / HORIZON_FILE).write_bytes(horizon_ms.to_bytes(8, "big", signed=True))
    n1 = FakeNode(cluster, "n1", calls, horizon=CallHorizon(str(tmp_path)))
    n1.clock_ms = AT_MS + 5000
    return n1


async def test_runs_armed_before_a_stop_and_never_called_are_judged_by_their_misfire_policy(
        cluster, tmp_path):
    """fire_once: of the three due while n1 was down, the latest is called
    late, once; the others end missed, uncalled."""
    run_ids = arm_three(cluster)
    calls: collections.Counter = collections.Counter()
    n1 = restarted_n1(cluster, calls, tmp_path, horizon_ms=AT_MS - 1)
    n1.renew()
    start(n1)
    await until(lambda: state(cluster, run_ids[2]) == "succeeded", "the latest to succeed")
    assert [state(cluster, run_id) for run_id in run_ids] == ["missed", "missed", "succeeded"]
    assert calls == {("n1", run_ids[2]): 1}
    assert cluster.tags["miss_uncalled"] == 1 and n1.dispatcher.missed_uncalled_total == 2
    # The call pushed the horizon past its due time first.
    assert CallHorizon(str(tmp_path)).previous_ms == AT_MS + 4000 + limits.call_horizon_step_ms


async def test_a_run_due_before_the_horizon_may_have_been_called_and_is_called_again(
        cluster, tmp_path):
    run_ids = arm_three(cluster)
    calls: collections.Counter = collections.Counter()
    n1 = restarted_n1(cluster, calls, tmp_path, horizon_ms=AT_MS + 1000)
    n1.renew()
    start(n1)
    await until(lambda: state(cluster, run_ids[2]) == "succeeded", "the latest to succeed")
    await until(lambda: state(cluster, run_ids[0]) == "succeeded", "the first to succeed")
    assert [state(cluster, run_id) for run_id in run_ids] == ["succeeded", "missed", "succeeded"]
    assert calls == {("n1", run_ids[0]): 1, ("n1", run_ids[2]): 1}


@pytest.mark.parametrize("horizon_ms, applies", [(None, commands.APPLY_LEVEL),
                                                 (AT_MS - 1, 2)])
async def test_with_no_horizon_or_an_older_node_each_is_called_late(
        cluster, tmp_path, monkeypatch, horizon_ms, applies):
    """A folder with no horizon says nothing; a node of an earlier release
    would stop on miss_uncalled. Either way each run is called, late."""
    monkeypatch.setattr(limits, "uncalled_level_wait_s", 0.0)
    run_ids = arm_three(cluster)
    calls: collections.Counter = collections.Counter()
    n1 = restarted_n1(cluster, calls, tmp_path, horizon_ms=horizon_ms)
    n1.applies = applies
    n1.renew()
    start(n1)
    await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids), "every call")
    assert calls == {("n1", run_id): 1 for run_id in run_ids}
    assert cluster.tags["miss_uncalled"] == 0


async def test_a_run_its_node_may_have_called_before_a_restart_is_not_handed_over_uncalled(
        cluster, tmp_path, monkeypatch):
    """Due by the call horizon its node had before the restart, a run may
    have been called then: when its shard moves before the node calls it
    again, it is not handed over as the same attempt (the new owner takes it
    over as its next one after the grace)."""
    # n1 never renews here: it looks for the move after each lease's length.
    monkeypatch.setattr(limits, "node_lease_s", 0.1)
    run_ids = arm_three(cluster)
    calls: collections.Counter = collections.Counter()
    n1 = restarted_n1(cluster, calls, tmp_path, horizon_ms=AT_MS + 10_000)
    start(n1)   # no renewal yet: it waits for its shard lease before any call
    await until(lambda: all(n1.dispatcher.maybe_called_before_start(cluster.get_run(r))
                            for r in run_ids), "the resumed runs to be marked")
    n2 = FakeNode(cluster, "n2", calls)
    n2.renew()
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=AT_MS + 5001))
    await until(lambda: n1.dispatcher.not_called_total == 3, "n1 to drop the runs", 5)
    await asyncio.sleep(0)   # a hand-over would be proposed on the takeover loop's turn
    assert cluster.tags["hand_over_runs"] == 0 and not calls
    assert [cluster.get_run(r)["holder"] for r in run_ids] == ["n1"] * 3


@pytest.mark.parametrize("level", [RECORDED_RENEWAL_LEVEL, RECORDED_RENEWAL_LEVEL - 1])
async def test_runs_a_dead_holder_armed_past_its_lease_are_judged_by_their_misfire_policy(
        cluster, level):
    """n1 armed three occurrences and stopped renewing long before they were
    due, so its shard lease ended before any of them: it called none. Its
    shard's new owner, once they are all late, judges them as n1 would have
    at a restart (fire_once: the latest called, as its first attempt, the
    others missed). Before every node records renewals (level 3), each is
    called again as its next attempt, as it may have been called."""
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    n1.applies = level
    run_ids = arm_three(cluster)
    n1.clock_ms = AT_MS - 20_000
    n1.renew()   # its last: its lease ended 1.5 s later, 18.5 s before the first was due
    n2 = FakeNode(cluster, "n2", calls)
    n2.applies = level
    n2.clock_ms = AT_MS + 5000
    n2.renew()
    assert n2.coordinator.live_nodes() == ["n2"]
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=n2.clock_ms))
    start(n2)
    await n2.dispatcher.take_over_pending()   # n1 is judged dead: at once
    if level >= RECORDED_RENEWAL_LEVEL:
        await until(lambda: state(cluster, run_ids[2]) == "succeeded", "the latest to succeed")
        assert [state(cluster, r) for r in run_ids] == ["missed", "missed", "succeeded"]
        assert calls == {("n2", run_ids[2]): 1}
        assert cluster.get_run(run_ids[2])["attempt"] == 1
        assert "node n1 held no shard lease after" in cluster.get_run(run_ids[0])["reason"]
        assert n2.dispatcher.missed_uncalled_total == 2
    else:
        await until(lambda: all(state(cluster, r) == "succeeded" for r in run_ids),
                    "every run to succeed")
        assert calls == {("n2", r): 1 for r in run_ids}
        assert [cluster.get_run(r)["attempt"] for r in run_ids] == [2, 2, 2]


async def test_runs_due_before_a_dead_holders_lease_ended_are_called_again_as_next_attempts(
        cluster):
    """n1's lease covered the first occurrence's second (it renewed 1 s
    before): it may have called it, so the new owner calls it again as its
    next attempt; the two due after the lease ended were never called and
    are judged (fire_once: the later called as its first attempt)."""
    calls: collections.Counter = collections.Counter()
    n1 = FakeNode(cluster, "n1", calls)
    run_ids = arm_three(cluster)
    n1.clock_ms = AT_MS - 1000
    n1.renew()   # its lease ends at AT_MS + 500: after the first second, before the others
    n2 = FakeNode(cluster, "n2", calls)
    n2.clock_ms = AT_MS + 5000
    n2.renew()
    cluster.run(commands.assign_shards(assignments=[(SHARD, "n2")], at_ms=n2.clock_ms))
    start(n2)
    await n2.dispatcher.take_over_pending()
    await until(lambda: state(cluster, run_ids[0]) == "succeeded"
                and state(cluster, run_ids[2]) == "succeeded", "two calls")
    assert [state(cluster, r) for r in run_ids] == ["succeeded", "missed", "succeeded"]
    assert [cluster.get_run(r)["attempt"] for r in run_ids] == [2, 1, 1]
    assert calls == {("n2", run_ids[0]): 1, ("n2", run_ids[2]): 1}
