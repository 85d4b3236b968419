"""The dispatcher: execute the runs given to this node, under a lease.

Runs arrive as RunQueued effects from apply (on the loop thread): HTTP and
publish targets, and commands on the default queue (the node's embedded
worker, which runs them only under --allow-commands: without it, such a run
fails at once, not retried). For each run, up to `runs_inflight_max` at a time:

  1. if its tenant's circuit breaker for its target host is open, wait for the cool-off
     (the run stays queued: no attempt is spent on a host that is down);
  2. propose `start` (taking the lease: holder = this node, the attempt, an
     expiry `run_lease_ms` ahead) and go on only if apply accepted it;
  3. call the target, heartbeating every `run_heartbeat_ms`; a refused
     heartbeat (cancelled, or the lease expired and the run moved on) stops
     the call;
  4. keep the attempt's output in the node's output store and propose
     `finish`, with a retry delay drawn here when the failure is retryable.

Reports are batched by the Reporter (one Raft entry carries many runs). On
start-up the node resumes its queued runs and ends the attempts it held when
it stopped (they died with the process) as retryable failures, rather than
leaving them to the reaper.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from raftsched import limits
from raftsched.core import commands, cost, dag, keys, retry, tenancy
from raftsched.core.apply import JOBS, RUNS, RUNS_OPEN, TENANTS
from raftsched.core.redact import redact_output, redact_text, secret_values
from raftsched.errors import Unavailable
from raftsched.executors.base import Attempt, Outcome
from raftsched.runtime.fair import FairQueue

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.dispatch")


def attempt_of(run: dict) -> Attempt:
    return Attempt(run_id=run["id"], job_id=run["job_id"], execution_id=run["execution_id"],
                   scheduled_ms=run["scheduled_ms"], attempt=run["attempt"],
                   fencing_token=run.get("token", 0))


def finish_update(node: "Node", run: dict, holder: str, outcome: Outcome,
                  policy: dict) -> commands.RunFinish:
    """The finish report for an attempt; the proposer draws the retry delay."""
    return commands.run_finish(
        run_id=run["id"], holder=holder, attempt=run["attempt"], at_ms=node.now_ms(),
        ok=outcome.ok, retryable=outcome.retryable,
        retry_delay_ms=None if outcome.ok else
        retry.draw_delay_ms(policy, run["attempt"], random.random),
        http_status=outcome.http_status, exit_code=outcome.exit_code, error=outcome.error,
        output_node=node.node_id if outcome.output else None)


def report_cost(job: dict | None, run: dict, event: str = "finish") -> int:
    """What apply may do for a report of this run, in cost units: the start or
    finish of a DAG task run rewrites its DAG run, and a finish may release
    every task downstream of it (core/cost.py)."""
    return cost.run_update_cost(job["spec"] if job else None, run.get("task_id"), event)


def masked_outcome(job: dict | None, outcome: Outcome) -> Outcome:
    """The outcome with the job's secrets masked in its output and error
    (core/redact.py), before the output is stored and the error replicated:
    a secret a target or command echoed never reaches a disk or another node."""
    values = secret_values(job["spec"]) if job is not None else ()
    if not values:
        return outcome
    return dataclasses.replace(
        outcome, output=outcome.output and redact_output(outcome.output, values),
        error=outcome.error and redact_text(outcome.error, values))


def breaker_ok(outcome: Outcome) -> bool:
    """Did the host answer sanely? A 3xx or a 4xx other than 429 is the
    request's fault, as is an address the node refused to call (the host was
    never reached)."""
    status = outcome.http_status
    if outcome.ok or (status is None and not outcome.retryable):
        return True
    return status is not None and 300 <= status < 500 and status != 429


class Dispatcher:
    def __init__(self, node: "Node") -> None:
        self._node = node
        # Runs waiting for a slot: fair between tenants by weight, priority
        # within one, each tenant held to its runs_concurrent_max (runtime/fair.py).
        self._queue: FairQueue[dict] = FairQueue(
            tenant_of=lambda run: run["tenant"],
            priority_of=lambda run: run.get("priority", "normal"),
            weight_of=lambda tenant: node.quota_of(tenant)["weight"],
            cap_of=lambda tenant: node.quota_of(tenant)["runs_concurrent_max"],
            maxsize=limits.dispatch_queue_max)
        # Runs taken and not yet settled: starting, executing, or finished with
        # the finish not yet committed. A rescan skips them.
        self._active: set[str] = set()
        self._running: dict[str, tuple[int, asyncio.Task]] = {}   # run -> (attempt, task)
        self._slots = asyncio.Semaphore(limits.runs_inflight_max)
        self._rescan = True   # resume open runs at start-up
        self._tasks: set[asyncio.Task] = set()
        self.dropped_notifications = 0
        self.parked_total = 0
        self.cancelled_total = 0

    # --- inputs (loop thread) ---------------------------------------------------------

    def submit(self, run: dict) -> None:
        """Never blocks. A run fired ahead is held until its second, or handed
        to its shard's owner (runtime/armed.py), which enqueues it then."""
        if not self._node.armed.hold(run):
            self.enqueue(run)

    def enqueue(self, run: dict) -> None:
        """Never blocks: on overflow, a rescan of the open-runs index picks the run up."""
        try:
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            self.dropped_notifications += 1
            self._rescan = True
            log.error("dispatch queue full (%d, dispatch_queue_max); run %s will be picked up "
                      "by the next rescan", limits.dispatch_queue_max, run["id"])

    def cancelled(self, run_id: str, attempt: int) -> None:
        """From apply's RunCancelled: stop the call (HTTP aborted, process group killed),
        or drop the run if it is held until its second."""
        self._node.armed.withdraw(run_id)
        entry = self._running.get(run_id)
        if entry is not None and entry[0] == attempt:
            self.cancelled_total += 1
            entry[1].cancel()

    def request_rescan(self) -> None:
        """After a snapshot install: the open-runs index may name new runs of ours."""
        self._rescan = True

    def running(self) -> int:
        return len(self._running)

    def queue_depths(self) -> dict[str, int]:
        """Runs waiting for a slot here, by tenant."""
        return self._queue.depths()

    # --- the loops --------------------------------------------------------------------

    async def run(self) -> None:
        # A restart after a failure (runtime/supervise.py) may have lost the run
        # it had taken from the queue: the open-runs index still names it.
        self._rescan = True
        while True:
            if self._rescan:
                self._rescan = False
                self._resume_open_runs()
            # A slot first, then the run: the fair queue chooses among the runs
            # waiting when a slot is free, not before.
            await self._slots.acquire()
            try:
                run = await asyncio.wait_for(self._queue.get(), 1.0)
            except asyncio.TimeoutError:
                self._slots.release()
                continue
            if run["id"] in self._active or self._maybe_park(run):
                self._queue.done(run["tenant"])
                self._slots.release()
                continue
            self._active.add(run["id"])
            task = self._node.supervisor.spawn("dispatcher.attempt", self._attempt(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _maybe_park(self, run: dict) -> bool:
        """Hold a run back while its tenant's breaker for its target host is
        open; say whether it did."""
        host = self._host(run)
        breaker = self._node.breaker
        if host is None or breaker.allow(run["tenant"], host):
            return False
        self.parked_total += 1
        delay_s = max(0.5, breaker.retry_at(run["tenant"], host) - self._node.monotonic())
        asyncio.get_running_loop().call_later(delay_s, self.submit, run)
        return True

    def _host(self, run: dict) -> str | None:
        job = self._node.store.get(JOBS, keys.job_key(run["job_id"]))
        target = dag.target_of(job["spec"], run.get("task_id")) if job is not None else None
        if target is None or target["type"] != "http":
            return None
        return urlsplit(target["url"]).netloc

    async def heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._node.config.run_heartbeat_ms / 1000)
            await self.send_heartbeats()

    async def send_heartbeats(self) -> None:
        """Extend the lease of every attempt running here; stop those refused."""
        node = self._node
        beats = []
        for run_id, (attempt, task) in list(self._running.items()):
            update = commands.run_heartbeat(run_id=run_id, holder=node.node_id, attempt=attempt,
                                            at_ms=node.now_ms(),
                                            lease_ms=node.now_ms() + node.config.run_lease_ms)
            beats.append((run_id, attempt, task, node.reporter.send(update)))
        for run_id, attempt, task, future in beats:
            if not await future and self._running.get(run_id, (None,))[0] == attempt:
                log.warning("run %s attempt %d: lease lost (cancelled or expired); "
                            "stopping it", run_id, attempt)
                task.cancel()

    def _resume_open_runs(self) -> None:
        node = self._node
        prefix = keys.open_run_prefix(node.node_id)
        rows = node.store.scan(RUNS_OPEN, start=prefix, stop=keys.prefix_end(prefix),
                               limit=limits.dispatch_queue_max)
        resumed = ended = 0
        for key, _ in rows:
            run = node.store.get(RUNS, key[len(prefix):])
            if run is None or run["id"] in self._active:
                continue
            if run["state"] == "queued":
                self.submit(run)
                resumed += 1
            elif run["state"] == "running" and run["holder"] == node.node_id:
                self._end_orphaned_attempt(run)
                ended += 1
        if resumed or ended:
            log.info("resuming %d queued runs; ending %d attempts this node held when it "
                     "stopped (retried by policy)", resumed, ended)

    def _end_orphaned_attempt(self, run: dict) -> None:
        node = self._node
        job = node.store.get(JOBS, keys.job_key(run["job_id"]))
        outcome = Outcome(ok=False, error=f"node {node.node_id} restarted during the attempt")
        self._active.add(run["id"])
        policy = dag.retry_policy(job["spec"], run.get("task_id"))
        future = node.reporter.send(finish_update(node, run, node.node_id, outcome, policy),
                                    run["tenant"], report_cost(job, run))
        future.add_done_callback(lambda _: self._active.discard(run["id"]))

    # --- one attempt ------------------------------------------------------------------

    async def _attempt(self, run: dict) -> None:
        node = self._node
        settled_here = True
        try:
            # A DAG task's start rewrites its DAG run: its job says how large.
            dag_job = (node.store.get(JOBS, keys.job_key(run["job_id"]))
                       if "dag_run" in run else None)
            started = await node.reporter.send(commands.run_start(
                run_id=run["id"], holder=node.node_id, attempt=run["attempt"],
                at_ms=node.now_ms(), lease_ms=node.now_ms() + node.config.run_lease_ms),
                run["tenant"], report_cost(dag_job, run, "start"))
            if not started:
                return   # cancelled, reassigned or already started: not ours to run
            task = asyncio.current_task()
            assert task is not None
            self._running[run["id"]] = (run["attempt"], task)
            job = node.store.get(JOBS, keys.job_key(run["job_id"]))
            try:
                outcome = await self._call(job, run)
            except asyncio.CancelledError:
                return   # apply cancelled it or the lease is gone: nothing to report
            finally:
                self._running.pop(run["id"], None)
            self._report(job, run, outcome)
            settled_here = False
        except Exception:
            # The supervisor logs the traceback and counts it; the lease, if
            # taken, expires and the reaper retries the run.
            log.error("run %s attempt %d: the dispatcher failed unexpectedly", run["id"],
                      run["attempt"])
            raise
        finally:
            self._slots.release()
            self._queue.done(run["tenant"])
            if settled_here:
                self._active.discard(run["id"])

    async def _call(self, job: dict | None, run: dict) -> Outcome:
        node = self._node
        if job is None or job["status"] == "deleted":
            return Outcome(ok=False, retryable=False,
                           error="the job was deleted before the run started")
        target = dag.target_of(job["spec"], run.get("task_id"))
        if target is None:
            return Outcome(ok=False, retryable=False,
                           error=f"task {run.get('task_id')!r} is no longer in the job's DAG")
        deadline_ms = node.now_ms() + int(target.get("timeout_s", 30) * 1000)
        attempt = attempt_of(run)
        if run["attempt"] == 1 and run.get("trigger") == "schedule" and "dag_run" not in run:
            # Trigger lateness: the first call of a run its schedule fired, against
            # when it was due (a backfill's or a DAG task's time is not a due time).
            node.trigger_lateness.record(node.now_ms() - run["scheduled_ms"]
                                      - run.get("jitter_ms", 0))
        if target["type"] == "http":
            outcome = await node.http_executor.run(attempt, target, deadline_ms)
            node.breaker.record(run["tenant"], urlsplit(target["url"]).netloc,
                                breaker_ok(outcome))
            return outcome
        if target["type"] == "command":
            withdrawn = tenancy.command_run_refusal(
                node.store.get(TENANTS, job["tenant"].encode()), job["tenant"])
            if withdrawn is not None:
                # The grant was withdrawn after the job was made: the job stays,
                # its runs fail unrun until an admin grants it again.
                log.warning("run %s of job %s not started: %s", run["id"], job["id"], withdrawn)
                return Outcome(ok=False, retryable=False, error=withdrawn)
            if not node.config.allow_commands:
                # Accepted by a node with --allow-commands, fired here: a retry
                # would most likely come back to this node, so the run fails.
                return Outcome(ok=False, retryable=False,
                               error=f"commands do not run on node {node.node_id} (started "
                                     "without --allow-commands); give the job a target.queue "
                                     "served by `raftsched worker`")
            codes = dag.retry_policy(job["spec"], run.get("task_id"))["non_retryable_exit_codes"]
            return await node.command_executor.run(
                attempt, dict(target, non_retryable_exit_codes=codes), deadline_ms)
        assert target["type"] == "publish", target
        return await self._publish(job, run, target)

    async def _publish(self, job: dict, run: dict, target: dict) -> Outcome:
        node = self._node
        full = node.storage.past_mark()
        if full is not None:
            # A publish adds state: it waits (as a retry) until purges free space.
            return Outcome(ok=False, error=f"publish deferred: storage is past its mark "
                                           f"({full[0]}): {full[1]}")
        try:
            result = await node.propose(commands.publish(
                topic=keys.scoped(job["tenant"], target["topic"]), key=target.get("key"),
                message=target["message"],
                execution_id=run["execution_id"], job_id=job["id"], at_ms=node.now_ms()))
        except Unavailable as exc:
            return Outcome(ok=False, error=f"publish not committed: {exc.detail}")
        if not result.get("ok"):
            # Refused by apply: the same publish would be refused again.
            return Outcome(ok=False, retryable=False,
                           error=f"publish refused ({result.get('error')}): "
                                 f"{result.get('detail')}")
        again = " (already published by an earlier attempt)" if result["duplicate"] else ""
        return Outcome(ok=True, output={"published": f"{target['topic']} offset "
                                                     f"{result['offset']}{again}"})

    def _report(self, job: dict | None, run: dict, outcome: Outcome) -> None:
        node = self._node
        outcome = masked_outcome(job, outcome)
        if outcome.output:
            node.outputs.put(run["id"], run["attempt"],
                             dict(outcome.output, holder=node.node_id,
                                  http_status=outcome.http_status, exit_code=outcome.exit_code),
                             now_ms=node.now_ms(), tenant=run["tenant"])
        policy = dag.retry_policy(job["spec"] if job else None, run.get("task_id"))
        future = node.reporter.send(finish_update(node, run, node.node_id, outcome, policy),
                                    run["tenant"], report_cost(job, run))
        future.add_done_callback(lambda _: self._active.discard(run["id"]))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
