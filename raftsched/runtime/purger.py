"""Leader-only retention: the purger proposes `purge` commands.

Every `purge_period_ms` the leader reads a bounded slice of the state and
proposes one `purge` command of at most `purge_batch_max` items and
`apply_entry_cost_max` cost units (a DAG run's purge removes its task runs
too: a unit each; core/cost.py). When a pass fills its batch and removes
something, the next pass starts at once:

  - finished runs past their job's history bounds (more finished runs than
    max_runs: the oldest go first; or finished longer than max_age ago);
  - every finished run of a job deleted or completed longer than
    --finished-job-retention-s ago, and then the job record itself;
  - idempotency keys older than --idempotency-ttl-s;
  - backfills that ended longer than --finished-job-retention-s ago.

A pass visits at most `purge_scan_jobs_max` jobs, from a cursor that goes
round the jobs table, and at most `purge_scan_idem_max` idempotency keys, from
a cursor of its own (and `purge_scan_backfills_max` backfills, from a third),
so the cost of a pass does not grow with the state.
Open runs and runs whose failure alert is not yet delivered are never chosen.
apply (core/retention.py) checks every item again against the command's at_ms
and the state as it is then: this module only chooses.

A *round* is the passes in which each table's cursor goes once round it. A
round that chose nothing notes the earliest time any record it read passes a
bound by time alone (a finished run's age, a retired job's or an ended
backfill's retention, an idempotency key's TTL). Only an applied entry can
make anything removable sooner, and from a round's first pass the node's
apply notes what each entry wrote that a round reads (`Touched`, kept by
runtime/apply_bridge.py while this node leads): the jobs whose record or
state it changed. So after a round that chose nothing the purger *rests*:
until that time (at most `purge_rest_max_s`) it reads only the jobs written
since the round began, each once a pass, and goes round again when the rest
ends, or at once when an entry wrote what a visit of jobs cannot judge (an
alert delivered, a backfill, an idempotency key reserved with a TTL shorter
than a rest, a snapshot installed, more than `purge_touched_jobs_max` jobs).
A leader with a large history reads what changes in it, where each pass
read a thousand jobs a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Callable

from raftsched import limits
from raftsched.core import backfill, commands, cost, keys, retention
from raftsched.core.apply import IDEM, JOBS, RUNS
from raftsched.core.tx import ALERTS, BACKFILLS, BACKFILLS_OPEN, JOB_STATE
from raftsched.errors import Unavailable
from raftsched.runtime.context import Replicated

log = logging.getLogger("raftsched.purger")


@dataclasses.dataclass
class Plan:
    """What one pass chose: the items of one purge command."""
    runs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    jobs: list[str] = dataclasses.field(default_factory=list)
    idem: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    backfills: list[str] = dataclasses.field(default_factory=list)
    # What the items chosen cost apply, in cost units (core/cost.py).
    cost: int = 0

    def room(self) -> int:
        if self.cost >= limits.apply_entry_cost_max:
            return 0
        return (limits.purge_batch_max - len(self.runs) - len(self.jobs) - len(self.idem)
                - len(self.backfills))

    def fits(self, cost: int) -> bool:
        """Whether an item of this cost fits (the first always does)."""
        return self.empty() or self.cost + cost <= limits.apply_entry_cost_max

    def empty(self) -> bool:
        return not (self.runs or self.jobs or self.idem or self.backfills)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Retention:
    """The cluster's retention defaults, as this node's flags give them
    (NodeConfig.retention); give every node the same, as any may lead."""
    history_max_runs: int = limits.history_max_runs_default
    history_max_age_s: float = limits.history_max_age_s_default
    finished_job_retention_s: float = limits.finished_job_retention_s_default
    idempotency_ttl_s: float = limits.idempotency_ttl_s_default


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bounds:
    """The cluster defaults of this node's flags, in ms where they are times."""
    now_ms: int
    history_max_runs: int
    history_max_age_ms: int
    finished_job_retention_ms: int
    idempotency_ttl_ms: int


# The tables a round goes round, each with a cursor of its own.
_TABLES = ("jobs", "idem", "backfills")
# Entries that write nothing a round reads (runtime/apply_bridge.py).
_UNCHANGING_TAGS = frozenset({"renew", "renew_recorded", "check_digest"})
_JOB_TABLES = frozenset({JOBS, JOB_STATE})
# Writes a visit of the jobs written cannot judge: a round goes round again.
_ROUND_TABLES = frozenset({ALERTS, BACKFILLS, BACKFILLS_OPEN})


class Touched:
    """What the entries applied on this node since a round began wrote that
    the purger reads: the keys of the jobs whose record or state they wrote,
    or `overflow` when one wrote what a visit of those jobs cannot judge (an
    alert, a backfill, an idempotency key with `idem_matters`, a snapshot
    installed, more than purge_touched_jobs_max jobs). Noted on the Raft
    thread, taken on the purger's: under a lock."""

    def __init__(self, idem_matters: bool) -> None:
        self._round_tables = _ROUND_TABLES | ({IDEM} if idem_matters else frozenset())
        self._jobs: set[bytes] = set()
        self._lock = threading.Lock()
        self.overflow = False

    def note(self, tag: str | None, writes: tuple) -> None:
        if tag in _UNCHANGING_TAGS or self.overflow:
            return   # (past overflow nothing is kept: a round goes round anyway)
        with self._lock:
            jobs = self._jobs
            for table, key, _ in writes:
                if table in _JOB_TABLES:
                    jobs.add(key)
                elif table in self._round_tables:
                    self.overflow = True
            if len(jobs) > limits.purge_touched_jobs_max:
                self.overflow = True
            if self.overflow:
                jobs.clear()

    def take(self) -> set[bytes]:
        with self._lock:
            jobs, self._jobs = self._jobs, set()
        return jobs

    def give_back(self, jobs: set[bytes]) -> None:
        """Jobs taken and not visited yet (a pass's batch was full)."""
        with self._lock:
            self._jobs |= jobs


@dataclasses.dataclass
class _Round:
    """What a round (or a rest's visits) has seen so far: the tables it went
    round, whether it chose anything or read anything it cannot date, and the
    earliest time a record it read passes a bound (None: none will by time
    alone)."""
    started: set[str] = dataclasses.field(default_factory=set)
    covered: set[str] = dataclasses.field(default_factory=set)
    quiet: bool = True
    wake_ms: int | None = None

    def note(self, at_ms: int) -> None:
        """A record read passes a bound at `at_ms`."""
        if self.wake_ms is None or at_ms < self.wake_ms:
            self.wake_ms = at_ms


@dataclasses.dataclass
class _Rest:
    """Resting after a quiet round, until the cluster's time reaches
    `until_ms` or this process's monotonic clock `until_s`, visiting the
    jobs `touched` names."""
    until_ms: int
    until_s: float
    touched: Touched


class Purger:
    def __init__(self, replicated: Replicated, retention: Retention,
                 watch: Callable[[Touched | None], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """`watch`: gives this node's apply the Touched to note entries in
        (None: none); without it the purger never rests. `monotonic`: this
        process's clock, which bounds a rest however the cluster's time moves."""
        self._replicated = replicated
        self._retention = retention
        self._watch = watch
        self._monotonic = monotonic
        self._touched: Touched | None = None
        self._job_cursor = b""
        self._idem_cursor = b""
        self._backfill_cursor = b""
        self._round: _Round | None = None
        self._rest: _Rest | None = None
        self.rests_total = 0
        self.touched_visits_total = 0
        self.passes_total = 0
        self.purged_runs_total = 0
        self.purged_jobs_total = 0
        self.purged_idem_total = 0
        self.purged_backfills_total = 0
        self.refused_total = 0

    async def run(self) -> None:
        again = False
        while True:
            await asyncio.sleep(0 if again else limits.purge_period_ms / 1000)
            again = False
            if not self._replicated.is_leader():
                self._stop_watching()
                continue
            try:
                again = await self.maybe_purge()
            except Unavailable as exc:
                log.warning("purge not committed: %s", exc.detail)
            # Any other failure is the node's supervisor's: it logs and counts
            # it and starts the loop again; the next pass starts over.

    def resting(self) -> bool:
        """Whether the purger rests after a quiet round (see the module's
        doc): it reads only the jobs written since, until the rest ends."""
        rest = self._rest
        if rest is None:
            return False
        if not rest.touched.overflow and self._replicated.now_ms() < rest.until_ms \
                and self._monotonic() < rest.until_s:
            return True
        self._rest = None
        return False

    def _stop_watching(self) -> None:
        """Not the leader: apply notes nothing for it, and a round starts
        afresh when it leads again."""
        if self._touched is not None and self._watch is not None:
            self._watch(None)
        self._touched, self._round, self._rest = None, None, None

    def bounds(self, now_ms: int) -> Bounds:
        cfg = self._retention
        return Bounds(now_ms=now_ms, history_max_runs=cfg.history_max_runs,
                      history_max_age_ms=int(cfg.history_max_age_s * 1000),
                      finished_job_retention_ms=int(cfg.finished_job_retention_s * 1000),
                      idempotency_ttl_ms=int(cfg.idempotency_ttl_s * 1000))

    async def maybe_purge(self) -> bool:
        """One pass: choose, then propose. Returns whether to go again at once
        (the batch was full and apply removed something)."""
        replicated = self._replicated
        bounds = self.bounds(replicated.now_ms())
        plan = await asyncio.get_running_loop().run_in_executor(None, self.plan, bounds)
        self.passes_total += 1
        if plan.empty():
            return False
        result = await replicated.propose(commands.purge(
            at_ms=bounds.now_ms, history_max_runs=bounds.history_max_runs,
            history_max_age_ms=bounds.history_max_age_ms,
            finished_job_retention_ms=bounds.finished_job_retention_ms,
            idempotency_ttl_ms=bounds.idempotency_ttl_ms,
            runs=plan.runs, jobs=plan.jobs, idem=plan.idem, backfills=plan.backfills))
        if not result.get("ok"):
            log.error("purge refused: %s", result.get("detail"))
            return False
        self.purged_runs_total += result["runs"]
        self.purged_jobs_total += result["jobs"]
        self.purged_idem_total += result["idem"]
        self.purged_backfills_total += result.get("backfills", 0)
        self.refused_total += result["refused"]
        removed = result["runs"] + result["jobs"] + result["idem"] + result.get("backfills", 0)
        log.debug("purged %d runs, %d jobs, %d idempotency keys (%d refused)", result["runs"],
                  result["jobs"], result["idem"], result["refused"])
        return plan.room() == 0 and removed > 0

    # --- choosing (on an executor thread: reads only) -------------------------------------

    def plan(self, bounds: Bounds) -> Plan:
        if self.resting():
            return self._plan_touched(bounds)
        round_ = self._round
        if round_ is None:
            round_ = self._round = _Round()
            if self._watch is not None:
                # What is applied from here on, the rest after the round visits.
                self._touched = Touched(
                    idem_matters=self._retention.idempotency_ttl_s < limits.purge_rest_max_s)
                self._watch(self._touched)
        round_.started.update(name for name, cursor in zip(_TABLES, self._cursors())
                              if cursor == b"")
        plan = Plan()
        self._plan_jobs(plan, bounds)
        self._plan_idem(plan, bounds)
        self._plan_backfills(plan, bounds)
        if not plan.empty():
            round_.quiet = False
        round_.covered.update(name for name, cursor in zip(_TABLES, self._cursors())
                              if cursor == b"" and name in round_.started)
        if len(round_.covered) == len(_TABLES):
            self._end_round(round_, bounds.now_ms)
        return plan

    def _cursors(self) -> tuple[bytes, bytes, bytes]:
        return self._job_cursor, self._idem_cursor, self._backfill_cursor

    def _end_round(self, round_: _Round, now_ms: int) -> None:
        self._round = None
        touched = self._touched
        if touched is None or not round_.quiet or touched.overflow:
            return
        until_ms = now_ms + int(limits.purge_rest_max_s * 1000)
        if round_.wake_ms is not None:
            until_ms = min(until_ms, round_.wake_ms)
        if until_ms > now_ms:
            self._rest = _Rest(until_ms=until_ms,
                               until_s=self._monotonic() + limits.purge_rest_max_s,
                               touched=touched)
            self.rests_total += 1
            log.debug("purger: nothing to remove; resting for %.1f s, reading only the jobs "
                      "written meanwhile", (until_ms - now_ms) / 1000)

    def _plan_touched(self, bounds: Bounds) -> Plan:
        """A pass of a rest: each job written since the round began, once;
        what they say can shorten the rest, and one they cannot date ends it."""
        rest = self._rest
        assert rest is not None
        plan, visits = Plan(), _Round()
        taken = rest.touched.take()
        store = self._replicated.store
        self._round = visits
        try:
            while taken and plan.room() > 0:
                key = taken.pop()
                # As a round reads it: a job with no history (a create) is
                # skipped undecoded, having nothing to remove.
                rows = store.scan_jobs_with_history(start=key, limit=1)
                job = rows[0][1] if rows and rows[0][0] == key else None
                if job is not None:
                    self._plan_job(plan, job, bounds)
                if plan.room() == 0:
                    taken.add(key)   # it may have more to remove
        finally:
            self._round = None
        rest.touched.give_back(taken)
        self.touched_visits_total += 1
        if not visits.quiet:
            self._rest = None
        elif visits.wake_ms is not None:
            rest.until_ms = min(rest.until_ms, visits.wake_ms)
        return plan

    def _plan_jobs(self, plan: Plan, bounds: Bounds) -> None:
        # A pending job (active, never run) reads as None, undecoded: it has
        # no history to choose from and is not retired.
        rows = self._replicated.store.scan_jobs_with_history(
            start=self._job_cursor, limit=limits.purge_scan_jobs_max)
        for key, job in rows:
            if job is None:
                continue
            self._plan_job(plan, job, bounds)
            if plan.room() == 0:
                self._job_cursor = key   # this job may have more: start the next pass here
                return
        full_page = len(rows) == limits.purge_scan_jobs_max
        self._job_cursor = rows[-1][0] + b"\x00" if full_page else b""

    def _plan_job(self, plan: Plan, job: dict, bounds: Bounds) -> None:
        """Walk the job's history oldest first, choosing finished runs past a
        bound; stop at the first finished run within every bound (the rest are
        newer). A retired job whose every run is chosen goes too."""
        retired = retention.retired_before(job, bounds.now_ms - bounds.finished_job_retention_ms)
        round_ = self._round
        if not retired and job["status"] in retention.RETIRED and round_ is not None:
            round_.note(job["updated_ms"] + bounds.finished_job_retention_ms)
        if not retired and retention.finished_runs(job) <= 0:
            # No finished run in its history (runs.create_run counts its
            # runs, purges uncount them; the open ones are its active and
            # waiting runs): nothing to choose, and no index to read. Most
            # jobs of a large state are one-offs waiting for their time, or,
            # in a spike, fired and not finished yet.
            return
        max_runs, max_age_ms = retention.history_bounds(job, bounds.history_max_runs,
                                                        bounds.history_max_age_ms)
        excess = retention.finished_runs(job) - max_runs
        age_cutoff_ms = bounds.now_ms - max_age_ms
        store = self._replicated.store
        # A run and, for a DAG job, the task runs removed with it.
        unit_cost = 1 + len(cost.dag_tasks(job["spec"]))
        # The job's runs, oldest first: the runs table's own order (keys.run_id).
        prefix = keys.job_runs_prefix(job["id"])
        start, page, seen, chosen = prefix, limits.purge_page_runs_first, 0, 0
        while plan.room() > 0 and seen < limits.purge_scan_runs_per_job_max:
            rows = store.scan(RUNS, start=start, stop=keys.job_runs_stop(job["id"]), limit=page)
            for _, run in rows:
                if run["job_id"] != job["id"]:
                    continue   # another job's, whose id extends this one's
                seen += 1
                if not retention.purgeable_state(run):
                    continue   # open, or its alert is not delivered yet: it stays
                run_id = run["id"]
                aged = run["finished_ms"] is not None and run["finished_ms"] <= age_cutoff_ms
                if not (retired or excess > 0 or aged):
                    # The oldest finished run within every bound: the first
                    # of this job's to pass one by time alone.
                    if round_ is not None and run["finished_ms"] is not None:
                        round_.note(run["finished_ms"] + max_age_ms)
                    return
                if not plan.fits(unit_cost):
                    return   # the entry is full: the next pass goes on from here
                plan.runs.append((run_id, job["id"]))
                plan.cost += unit_cost
                chosen += 1
                excess -= 1
                if plan.room() == 0:
                    return
            if len(rows) < page:
                break
            start, page = rows[-1][0] + b"\x00", min(page * 2, limits.purge_page_runs_max)
        else:
            # The walk stopped at its bound: the job keeps runs not seen yet,
            # which the round cannot date.
            if round_ is not None:
                round_.quiet = False
            return
        if retired and seen == chosen and not retention.open_runs(job) and plan.room() > 0:
            plan.jobs.append(job["id"])
            plan.cost += 1

    def _plan_idem(self, plan: Plan, bounds: Bounds) -> None:
        if plan.room() == 0:
            return
        store = self._replicated.store
        cutoff_ms = bounds.now_ms - bounds.idempotency_ttl_ms
        rows = store.scan(IDEM, start=self._idem_cursor, limit=limits.purge_scan_idem_max)
        for key, value in rows:
            if plan.room() == 0:
                self._idem_cursor = key
                return
            created_ms = retention.idem_created_ms(store, value)
            if created_ms is None or created_ms <= cutoff_ms:
                tenant, _, idem = key.partition(b"\x00")
                plan.idem.append((tenant.decode(), idem.decode()))
                plan.cost += 1
            elif self._round is not None:
                self._round.note(created_ms + bounds.idempotency_ttl_ms)
        full_page = len(rows) == limits.purge_scan_idem_max
        self._idem_cursor = rows[-1][0] + b"\x00" if full_page else b""

    def _plan_backfills(self, plan: Plan, bounds: Bounds) -> None:
        if plan.room() == 0:
            return
        cutoff_ms = bounds.now_ms - bounds.finished_job_retention_ms
        rows = self._replicated.store.scan(BACKFILLS, start=self._backfill_cursor,
                                           limit=limits.purge_scan_backfills_max)
        for key, record in rows:
            if plan.room() == 0:
                self._backfill_cursor = key
                return
            if backfill.purgeable(record, cutoff_ms):
                plan.backfills.append(record["id"])
                plan.cost += 1
            elif record["state"] != backfill.RUNNING and self._round is not None:
                self._round.note(record["finished_ms"] + bounds.finished_job_retention_ms)
        full_page = len(rows) == limits.purge_scan_backfills_max
        self._backfill_cursor = rows[-1][0] + b"\x00" if full_page else b""
