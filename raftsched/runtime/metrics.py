"""GET /metrics: the node's figures in the Prometheus text format.

The only importer of prometheus_client. The collector keeps no counters of its
own: at each scrape it reads what the node already keeps (the trigger loop's
and the dispatcher's counters, the lateness histograms, the Raft status, the
storage guard's last measurement, the clock's judgement, what apply did), so
the metrics can never drift from GET /v1/node. Each node has a registry of its
own, holding only that collector (none of the library's process-wide defaults).

Two kinds of counters, named apart in docs/metrics.md:
  - this node's own work (fires it proposed, runs it dispatched, ...): sum them
    over the nodes;
  - what apply did, counted by every replica as it applies each entry
    (AppliedCounts, from Transition.tallies: runs ended by state, retries,
    dead letters, misfires; and stale fires, read from the replicated shard
    records): every node reports the cluster's count, so take the max over
    the nodes, never the sum.

No label holds a job id or a run id: labels are tenants (bounded by
limits.tenants_max), node ids, task and state names.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Iterable, Iterator

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from raftsched.core import lifecycle
from raftsched.core.apply import NODES, SHARDS
from raftsched.core.spec import MISFIRE_POLICIES
from raftsched.core.tx import (TALLY_DEAD_LETTER, TALLY_MISFIRE, TALLY_REDELIVERED, TALLY_RETRY,
                               TALLY_RUN_ENDED)
from raftsched.runtime.lateness import BOUNDS_MS

if TYPE_CHECKING:
    from raftsched.runtime.node import Node

PREFIX = "raftsched_"
# The states a misfire leaves an occurrence in: with the policies, the series
# exist from the start, at 0.
MISFIRE_STATES = (lifecycle.MISSED, lifecycle.SKIPPED)


class AppliedCounts:
    """What apply did on this replica since the process started, from each
    applied entry's Transition.tallies. The Raft thread adds; a scrape reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def add(self, tallies: Iterable[tuple[tuple[str, str], int]]) -> None:
        with self._lock:
            for key, count in tallies:
                self._counts[key] += count

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class NodeCollector(Collector):
    """Reads the node at each scrape (prometheus_client's custom collector)."""

    def __init__(self, node: "Node") -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        yield from self._lateness()
        yield from self._firing()
        yield from self._runs()
        yield from self._dispatch()
        yield from self._raft()
        yield from self._storage()
        yield from self._clock()
        yield from self._background()
        yield from self._gc()
        yield from self._threads()

    def _lateness(self) -> Iterator[Metric]:
        node = self._node
        yield histogram("trigger_lateness_seconds",
                        "First calls of scheduled runs this node made, by how late the call "
                        "began after the run was due", node.trigger_lateness.snapshot())
        yield histogram("arming_lead_seconds",
                        "Runs this node's fires queued, by how long before the run was due "
                        "the fire was applied here (0: at or after it)",
                        node.arming_lead.snapshot())

    def _firing(self) -> Iterator[Metric]:
        node = self._node
        trigger = node.trigger
        yield counter("fired", "Runs queued by the fires this node proposed", trigger.fired_total)
        yield counter("refused_fires", "Fires this node proposed that apply refused (a stale "
                      "fencing token, or refused whole)", trigger.refused_fires_total)
        yield gauge("armed_runs", "Runs fired ahead that this node holds until their second",
                    len(node.armed))
        yield counter("trigger_stale_items", "Items of this node's fires that apply skipped as "
                      "stale (the job changed or had fired)", trigger.stale_items_total)
        stale = sum(state["stale_fires"] for _, state in node.store.scan(SHARDS))
        yield counter("stale_fires", "Fires refused by apply for a stale fencing token, "
                      "cluster-wide (replicated: the same on every node)", stale)
        yield gauge("shards_owned", "Shards this node fires", len(trigger.owned()))
        yield counter("shard_lease_lapses", "Times this node's shard lease lapsed (a renewal "
                      "applied too late): its runs were not called meanwhile",
                      node.coordinator.lease_lapses_total)
        yield gauge("log_latency_seconds", "How far this node's applied log trails its "
                    "proposals (its latest renewal's round trip within one term)",
                    node.coordinator.log_latency_s())

    def _threads(self) -> Iterator[Metric]:
        seconds = self._node.thread_cpu.seconds()
        if seconds is None:
            return
        family = CounterMetricFamily(
            PREFIX + "thread_cpu_seconds", "CPU seconds of the node's threads by what each "
            "does: event_loop (HTTP, calls, trigger), raft (Raft and apply), journal, digest, "
            "other (the rest of the process)", labels=["thread"])
        for thread, spent in seconds.items():
            family.add_metric([thread], spent)
        yield family

    def _gc(self) -> Iterator[Metric]:
        times = self._node.gc_times
        collections = CounterMetricFamily(
            PREFIX + "gc_collections", "Collections of the process's cyclic garbage collector, "
            "by generation (0: the youngest)", labels=["generation"])
        seconds = CounterMetricFamily(
            PREFIX + "gc_seconds", "Seconds the process's cyclic garbage collector ran, by "
            "generation: the process did nothing else meanwhile", labels=["generation"])
        for generation, (count, spent) in enumerate(zip(times.collections, times.seconds)):
            collections.add_metric([str(generation)], count)
            seconds.add_metric([str(generation)], spent)
        yield collections
        yield seconds

    def _runs(self) -> Iterator[Metric]:
        applied = self._node.applied_counts.snapshot()
        ended = CounterMetricFamily(
            PREFIX + "runs_ended", "Runs that reached a terminal state, by state, as applied "
            "by this replica since it started (cluster-wide: take the max over nodes)",
            labels=["state"])
        for state in sorted(lifecycle.TERMINAL):
            ended.add_metric([state], applied.get((TALLY_RUN_ENDED, state), 0))
        yield ended
        yield counter("run_retries", "Failed attempts given another attempt, as applied by "
                      "this replica (cluster-wide)", applied.get((TALLY_RETRY, ""), 0))
        yield counter("run_redeliveries", "Held runs whose next attempt went to their "
                      "shard's new owner (the old holder lost the shard), as applied by this "
                      "replica (cluster-wide)", applied.get((TALLY_REDELIVERED, ""), 0))
        yield counter("dead_letters", "Runs that failed for good and raised an alert, as "
                      "applied by this replica (cluster-wide)",
                      applied.get((TALLY_DEAD_LETTER, ""), 0))
        misfires = CounterMetricFamily(
            PREFIX + "misfires", "Occurrences a fire recorded missed or skipped, by the job's "
            "misfire policy, as applied by this replica (cluster-wide)",
            labels=["policy", "state"])
        labels = {f"{policy}:{state}" for policy in MISFIRE_POLICIES for state in MISFIRE_STATES}
        labels |= {label for name, label in applied if name == TALLY_MISFIRE}
        for label in sorted(labels):
            misfires.add_metric(label.split(":", 1), applied.get((TALLY_MISFIRE, label), 0))
        yield misfires

    def _dispatch(self) -> Iterator[Metric]:
        node = self._node
        dispatcher = node.dispatcher
        depth = GaugeMetricFamily(PREFIX + "dispatcher_queue_depth",
                                  "Runs waiting here for an execution slot, by tenant",
                                  labels=["tenant"])
        for tenant, count in sorted(dispatcher.queue_depths().items()):
            depth.add_metric([tenant], count)
        yield depth
        yield gauge("dispatcher_running", "Attempts executing on this node", dispatcher.running())
        yield counter("dispatcher_parked", "Runs held back while their host's circuit breaker "
                      "was open", dispatcher.parked_total)
        yield counter("dispatcher_host_waited", "Runs that waited for a call to their target "
                      "host to end (http_connections_per_host_max in flight)",
                      dispatcher.host_waited_total)
        yield counter("dispatcher_held_past_bound", "Runs called anyway after breaker_hold_max_s "
                      "held behind an open circuit breaker", dispatcher.held_past_bound_total)
        yield counter("dispatcher_cancelled", "Attempts stopped here because their run was "
                      "cancelled", dispatcher.cancelled_total)
        yield counter("dispatcher_dropped_notifications", "Runs not queued here because the "
                      "dispatch queue was full (picked up by a rescan)",
                      dispatcher.dropped_notifications)
        yield counter("breaker_opened", "Times a target host's circuit breaker opened",
                      node.breaker.opened_total)
        yield gauge("breakers_open", "Tenants' circuit breakers open here now: their runs "
                    "for the host are held, not called", len(node.breaker.open_hosts()))
        yield counter("worker_claimed", "Runs remote workers claimed through this node",
                      node.workers.claimed_total)
        yield counter("long_polls_refused", "Long polls (topic reads, worker claims) refused "
                      "here for waiting on more names than waited_names_per_tenant_max or "
                      "waited_names_max", node.topic_waiters.refused_total
                      + node.workers.waits_refused())
        yield gauge("long_polls_waiting", "Names (topics, worker queues) long polls wait on "
                    "here now", node.topic_waiters.names_waited() + node.workers.waiting_queues())
        yield gauge("reporter_pending", "Run reports waiting to be proposed",
                    node.reporter.pending())
        yield counter("reporter_dropped", "Run reports dropped with run_update_pending_max "
                      "reached", node.reporter.dropped_total)
        yield gauge("reporter_held_finishes", "Finishes held back while runs wait here for a "
                    "call slot (finish_hold_max_s)", node.reporter.held())
        yield counter("finishes_held", "Finishes held back while runs waited here "
                      "for a call slot", node.reporter.held_total)

    def _raft(self) -> Iterator[Metric]:
        node = self._node
        replicator = node.replicator
        status = replicator.status()
        is_leader = status.role == "leader"
        yield gauge("raft_term", "The Raft term this node is in", status.term)
        yield gauge("raft_commit_index", "The highest log index this node knows committed",
                    status.commit_index)
        yield gauge("raft_applied_index", "The log index this node's state is applied up to",
                    node.store.applied_index())
        yield gauge("raft_is_leader", "1 while this node is the Raft leader", int(is_leader))
        yield gauge("raft_has_quorum", "1 while this node sees a quorum", int(status.has_quorum))
        leader = GaugeMetricFamily(PREFIX + "raft_leader", "1, labelled with the node this node "
                                   "takes for the leader (absent while none is known)",
                                   labels=["leader"])
        leader_id = node.node_id if is_leader else self._node_of_raft(status.leader)
        if leader_id is not None:
            leader.add_metric([leader_id], 1)
        yield leader
        yield counter("journal_flushes", "Flushes of the Raft journal to disk",
                      replicator.journal_flushes_total)
        yield counter("state_commits", "LMDB transactions committed by apply (the entries a "
                      "Raft tick applies share one, up to apply_batch_max_s)",
                      node.store.commits_total)
        yield counter("raft_frames_refused", "Raft connections closed for an oversized frame",
                      replicator.frames_refused_total)
        yield counter("raft_handshakes_refused",
                      "Raft connections closed before they authenticated: too slow, or over "
                      "a cap of connections authenticating", replicator.handshakes_refused_total)
        yield counter("snapshots_written", "Raft snapshots this node wrote and put in place",
                      replicator.snapshots_written_total)
        yield counter("snapshot_installs", "Raft snapshots this node installed",
                      replicator.snapshot_installs_total)
        yield counter("snapshot_write_seconds", "Seconds spent writing the snapshots counted by "
                      "raftsched_snapshots_written_total", replicator.snapshot_write_s_sum)
        last = GaugeMetricFamily(PREFIX + "snapshot_last_write_seconds",
                                 "Seconds the last snapshot put in place took to write "
                                 "(absent before the first)")
        if replicator.snapshot_write_s_last is not None:
            last.add_metric([], replicator.snapshot_write_s_last)
        yield last

    def _node_of_raft(self, raft_addr: str | None) -> str | None:
        if raft_addr is None:
            return None
        return next((rec["id"] for _, rec in self._node.store.scan(NODES)
                     if rec["raft"] == raft_addr), None)

    def _storage(self) -> Iterator[Metric]:
        storage = self._node.storage.status()
        yield gauge("storage_used_bytes", "Bytes of the LMDB map in use (last measured)",
                    storage["used_bytes"])
        yield gauge("storage_max_bytes", "The LMDB map size (max_data_bytes)",
                    storage["max_data_bytes"])
        yield gauge("storage_high_water_bytes", "Used bytes past which writes that add state "
                    "are refused", storage["high_water_bytes"])
        yield gauge("storage_file_bytes", "Bytes of the LMDB data file", storage["file_bytes"])
        free = GaugeMetricFamily(PREFIX + "storage_free_disk_bytes",
                                 "Free bytes on the data disk (absent before the first check)")
        if storage["free_disk_bytes"] is not None:
            free.add_metric([], storage["free_disk_bytes"])
        yield free
        yield gauge("storage_full", "1 while this node is past its storage mark",
                    int(storage["full"] is not None))
        yield counter("storage_refused_writes", "Writes refused with 507 while storage was past "
                      "its mark", self._node.storage.refused_total)
        admission = self._node.client_proposals.status()
        yield gauge("admission_writes_inflight", "Client write requests awaiting commit on this node",
                    admission["writes_inflight"])
        yield gauge("admission_create_jobs_inflight", "Jobs of creates awaiting commit on this node",
                    admission["create_jobs_inflight"])
        yield counter("admission_busy_refused", "Client writes refused with 503 busy, before "
                      "proposal, past writes_inflight_max or create_jobs_inflight_max",
                      admission["busy_refused_total"])
        yield counter("admission_create_group_entries", "Raft entries this node proposed for single "
                      "creates (group commit)", admission["create_group_entries_total"])
        yield counter("admission_creates_grouped", "Single creates that went out in one entry with "
                      "others", admission["creates_grouped_total"])

    def _clock(self) -> Iterator[Metric]:
        clock = self._node.clock
        status = clock.status()
        yield gauge("clock_synced", "1 once this node knows the cluster's time",
                    int(status["synced"]))
        yield gauge("clock_in_bound", "1 while this node's clock is within --max-clock-skew-ms "
                    "of the cluster's", int(status["in_bound"] is True))
        yield gauge("clock_max_skew_seconds", "--max-clock-skew-ms, in seconds",
                    status["max_clock_skew_ms"] / 1000)
        offset = GaugeMetricFamily(PREFIX + "clock_offset_seconds",
                                   "A node's wall clock minus the cluster's time, as this node "
                                   "last judged it, by node", labels=["node"])
        for node_id, offset_ms in sorted(clock.offsets_ms().items()):
            offset.add_metric([node_id], offset_ms / 1000)
        yield offset
        yield counter("clock_probes_failed", "Clock probes of peers that failed",
                      status["probes_failed_total"])

    def _background(self) -> Iterator[Metric]:
        node = self._node
        failures = CounterMetricFamily(PREFIX + "task_failures",
                                       "Failures of each background task since start",
                                       labels=["task"])
        for task, count in sorted(node.supervisor.failures.items()):
            failures.add_metric([task], count)
        yield failures
        yield counter("effect_handler_failures", "Handlers of applied entries' effects that "
                      "raised (runtime/effects.py)", node.effects.failed_total)
        reaper, purger, backfiller = node.reaper, node.purger, node.backfiller
        yield counter("reaper_expired", "Attempts whose lease expired, ended by this node "
                      "as leader", reaper.expired_total)
        yield counter("runs_taken_over", "Open runs of shards this node gained, taken "
                      "over from the shard's former owner", node.dispatcher.taken_over_total)
        yield counter("runs_missed_uncalled", "Runs this node held from before its start "
                      "and never called, ended missed or skipped by their misfire policies "
                      "(runtime/horizon.py)", node.dispatcher.missed_uncalled_total)
        yield counter("call_horizon_writes", "Pushes of this node's call horizon, each one "
                      "write and fdatasync (runtime/horizon.py)",
                      node.call_horizon.writes_total)
        yield counter("runs_not_called", "Runs this node dropped before their call because "
                      "it no longer held them (its shard moved)",
                      node.dispatcher.not_called_total)
        yield counter("reaper_alerts_sent", "Alerts delivered", reaper.alerts_sent_total)
        yield counter("reaper_alerts_failed", "Alert deliveries that failed",
                      reaper.alerts_failed_total)
        yield counter("coordinator_rebalances", "Shard reassignments this node proposed as "
                      "leader", node.coordinator.rebalances_total)
        yield counter("purger_passes", "Retention passes this node ran as leader",
                      purger.passes_total)
        yield counter("purger_refused", "Purge items apply refused", purger.refused_total)
        yield counter("purger_rests", "Rests the purger took after a round that found nothing "
                      "to remove", purger.rests_total)
        yield counter("purger_rest_passes", "Passes of the purger's rests, each reading the "
                      "jobs written since", purger.touched_visits_total)
        yield counter("purged_runs", "Finished runs purged by retention", purger.purged_runs_total)
        yield counter("purged_jobs", "Finished or deleted jobs purged", purger.purged_jobs_total)
        yield counter("purged_idempotency_keys", "Idempotency keys purged past their TTL",
                      purger.purged_idem_total)
        yield counter("purged_backfills", "Finished backfills purged",
                      purger.purged_backfills_total)
        yield counter("backfiller_steps", "Backfill steps this node proposed as leader",
                      backfiller.steps_total)
        yield counter("backfiller_launched", "Runs backfills launched", backfiller.launched_total)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """`name` without the _total the format adds."""
    return CounterMetricFamily(PREFIX + name, documentation, value=value)


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, value=value)


def histogram(name: str, documentation: str, snapshot: dict) -> HistogramMetricFamily:
    """A LatenessHistogram snapshot (ms, cumulative, only the buckets that hold
    runs) as a Prometheus histogram in seconds with every bucket, so each
    scrape has the same series."""
    recorded = {float(bound): count for bound, count in snapshot["buckets"].items()}
    buckets, cumulative = [], 0
    for bound_ms in BOUNDS_MS:
        cumulative = recorded.get(float(bound_ms), cumulative)
        buckets.append((_seconds_text(bound_ms), cumulative))
    buckets.append(("+Inf", snapshot["count"]))
    return HistogramMetricFamily(PREFIX + name, documentation, buckets=buckets,
                                 sum_value=snapshot["sum_ms"] / 1000)


def _seconds_text(bound_ms: int) -> str:
    return repr(bound_ms / 1000)


def make_registry(node: "Node") -> CollectorRegistry:
    """A registry of the node's own (not the library's global one, which
    would also collect this Python process's figures into every node's
    answer, and which tests starting several nodes in one process share)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in the text format, version 0.0.4 (what every
    Prometheus release reads; api/metrics.py answers with its content type)."""
    return generate_latest(registry)
