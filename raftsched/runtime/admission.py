"""Admission and group commit of the writes a node takes from its clients.

Admission: a node refuses a client's write before proposing it when it
already has as much awaiting commit as it takes (writes_inflight_max
requests, create_jobs_inflight_max jobs of creates). The answer is 503
`busy` with Retry-After, naming the limit, and nothing was proposed. So what
a node proposes is what the cluster commits within propose_timeout_s, and a
commit timeout means a fault (no quorum), not a queue. A batch is admitted
whole or refused whole. A node carrying a batch's worth of creates also
refuses more once its log trails by more than create_log_latency_max_s (the
wait of its oldest create in flight, or its latest renewal's round trip):
every node's renewals queue behind whatever the log holds, and a node whose
renewals take longer than its shard lease stops calling its runs.

Group commit: single creates of one tenant, token and quota that arrive
while this node has create_groups_inflight_max create entries in flight wait
for one of them to finish, and go out together as one create_jobs entry (a
lone one as the create_job it is). apply creates each item exactly as a
create_job, in order: its idempotency key, the tenant's quota and command
grant are judged per item, and each request gets its own item's result. The
entry's audit record is the tenant's, by the token, naming every job created.

    create handler: admit(1 job) -> validate -> ClientProposals.create(command)
        -> CreateGroups: pending by (tenant, actor, quota) -> one entry -> results
    batchCreate: decode -> admit(n jobs) -> validate -> ClientProposals.batch(entries)

A create request is admitted before its jobs are checked, so a node that
refuses it spends nothing more on it (checking a batch of 1000 takes tens of
milliseconds of the node's one interpreter, which its Raft thread needs for
heartbeats).

The waiters these hold are bounded by admission: at most
create_jobs_inflight_max creates wait, grouped or in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import ContextManager
from dataclasses import dataclass, field

from raftsched import limits
from raftsched.core import commands
from raftsched.errors import Busy

# The command levels (commands.APPLY_LEVEL) that apply create_jobs_compact
# and create_jobs_stored.
COMPACT_CREATE_LEVEL = 5
STORED_CREATE_LEVEL = 6
# The forms in which a node proposes creates (create_form).
WHOLE, COMPACT, STORED = "whole", "compact", "stored"


def create_form(level: int) -> str:
    """How a node proposes creates while every node applies `level`: each
    spec whole (create_jobs), without its defaults (create_jobs_compact), or
    in the form the stores keep it (create_jobs_stored)."""
    if level >= STORED_CREATE_LEVEL:
        return STORED
    return COMPACT if level >= COMPACT_CREATE_LEVEL else WHOLE


def _in_form(entry: commands.CreateJobs, form: str) -> commands.CreateJobs:
    """`entry` (a create_jobs) as `form` says: the same jobs."""
    if form == WHOLE or type(entry) is not commands.CreateJobs:
        return entry
    return commands.create_jobs(tenant=entry.tenant, at_ms=entry.at_ms, items=entry.items,
                                quota=commands.given(entry.quota), actor=entry.actor,
                                compact=form == COMPACT, stored=form == STORED)

log = logging.getLogger("raftsched.admission")

Propose = Callable[[commands.Command], Awaitable[dict]]


class Admission:
    """What a node's clients have awaiting commit, against the node's bounds."""

    def __init__(self, *, writes_max: int = limits.writes_inflight_max,
                 jobs_max: int = limits.create_jobs_inflight_max,
                 tenant_jobs_max: int = limits.create_jobs_inflight_per_tenant_max,
                 retry_after_s: int = limits.busy_retry_after_s,
                 clock: Callable[[], float] = time.monotonic,
                 log_latency_s: Callable[[], float] = lambda: 0.0) -> None:
        assert jobs_max >= limits.batch_create_jobs_max, jobs_max
        assert tenant_jobs_max >= limits.batch_create_jobs_max, tenant_jobs_max
        self.writes_max, self.jobs_max, self.retry_after_s = writes_max, jobs_max, retry_after_s
        self.tenant_jobs_max = tenant_jobs_max
        self.writes = 0
        self.jobs = 0
        # Jobs in flight by tenant: a tenant's entry holds at least one admitted
        # request, so there are at most writes_max entries; it goes at zero.
        self.jobs_by_tenant: dict[str, int] = {}
        self.refused_total = 0
        self._clock = clock
        self._log_latency_s = log_latency_s
        # Create requests in flight -> when each was admitted (self._clock),
        # oldest first.
        self._creates_since: dict[object, float] = {}
        self._logged_at: float | None = None
        self._refused_since_log = 0

    @contextmanager
    def admit(self, *, jobs: int, tenant: str | None = None) -> Iterator[None]:
        """Hold one write request (and its `jobs` creates, of `tenant`) until
        the block ends; raise Busy, holding nothing, when over a bound."""
        refusal = self._refusal(jobs, tenant)
        if refusal is not None:
            self._note_refused(refusal)
            raise refusal
        self.writes += 1
        self.jobs += jobs
        if jobs and tenant is not None:
            self.jobs_by_tenant[tenant] = self.jobs_by_tenant.get(tenant, 0) + jobs
        ticket = object()
        if jobs:
            self._creates_since[ticket] = self._clock()
        try:
            yield
        finally:
            self.writes -= 1
            self.jobs -= jobs
            self._creates_since.pop(ticket, None)
            if jobs and tenant is not None:
                left = self.jobs_by_tenant.pop(tenant) - jobs
                if left:
                    self.jobs_by_tenant[tenant] = left

    def _refusal(self, jobs: int, tenant: str | None) -> Busy | None:
        if self.writes >= self.writes_max:
            return self._busy(f"{self.writes} write requests await commit on it",
                              "writes_inflight_max", self.writes_max)
        # Past a bound only with something in flight: an idle node takes any batch.
        if jobs and self.jobs and self.jobs + jobs > self.jobs_max:
            return self._busy(f"{self.jobs} jobs of creates await commit on it, and this "
                              f"request adds {jobs}", "create_jobs_inflight_max", self.jobs_max)
        if jobs and self.jobs >= limits.batch_create_jobs_max:
            # A log that trails by this much delays every node's renewals,
            # and with them its shard lease. Judged while this node carries a
            # batch's worth of creates (one with less takes any create): by
            # its oldest create in flight, and by its latest renewal's round
            # trip, which the other nodes' creates delay too.
            waited_s = self._clock() - next(iter(self._creates_since.values()))
            if waited_s > limits.create_log_latency_max_s:
                return self._busy(f"its oldest create in flight has waited {waited_s:.2f} s",
                                  "create_log_latency_max_s", limits.create_log_latency_max_s)
            latency_s = self._log_latency_s()
            if latency_s > limits.create_log_latency_max_s:
                return self._busy(f"its applied log trails its proposals by {latency_s:.2f} s",
                                  "create_log_latency_max_s", limits.create_log_latency_max_s)
        held = self.jobs_by_tenant.get(tenant, 0) if tenant is not None else 0
        if jobs and held and held + jobs > self.tenant_jobs_max:
            return self._busy(f"{held} jobs of tenant {tenant}'s creates await commit on it, "
                              f"and this request adds {jobs}",
                              "create_jobs_inflight_per_tenant_max", self.tenant_jobs_max)
        return None

    def _busy(self, what: str, limit: str, bound: float) -> Busy:
        return Busy(f"this node is busy: {what} ({limit} is {bound}); the request was not "
                    f"proposed: retry after {self.retry_after_s} s", limit=limit,
                    retry_after_s=self.retry_after_s)

    def _note_refused(self, refusal: Busy) -> None:
        """Count the refusal, and log once per busy_log_period_s how many."""
        self.refused_total += 1
        self._refused_since_log += 1
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= limits.busy_log_period_s:
            log.warning("refusing client writes as busy (%d since the last such line): %s; "
                        "the cluster commits slower than clients send: add capacity or have "
                        "clients honour Retry-After", self._refused_since_log, refusal.detail)
            self._logged_at = now
            self._refused_since_log = 0


@dataclass(eq=False)
class _Waiting:
    command: commands.CreateJob
    body_bytes: int
    future: asyncio.Future = field(repr=False)


class CreateGroups:
    """Group commit of single creates (see the module docstring)."""

    def __init__(self, propose: Propose, *,
                 inflight_max: int = limits.create_groups_inflight_max,
                 create_form: Callable[[], str] = lambda: WHOLE) -> None:
        """`create_form`: the form of the entry of a group (create_form, by
        what every node applies)."""
        self._propose = propose
        self._inflight_max = inflight_max
        self._create_form = create_form
        self._pending: dict[tuple, list[_Waiting]] = {}
        self._inflight = 0
        self._flush_scheduled = False
        self._tasks: set[asyncio.Task] = set()
        self.entries_total = 0
        self.grouped_total = 0   # creates that went out in an entry with others

    async def create(self, command: commands.CreateJob, body_bytes: int) -> dict:
        """apply's result for `command`, proposed alone or with others."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(command, body_bytes, loop.create_future())
        self._pending.setdefault(_group_key(command), []).append(waiting)
        self._schedule_flush(loop)
        return await waiting.future

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        # On the loop's next turn, so that requests ready in this turn join.
        if not self._flush_scheduled and self._pending and self._inflight < self._inflight_max:
            self._flush_scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Propose pending groups while fewer than inflight_max are in flight,
        one group per key in turn (the oldest key first)."""
        self._flush_scheduled = False
        loop = asyncio.get_running_loop()
        while self._pending and self._inflight < self._inflight_max:
            key = next(iter(self._pending))
            group, rest = _take_group(self._pending.pop(key))
            if rest:
                self._pending[key] = rest   # behind the other keys
            if not group:
                continue
            self._inflight += 1
            task = loop.create_task(self._commit(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, group: list[_Waiting]) -> None:
        """Propose one group and settle each waiter with its own result (or
        every waiter with the error). Raises nothing: every outcome reaches
        the waiters, whose handlers answer it."""
        try:
            answers = await self._propose_group(group)
            for waiting, answer in zip(group, answers):
                if not waiting.future.done():
                    waiting.future.set_result(answer)
        except asyncio.CancelledError:
            for waiting in group:
                waiting.future.cancel()
            raise
        except Exception as exc:   # Unavailable; anything else is a bug the handler reports
            for waiting in group:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
        finally:
            self._inflight -= 1
            self._schedule_flush(asyncio.get_running_loop())

    async def _propose_group(self, group: list[_Waiting]) -> list[dict]:
        self.entries_total += 1
        if len(group) == 1:
            return [await self._propose(group[0].command)]
        self.grouped_total += len(group)
        first = group[0].command
        entry = _in_form(commands.create_jobs(
            tenant=first.tenant, at_ms=max(w.command.at_ms for w in group),
            items=[_item_of(w.command) for w in group], quota=commands.given(first.quota),
            actor=first.actor), self._create_form())
        answer = await self._propose(entry)
        if not answer.get("ok"):   # refused whole (a bug, logged by every replica)
            return [answer] * len(group)
        results = answer["results"]
        assert len(results) == len(group), (len(results), len(group))
        return results


def _group_key(command: commands.CreateJob) -> tuple:
    """Creates that may share an entry: one tenant, one actor (the audit
    record's), one quota in force (apply counts the entry against one)."""
    quota = commands.given(command.quota)
    return (command.tenant, command.actor,
            None if quota is None else (quota.jobs_max, quota.creates_per_s))


def _take_group(waiting: list[_Waiting]) -> tuple[list[_Waiting], list[_Waiting]]:
    """(the creates of one entry, the rest): at most batch_entry_jobs_max jobs
    and batch_entry_bytes_max bytes of bodies (a larger one alone), in order.
    A create whose request went away is dropped, not proposed."""
    group: list[_Waiting] = []
    size = 0
    for position, item in enumerate(waiting):
        if item.future.done():
            continue
        if group and (len(group) >= limits.batch_entry_jobs_max
                      or size + item.body_bytes > limits.batch_entry_bytes_max):
            return group, waiting[position:]
        group.append(item)
        size += item.body_bytes
    return group, []


def _item_of(command: commands.CreateJob) -> commands.CreateJobItem:
    return commands.create_job_item(job_id=command.job_id, spec=command.spec,
                                    idempotency_key=command.idempotency_key,
                                    shard=command.shard, next_ms=command.next_ms)


class ClientProposals:
    """The writes a node's clients propose (raftsched.nodeport's propose,
    propose_create, propose_batch): admitted, and single creates grouped."""

    def __init__(self, propose: Propose, *, admission: Admission | None = None,
                 groups: CreateGroups | None = None,
                 create_form: Callable[[], str] = lambda: WHOLE) -> None:
        """`create_form`: the form batches and groups of creates go in
        (create_form, by what every node applies)."""
        self._propose = propose
        self._create_form = create_form
        self.admission = admission or Admission()
        self.groups = groups or CreateGroups(propose, create_form=create_form)

    def status(self) -> dict:
        admission, groups = self.admission, self.groups
        return {"writes_inflight": admission.writes, "create_jobs_inflight": admission.jobs,
                "busy_refused_total": admission.refused_total,
                "create_group_entries_total": groups.entries_total,
                "creates_grouped_total": groups.grouped_total}

    def admit(self, jobs: int, tenant: str) -> ContextManager[None]:
        """Admission of a create request (see raftsched.nodeport.NodePort.admit)."""
        return self.admission.admit(jobs=jobs, tenant=tenant)

    async def write(self, command: commands.Command) -> dict:
        with self.admission.admit(jobs=0):
            return await self._propose(command)

    async def create(self, command: commands.CreateJob, body_bytes: int) -> dict:
        """Within admit(1): the create's own result, group-committed."""
        return await self.groups.create(command, body_bytes)

    async def batch(self, entries: list[commands.CreateJobs]) -> list[dict | BaseException]:
        """Within admit(jobs): each entry's result (or the exception it raised),
        in order. Proposed together: pysyncobj keeps their order, so a job sees
        those before it."""
        form = self._create_form()
        entries = [_in_form(entry, form) for entry in entries]
        return await asyncio.gather(*(self._propose(entry) for entry in entries),
                                    return_exceptions=True)

