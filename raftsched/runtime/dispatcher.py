"""The dispatcher: execute the runs this node holds, under its shard lease.

The lease is taken at fire (core/runs.py): a node-executed run (HTTP and
publish targets, and commands on the default queue, the node's embedded
worker, which runs them only under --allow-commands: without it, such a run
fails at once, not retried) is created held by its shard's owner, under the
shard's fencing token. Runs arrive as RunQueued effects from apply (on the
loop thread) at `submit`. For each run, up to `runs_inflight_max` at a time:

  1. if its tenant's circuit breaker for its target host is open, wait for the cool-off
     (the run stays held: no attempt is spent on a host that is down), for at most
     breaker_hold_max_s, past which it is called anyway;
  1b. if `http_connections_per_host_max` calls to its target host are in flight here,
     wait for one of them to end, without a slot, in the host's own fair queue
     (tenants in turn by weight, one run each: FairQueue with a quantum of 1). The
     HTTP client never queues a call for a connection itself: a call waiting there
     spent its timeout waiting behind the others, and in arrival order, so that one
     tenant's burst at a shared host held back another's calls to it and timed its
     own out unsent. A run waiting for its host holds no place in its tenant's
     runs_concurrent_max (it takes one again when its call begins), so a tenant's
     slow host does not hold back its runs for other hosts; with the runs waiting
     for a slot, at most dispatch_queue_max wait;
  2. the call step (`_attempt`): call only while this node holds the run's
     shard under the run's token and its shard lease is valid by its
     monotonic clock (runtime/coordinator.py `shard_lease_valid`); a run of a
     shard this node lost is dropped (the new owner takes it over), and while
     the lease is past but the shard still ours the call waits;
  3. call the target; keep the attempt's output in the node's output store
     and propose `finish`, with a retry delay drawn here when the failure is
     retryable.

There is no `start` entry and no per-run heartbeat: a run is held while the
shard is, however long it waits in the queue. Finishes are batched by the
Reporter (one Raft entry carries many runs). When this node gains a shard,
the takeover loop proposes `take_over_runs` for the shard's open runs that
another node (or nobody) held. On start-up the node resumes the runs it
holds in the shards it owns: calls cut short by its stop are made again
(a crash is a fault: at least once).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
from typing import Any, Awaitable, Callable, Protocol
from urllib.parse import urlsplit

from raftsched import limits
from raftsched.core import commands, cost, dag, keys, queries, retry, runs, tenancy
from raftsched.core.redact import redact_output, redact_text, secret_values
from raftsched.errors import Unavailable
from raftsched.executors.base import Attempt, Outcome
from raftsched.executors import breaker as breaker_states
from raftsched.executors.breaker import Breaker
from raftsched.runtime.context import Replicated, Spawn
from raftsched.runtime.fair import FairQueue
from raftsched.runtime.horizon import CallHorizon, cover_or_drop
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.storage.output_store import OutputStore

log = logging.getLogger("raftsched.dispatch")

_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=limits.url_parts_remembered_max)
def _url_parts(url: str) -> tuple[str, str | None]:
    """(host, connection) of a target URL: what its tenant's breaker counts
    calls by (the URL's netloc), and what the HTTP client pools its
    connections by (scheme, host, port; None for a URL that cannot be
    called: the call fails at once). A call reads both, three times."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "", None
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return parts.netloc, None
    return parts.netloc, f"{parts.scheme}://{parts.hostname}:{port}"


# In place of a job read when a run was taken: the attempt reads it as it starts.
_READ_JOB = object()

# The command level (commands.APPLY_LEVEL) that applies hand_over_runs.
HAND_OVER_LEVEL = 2
# The command level that applies miss_uncalled.
MISS_UNCALLED_LEVEL = 3
# The command level that applies take_over_judged.
JUDGE_UNCALLED_LEVEL = 4


def recorded_level(store: Any, node_id: str) -> int:
    """What the state shows of a node's command level: one whose renewals are
    recorded (a renewal's time in its record) runs a build that applies
    JUDGE_UNCALLED_LEVEL, since only such a build proposes them; of any other
    nothing is known."""
    record = queries.node_record(store, node_id)
    return JUDGE_UNCALLED_LEVEL if record is not None and "renewed_ms" in record \
        else commands.APPLY_LEVEL_UNSAID


async def _each(items: list, work: Callable[[Any], Awaitable[None]]) -> None:
    """`work(item)` for every item, take_over_shards_at_once at a time, until
    all have ended; then the first exception any raised, if one did."""
    gate = asyncio.Semaphore(limits.take_over_shards_at_once)

    async def one(item: Any) -> None:
        async with gate:
            await work(item)

    results = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


def attempt_of(run: dict) -> Attempt:
    return Attempt(run_id=run["id"], job_id=run["job_id"], execution_id=run["execution_id"],
                   scheduled_ms=run["scheduled_ms"], attempt=run["attempt"],
                   fencing_token=run.get("token", 0))


def finish_update(run: dict, holder: str, outcome: Outcome, policy: dict, *, at_ms: int,
                  output_node: str, called_ms: int | None = None) -> commands.RunFinish:
    """The finish report for an attempt; the proposer draws the retry delay.
    `output_node`: the node that keeps the attempt's output, if it has one."""
    return commands.run_finish(
        run_id=run["id"], holder=holder, attempt=run["attempt"], at_ms=at_ms,
        ok=outcome.ok, retryable=outcome.retryable,
        retry_delay_ms=None if outcome.ok else
        retry.draw_delay_ms(policy, run["attempt"], random.random),
        http_status=outcome.http_status, exit_code=outcome.exit_code, error=outcome.error,
        output_node=output_node if outcome.output else None, called_ms=called_ms)


def report_cost(job: dict | None, run: dict, event: str = "finish") -> int:
    """What apply may do for a report of this run, in cost units: the start or
    finish of a DAG task run rewrites its DAG run, and a finish may release
    every task downstream of it (core/cost.py)."""
    return cost.run_update_cost(job["spec"] if job else None, run.get("task_id"), event)


def masked_outcome(job: dict | None, outcome: Outcome) -> Outcome:
    """The outcome with the job's secrets masked in its output and error
    (core/redact.py), before the output is stored and the error replicated:
    a secret a target or command echoed never reaches a disk or another node."""
    if not outcome.output and not outcome.error:
        return outcome   # nothing to mask (a 2xx with an empty body)
    values = secret_values(job["spec"]) if job is not None else ()
    if not values:
        return outcome
    return dataclasses.replace(
        outcome, output=outcome.output and redact_output(outcome.output, values),
        error=outcome.error and redact_text(outcome.error, values))


def may_hold(job: dict | None, run: dict, outcome: Outcome) -> bool:
    """May this finish wait while calls do (runtime/reporter.py)? Only when
    nothing waits on it: a scheduled run's success (no retry to schedule, no
    alert), not a DAG task (its finish releases others), of a job whose
    concurrency policy lets its next run start while this one is open."""
    return outcome.ok and job is not None and run.get("trigger") == "schedule" \
        and "dag_run" not in run \
        and job["spec"].get("concurrency", {}).get("policy", "allow") == "allow"


def _log_breaker(breaker: Breaker, changed: str, tenant: str, host: str,
                 outcome: Outcome) -> None:
    """The line an operator reads when a tenant's breaker for a host opens,
    stays open after its probe, or closes (executors/breaker.py)."""
    cooloff = f"{limits.breaker_cooloff_s:g} s (breaker_cooloff_s)"
    if changed == breaker_states.OPENED:
        failed, counted = breaker.failures(tenant, host)
        log.warning("circuit breaker open for tenant %s's calls to %s: %d of its last %d "
                    "calls failed, the latest with %s; this node holds its runs for that host "
                    "(running, not called, spending no attempt) for %s, then lets one call "
                    "through", tenant, host, failed, counted, _failure(outcome), cooloff)
    elif changed == breaker_states.REOPENED:
        log.warning("circuit breaker for tenant %s's calls to %s stays open another %s: the "
                    "call let through after the cool-off failed with %s", tenant, host,
                    cooloff, _failure(outcome))
    else:
        log.info("circuit breaker closed for tenant %s's calls to %s: the call let through "
                 "after the cool-off succeeded; its held runs are called", tenant, host)


def _failure(outcome: Outcome) -> str:
    if outcome.http_status is not None:
        return f"HTTP {outcome.http_status}"
    return (outcome.error or "an error")[:200]


def breaker_ok(outcome: Outcome) -> bool:
    """Did the host answer sanely? A 3xx or a 4xx other than 429 is the
    request's fault, as is an address the node refused to call (the host was
    never reached)."""
    status = outcome.http_status
    if outcome.ok or (status is None and not outcome.retryable):
        return True
    return status is not None and 300 <= status < 500 and status != 429


class Executor(Protocol):
    """Makes one attempt's call (executors/http.py, executors/command.py)."""

    async def run(self, attempt: Attempt, target: dict, deadline_ms: int) -> Outcome: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Calls:
    """How this node calls its runs' targets, and what it keeps of them."""
    http: Executor
    # The embedded worker for command targets of the default queue; None
    # without --allow-commands (such a run then fails, not retried).
    command: Executor | None
    # Per tenant and target host (executors/breaker.py).
    breaker: Breaker
    # Each attempt's output, kept on this node (storage/output_store.py).
    outputs: OutputStore
    # (limit, detail) while storage is past its mark: a publish waits then
    # (runtime/storage_guard.py StorageGuard.past_mark).
    storage_past_mark: Callable[[], tuple[str, str] | None]
    # First calls of scheduled runs against when they were due.
    lateness: LatenessHistogram
    # A time no run this node called was due after, kept in its data folder
    # (runtime/horizon.py); None keeps none, and judges no run uncalled.
    horizon: CallHorizon | None = None


class ShardLease(Protocol):
    """This node's shard lease and the live nodes (runtime/coordinator.py)."""

    def shard_lease_valid(self) -> bool: ...

    async def wait_lease_extended(self, timeout_s: float) -> None: ...

    def live_nodes(self) -> list[str]: ...


class Armed(Protocol):
    """Runs fired ahead, held until their second (runtime/armed.py)."""

    def hold(self, run: dict) -> bool: ...

    def withdraw(self, run_id: str) -> bool: ...

    def held_in(self, shards: set[int]) -> list[dict]: ...


class SendReport(Protocol):
    """A run report to the reporter (runtime/reporter.py Reporter.send): a
    future of whether apply accepted it."""

    def __call__(self, update: Any, tenant: str = "", cost: int = 1,
                 hold: bool = False) -> "asyncio.Future[bool]": ...


class Dispatcher:
    def __init__(self, replicated: Replicated, *, calls: Calls, lease: ShardLease,
                 armed: Armed, report: SendReport, spawn: Spawn,
                 quota_of: Callable[[str], dict[str, int]],
                 cluster_applies: Callable[[], int],
                 monotonic: Callable[[], float],
                 take_over_applies: Callable[[], int] | None = None) -> None:
        """`quota_of`: a tenant's quotas in force (weight, runs_concurrent_max);
        `cluster_applies`: the command level every node applies
        (runtime/clock.py), which decides how runs are handed over;
        `take_over_applies`: the same, counting a node not heard from (a dead
        holder, say) by what its record shows (recorded_level), which decides
        how runs are taken over (default: cluster_applies)."""
        self._replicated = replicated
        self._store = replicated.store
        self._me = replicated.node_id
        self._now_ms = replicated.now_ms
        self._calls = calls
        self._lease = lease
        self._armed = armed
        self._send_report = report
        self._spawn = spawn
        self._cluster_applies = cluster_applies
        self._take_over_applies = take_over_applies or cluster_applies
        self._monotonic = monotonic
        # Runs waiting for a slot: fair between tenants by weight, priority
        # within one, each tenant held to its runs_concurrent_max (runtime/fair.py).
        self._queue: FairQueue[dict] = FairQueue(
            tenant_of=lambda run: run["tenant"],
            priority_of=lambda run: run.get("priority", "normal"),
            weight_of=lambda tenant: quota_of(tenant)["weight"],
            cap_of=lambda tenant: quota_of(tenant)["runs_concurrent_max"],
            maxsize=limits.dispatch_queue_max)
        # Attempts taken and not yet settled (run id -> attempt): starting,
        # executing, or finished with the finish not yet committed (or held).
        # A rescan skips them. By attempt: the finish of one attempt may queue
        # the next (a retry fired ahead) before its own sender has ended here.
        self._active: dict[str, int] = {}
        self._running: dict[str, tuple[int, asyncio.Task]] = {}   # run -> (attempt, task)
        self._slots = asyncio.Semaphore(limits.runs_inflight_max)
        self._rescan = True   # resume open runs at start-up
        self._judged_uncalled = False   # runs held since before this start (judge_uncalled)
        # Runs held since before this start that this node's earlier process
        # may have called (due by its call horizon, or any without one): run
        # id -> attempt. Never handed over as uncalled (_may_hand_over). Filled
        # by the first resume, bounded by dispatch_queue_max, emptied as each
        # attempt ends here.
        self._maybe_called: dict[str, int] | None = None
        self.missed_uncalled_total = 0
        self._tasks: set[asyncio.Task] = set()
        self.dropped_notifications = 0
        self.parked_total = 0
        # Runs held back by an open breaker: (run id, attempt) -> when this node
        # first held it (`monotonic`). An entry goes when the run is let
        # through: once its breaker lets calls go, or past breaker_hold_max_s;
        # past dispatch_queue_max entries, those older than that go too.
        self._held_since: dict[tuple[str, int], float] = {}
        self.held_past_bound_total = 0
        self._past_bound_unlogged = 0
        self._past_bound_logged_at: float | None = None
        self.cancelled_total = 0
        self.not_called_total = 0   # runs dropped before their call: the shard was lost
        self.taken_over_total = 0
        # Shards gained whose open runs another node may hold: the takeover
        # loop proposes take_over_runs for them.
        # shard -> when (`monotonic`) this node gained it; at most one entry
        # per shard (shard_count_max).
        self._to_take_over: dict[int, float] = {}
        # Shards of _to_take_over swept early already, in their grace (a
        # subset of it), with the nodes live when swept: see take_over_pending.
        self._armed_swept: dict[int, frozenset[str]] = {}
        # Shards this node lost -> runs it held there and is not calling, for
        # their new owner to take over at once (hand_over_pending).
        self._handing: dict[int, set[str]] = {}
        # Of those, the ones whose hand-over is proposed and not answered yet:
        # a draining node waits for them too (handing_over).
        self._handing_proposed = 0
        self.handed_over_total = 0
        self._take_over_wake = asyncio.Event()
        # HTTP calls in flight here by target host, and the runs waiting for
        # one of them to end (step 1b): a queue per host while any waits.
        self._host_calls: dict[str, int] = {}
        self._host_waiting: dict[str, FairQueue[dict]] = {}
        self._host_waiting_count = 0
        self._quota_of = quota_of
        self.host_waited_total = 0
        self._closing = False

    # --- inputs (loop thread) ---------------------------------------------------------

    def submit(self, run: dict) -> None:
        """Never blocks. A run fired ahead is held until its second, or handed
        to its shard's owner (runtime/armed.py), which enqueues it then."""
        if not self._armed.hold(run):
            self.enqueue(run)

    def enqueue(self, run: dict) -> None:
        """Never blocks: on overflow (dispatch_queue_max runs waiting, for a
        slot or for their host), a rescan of the open-runs index picks the run up."""
        try:
            if self.calls_waiting() >= limits.dispatch_queue_max:
                raise asyncio.QueueFull
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            self.dropped_notifications += 1
            self._rescan = True
            log.error("dispatch queue full (%d, dispatch_queue_max); run %s will be picked up "
                      "by the next rescan", limits.dispatch_queue_max, run["id"])

    def cancelled(self, run_id: str, attempt: int) -> None:
        """From apply's RunCancelled: stop the call (HTTP aborted, process group killed),
        or drop the run if it is held until its second."""
        self._armed.withdraw(run_id)
        entry = self._running.get(run_id)
        if entry is not None and entry[0] == attempt:
            self.cancelled_total += 1
            entry[1].cancel()

    def request_rescan(self) -> None:
        """After a snapshot install: the open-runs index may name new runs of ours."""
        self._rescan = True

    def shard_gained(self, shard: int) -> None:
        """From apply's ShardsAssigned naming this node: take over the shard's
        open runs, take_over_grace_s from now."""
        self._to_take_over[shard] = self._monotonic()
        self._take_over_wake.set()

    def renewal_applied(self) -> None:
        """From apply's NodeRenewed: while a gained shard is in its grace, a
        renewal may be what shows its former holder dead (Coordinator.live_nodes):
        look again now rather than at the loop's next period."""
        if self._to_take_over:
            self._take_over_wake.set()

    def shards_lost(self, shards: set[int]) -> None:
        """From apply's ShardsAssigned naming another node: the runs this node
        holds armed in those shards go to their new owner now, as the same
        attempt (hand_over_runs), rather than at their second. Those fired
        ahead and not due by take_over_armed_margin_ms the new owner takes
        over itself; those due sooner only this node can hand over uncalled
        (otherwise the new owner waits take_over_grace_s, then calls them as
        next attempts)."""
        store = self._store
        for run in self._armed.held_in(shards):
            state = queries.shard(store, run["shard"])
            if self._may_hand_over(run, state, queries.run_hold(store, run["id"])):
                self._armed.withdraw(run["id"])
                self._hand_over(run["shard"], run["id"])

    def _may_hand_over(self, run: dict, state: dict | None,
                       current: queries.RunHold | None) -> bool:
        """Is `run` (this attempt) still this node's, in a shard another node
        owns now (`state`: the shard's; `current`: who holds the run as stored)?"""
        me = self._me
        return state is not None and state["owner"] not in (None, me) \
            and current is not None and current.running_for(me, run["attempt"]) \
            and not self.maybe_called_before_start(run)

    def maybe_called_before_start(self, run: dict) -> bool:
        """Did this node's process before this start perhaps call this attempt
        (it held it then, due by the call horizon)? Then it is not handed over
        as uncalled: its new owner takes it over as its next attempt."""
        return self._maybe_called is not None \
            and self._maybe_called.get(run["id"]) == run["attempt"]

    def _move_cost(self, run: dict) -> int:
        """What moving `run` to another holder costs apply: a DAG task run's
        move rewrites its DAG run (core/cost.py)."""
        job = queries.job(self._store, run["job_id"]) if "dag_run" in run else None
        return report_cost(job, run, "start")

    def handing_over(self) -> int:
        """Runs this node has yet to hand to their shards' new owners, those
        whose hand-over is on its way through the log included."""
        return sum(len(ids) for ids in self._handing.values()) + self._handing_proposed

    def running(self) -> int:
        return len(self._running)

    def waiting(self) -> int:
        """Runs waiting here for a call slot."""
        return self._queue.qsize()

    def waiting_for_host(self) -> int:
        """Runs waiting here for a call to their target host to end (step 1b)."""
        return self._host_waiting_count

    def calls_waiting(self) -> int:
        """Runs waiting here for their call: for a slot, or for their host.
        While any do, the reporter holds the finishes it may (runtime/reporter.py)."""
        return self._queue.qsize() + self._host_waiting_count

    def queue_depths(self) -> dict[str, int]:
        """Runs waiting here for a slot or for their host, by tenant."""
        depths = self._queue.depths()
        for queue in self._host_waiting.values():
            for tenant, count in queue.depths().items():
                depths[tenant] = depths.get(tenant, 0) + count
        return depths

    # --- the loops --------------------------------------------------------------------

    async def run(self) -> None:
        if not self._judged_uncalled:
            self._judged_uncalled = True
            await self.judge_uncalled()
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
            # One turn of the loop first, as a wait would give: what apply
            # has told this node meanwhile (a cancel, a shard moved, a run
            # released at its second) is handled before the next run is
            # taken. Taking up to 32 runs a turn instead cost a third less
            # CPU a call in one process but made another tenant's few runs
            # wait twice as long behind a backlog (docs/benchmarks.md,
            # "Tried and not kept: up to 32 takes a turn"). A run ready is
            # taken then with no task or timer of its own (asyncio.wait_for
            # makes both); none ready, the take waits up to a second.
            await asyncio.sleep(0)
            run = self._queue.get_nowait()
            if run is None:
                try:
                    run = await asyncio.wait_for(self._queue.get(), 1.0)
                except asyncio.TimeoutError:
                    self._slots.release()
                    continue
            # Read once for the breaker's host and for the call.
            job = queries.job_to_call(self._store, run["job_id"])
            if self._active.get(run["id"]) == run["attempt"] or self._maybe_park(run, job):
                self._queue.done(run["tenant"])
                self._slots.release()
                continue
            self._active[run["id"]] = run["attempt"]
            host = self._connection_of(run, job)
            if host is not None and self._host_calls.get(host, 0) \
                    >= limits.http_connections_per_host_max:
                # It waits for its host, holding no slot and no place in its
                # tenant's cap: the tenant's runs for other hosts go on.
                self._slots.release()
                self._queue.done(run["tenant"])
                self._wait_for_host(host, run)
                continue
            self._start_attempt(run, job, host)

    def _start_attempt(self, run: dict, job: Any, host: str | None) -> None:
        """Spawn the attempt of a run that holds a slot (and, for an HTTP
        target, one of its host's calls)."""
        if host is not None:
            self._host_calls[host] = self._host_calls.get(host, 0) + 1
        task = self._spawn("dispatcher.attempt", self._attempt(run, job, host))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wait_for_host(self, host: str, run: dict) -> None:
        """Queue `run` behind the calls in flight to its host (step 1b)."""
        queue = self._host_waiting.get(host)
        if queue is None:
            queue = self._host_waiting[host] = FairQueue(
                tenant_of=lambda run: run["tenant"],
                priority_of=lambda run: run.get("priority", "normal"),
                weight_of=lambda tenant: self._quota_of(tenant)["weight"],
                # Caps are the slot queue's to count, as a call begins.
                cap_of=lambda tenant: limits.dispatch_queue_max,
                maxsize=limits.dispatch_queue_max, quantum=1)
        queue.put_nowait(run)
        self._host_waiting_count += 1
        self.host_waited_total += 1

    def _host_call_ended(self, host: str) -> bool:
        """A call to `host` ended: its slot goes to the next run waiting for
        that host, if any (then say so: the slot stays taken)."""
        queue = self._host_waiting.get(host)
        run = queue.get_nowait() if queue is not None and not self._closing else None
        if run is None:
            left = self._host_calls.get(host, 0) - 1
            if left > 0:
                self._host_calls[host] = left
            else:
                self._host_calls.pop(host, None)
            return False
        queue.done(run["tenant"])
        self._queue.take(run["tenant"])   # given back as its attempt ends
        self._host_waiting_count -= 1
        if not queue.qsize():
            del self._host_waiting[host]
        self._host_calls[host] -= 1
        # Its job is read again as its attempt starts: it may have changed meanwhile.
        self._start_attempt(run, _READ_JOB, host)
        return True

    def _maybe_park(self, run: dict, job: dict | None) -> bool:
        """Hold a run back while its tenant's breaker for its target host is
        open, for at most breaker_hold_max_s; say whether it did."""
        host = self._host(run, job)
        breaker = self._calls.breaker
        held = (run["id"], run["attempt"])
        if host is None or breaker.allow(run["tenant"], host):
            self._held_since.pop(held, None)
            return False
        now = self._monotonic()
        since = self._held_since.setdefault(held, now)
        if len(self._held_since) > limits.dispatch_queue_max:
            # A held run is seen again each cool-off, and let through (its entry
            # gone) by breaker_hold_max_s: an older entry is one whose run left
            # this node unseen (a dispatch queue overflow). Bounded so.
            self._held_since = {k: t for k, t in self._held_since.items()
                                if now - t < limits.breaker_hold_max_s}
        if now - since >= limits.breaker_hold_max_s:
            # Called anyway: its attempt ends as the host answers, and its
            # retry policy decides the rest. (Its outcome leaves the open
            # breaker as it is: only the probe after a cool-off closes it.)
            del self._held_since[held]
            self._held_past_bound(run["tenant"], host, now)
            return False
        self.parked_total += 1
        delay_s = max(0.5, breaker.retry_at(run["tenant"], host) - self._monotonic())
        asyncio.get_running_loop().call_later(delay_s, self.submit, run)
        return True

    def _held_past_bound(self, tenant: str, host: str, now: float) -> None:
        """Count a run let through past breaker_hold_max_s; say so in a line
        at most once a cool-off, however many there are."""
        self.held_past_bound_total += 1
        self._past_bound_unlogged += 1
        last = self._past_bound_logged_at
        if last is not None and now - last < limits.breaker_cooloff_s:
            return
        log.warning("runs held behind an open circuit breaker for breaker_hold_max_s (%g s) "
                    "are called anyway: %d since the last such line, the latest of tenant %s "
                    "to %s; each ends as the host answers, and its retry policy decides the "
                    "rest", limits.breaker_hold_max_s, self._past_bound_unlogged, tenant, host)
        self._past_bound_unlogged = 0
        self._past_bound_logged_at = now

    @staticmethod
    def _connection_of(run: dict, job: dict | None) -> str | None:
        """What the HTTP client pools a call's connections by (scheme, host,
        port), for an HTTP target; else None."""
        target = dag.target_of(job["spec"], run.get("task_id")) if job is not None else None
        if target is None or target["type"] != "http":
            return None
        return _url_parts(target["url"])[1]

    @staticmethod
    def _host(run: dict, job: dict | None) -> str | None:
        target = dag.target_of(job["spec"], run.get("task_id")) if job is not None else None
        if target is None or target["type"] != "http":
            return None
        return _url_parts(target["url"])[0]

    async def takeover_loop(self) -> None:
        """Propose take_over_runs for the shards this node gained; a shard
        whose proposal did not commit, or held more than one entry's worth,
        is tried again."""
        while True:
            # While a gained shard is in its grace, look each renewal period:
            # a former holder may be judged dead meanwhile (take_over_pending).
            period_s = limits.renew_period_s * (1 if self._to_take_over else 4)
            try:
                await asyncio.wait_for(self._take_over_wake.wait(), period_s)
            except asyncio.TimeoutError:
                pass
            self._take_over_wake.clear()
            await self.hand_over_pending()
            await self.take_over_pending()

    def _hand_over(self, shard: int, run_id: str) -> None:
        """A run this node still holds in a shard it lost, and is not calling:
        its new owner may take it over now instead of after take_over_grace_s
        (the grace waits for calls of this node that it says it is not making).
        Bounded by what this node holds (armed_runs_max, dispatch_queue_max);
        proposed take_over_batch_max at a time (hand_over_pending)."""
        self._handing.setdefault(shard, set()).add(run_id)
        self._take_over_wake.set()

    async def hand_over_pending(self) -> None:
        """See _hand_over_shard; the shards at once (_each)."""
        # While a node of an earlier release is in the cluster (a rolling
        # upgrade), it would stop on hand_over_runs: the runs go as a
        # take-over (their next attempts) as that release did.
        keeps_attempt = self._cluster_applies() >= HAND_OVER_LEVEL
        handing, self._handing = self._handing, {}
        self._handing_proposed += sum(len(ids) for ids in handing.values())
        await _each(sorted(handing.items()),
                    lambda item: self._hand_over_shard(item[0], sorted(item[1]), keeps_attempt))

    async def _hand_over_shard(self, shard: int, run_ids: list[str],
                               keeps_attempt: bool) -> None:
        try:
            await self._propose_hand_over(shard, run_ids, keeps_attempt)
        finally:
            self._handing_proposed -= len(run_ids)   # answered, or back in _handing

    async def _propose_hand_over(self, shard: int, run_ids: list[str],
                                 keeps_attempt: bool) -> None:
        """Propose, for each shard this node lost, that its owner take over
        the runs this node held there and did not call (hand_over_runs, under
        the owner's name and token: apply checks both). This node names itself
        as their holder that did not call them, so each moves as the same
        attempt: a shard moved off a live node is not a failed attempt."""
        state = queries.shard(self._store, shard)
        if state is None or state["owner"] in (None, self._me):
            return
        chunks = self._by_cost(run_ids)
        for i, chunk in enumerate(chunks):
            try:
                result = await self._replicated.propose(
                    commands.hand_over_runs(
                        node=state["owner"], holder=self._me, shard=shard,
                        token=state["token"], run_ids=chunk, at_ms=self._now_ms())
                    if keeps_attempt else commands.take_over_runs(
                        node=state["owner"], shard=shard, token=state["token"],
                        run_ids=chunk, at_ms=self._now_ms()))
            except Unavailable as exc:
                left = [run_id for c in chunks[i:] for run_id in c]
                log.warning("hand-over of %d runs of shard %d to %s not committed: %s",
                            len(left), shard, state["owner"], exc.detail)
                self._handing.setdefault(shard, set()).update(left)
                return
            if result.get("ok"):
                self.handed_over_total += result["taken"]
                log.info("handed %d runs of shard %d to %s, not called here (%s)",
                         result["taken"], shard, state["owner"],
                         "the same attempts" if keeps_attempt else
                         "as next attempts: a node of an earlier release is in the "
                         "cluster")

    def _by_cost(self, run_ids: list[str]) -> list[list[str]]:
        """`run_ids` in entries of at most take_over_batch_max runs and
        apply_entry_cost_max: moving a DAG task run rewrites its DAG run
        (core/cost.py), as in maybe_take_over."""
        store = self._store
        chunks: list[list[str]] = [[]]
        total = 0
        for run_id in run_ids:
            run = queries.run(store, run_id)
            item_cost = self._move_cost(run) if run is not None else 1
            if chunks[-1] and (total + item_cost > limits.apply_entry_cost_max
                               or len(chunks[-1]) >= limits.take_over_batch_max):
                chunks.append([])
                total = 0
            chunks[-1].append(run_id)
            total += item_cost
        return [chunk for chunk in chunks if chunk]

    async def take_over_pending(self) -> None:
        """One pass: each shard gained at least take_over_grace_s ago and not
        yet swept."""
        now = self._monotonic()
        live = frozenset(self._lease.live_nodes()) if self._to_take_over else None
        early, after_grace = [], []
        for shard, gained in sorted(self._to_take_over.items()):
            if now - gained < limits.take_over_grace_s:
                # At once, without the grace: the runs of a holder this node
                # judges dead (its calls died with it or stopped with its
                # shard lease; nothing of it is on its way through the log),
                # and runs fired ahead and not due yet, which no node can
                # have called (none calls early): core/runs.py take_over.
                # Again whenever the live nodes change within the grace: a
                # holder killed as its shards moved is judged dead here only
                # once its renewals lapse, by the log (Coordinator.live_nodes).
                if self._armed_swept.get(shard) != live:
                    self._armed_swept[shard] = live
                    early.append(shard)
                continue
            del self._to_take_over[shard]
            self._armed_swept.pop(shard, None)
            after_grace.append((shard, gained))

        async def sweep_early(shard: int) -> None:
            try:
                await self.maybe_take_over(shard, early=True)
            except Unavailable as exc:
                self._armed_swept.pop(shard, None)
                log.warning("takeover of shard %d's armed runs not committed: %s",
                            shard, exc.detail)

        async def sweep(item: tuple[int, float]) -> None:
            shard, gained = item
            try:
                more = await self.maybe_take_over(shard)
            except Unavailable as exc:
                log.warning("takeover of shard %d's open runs not committed: %s", shard,
                            exc.detail)
                more = True
            if more:
                self._to_take_over.setdefault(shard, gained)

        # The shards at once, each its own entry: one after another, a node
        # that gained 85 shards took 4 s (a commit each) to reach the last.
        await _each(early, sweep_early)
        await _each(after_grace, sweep)

    async def maybe_take_over(self, shard: int, early: bool = False) -> bool:
        """Take over the open runs of `shard` held under an older token (or by
        nobody), if this node owns it; say whether some may be left.
        `early`: only those fired ahead and not due yet, and those of a
        holder this node judges dead (not live to its coordinator)."""
        store, me = self._store, self._me
        at_ms = self._now_ms()
        live = set(self._lease.live_nodes()) if early else set()
        state = queries.shard(store, shard)
        if state is None or state["owner"] != me:
            return False
        run_ids, total, holders = [], 0, set()
        for run_id in queries.open_run_ids(store, shard, limits.take_over_batch_max):
            # Most are this node's own, under this token: told apart by who
            # holds them, without reading each whole.
            hold = queries.run_hold(store, run_id)
            if hold is None or (hold.holder == me and hold.token == state["token"]):
                continue
            run = queries.run(store, run_id)
            if run is None:
                continue
            if early and run.get("holder") in live and not runs.not_due(run, at_ms):
                continue
            # An entry holds at most apply_entry_cost_max; the rest is next.
            item_cost = self._move_cost(run)
            if run_ids and total + item_cost > limits.apply_entry_cost_max:
                break
            total += item_cost
            run_ids.append(run["id"])
            if run.get("holder"):
                holders.add(run["holder"])
        if not run_ids:
            return False
        result = await self._replicated.propose(commands.take_over_runs(
            node=me, shard=shard, token=state["token"], run_ids=run_ids, at_ms=at_ms,
            judge_uncalled=self._take_over_applies() >= JUDGE_UNCALLED_LEVEL))
        if result.get("ok"):
            self.taken_over_total += result["taken"]
            if result.get("ended"):
                self.missed_uncalled_total += result["ended"]
                log.info("ended %d runs of shard %d that their holder %s never called (its "
                         "shard lease ended before their second), as their jobs' misfire "
                         "policies say", result["ended"], shard, ",".join(sorted(holders)))
            again = result.get("next_attempts", 0)
            if again:
                log.warning("took over %d open runs of shard %d from %s (their holder lost "
                            "the shard; %s); %d of them may have been called and are called "
                            "here again, as their next attempts", result["taken"], shard,
                            ",".join(sorted(holders)) or "no node",
                            f"live here: {','.join(sorted(live))}" if early
                            else f"after take_over_grace_s, {limits.take_over_grace_s:g} s",
                            again)
            elif result["taken"]:
                log.info("took over %d open runs of shard %d, none called yet (fired "
                         "ahead, or handed over)", result["taken"], shard)
        return bool(result.get("ok")) and result["taken"] + result.get("ended", 0) > 0

    async def judge_uncalled(self) -> None:
        """Once, at start, before any run this node holds is called: those it
        held before this start, fired ahead of a second that passed while it
        was down, and due after its call horizon's time (so never called:
        runtime/horizon.py), go to their jobs' misfire policies
        (miss_uncalled), which end those they would not run. Waits for this
        node's shard lease (its state caught up with a renewal of this start)
        up to uncalled_judge_wait_s; without it, or while a node of an
        earlier release is in the cluster, they are called late, each one."""
        horizon = self._calls.horizon
        after_ms = None if horizon is None else horizon.previous_ms
        if after_ms is None or not self._uncalled(after_ms):
            return
        deadline = self._monotonic() + limits.uncalled_judge_wait_s
        while not self._lease.shard_lease_valid():
            left = deadline - self._monotonic()
            if left <= 0:
                log.warning("runs held since before this start, due while this node was "
                            "down, are called late, each one: no shard lease within %.0f s "
                            "(uncalled_judge_wait_s), so their misfire policies did not judge "
                            "them", limits.uncalled_judge_wait_s)
                return
            await self._lease.wait_lease_extended(min(left, limits.renew_period_s))
        # Every peer's release, from its clock answers (a rolling upgrade
        # may have an older node in the cluster, which costs the calls no
        # more than this wait).
        deadline = self._monotonic() + limits.uncalled_level_wait_s
        while self._cluster_applies() < MISS_UNCALLED_LEVEL:
            if self._monotonic() >= deadline:
                log.warning("runs held since before this start, due while this node was "
                            "down, are called late, each one: a node of an earlier release "
                            "is in the cluster, so their misfire policies did not judge them")
                return
            await asyncio.sleep(limits.clock_probe_period_unmeasured_s)
        for shard, (token, run_ids) in sorted(self._uncalled(after_ms).items()):
            for chunk in self._by_cost(run_ids):
                try:
                    result = await self._replicated.propose(commands.miss_uncalled(
                        node=self._me, shard=shard, token=token, uncalled_after_ms=after_ms,
                        run_ids=chunk, at_ms=self._now_ms()))
                except Unavailable as exc:
                    log.warning("runs of shard %d held since before this start are called "
                                "late, each one: their misfire judgement was not committed: "
                                "%s", shard, exc.detail)
                    break
                if result.get("ok"):
                    self.missed_uncalled_total += result["ended"]
                    log.info("%d runs of shard %d were due while this node was down and never "
                             "called: %d ended missed or skipped by their misfire policies, "
                             "the others are called late", result["judged"], shard,
                             result["ended"])

    def _uncalled(self, after_ms: int) -> dict[int, tuple[int, list[str]]]:
        """shard -> (token, ids of the runs this node holds there that it never
        called and that were due by now: core/runs.uncalled_late)."""
        store, me, now_ms = self._store, self._me, self._now_ms()
        found: dict[int, tuple[int, list[str]]] = {}
        for shard, token in queries.owned_shards(store, me).items():
            ids = [run["id"] for run in queries.open_runs(store, shard, limits.dispatch_queue_max)
                   if runs.uncalled_late(run, me, token, after_ms, now_ms)]
            if ids:
                found[shard] = (token, ids)
        return found

    def _resume_open_runs(self) -> None:
        """Submit the runs this node holds in the shards it owns (at start-up,
        after a restart of this loop or a snapshot install), and mark every
        owned shard for the takeover loop (runs held under an older token)."""
        store, me = self._store, self._me
        resumed = 0
        first = self._maybe_called is None
        if first:
            self._maybe_called = {}
        horizon = self._calls.horizon
        after_ms = None if horizon is None else horizon.previous_ms
        now_ms = self._now_ms()
        for shard, token in queries.owned_shards(store, me).items():
            self._to_take_over.setdefault(shard, self._monotonic())
            for run in queries.open_runs(store, shard, limits.dispatch_queue_max - resumed):
                if self._active.get(run["id"]) == run["attempt"] \
                        or run["state"] != "running" \
                        or run["holder"] != me or run["token"] != token:
                    continue
                due_ms = run["scheduled_ms"] + run.get("jitter_ms", 0)
                if first and due_ms <= now_ms and (after_ms is None or due_ms <= after_ms):
                    self._maybe_called[run["id"]] = run["attempt"]
                self.submit(run)
                resumed += 1
        self._take_over_wake.set()
        if resumed:
            log.info("resuming %d runs this node holds (a call its stop cut short is made "
                     "again)", resumed)

    # --- one attempt ------------------------------------------------------------------

    async def _attempt(self, run: dict, job: Any, host: str | None = None) -> None:
        """`job`: what a call reads of the run's job (queries.job_to_call) as
        read when the run was taken from the queue (or _READ_JOB: read it
        first), read again if the call has to wait for this node's shard
        lease. `host`: the target host whose call count it holds (step 1b)."""
        settled_here = True
        try:
            if job is _READ_JOB:
                job = queries.job_to_call(self._store, run["job_id"])
            # No call past the call horizon (runtime/horizon.py): pushed
            # first, so that the checks below come right before the call.
            await cover_or_drop(self._calls.horizon,
                                run["scheduled_ms"] + run.get("jitter_ms", 0))
            waits = not self._lease.shard_lease_valid()
            if not await self._still_held(run):
                return   # the shard moved: its new owner takes the run over
            task = asyncio.current_task()
            assert task is not None
            self._running[run["id"]] = (run["attempt"], task)
            if waits:
                job = queries.job_to_call(self._store, run["job_id"])
            called_ms = self._now_ms()
            try:
                outcome = await self._call(job, run)
            except asyncio.CancelledError:
                return   # apply cancelled it or took it over: nothing to report
            finally:
                self._running.pop(run["id"], None)
            self._report(job, run, outcome, called_ms)
            settled_here = False
        except Exception as exc:
            # The supervisor logs the traceback and counts it. The run is held
            # by this node, with no lease of its own to expire: the attempt
            # ends here as a retryable failure, retried by its policy.
            log.error("run %s attempt %d: the dispatcher failed unexpectedly; the attempt "
                      "ends as a retryable failure", run["id"], run["attempt"])
            if settled_here:
                settled_here = False
                self._report_failure(run, f"the dispatcher of node {self._me} failed "
                                          f"during the attempt: {exc!r}")
            raise
        finally:
            if host is None or not self._host_call_ended(host):
                self._slots.release()
            self._queue.done(run["tenant"])
            if settled_here:
                self._settled(run)

    def _settled(self, run: dict) -> None:
        """This attempt is settled here (a later one of the run may be active)."""
        if self._active.get(run["id"]) == run["attempt"]:
            del self._active[run["id"]]
        if self._maybe_called and self._maybe_called.get(run["id"]) == run["attempt"]:
            del self._maybe_called[run["id"]]

    def _report_failure(self, run: dict, error: str) -> None:
        job = queries.job_to_call(self._store, run["job_id"])
        self._report(job, run, Outcome(ok=False, error=error))

    async def _still_held(self, run: dict) -> bool:
        """May this node call the run now? Only while it owns the run's shard
        under the run's token (else the run is another node's to take over)
        and its shard lease is valid by its monotonic clock: while the lease
        is past and the shard still ours here, wait (a renewal renews it, or
        the shard's reassignment arrives first: apply is in log order)."""
        store, me = self._store, self._me
        while True:
            state = queries.shard(store, run["shard"])
            current = queries.run_hold(store, run["id"])
            if state is None or state["owner"] != me \
                    or state["token"] != run["token"] or current is None \
                    or not current.running_for(me, run["attempt"]):
                self.not_called_total += 1
                if self._may_hand_over(run, state, current):
                    # Its shard moved: the new owner gets it as it is (one
                    # line a shard's entry in hand_over_pending).
                    self._hand_over(run["shard"], run["id"])
                else:
                    log.warning("run %s attempt %d not called: this node no longer holds it "
                                "(shard %d moved, or the run was cancelled or taken over)",
                                run["id"], run["attempt"], run["shard"])
                return False
            if self._lease.shard_lease_valid():
                return True
            # Look again at the next renewal seen applied (or at the latest
            # after a lease's length, for a reassignment that came first).
            await self._lease.wait_lease_extended(limits.node_lease_s)

    async def _call(self, job: dict | None, run: dict) -> Outcome:
        calls = self._calls
        if job is None or job["status"] == "deleted":
            return Outcome(ok=False, retryable=False,
                           error="the job was deleted before the run started")
        target = dag.target_of(job["spec"], run.get("task_id"))
        if target is None:
            return Outcome(ok=False, retryable=False,
                           error=f"task {run.get('task_id')!r} is no longer in the job's DAG")
        now_ms = self._now_ms()
        deadline_ms = now_ms + int(target.get("timeout_s", 30) * 1000)
        attempt = attempt_of(run)
        if run["attempt"] == 1 and run.get("trigger") == "schedule" and "dag_run" not in run:
            # Trigger lateness: the first call of a run its schedule fired, against
            # when it was due (a backfill's or a DAG task's time is not a due time).
            calls.lateness.record(now_ms - run["scheduled_ms"] - run.get("jitter_ms", 0))
        if target["type"] == "http":
            outcome = await calls.http.run(attempt, target, deadline_ms)
            host = _url_parts(target["url"])[0]
            changed = calls.breaker.record(run["tenant"], host, breaker_ok(outcome))
            if changed is not None:
                _log_breaker(calls.breaker, changed, run["tenant"], host, outcome)
            return outcome
        if target["type"] == "command":
            withdrawn = tenancy.command_run_refusal(
                queries.tenant(self._store, job["tenant"]), job["tenant"])
            if withdrawn is not None:
                # The grant was withdrawn after the job was made: the job stays,
                # its runs fail unrun until an admin grants it again.
                log.warning("run %s of job %s not started: %s", run["id"], job["id"], withdrawn)
                return Outcome(ok=False, retryable=False, error=withdrawn)
            if calls.command is None:
                # Accepted by a node with --allow-commands, fired here: a retry
                # would most likely come back to this node, so the run fails.
                return Outcome(ok=False, retryable=False,
                               error=f"commands do not run on node {self._me} (started "
                                     "without --allow-commands); give the job a target.queue "
                                     "served by `raftsched worker`")
            codes = dag.retry_policy(job["spec"], run.get("task_id"))["non_retryable_exit_codes"]
            return await calls.command.run(
                attempt, dict(target, non_retryable_exit_codes=codes), deadline_ms)
        assert target["type"] == "publish", target
        return await self._publish(job, run, target)

    async def _publish(self, job: dict, run: dict, target: dict) -> Outcome:
        full = self._calls.storage_past_mark()
        if full is not None:
            # A publish adds state: it waits (as a retry) until purges free space.
            return Outcome(ok=False, error=f"publish deferred: storage is past its mark "
                                           f"({full[0]}): {full[1]}")
        try:
            result = await self._replicated.propose(commands.publish(
                topic=keys.scoped(job["tenant"], target["topic"]), key=target.get("key"),
                message=target["message"],
                execution_id=run["execution_id"], job_id=job["id"], at_ms=self._now_ms()))
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

    def _report(self, job: dict | None, run: dict, outcome: Outcome,
                called_ms: int | None = None) -> None:
        outcome = masked_outcome(job, outcome)
        if outcome.output:
            self._calls.outputs.put(
                run["id"], run["attempt"],
                dict(outcome.output, holder=self._me, http_status=outcome.http_status,
                     exit_code=outcome.exit_code),
                now_ms=self._now_ms(), tenant=run["tenant"])
        policy = dag.retry_policy(job["spec"] if job else None, run.get("task_id"))
        update = finish_update(run, self._me, outcome, policy, at_ms=self._now_ms(),
                               output_node=self._me, called_ms=called_ms)
        cost_units, hold = report_cost(job, run), may_hold(job, run, outcome)
        # No task of its own unless the finish must be sent again: a call's
        # finish is nearly always applied the first time.
        self._send_report(update, run["tenant"], cost_units, hold).add_done_callback(
            lambda sent: self._finish_answered(sent, run, update, cost_units, hold))

    def _finish_answered(self, sent: "asyncio.Future[bool]", run: dict,
                         update: commands.RunFinish, cost_units: int, hold: bool) -> None:
        """The reporter answered a finish: the attempt is settled here, unless
        the finish was not applied and the run is still this node's attempt
        (then _send_finish sends it again, and settles it once it ends)."""
        if not sent.cancelled() and sent.exception() is not None:
            log.error("run %s attempt %d: sending its finish failed", run["id"],
                      run["attempt"], exc_info=sent.exception())
        elif not sent.cancelled() and not sent.result() and self._still_ours(run):
            task = self._spawn("dispatcher.finish", self._send_finish(
                run, update, cost_units, hold))
            task.add_done_callback(lambda _: self._settled(run))
            return
        self._settled(run)

    def _still_ours(self, run: dict) -> bool:
        current = queries.run_hold(self._store, run["id"])
        return current is not None and current.running_for(self._me, run["attempt"])

    async def _send_finish(self, run: dict, update: commands.RunFinish, cost_units: int,
                           hold: bool = False) -> None:
        """Send again, every finish_resend_s, a finish that was not applied,
        until it is, or the run is no longer this node's attempt (cancelled,
        taken over). A node-executed run has no lease of its own that would
        expire: a finish the reporter dropped (run_update_pending_max) or a
        batch apply refused is sent again."""
        while True:
            log.warning("run %s attempt %d: its finish was not applied; sending it again "
                        "in %.1f s", run["id"], run["attempt"], limits.finish_resend_s)
            await asyncio.sleep(limits.finish_resend_s)
            if await self._send_report(update, run["tenant"], cost_units, hold) \
                    or not self._still_ours(run):
                return   # applied, or refused because the run moved on

    async def close(self) -> None:
        self._closing = True   # runs waiting for a host stay held: a restart resumes them
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
