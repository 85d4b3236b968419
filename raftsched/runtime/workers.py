"""The node's side of remote workers: claim, heartbeat, complete.

A worker (`raftsched worker`) long-polls any node for runs of its queue. The
node reads its READY index, proposes `start` for some of them with the
worker as holder (through the Reporter, so many workers' claims share Raft
entries), and answers with the runs apply granted: a run two workers race
for goes to one. Heartbeats extend the worker's leases; one refused means the
run was cancelled or its lease expired, and the worker stops it. Completions
are reported with the output, which this node keeps (off Raft) in its output
store; this node draws the retry delay. A run of a tenant that lost its
command grant is failed here, unrun, instead of being given to the worker.

Holders are named `worker:<id>` so they never collide with node ids.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Awaitable, Callable

from raftsched import limits
from raftsched.core import commands, dag, lifecycle, queries, tenancy
from raftsched.core.timeutil import format_ms
from raftsched.errors import Conflict
from raftsched.executors.base import Outcome
from raftsched.runtime.context import Replicated
from raftsched.runtime.dispatcher import SendReport, finish_update, masked_outcome, report_cost
from raftsched.runtime.waiters import Waiters
from raftsched.storage.output_store import OutputStore

log = logging.getLogger("raftsched.workers")


def holder_of(worker_id: str) -> str:
    return "worker:" + worker_id


class WorkerService:
    def __init__(self, replicated: Replicated, *, report: SendReport, outputs: OutputStore,
                 wait_caught_up: Callable[[], Awaitable[None]], run_lease_ms: int,
                 run_heartbeat_ms: int) -> None:
        """`report`: run reports to the reporter; `outputs`: where the
        workers' outputs are kept on this node; `wait_caught_up`: until this
        node applied what the leader had committed (a claim may have been
        granted through another node); `run_lease_ms` and `run_heartbeat_ms`:
        a worker's lease and how often it extends it."""
        self._replicated = replicated
        self._store = replicated.store
        self._report = report
        self._outputs = outputs
        self._wait_caught_up = wait_caught_up
        self._run_lease_ms = run_lease_ms
        self._run_heartbeat_ms = run_heartbeat_ms
        # Claims waiting for runs, by queue (tenant-scoped): bounded and freed.
        self._waiters = Waiters(names_max=limits.waited_names_max,
                                names_per_tenant_max=limits.waited_names_per_tenant_max,
                                names_limit="waited_names_max",
                                per_tenant_limit="waited_names_per_tenant_max",
                                what="worker queues")
        self.claimed_total = 0

    def queued(self, queue: str) -> None:
        """Loop thread, from apply's RunQueued for a worker queue (scoped by
        tenant, keys.scoped): wake its claimers."""
        self._waiters.wake(queue)

    async def claim(self, worker_id: str, queue: str, max_runs: int, wait_s: float,
                    gone: Callable[[], bool] = lambda: False) -> list[dict]:
        """`queue` is scoped by the worker's tenant (keys.scoped): a worker
        claims only its tenant's runs, high priority first, then oldest.
        `gone`: whether the worker stopped waiting for the answer (it closed
        the connection: a drain withdrew the claim). A claim that waited
        claims nothing once it has: a run granted then would be held by no
        one until its lease expired."""
        deadline = time.monotonic() + wait_s
        granted = await self._try_claim(worker_id, queue, max_runs)
        if granted or wait_s <= 0:
            return granted
        with self._waiters.waiting(queue) as waiting:
            while True:
                event = waiting.event()
                if gone():
                    return []
                granted = await self._try_claim(worker_id, queue, max_runs)
                remaining = deadline - time.monotonic()
                if granted or remaining <= 0 or waiting.ended:
                    return granted
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    return []

    def end_waits(self) -> None:
        """As the node stops: claims waiting for runs answer at once."""
        self._waiters.close()

    def waiting_queues(self) -> int:
        """Queues some claim waits on now."""
        return len(self._waiters)

    def waits_refused(self) -> int:
        """Claims refused for waiting on a queue past a waited-names bound."""
        return self._waiters.refused_total

    async def _try_claim(self, worker_id: str, queue: str, max_runs: int) -> list[dict]:
        store, now_ms = self._store, self._replicated.now_ms
        ready = queries.ready_run_ids(store, queue, max_runs * 4)
        # Workers racing for the head of the queue would mostly collide: each
        # picks a random few of the oldest.
        picked = random.sample(ready, min(max_runs, len(ready)))
        runs = [queries.run(store, run_id) for run_id in picked]
        runs = [r for r in runs if r is not None and r["state"] == "queued"]
        lease_ms = now_ms() + self._run_lease_ms
        futures = [self._report(commands.run_start(
                       run_id=r["id"], holder=holder_of(worker_id), attempt=r["attempt"],
                       at_ms=now_ms(), lease_ms=lease_ms), r["tenant"],
                       report_cost(self._dag_job(r), r, "start"))
                   for r in runs]
        granted = []
        for run, future in zip(runs, futures):
            if await future:
                assignment = self._assignment(run, lease_ms, worker_id)
                if assignment is not None:
                    granted.append(assignment)
        self.claimed_total += len(granted)
        return granted

    def _dag_job(self, run: dict) -> dict | None:
        """The job of a DAG task run (its start's cost depends on it), else None."""
        return (queries.job(self._store, run["job_id"])
                if "dag_run" in run else None)

    def _assignment(self, run: dict, lease_ms: int, worker_id: str) -> dict | None:
        """What the worker is given for a run it was granted; None (and the
        attempt failed for good) for a DAG task that is no longer in its job,
        or a run of a tenant that lost its command grant."""
        job = queries.job(self._store, run["job_id"])
        policy = dag.retry_policy(job["spec"] if job else None, run.get("task_id"))
        target = dag.target_of(job["spec"], run.get("task_id")) if job else None
        error = self._why_not_given(run, target)
        if error is not None:
            failed = Outcome(ok=False, retryable=False, error=error)
            self._report(finish_update(run, holder_of(worker_id), failed, policy,
                                       at_ms=self._replicated.now_ms(),
                                       output_node=self._replicated.node_id),
                         run["tenant"], report_cost(job, run))
            return None
        return {"run_id": run["id"], "job_id": run["job_id"], "attempt": run["attempt"],
                "execution_id": run["execution_id"], "scheduled_ms": run["scheduled_ms"],
                "scheduled_for": format_ms(run["scheduled_ms"]),
                "fencing_token": run.get("token", 0), "lease_expires_ms": lease_ms,
                "heartbeat_ms": self._run_heartbeat_ms,
                **({"task_id": run["task_id"]} if "task_id" in run else {}),
                "target": dict(target,
                               non_retryable_exit_codes=policy["non_retryable_exit_codes"])}

    def _why_not_given(self, run: dict, target: dict | None) -> str | None:
        """Why a run granted to a worker fails instead (for good): its target is
        gone, or its tenant lost the command grant after the job was made, so
        the worker never sees it. None: give it to the worker."""
        if target is None:
            return (f"the run's target is gone (job {run['job_id']} deleted, or "
                    f"task {run.get('task_id')!r} no longer in its DAG)")
        refusal = tenancy.command_run_refusal(
            queries.tenant(self._store, run["tenant"]), run["tenant"])
        if refusal is not None:
            log.warning("run %s of job %s not started: %s", run["id"], run["job_id"], refusal)
        return refusal

    def _run_of(self, run_id: str, tenant: str | None) -> dict | None:
        """The run, if it belongs to `tenant` (None: any, for an admin)."""
        run = queries.run(self._store, run_id)
        if run is None or (tenant is not None and run["tenant"] != tenant):
            return None
        return run

    async def heartbeat(self, worker_id: str, beats: list[dict],
                        tenant: str | None = None) -> list[str]:
        """Extend the leases; return the run ids whose lease is gone (stop them).
        Another tenant's run is answered as lost, without a report."""
        now_ms = self._replicated.now_ms
        lease_ms = now_ms() + self._run_lease_ms
        lost, futures = [], []
        for b in beats:
            if self._run_of(b["run_id"], tenant) is None:
                lost.append(b["run_id"])
                continue
            futures.append((b["run_id"], self._report(commands.run_heartbeat(
                run_id=b["run_id"], holder=holder_of(worker_id), attempt=b["attempt"],
                at_ms=now_ms(), lease_ms=lease_ms))))
        return lost + [run_id for run_id, future in futures if not await future]

    async def complete(self, worker_id: str, results: list[dict],
                       tenant: str | None = None) -> list[bool]:
        """Record a worker's results, each only if the worker holds that
        attempt of the run (it is running, its holder is this worker, its
        attempt is the one reported). One that it does not hold refuses the
        whole request with Conflict naming it, and nothing is stored or
        reported: a stale worker (its lease expired, the run moved on) or a
        foreign one cannot put output under a run it does not hold. A held
        run's output is stored before its finish is proposed, so whoever reads
        the run finished finds its logs; a lease lost between the check and
        the commit leaves the output of the attempt the worker did run."""
        now_ms = self._replicated.now_ms
        holder = holder_of(worker_id)
        runs = [self._held_run(result, holder, tenant) for result in results]
        if None in runs:
            await self._wait_caught_up()   # the claim may have been granted through another node
            runs = [self._held_run(result, holder, tenant) for result in results]
        if None in runs:
            raise Conflict(_not_held_detail(results, runs, holder),
                           field=f"results[{runs.index(None)}].run_id")
        reports = []
        for result, run in zip(results, runs):
            outcome = Outcome(ok=result["ok"], exit_code=result.get("exit_code"),
                              error=result.get("error"), retryable=result.get("retryable", True),
                              output=result.get("output"))
            job = queries.job(self._store, run["job_id"])
            outcome = masked_outcome(job, outcome)
            if outcome.output:
                # Kept before the finish is proposed: once the run reads finished,
                # its logs are there. The worker holds this attempt (checked above);
                # a finish refused after all leaves the output of an attempt that ran.
                self._outputs.put(run["id"], run["attempt"],
                                  dict(outcome.output, holder=holder, exit_code=outcome.exit_code),
                                  now_ms=now_ms(), tenant=run["tenant"])
            future = self._report(finish_update(
                run, holder, outcome,
                dag.retry_policy(job["spec"] if job else None, run.get("task_id")),
                at_ms=now_ms(), output_node=self._replicated.node_id),
                cost=report_cost(job, run))
            reports.append(future)
        return [bool(await future) for future in reports]

    def _held_run(self, result: dict, holder: str, tenant: str | None) -> dict | None:
        """The run `result` reports on, if `holder` holds its reported attempt."""
        run = self._run_of(result["run_id"], tenant)
        if run is None or run["state"] != lifecycle.RUNNING or run.get("holder") != holder \
                or run["attempt"] != result["attempt"]:
            return None
        return run


def _not_held_detail(results: list[dict], runs: list[dict | None], holder: str) -> str:
    stale = [f"{r['run_id']} attempt {r['attempt']}" for r, run in zip(results, runs)
             if run is None]
    shown = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
    return (f"{holder} does not hold {shown}: the run is not running under this worker at "
            f"that attempt (its lease expired, it was cancelled or finished, or another "
            f"worker holds it); nothing was stored for this request. Drop those results "
            f"and send the others again")
