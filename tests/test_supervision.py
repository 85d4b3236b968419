"""No background task dies silently: a fault in any loop or one-shot task of a
node is logged with its traceback and counted, and the loop goes on; a loop
that cannot go on stops the process."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

import pytest

from raftsched import limits
from raftsched.core import commands
from raftsched.executors.command import CommandExecutor
from raftsched.replication.raft import Replicator
from raftsched.runtime.backfiller import Backfiller
from raftsched.runtime.clock import ClusterClock
from raftsched.runtime.armed import ArmedRuns
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.dispatcher import Dispatcher
from raftsched.runtime.node import EXIT_INVARIANT, Node, NodeConfig
from raftsched.runtime.purger import Purger
from raftsched.runtime.reaper import Reaper
from raftsched.runtime.remote_worker import RemoteWorker
from raftsched.runtime.reporter import Reporter
from raftsched.runtime.storage_guard import StorageGuard
from raftsched.runtime.supervise import EXIT_TASK_FAILED, Supervisor
from raftsched.runtime.trigger import TriggerLoop
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.output_store import OutputStore
from raftsched.server import app_for
from raftsched.testing.cluster import free_ports
from raftsched.testing.http import ADMIN_TOKEN, call
from raftsched.testing.sink import Sink


class Injected(RuntimeError):
    """The fault a test injects; nothing else raises it."""


def fail_once(where: str, real, when=lambda *args: True):
    """A stand-in for `real` that raises Injected on its first call for which
    `when(*args)` holds, and delegates otherwise; `.calls` counts every call."""
    state = {"failed": False}

    def stand_in(*args, **kwargs):
        stand_in.calls += 1
        if not state["failed"] and when(*args):
            state["failed"] = True
            stand_in.failed_at = stand_in.calls
            raise Injected(f"injected fault in {where}")
        return real(*args, **kwargs)

    stand_in.calls = 0
    stand_in.failed_at = None
    return stand_in


async def until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.02)
    return value


def tracebacks_of(caplog, name: str) -> list[logging.LogRecord]:
    """Records that name the task and carry the injected fault's traceback."""
    return [r for r in caplog.records if f"task {name} " in r.getMessage() + " "
            and r.exc_info and isinstance(r.exc_info[1], Injected)]


# --- the supervisor alone ------------------------------------------------------------------

def quick(exits: list, **over) -> Supervisor:
    options = dict(exit_hook=exits.append, backoff_s_min=0.01, backoff_s_max=0.04,
                   failures_max=5, healthy_run_s=60.0)
    options.update(over)
    return Supervisor("test", **options)


async def test_a_failed_loop_is_logged_counted_and_started_again(caplog):
    exits: list[int] = []
    supervisor = quick(exits)
    passes = []

    async def loop() -> None:
        passes.append(time.monotonic())
        if len(passes) == 1:
            raise Injected("injected fault in pass 1")
        await asyncio.Event().wait()

    supervisor.start("looper", loop)
    await until(lambda: len(passes) == 2, 5, "the loop to run again")
    assert supervisor.failures == {"looper": 1}
    [record] = tracebacks_of(caplog, "looper")
    assert record.levelno == logging.ERROR
    assert "Traceback" in caplog.text
    await supervisor.stop()
    assert exits == []


async def test_the_backoff_doubles_up_to_its_bound_and_the_limit_exits(caplog):
    exits: list[int] = []
    supervisor = quick(exits)

    async def loop() -> None:
        raise Injected("injected fault, every time")

    task = supervisor.start("hot", loop)
    await until(lambda: exits, 5, "the exit hook")
    await task
    assert exits == [EXIT_TASK_FAILED]
    assert supervisor.failures == {"hot": 5}
    waits = [r.args[-1] for r in caplog.records if r.getMessage().startswith("test: task hot")]
    assert waits == [0.01, 0.02, 0.04, 0.04]
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1
    assert "stopping test: task hot failed 5 times in a row" in critical[0].getMessage()
    assert isinstance(critical[0].exc_info[1], Injected)


async def test_a_loop_that_ran_long_enough_starts_its_count_afresh():
    exits: list[int] = []
    supervisor = quick(exits, failures_max=2, healthy_run_s=0.05)
    failed = []

    async def loop() -> None:
        await asyncio.sleep(0.06)   # longer than healthy_run_s
        failed.append(1)
        raise Injected("injected fault after a healthy run")

    supervisor.start("slow", loop)
    await until(lambda: len(failed) >= 4, 5, "four failures")
    assert exits == []
    await supervisor.stop()


async def test_a_loop_that_ends_stops_the_process_unless_it_is_finite(caplog):
    exits: list[int] = []
    supervisor = quick(exits)

    async def done() -> None:
        return None

    await supervisor.start("once", done, finite=True)
    assert exits == []
    await supervisor.start("forever", done)
    assert exits == [EXIT_TASK_FAILED]
    assert "task forever returned, but it must run until the process stops" in caplog.text


async def test_a_stray_cancellation_inside_a_loop_is_a_failure():
    exits: list[int] = []
    supervisor = quick(exits)
    passes = []

    async def loop() -> None:
        passes.append(1)
        if len(passes) == 1:
            raise asyncio.CancelledError()   # e.g. from a future someone else cancelled
        await asyncio.Event().wait()

    supervisor.start("stray", loop)
    await until(lambda: len(passes) == 2, 5, "the loop to run again")
    assert supervisor.failures == {"stray": 1}
    await supervisor.stop()
    assert exits == []


async def test_a_failed_one_shot_task_is_logged_and_counted(caplog):
    supervisor = quick([])

    async def boom() -> None:
        raise Injected("injected fault in a one-shot task")

    async def fine() -> None:
        return None

    await asyncio.gather(supervisor.spawn("shot", boom()), supervisor.spawn("shot", fine()),
                         return_exceptions=True)
    await asyncio.sleep(0)   # done callbacks run on the next loop pass
    assert supervisor.failures == {"shot": 1}
    assert len(tracebacks_of(caplog, "shot")) == 1


async def test_stop_cancels_every_loop_even_one_waiting_to_restart():
    exits: list[int] = []
    supervisor = quick(exits, backoff_s_min=30.0, backoff_s_max=30.0)
    failed = asyncio.Event()

    async def failing() -> None:
        failed.set()
        raise Injected("injected fault before a long backoff")

    async def idle() -> None:
        await asyncio.Event().wait()

    tasks = [supervisor.start("failing", failing), supervisor.start("idle", idle),
             supervisor.spawn("shot", idle())]
    await failed.wait()
    await asyncio.wait_for(supervisor.stop(), 2)
    assert all(t.done() for t in tasks)
    assert exits == []
    assert supervisor.failures == {"failing": 1, "idle": 0}


async def test_a_task_spawned_once_stop_has_begun_never_starts():
    """A task that stop is ending may spawn another in its cleanup (the
    dispatcher hands a host's freed call to the next run waiting for it): that
    one must not run on past the stop."""
    supervisor = quick([])
    began: list[str] = []
    spawned: list[asyncio.Task] = []

    async def work(name: str) -> None:
        began.append(name)
        await asyncio.Event().wait()

    async def ending() -> None:
        try:
            await work("first")
        finally:
            spawned.append(supervisor.spawn("next", work("next")))

    first = supervisor.spawn("first", ending())
    await asyncio.sleep(0)
    await asyncio.wait_for(supervisor.stop(), 2)
    await asyncio.sleep(0)
    assert first.cancelled() and len(spawned) == 1 and spawned[0].cancelled()
    assert began == ["first"]


async def test_stop_cancels_again_a_loop_that_lost_its_cancellation():
    # Before Python 3.12, asyncio.wait_for may drop a cancellation that arrives
    # as the future it waits for completes; the loop then goes on.
    supervisor = quick([])
    lost = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(1)

    task = supervisor.start("stubborn", loop)
    await asyncio.sleep(0)
    await asyncio.wait_for(supervisor.stop(), 2)
    assert task.cancelled()
    assert lost == [1]


# --- every loop of a real node -------------------------------------------------------------

# Loop name -> (owner, method): one method the loop calls on every pass (or,
# for register, on its one pass). Patched on the class, so the node built by
# the fixture uses the stand-in.
LOOP_FAULTS = {
    "trigger": (TriggerLoop, "maybe_fire_due"),
    "armed": (ArmedRuns, "take_due"),
    "dispatcher": (Dispatcher, "_resume_open_runs"),
    "dispatcher.takeover": (Dispatcher, "take_over_pending"),
    "reporter": (Reporter, "_take_batch"),
    "reaper": (Reaper, "maybe_expire_leases"),
    "coordinator": (Coordinator, "maybe_rebalance"),
    "renew": (commands, "renew"),
    "register": (commands, "register_node"),
    "sync": (LmdbStore, "sync"),
    "prune_outputs": (OutputStore, "prune"),
    "purger": (Purger, "maybe_purge"),
    "storage": (StorageGuard, "check"),
    "clock": (ClusterClock, "measure_round"),
    "backfiller": (Backfiller, "maybe_step"),
}


def soon(seconds: float) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class InProcessNode:
    """One single-node cluster in this event loop, with a fast-restarting
    supervisor whose exit hook records instead of exiting."""

    def __init__(self, tmp_path, **supervisor_options) -> None:
        http_port, raft_port = free_ports(2)
        self.config = NodeConfig(
            node_id="n1", http_host="127.0.0.1", http_port=http_port,
            raft_addr=f"127.0.0.1:{raft_port}", peers=(), data_dir=str(tmp_path),
            raft_secret=None, run_lease_ms=1000, run_heartbeat_ms=200,
            max_data_bytes=256 * 1024 ** 2, min_free_disk_bytes=0,
            allow_target_cidrs=("127.0.0.0/8",),   # the sinks listen on loopback
            admin_token=ADMIN_TOKEN)               # what call() sends
        self.exits: list[int] = []
        self.supervisor_options = dict(exit_hook=self.exits.append, exit_code=EXIT_INVARIANT,
                                       backoff_s_min=0.01, backoff_s_max=0.05)
        self.supervisor_options.update(supervisor_options)
        self.node: Node | None = None

    async def start(self) -> Node:
        node = Node(self.config)
        node.supervisor = Supervisor("node n1", **self.supervisor_options)
        await node.start(app_for)
        self.node = node
        await until(node.replicator.is_leader, 20, "the single node to lead")
        return node

    async def api(self, method: str, path: str, body=None):
        return await asyncio.to_thread(call, method, self.config.http_url + path, body)

    async def create(self, body: dict) -> str:
        created = await self.api("POST", "/v1/jobs", body)
        assert created.status == 201, created
        return created.body["job_id"]

    async def run_of(self, job_id: str) -> dict | None:
        runs = (await self.api("GET", f"/v1/jobs/{job_id}/runs")).body["runs"]
        return runs[0] if runs else None

    async def wait_run(self, job_id: str, state: str, timeout_s: float = 20) -> dict:
        deadline = time.monotonic() + timeout_s
        while (run := await self.run_of(job_id)) is None or run["state"] != state:
            assert time.monotonic() < deadline, f"job {job_id}: no {state} run, last {run}"
            await asyncio.sleep(0.05)
        return run


@pytest.fixture
async def in_process(tmp_path, monkeypatch):
    # Short periods, so that the loops that pass rarely pass during the test.
    monkeypatch.setattr(limits, "store_sync_period_s", 0.05)
    monkeypatch.setattr(limits, "output_prune_period_s", 0.05)
    harness = InProcessNode(tmp_path)
    yield harness
    if harness.node is not None:
        node = harness.node
        await asyncio.wait_for(node.stop(), 10)
        assert all(task.done() for task in node.supervisor._loops.values())


async def test_a_fault_in_any_loop_of_a_node_is_logged_counted_and_the_loop_goes_on(
        in_process, monkeypatch, caplog):
    stand_ins = {}
    for name, (owner, method) in LOOP_FAULTS.items():
        stand_ins[name] = fail_once(name, getattr(owner, method))
        monkeypatch.setattr(owner, method, stand_ins[name])
    node = await in_process.start()
    with Sink() as sink:
        # End to end: fired, dispatched and reported by loops that all failed once.
        job_id = await in_process.create({"name": "after-faults", "run_at": soon(0.5),
                                          "target": {"type": "http", "url": sink.url}})
        await until(lambda: all(s.failed_at and s.calls > s.failed_at
                                for s in stand_ins.values()), 20,
                    "every faulted loop to pass again")
        await in_process.wait_run(job_id, "succeeded")
    for name, stand_in in stand_ins.items():
        assert stand_in.failed_at == 1, name
        assert stand_in.calls >= 2, name   # the loop called it again after the fault
        assert node.supervisor.failures[name] == 1, name
        assert len(tracebacks_of(caplog, name)) == 1, name
    status = (await in_process.api("GET", "/v1/node")).body
    assert status["task_failures"] == {name: 1 for name in LOOP_FAULTS}
    assert in_process.exits == []


def is_fire(replicator: Replicator, data: bytes, *args) -> bool:
    return commands.tag_of(commands.decode(data)) in ("fire", "fire_many")


async def test_a_fault_in_a_one_shot_task_is_logged_counted_and_the_work_is_done_again(
        in_process, monkeypatch, caplog):
    faults = {"trigger.send": fail_once("trigger.send", Replicator.propose_wait, when=is_fire),
              "dispatcher.attempt": fail_once("dispatcher.attempt", Dispatcher._call),
              "reaper.alert": fail_once("reaper.alert", Reaper._done)}
    monkeypatch.setattr(Replicator, "propose_wait", faults["trigger.send"])
    monkeypatch.setattr(Dispatcher, "_call", faults["dispatcher.attempt"])
    monkeypatch.setattr(Reaper, "_done", faults["reaper.alert"])
    await in_process.start()
    retry = {"max_attempts": 3, "base_s": 0.1, "max_s": 0.2}
    with Sink(status_for=lambda c: 500 if c.path.endswith("/fails") else 200) as sink:
        ok = await in_process.create({"name": "retried", "run_at": soon(0.5), "retry": retry,
                                      "target": {"type": "http", "url": sink.url + "/ok"}})
        bad = await in_process.create({"name": "alerted", "run_at": soon(0.5),
                                       "retry": dict(retry, max_attempts=1),
                                       "target": {"type": "http", "url": sink.url + "/fails"}})
        done = await in_process.wait_run(ok, "succeeded")
        failed = await in_process.wait_run(bad, "failed")
        await until(lambda: faults["reaper.alert"].calls >= 2, 10, "the alert to be retried")
        deadline = time.monotonic() + 10
        while (failed := await in_process.run_of(bad))["alert"] == "pending":
            # The retried outcome is proposed once the call above began: poll
            # until it is applied.
            assert time.monotonic() < deadline, failed
            await asyncio.sleep(0.05)
    # The attempt whose dispatcher task failed ended as a retryable failure
    # (the run is held under the node's shard lease, which did not lapse).
    assert len(done["attempts"]) == 2
    assert "dispatcher of node n1 failed" in done["attempts"][0]["error"]
    assert failed["alert"] == "no_webhook"
    for name in faults:
        assert in_process.node.supervisor.failures[name] == 1, name
        assert len(tracebacks_of(caplog, name)) == 1, name
    assert in_process.exits == []


async def test_a_node_loop_failing_past_the_limit_exits_the_node(tmp_path, monkeypatch, caplog):
    async def always(self) -> bool:
        raise Injected("injected fault in every coordinator pass")

    monkeypatch.setattr(Coordinator, "maybe_rebalance", always)
    harness = InProcessNode(tmp_path, failures_max=3)
    node = await harness.start()
    try:
        await until(lambda: harness.exits, 10, "the node's exit hook")
    finally:
        await node.stop()
    assert harness.exits == [EXIT_INVARIANT]
    assert node.supervisor.failures["coordinator"] == 3
    assert "stopping node n1: task coordinator failed 3 times in a row" in caplog.text


# --- the loops of a remote worker ----------------------------------------------------------

def assignment(run_id: str, script: str) -> dict:
    return {"run_id": run_id, "job_id": "job_1", "attempt": 1, "execution_id": "exe_1",
            "scheduled_ms": 0, "fencing_token": 1, "heartbeat_ms": 50,
            "target": {"type": "command", "argv": [script], "env": {}, "cwd": None,
                       "timeout_s": 10.0, "queue": "q", "shell": True,
                       "non_retryable_exit_codes": []}}


async def test_a_fault_in_any_loop_of_a_worker_is_logged_counted_and_the_loop_goes_on(
        monkeypatch, caplog):
    # The worker talks to a node through _post; this stand-in for the node
    # fails the first request of each loop, and hands out two runs: the first
    # one's execution fails (the executor raises), the second runs.
    requests = {"claim": 0, "heartbeat": 0, "complete": 0}
    to_claim = [assignment("run_a", "true"), assignment("run_b", "sleep 1.5")]
    completed: list[str] = []

    async def node(self, path: str, body: dict, timeout_s: float):
        kind = path.rsplit("/", 1)[1]
        requests[kind] += 1
        if requests[kind] == 1:
            raise Injected(f"injected fault in {kind}")
        if kind == "claim":
            await asyncio.sleep(0.02)
            return {"runs": [to_claim.pop(0)] if to_claim else []}
        if kind == "heartbeat":
            return {"lost": []}
        completed.extend(r["run_id"] for r in body["results"])
        return {"accepted": [True] * len(body["results"])}

    monkeypatch.setattr(RemoteWorker, "_post", node)
    executor = CommandExecutor()
    monkeypatch.setattr(executor, "run", fail_once("execute", executor.run))
    exits: list[int] = []
    worker = RemoteWorker(["http://127.0.0.1:9"], "q", 2, "w1", executor=executor,
                          supervisor=quick(exits))
    serving = asyncio.ensure_future(worker.run())
    try:
        await until(lambda: completed == ["run_b"] and requests["heartbeat"] >= 2, 10,
                    "run_b to be reported after every loop failed once")
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert worker.supervisor.failures == {"claim": 1, "heartbeat": 1, "report": 1,
                                          "execute": 1}
    for name in ("claim", "heartbeat", "report", "execute"):
        assert len(tracebacks_of(caplog, name)) == 1, name
    assert exits == []
