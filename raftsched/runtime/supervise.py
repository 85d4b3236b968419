"""Supervision: no background task of a node or a worker dies silently.

    supervisor = Supervisor("node n1")
    supervisor.start("trigger", trigger.run)        # a loop, restarted when it fails
    supervisor.start("register", register, finite=True)   # may end by itself
    supervisor.spawn("trigger.send", coroutine)     # one-shot: a failure is logged
    supervisor.failures                             # {name: failures so far}
    await supervisor.stop()                         # cancel everything and wait

A loop that raises is logged with its traceback, counted, and started again
(its factory is called anew; the loop's object keeps its state) after a
backoff that doubles from `task_restart_backoff_s_min` to
`task_restart_backoff_s_max`, so a loop that fails on every pass does not spin.
A loop that ran `task_healthy_run_s` before failing starts the count afresh.

A loop cannot go on when it fails `task_failures_consecutive_max` times in a
row, or when it returns (or is cancelled from inside) while nobody stopped it.
The supervisor then logs which task and why at CRITICAL and exits the process
with EXIT_TASK_FAILED: a process that no longer fires, executes or renews but
still answers and holds its shards is worse than one that is gone, whose shards
move and whose runs are retried elsewhere. A service manager restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Awaitable, Callable, Coroutine

from raftsched import limits

log = logging.getLogger("raftsched.supervise")

# Exit status of a process whose task could not go on: EX_SOFTWARE (sysexits.h),
# the same as a node that stopped on a broken invariant.
EXIT_TASK_FAILED = 70


def exit_process(code: int) -> None:
    """Leave now: flush the logs, run nothing else (no finally, no atexit)."""
    logging.shutdown()
    os._exit(code)


class Supervisor:
    def __init__(self, owner: str, *, exit_hook: Callable[[int], None] = exit_process,
                 exit_code: int = EXIT_TASK_FAILED,
                 failures_max: int = limits.task_failures_consecutive_max,
                 backoff_s_min: float = limits.task_restart_backoff_s_min,
                 backoff_s_max: float = limits.task_restart_backoff_s_max,
                 healthy_run_s: float = limits.task_healthy_run_s) -> None:
        assert failures_max >= 1
        assert 0 < backoff_s_min <= backoff_s_max
        self.owner = owner   # "node n1", "worker w7": the log names what stops
        self._exit_hook = exit_hook
        self._exit_code = exit_code
        self._failures_max = failures_max
        self._backoff_s_min = backoff_s_min
        self._backoff_s_max = backoff_s_max
        self._healthy_run_s = healthy_run_s
        self._loops: dict[str, asyncio.Task] = {}
        self._spawned: set[asyncio.Task] = set()
        self._stopping = False
        # Failures per task name, since the process started (GET /v1/node).
        self.failures: dict[str, int] = {}

    # --- loops ------------------------------------------------------------------------

    def start(self, name: str, loop_factory: Callable[[], Awaitable[None]], *,
              finite: bool = False) -> asyncio.Task:
        """Run `loop_factory()` until stop(), restarting it when it fails. A
        `finite` task may return when its work is done; any other that returns
        stops the process."""
        assert name not in self._loops, name
        self.failures.setdefault(name, 0)
        task = asyncio.ensure_future(self._keep_running(name, loop_factory, finite))
        self._loops[name] = task
        return task

    async def _keep_running(self, name: str, loop_factory: Callable[[], Awaitable[None]],
                            finite: bool) -> None:
        in_a_row = 0
        backoff_s = self._backoff_s_min
        while True:
            started = time.monotonic()
            error = await self._run_once(loop_factory)
            if error is None:
                if not (finite or self._stopping or _being_cancelled()):
                    self._fatal(name, "returned, but it must run until the process stops")
                return
            if time.monotonic() - started >= self._healthy_run_s:
                in_a_row, backoff_s = 0, self._backoff_s_min
            in_a_row += 1
            self.failures[name] += 1
            if in_a_row >= self._failures_max:
                self._fatal(name, f"failed {in_a_row} times in a row "
                                  f"(task_failures_consecutive_max)", error)
                return
            log.error("%s: task %s failed (%d in a row); restarting it in %.2f s", self.owner,
                      name, in_a_row, backoff_s, exc_info=error)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._backoff_s_max)

    async def _run_once(self, loop_factory: Callable[[], Awaitable[None]]) -> BaseException | None:
        """Run the loop once; return what ended it in error (None: it returned)."""
        try:
            await loop_factory()
        except asyncio.CancelledError as exc:
            if self._stopping or _being_cancelled():
                raise
            return exc   # a CancelledError that was not for this task
        except Exception as exc:
            return exc
        return None

    def _fatal(self, name: str, why: str, error: BaseException | None = None) -> None:
        log.critical("stopping %s: task %s %s", self.owner, name, why, exc_info=error)
        self._exit_hook(self._exit_code)

    # --- one-shot tasks ---------------------------------------------------------------

    def spawn(self, name: str, coroutine: Coroutine) -> asyncio.Task:
        """Run a one-shot task (a fire, an execution, an alert delivery). Its
        failure is logged with the traceback and counted; the task is held here
        until done (the event loop itself only keeps weak references). Once
        stop() has begun, a task spawned (by one that stop is ending, say) is
        cancelled before it starts: nothing begins after the stop."""
        task = asyncio.ensure_future(coroutine)
        if self._stopping:
            task.cancel()
        self._spawned.add(task)
        task.add_done_callback(lambda done: self._spawned_done(name, done))
        return task

    def _spawned_done(self, name: str, task: asyncio.Task) -> None:
        self._spawned.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.failures[name] = self.failures.get(name, 0) + 1
            log.error("%s: task %s failed", self.owner, name, exc_info=error)

    # --- stopping ---------------------------------------------------------------------

    async def stop(self) -> None:
        """Cancel every loop and one-shot task and wait until all have ended.
        A cancellation can be lost (before Python 3.12, asyncio.wait_for drops
        one that arrives as the awaited future completes), so the tasks still
        running are cancelled again every `limits.task_stop_recancel_s`."""
        self._stopping = True
        pending = {*self._loops.values(), *self._spawned}
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=limits.task_stop_recancel_s)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
