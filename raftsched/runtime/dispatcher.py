"""The dispatcher: execute the runs this node fired, and report their states.

Runs arrive as RunCreated effects from apply (on the loop thread). Each is
executed at most `runs_inflight_max` at a time; its start and finish are
batched into `run_updates` commands (one Raft entry per tick carries many
runs). On start-up the node also resumes every run the replicated open-runs
index still assigns to it, so a run fired just before a crash is executed
after the restart (at-least-once: it may be called twice, with the same
execution id).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING

from raftsched import limits
from raftsched.core import commands, keys
from raftsched.core.apply import JOBS, RUNS, RUNS_OPEN
from raftsched.errors import Unavailable
from raftsched.executors.base import Attempt, Outcome

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

log = logging.getLogger("raftsched.dispatch")


class Dispatcher:
    def __init__(self, node: "Node") -> None:
        self._node = node
        self._queue: asyncio.Queue[dict] = asyncio.Queue(maxsize=limits.dispatch_queue_max)
        # Runs submitted and not yet settled: executing, or finished with the
        # final report not yet committed. A rescan skips them, so a run whose
        # success is still on its way to the log is not executed again.
        self._active: set[str] = set()
        self._slots = asyncio.Semaphore(limits.runs_inflight_max)
        self._pending: collections.deque[dict] = collections.deque()
        self._flush = asyncio.Event()
        self._rescan = True   # resume open runs at start-up
        self._tasks: set[asyncio.Task] = set()
        self.dropped_notifications = 0

    def submit(self, run: dict) -> None:
        """Loop thread. Never blocks: on overflow, a rescan of the open-runs index
        picks the run up later."""
        try:
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            self.dropped_notifications += 1
            self._rescan = True
            log.error("dispatch queue full (%d, dispatch_queue_max); run %s will be picked up "
                      "by the next rescan", limits.dispatch_queue_max, run["id"])

    async def run(self) -> None:
        while True:
            if self._rescan:
                self._rescan = False
                self._resume_open_runs()
            try:
                run = await asyncio.wait_for(self._queue.get(), 1.0)
            except asyncio.TimeoutError:
                continue
            if run["id"] in self._active:
                continue
            await self._slots.acquire()
            self._active.add(run["id"])
            task = asyncio.ensure_future(self._execute(run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _resume_open_runs(self) -> None:
        node = self._node
        prefix = keys.open_run_prefix(node.node_id)
        rows = node.store.scan(RUNS_OPEN, start=prefix, stop=prefix[:-1] + b"\x01",
                               limit=limits.dispatch_queue_max)
        resumed = 0
        for key, _ in rows:
            run = node.store.get(RUNS, key[len(prefix):])
            if run is not None and run["id"] not in self._active:
                self.submit(run)
                resumed += 1
        if resumed:
            log.info("resuming %d open runs assigned to %s", resumed, node.node_id)

    async def _execute(self, run: dict) -> None:
        node = self._node
        try:
            job = node.store.get(JOBS, keys.job_key(run["job_id"]))
            if run["state"] == "queued":
                self._report(run, "start", None)
            if job is None or job["status"] == "deleted":
                outcome = Outcome(ok=False, error="the job was deleted before the run started")
            else:
                attempt = Attempt(run_id=run["id"], job_id=run["job_id"],
                                  execution_id=run["execution_id"],
                                  scheduled_ms=run["scheduled_ms"], attempt=run["attempt"],
                                  fencing_token=run.get("token", 0))
                target = job["spec"]["target"]
                deadline_ms = node.now_ms() + int(target["timeout_s"] * 1000)
                outcome = await node.http_executor.run(attempt, target, deadline_ms)
            self._report(run, "succeed" if outcome.ok else "fail", outcome)
        except Exception:
            log.exception("run %s: executor failed unexpectedly", run["id"])
            self._report(run, "fail", Outcome(ok=False, error="internal executor error"))
        finally:
            self._slots.release()

    def _report(self, run: dict, event: str, outcome: Outcome | None) -> None:
        if len(self._pending) >= limits.run_update_pending_max:
            log.error("run_update_pending_max (%d) reached; dropping the %s of run %s "
                      "(it stays open and runs again after a restart)",
                      limits.run_update_pending_max, event, run["id"])
            if event != "start":
                self._active.discard(run["id"])
            return
        self._pending.append({"run_id": run["id"], "event": event, "at_ms": self._node.now_ms(),
                              "node": self._node.node_id,
                              "http_status": outcome.http_status if outcome else None,
                              "error": outcome.error if outcome else None})
        self._flush.set()

    async def report_loop(self) -> None:
        """Send pending run updates in batches; keep them while there is no leader."""
        backoff_s = limits.run_update_period_ms / 1000
        while True:
            await self._flush.wait()
            await asyncio.sleep(limits.run_update_period_ms / 1000)
            batch = [self._pending.popleft()
                     for _ in range(min(len(self._pending), limits.run_update_batch_max))]
            if not self._pending:
                self._flush.clear()
            if not batch:
                continue
            try:
                await self._node.replicator.propose_wait(
                    commands.encode(commands.run_updates(updates=batch)))
                for update in batch:
                    if update["event"] != "start":
                        self._active.discard(update["run_id"])
                backoff_s = limits.run_update_period_ms / 1000
            except Unavailable as exc:
                log.warning("%d run updates not committed (%s); retrying", len(batch), exc.detail)
                self._pending.extendleft(reversed(batch))
                self._flush.set()
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def request_rescan(self) -> None:
        """After a snapshot install: the open-runs index may name new runs of ours."""
        self._rescan = True
