"""The node's side of remote workers: claim, heartbeat, complete.

A worker (`raftsched worker`) long-polls any node for runs of its queue. The
node reads its READY index, proposes `start` for some of them with the
worker as holder (through the Reporter, so many workers' claims share Raft
entries), and answers with the runs apply granted: a run two workers race
for goes to one. Heartbeats extend the worker's leases; one refused means the
run was cancelled or its lease expired, and the worker stops it. Completions
are reported with the output, which this node keeps (off Raft) in its output
store; this node draws the retry delay.

Holders are named `worker:<id>` so they never collide with node ids.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

from raftsched.core import dag, keys
from raftsched.core.apply import JOBS, READY, RUNS
from raftsched.core.timeutil import format_ms
from raftsched.executors.base import Outcome
from raftsched.runtime.dispatcher import finish_update, masked_outcome, report_cost

if TYPE_CHECKING:
    from raftsched.runtime.node import Node


def holder_of(worker_id: str) -> str:
    return "worker:" + worker_id


class WorkerService:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self._queued: dict[str, asyncio.Event] = {}
        self.claimed_total = 0

    def queued(self, queue: str) -> None:
        """Loop thread, from apply's RunQueued for a worker queue (scoped by
        tenant, keys.scoped): wake its claimers."""
        event = self._queued.get(queue)
        if event is not None:
            event.set()

    async def claim(self, worker_id: str, queue: str, max_runs: int, wait_s: float) -> list[dict]:
        """`queue` is scoped by the worker's tenant (keys.scoped): a worker
        claims only its tenant's runs, high priority first, then oldest."""
        deadline = time.monotonic() + wait_s
        while True:
            event = self._queued.setdefault(queue, asyncio.Event())
            event.clear()
            granted = await self._try_claim(worker_id, queue, max_runs)
            remaining = deadline - time.monotonic()
            if granted or remaining <= 0:
                return granted
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                return []

    async def _try_claim(self, worker_id: str, queue: str, max_runs: int) -> list[dict]:
        node = self._node
        prefix = keys.ready_prefix(queue)
        rows = node.store.scan(READY, start=prefix, stop=keys.prefix_end(prefix),
                               limit=max_runs * 4)
        # Workers racing for the head of the queue would mostly collide: each
        # picks a random few of the oldest.
        picked = random.sample(rows, min(max_runs, len(rows)))
        runs = [node.store.get(RUNS, keys.ready_run_id(prefix, key).encode()) for key, _ in picked]
        runs = [r for r in runs if r is not None and r["state"] == "queued"]
        lease_ms = node.now_ms() + node.config.run_lease_ms
        futures = [node.reporter.send({"run_id": r["id"], "event": "start",
                                       "holder": holder_of(worker_id), "attempt": r["attempt"],
                                       "at_ms": node.now_ms(), "lease_ms": lease_ms},
                                      r["tenant"], report_cost(self._dag_job(r), r, "start"))
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
        return (self._node.store.get(JOBS, keys.job_key(run["job_id"]))
                if "dag_run" in run else None)

    def _assignment(self, run: dict, lease_ms: int, worker_id: str) -> dict | None:
        """What the worker is given for a run it was granted; None (and the
        attempt failed for good) for a DAG task that is no longer in its job."""
        job = self._node.store.get(JOBS, keys.job_key(run["job_id"]))
        policy = dag.retry_policy(job["spec"] if job else None, run.get("task_id"))
        target = dag.target_of(job["spec"], run.get("task_id")) if job else None
        if target is None:
            gone = Outcome(ok=False, retryable=False,
                           error=f"the run's target is gone (job {run['job_id']} deleted, or "
                                 f"task {run.get('task_id')!r} no longer in its DAG)")
            self._node.reporter.send(finish_update(self._node, run, holder_of(worker_id), gone,
                                                   policy), run["tenant"], report_cost(job, run))
            return None
        return {"run_id": run["id"], "job_id": run["job_id"], "attempt": run["attempt"],
                "execution_id": run["execution_id"], "scheduled_ms": run["scheduled_ms"],
                "scheduled_for": format_ms(run["scheduled_ms"]),
                "fencing_token": run.get("token", 0), "lease_expires_ms": lease_ms,
                "heartbeat_ms": self._node.config.run_heartbeat_ms,
                **({"task_id": run["task_id"]} if "task_id" in run else {}),
                "target": dict(target,
                               non_retryable_exit_codes=policy["non_retryable_exit_codes"])}

    def _run_of(self, run_id: str, tenant: str | None) -> dict | None:
        """The run, if it belongs to `tenant` (None: any, for an admin)."""
        run = self._node.store.get(RUNS, run_id.encode())
        if run is None or (tenant is not None and run["tenant"] != tenant):
            return None
        return run

    async def heartbeat(self, worker_id: str, beats: list[dict],
                        tenant: str | None = None) -> list[str]:
        """Extend the leases; return the run ids whose lease is gone (stop them).
        Another tenant's run is answered as lost, without a report."""
        node = self._node
        lease_ms = node.now_ms() + node.config.run_lease_ms
        lost, futures = [], []
        for b in beats:
            if self._run_of(b["run_id"], tenant) is None:
                lost.append(b["run_id"])
                continue
            futures.append((b["run_id"], node.reporter.send({
                "run_id": b["run_id"], "event": "heartbeat", "holder": holder_of(worker_id),
                "attempt": b["attempt"], "at_ms": node.now_ms(), "lease_ms": lease_ms})))
        return lost + [run_id for run_id, future in futures if not await future]

    async def complete(self, worker_id: str, results: list[dict],
                       tenant: str | None = None) -> list[bool]:
        node = self._node
        futures = []
        for result in results:
            run = self._run_of(result["run_id"], tenant)
            if run is None:
                futures.append(None)
                continue
            run = dict(run, attempt=result["attempt"])
            outcome = Outcome(ok=result["ok"], exit_code=result.get("exit_code"),
                              error=result.get("error"), retryable=result.get("retryable", True),
                              output=result.get("output"))
            job = node.store.get(JOBS, keys.job_key(run["job_id"]))
            outcome = masked_outcome(job, outcome)
            if outcome.output:
                node.outputs.put(run["id"], run["attempt"],
                                 dict(outcome.output, holder=holder_of(worker_id),
                                      exit_code=outcome.exit_code), now_ms=node.now_ms())
            futures.append(node.reporter.send(finish_update(
                node, run, holder_of(worker_id), outcome,
                dag.retry_policy(job["spec"] if job else None, run.get("task_id"))),
                cost=report_cost(job, run)))
        return [bool(f is not None and await f) for f in futures]

