"""Leader-only pacing of backfills: the backfiller proposes `backfill_step` commands.

Every `backfill_period_ms`, while a backfill runs, the leader reads each running backfill (at most
`backfills_open_max`, listed in BACKFILLS_OPEN) and the states of its open
runs, and plans a step for it (core/backfill.py plan_step): the finished runs
to count, and the next occurrences of its schedule that fit in its room. The
steps of one pass go in one entry of at most `backfill_step_runs_max` new runs
and `apply_entry_cost_max` cost units (a run of a DAG job costs a unit per task
that starts at once: core/cost.py);
the next pass starts once that entry is applied, so it sees the room the step
used. All progress is in the replicated record: a new leader's first pass
picks up where the old one stopped, and apply ignores an occurrence at or
before a backfill's cursor, so a step proposed twice (by two leaders, or
again after a timeout) launches nothing twice.

While none runs, the leader does not pass: it waits until apply says a
backfill began (BackfillOpened, on every replica, so a follower that becomes
leader knows it too) or the state was replaced by a snapshot, and looks
again every `backfill_idle_recheck_s` all the same.
"""

from __future__ import annotations

import asyncio
import logging
from raftsched import limits
from raftsched.core import backfill, commands, cost, queries
from raftsched.errors import Unavailable
from raftsched.runtime.context import Replicated

log = logging.getLogger("raftsched.backfiller")


class Backfiller:
    def __init__(self, replicated: Replicated) -> None:
        self._replicated = replicated
        self._failing: set[str] = set()   # backfills whose planning raised (logged once)
        # False once a pass found no backfill running, until one begins.
        self._maybe_running = True
        self._opened = asyncio.Event()
        self.steps_total = 0
        self.launched_total = 0

    async def run(self) -> None:
        """Any failure but Unavailable is the node's supervisor's: it logs it
        and starts the loop again (runtime/supervise.py)."""
        while True:
            if not self._maybe_running and self._replicated.is_leader():
                self._opened.clear()   # (on the loop: `opened` cannot come in between)
                try:
                    await asyncio.wait_for(self._opened.wait(),
                                           limits.backfill_idle_recheck_s)
                except asyncio.TimeoutError:
                    self._maybe_running = True
                continue
            await asyncio.sleep(limits.backfill_period_ms / 1000)
            if not self._replicated.is_leader():
                continue
            try:
                await self.maybe_step()
            except Unavailable as exc:
                log.warning("backfill step not committed: %s", exc.detail)

    def opened(self) -> None:
        """Loop thread: a backfill began (apply's BackfillOpened), or this
        node's state was replaced by a snapshot."""
        self._maybe_running = True
        self._opened.set()

    async def maybe_step(self) -> bool:
        """One pass: plan (reads and schedule evaluation, on a thread), then
        propose. Returns whether a step was proposed."""
        replicated = self._replicated
        if not queries.running_backfill_ids(replicated.store, 1):
            self._maybe_running = False
            return False   # nothing to plan: no need to wake a thread for it
        items = await asyncio.get_running_loop().run_in_executor(None, self.plan)
        if not items:
            return False
        result = await replicated.propose(commands.backfill_step(
            node=replicated.node_id, at_ms=replicated.now_ms(), items=items))
        if not result.get("ok"):
            log.error("backfill step refused (%s): %s", result.get("error"),
                      result.get("detail"))
            return True
        self.steps_total += 1
        self.launched_total += result["launched"]
        return True

    def plan(self) -> list[dict]:
        """The items of one step, over every running backfill, within the
        entry's budgets of new runs and of cost units (the first run planned
        goes whatever it costs, so a backfill of a large DAG job advances)."""
        store = self._replicated.store
        runs_left = limits.backfill_step_runs_max
        cost_left = limits.apply_entry_cost_max
        items = []
        for backfill_id in queries.running_backfill_ids(store, limits.backfills_open_max):
            record = queries.backfill(store, backfill_id)
            if record is None or record["state"] != backfill.RUNNING:
                continue
            planned = self._plan_one(record, runs_left, cost_left,
                                     first=runs_left == limits.backfill_step_runs_max)
            if planned is not None:
                item, unit_cost = planned
                items.append(item)
                runs_left -= len(item["occurrences"])
                cost_left -= len(item["occurrences"]) * unit_cost
        return items

    def _plan_one(self, record: dict, runs_left: int, cost_left: int,
                  first: bool) -> tuple[dict, int] | None:
        """One backfill's item. A backfill whose planning raises is left out
        (and logged once) rather than failing every pass: the pass would fail
        again on every leader in turn, and the other backfills with it. It
        stays running until it is cancelled."""
        store = self._replicated.store
        try:
            job = queries.job(store, record["job_id"])
            states = queries.run_states(store, [run_id for run_id, _ in record["open"]])
            unit_cost = cost.occurrence_cost(job["spec"]) if job is not None else 1
            budget = min(runs_left, max(cost_left // unit_cost, int(first)))
            item = backfill.plan_step(record, job, states, budget)
        except Exception:
            if record["id"] not in self._failing:
                self._failing.add(record["id"])
                log.exception("backfill %s cannot be planned; it makes no progress until "
                              "it is cancelled", record["id"])
            return None
        self._failing.discard(record["id"])
        return None if item is None else (item, unit_cost)
