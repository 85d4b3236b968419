"""GET /metrics exports what the node keeps (every counter of /v1/node and /v1/cluster included), its values move on a live cluster, no label names a job or run, it needs a token, and the Grafana dashboard queries only what it exports."""

from __future__ import annotations

import gc
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftsched.core import commands, keys
from raftsched.core.apply import apply_entry
from raftsched.core.jobspec import JOB_ID_PATTERN, RUN_ID_PATTERN
from raftsched.core.tx import TALLY_MISFIRE
from raftsched.runtime.lateness import BOUNDS_MS, LatenessHistogram
from raftsched.runtime.gcpolicy import GcTimes
from raftsched.runtime.metrics import AppliedCounts, exposition, make_registry
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, wait_until
from raftsched.testing.replica import EVERY_2S, HTTP, Replica
from raftsched.testing.sink import Sink

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"
SHARDS = 256
# The families every scrape has, and their types: the names docs/metrics.md lists.
FAMILIES = {
    "raftsched_trigger_lateness_seconds": "histogram",
    "raftsched_arming_lead_seconds": "histogram",
    "raftsched_armed_runs": "gauge",
    "raftsched_fired": "counter",
    "raftsched_refused_fires": "counter",
    "raftsched_stale_fires": "counter",
    "raftsched_runs_ended": "counter",
    "raftsched_run_retries": "counter",
    "raftsched_dead_letters": "counter",
    "raftsched_misfires": "counter",
    "raftsched_dispatcher_queue_depth": "gauge",
    "raftsched_raft_term": "gauge",
    "raftsched_raft_commit_index": "gauge",
    "raftsched_raft_applied_index": "gauge",
    "raftsched_raft_is_leader": "gauge",
    "raftsched_raft_leader": "gauge",
    "raftsched_storage_used_bytes": "gauge",
    "raftsched_storage_max_bytes": "gauge",
    "raftsched_snapshot_write_seconds": "counter",
    "raftsched_snapshot_last_write_seconds": "gauge",
    "raftsched_clock_offset_seconds": "gauge",
    "raftsched_task_failures": "counter",
    "raftsched_gc_collections": "counter",
    "raftsched_gc_seconds": "counter",
    "raftsched_thread_cpu_seconds": "counter",
}


def parse(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


# --- what apply counts (core, no node) --------------------------------------------------

class CountingReplica(Replica):
    """A replica that adds each transition's tallies up, as a node does."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = AppliedCounts()

    def run_entry(self, data: bytes) -> dict:
        self.index += 1
        _, transition = apply_entry(self.store, data, self.index)
        self.store.commit(transition, self.index)
        self.counts.add(transition.tallies)
        return transition.result


def _create(log: Replica, job_id: str, retry: dict) -> None:
    spec = {"name": "j", "schedule": EVERY_2S, "target": HTTP, "retry": retry,
            "concurrency": {"policy": "allow"}, "metadata": {}}
    result = log.run(commands.create_job(job_id=job_id, tenant="default", spec=spec,
                                         idempotency_key=None,
                                         shard=keys.shard_of(job_id, SHARDS),
                                         next_ms=10_000, at_ms=1_000))
    assert result["ok"], result


def _fire(log: Replica, job_id: str, occurrences: list[int]) -> None:
    shard = keys.shard_of(job_id, SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    result = log.run(commands.fire(shard=shard, token=1, upto_ms=occurrences[-1] + 500,
                                   node="n1", at_ms=occurrences[-1] + 500,
                                   items=[(job_id, occurrences[0], occurrences[-1] + 2000,
                                           occurrences, False)]))
    assert result["ok"], result


def _finish(log: Replica, job_id: str, scheduled_ms: int, ok: bool, attempt: int = 1) -> bool:
    base = {"run_id": keys.run_id(job_id, scheduled_ms), "holder": "n1", "attempt": attempt,
            "at_ms": scheduled_ms + 600, "lease_ms": scheduled_ms + 9000}
    finish = dict(base, event="finish", ok=ok, retryable=True, retry_delay_ms=100,
                  http_status=200 if ok else 500, exit_code=None, error=None, output_node=None)
    result = log.run(commands.run_updates(updates=[finish]))   # held from its fire: no start
    return result["accepted"] == [True]


def test_apply_counts_ended_runs_retries_dead_letters_and_misfires():
    log = CountingReplica()
    _create(log, "job_" + "a" * 20, {"max_attempts": 1})   # misfire: fire_once by default
    _create(log, "job_" + "b" * 20, {"max_attempts": 3})
    # Three occurrences in one late fire: fire_once runs the last, records two missed.
    _fire(log, "job_" + "a" * 20, [10_000, 12_000, 14_000])
    _fire(log, "job_" + "b" * 20, [10_000])
    assert _finish(log, "job_" + "a" * 20, 14_000, ok=False)   # one attempt: failed for good
    assert _finish(log, "job_" + "b" * 20, 10_000, ok=False)   # retried
    assert not _finish(log, "job_" + "b" * 20, 10_000, ok=False)   # stale: counts nothing
    counts = log.counts.snapshot()
    assert counts == {("run_ended", "missed"): 2, ("run_ended", "failed"): 1,
                      ("dead_letter", ""): 1, ("retry", ""): 1,
                      (TALLY_MISFIRE, "fire_once:missed"): 2}


# --- the collector on a stand-in node ---------------------------------------------------

def fake_node(**overrides: object) -> SimpleNamespace:
    """The attributes the collector reads, with quiet values."""
    ns = SimpleNamespace
    raft = ns(role="follower", leader="127.0.0.1:7002", term=4, commit_index=90,
              applied_index=88, leader_commit_index=90, has_quorum=True)
    node = ns(
        node_id="n1", trigger_lateness=LatenessHistogram(), arming_lead=LatenessHistogram(),
        armed=[],
        applied_counts=AppliedCounts(), gc_times=GcTimes(),
        thread_cpu=ns(seconds=lambda: {"event_loop": 2.5, "raft": 1.25, "journal": 0.0,
                                       "digest": 0.0, "other": 0.5}),
        trigger=ns(fired_total=7, refused_fires_total=1, stale_items_total=2,
                   owned=lambda: {1: 3, 2: 3}),
        store=ns(applied_index=lambda: 88, commits_total=70, scan=lambda table: {
            "shards": [(b"\x00\x01", {"stale_fires": 2}), (b"\x00\x02", {"stale_fires": 1})],
            "nodes": [(b"n2", {"id": "n2", "raft": "127.0.0.1:7002"})]}[table]),
        dispatcher=ns(queue_depths=lambda: {"acme": 3, "default": 0}, running=lambda: 2,
                      parked_total=0, held_past_bound_total=2, host_waited_total=5, cancelled_total=0,
                      dropped_notifications=0,
                      taken_over_total=0, not_called_total=0, missed_uncalled_total=0),
        call_horizon=ns(writes_total=3),
        breaker=ns(opened_total=0, open_hosts=lambda: [("acme", "h:443")]), workers=ns(claimed_total=0, waits_refused=lambda: 1,
                                               waiting_queues=lambda: 4),
        topic_waiters=ns(refused_total=2, names_waited=lambda: 1),
        reporter=ns(pending=lambda: 0, dropped_total=0, held=lambda: 0, held_total=0),
        replicator=ns(status=lambda: raft, journal_flushes_total=5, frames_refused_total=0,
                      handshakes_refused_total=0,
                      snapshots_written_total=2, snapshot_installs_total=0,
                      snapshot_write_s_sum=0.75, snapshot_write_s_last=0.25),
        client_proposals=ns(status=lambda: {
            "writes_inflight": 3, "create_jobs_inflight": 1200, "busy_refused_total": 4,
            "create_group_entries_total": 10, "creates_grouped_total": 60}),
        storage=ns(refused_total=0, status=lambda: {
            "used_bytes": 4096, "file_bytes": 8192, "max_data_bytes": 1 << 30,
            "high_water_bytes": 900 << 20, "free_disk_bytes": 10 ** 9, "full": None}),
        clock=ns(offsets_ms=lambda: {"n1": 12, "n2": -3}, status=lambda: {
            "synced": True, "in_bound": True, "max_clock_skew_ms": 500,
            "probes_failed_total": 4}),
        supervisor=ns(failures={"trigger": 1, "reaper": 0}), effects=ns(failed_total=0),
        reaper=ns(expired_total=0, alerts_sent_total=0,
                  alerts_failed_total=0),
        coordinator=ns(rebalances_total=0, lease_lapses_total=0, log_latency_s=lambda: 0.0),
        purger=ns(passes_total=0, refused_total=0, purged_runs_total=6, purged_jobs_total=0,
                  purged_idem_total=0, purged_backfills_total=0, rests_total=0,
                  touched_visits_total=0),
        backfiller=ns(steps_total=0, launched_total=0))
    for name, replacement in overrides.items():
        setattr(node, name, replacement)
    return node


def scrape(node: SimpleNamespace) -> str:
    return exposition(make_registry(node)).decode()   # type: ignore[arg-type]


def test_lateness_becomes_a_cumulative_histogram_in_seconds():
    node = fake_node()
    for lateness_ms in (0, 3, 3, 40, 900, 10 ** 9):
        node.trigger_lateness.record(lateness_ms)
    text = scrape(node)
    family = parse(text)["raftsched_trigger_lateness_seconds"]
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples
               if s.name.endswith("_bucket")]
    # Every bound, in seconds, each count at or under it: the same series at each scrape.
    assert [bound for bound, _ in buckets] == [b / 1000 for b in BOUNDS_MS] + [float("inf")]
    assert [count for _, count in buckets] == sorted(count for _, count in buckets)
    assert dict(buckets)[0.001] == 1
    assert dict(buckets)[0.003] == 3
    assert dict(buckets)[0.044] == 4
    assert dict(buckets)[float("inf")] == 6
    assert value(text, "raftsched_trigger_lateness_seconds_count") == 6
    assert value(text, "raftsched_trigger_lateness_seconds_sum") == \
        pytest.approx((3 + 3 + 40 + 900 + 10 ** 9) / 1000)
    assert value(text, "raftsched_arming_lead_seconds_count") == 0


def test_the_collector_reads_the_node_at_each_scrape():
    node = fake_node()
    first = scrape(node)
    assert parse(first).keys() >= FAMILIES.keys()
    assert {name: parse(first)[name].type for name in FAMILIES} == FAMILIES
    assert value(first, "raftsched_fired_total") == 7
    assert value(first, "raftsched_stale_fires_total") == 3
    assert value(first, "raftsched_purged_runs_total") == 6
    assert value(first, "raftsched_clock_probes_failed_total") == 4
    assert value(first, "raftsched_task_failures_total", task="trigger") == 1
    assert value(first, "raftsched_dispatcher_queue_depth", tenant="acme") == 3
    assert value(first, "raftsched_raft_is_leader") == 0
    assert value(first, "raftsched_raft_leader", leader="n2") == 1
    assert value(first, "raftsched_snapshot_last_write_seconds") == 0.25
    assert value(first, "raftsched_clock_offset_seconds", node="n2") == -0.003
    assert value(first, "raftsched_runs_ended_total", state="succeeded") == 0
    assert value(first, "raftsched_misfires_total", policy="skip", state="skipped") == 0
    assert value(first, "raftsched_long_polls_refused_total") == 3   # topics 2, queues 1
    assert value(first, "raftsched_long_polls_waiting") == 5          # topics 1, queues 4
    assert value(first, "raftsched_admission_busy_refused_total") == 4
    assert value(first, "raftsched_admission_create_jobs_inflight") == 1200
    assert value(first, "raftsched_breakers_open") == 1
    assert value(first, "raftsched_dispatcher_held_past_bound_total") == 2
    assert value(first, "raftsched_dispatcher_host_waited_total") == 5
    assert value(first, "raftsched_state_commits_total") == 70
    # No second set of counters: what the node holds now is what the next scrape says.
    node.trigger.fired_total = 9
    node.applied_counts.add([(("run_ended", "succeeded"), 5), (("retry", ""), 2)])
    node.replicator.status = lambda: SimpleNamespace(
        role="leader", leader=None, term=5, commit_index=91, has_quorum=True)
    second = scrape(node)
    assert value(second, "raftsched_fired_total") == 9
    assert value(second, "raftsched_runs_ended_total", state="succeeded") == 5
    assert value(second, "raftsched_run_retries_total") == 2
    assert value(second, "raftsched_raft_is_leader") == 1
    assert value(second, "raftsched_raft_leader", leader="n1") == 1
    assert ("raftsched_raft_leader", (("leader", "n2"),)) not in samples(second)


def test_figures_not_known_yet_are_absent_rather_than_zero():
    node = fake_node()
    node.replicator.snapshot_write_s_last = None
    node.storage.status = lambda: {"used_bytes": 0, "file_bytes": 0, "max_data_bytes": 1 << 30,
                                   "high_water_bytes": 900 << 20, "free_disk_bytes": None,
                                   "full": None}
    node.replicator.status = lambda: SimpleNamespace(
        role="candidate", leader=None, term=6, commit_index=91, has_quorum=False)
    names = {name for name, _ in samples(scrape(node))}
    assert "raftsched_snapshot_last_write_seconds" not in names
    assert "raftsched_storage_free_disk_bytes" not in names
    assert "raftsched_raft_leader" not in names
    assert "raftsched_raft_term" in names


# --- a live cluster ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """Snapshots every 40 entries, so that the snapshot figures move too."""
    with LocalCluster(tmp_path_factory.mktemp("metrics"),
                      node_args=["--raft-snapshot-entries", "40"]) as live:
        live.wait_ready()
        yield live


def metrics_text(cluster: LocalCluster, nid: str) -> str:
    response = call("GET", cluster.url(nid) + "/metrics")
    assert response.status == 200, response
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4"), response
    return response.body


def soon(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))


def _totals(body: object, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Every `*_total` member of a JSON answer, at any depth, by its path."""
    found: dict[tuple[str, ...], int] = {}
    if isinstance(body, dict):
        for key, inner in body.items():
            if key.endswith("_total") and isinstance(inner, int):
                found[(*path, key)] = inner
            else:
                found.update(_totals(inner, (*path, key)))
    return found


@pytest.mark.integration
def test_metrics_need_a_token(cluster):
    response = call("GET", cluster.url("n1") + "/metrics", token=None)
    assert response.status == 401, response
    assert "Bearer" in response.headers.get("WWW-Authenticate", ""), response


@pytest.mark.integration
def test_every_total_counter_of_node_and_cluster_status_is_exported(cluster):
    for nid in cluster.ids:
        status = cluster.api(nid, "GET", "/v1/node").body
        counters = {**_totals(status), **_totals(cluster.api(nid, "GET", "/v1/cluster").body)}
        text = metrics_text(cluster, nid)
        exported = samples(text)
        assert ("fired_total",) in counters   # the walk finds them
        for path, before in counters.items():
            # purged.runs_total -> raftsched_purged_runs_total: read after the JSON,
            # so never below it.
            name = "raftsched_" + "_".join(path)
            assert (name, ()) in exported, f"{'.'.join(path)} of the status is not in /metrics"
            assert exported[(name, ())] >= before, name
        for task, failures in status["task_failures"].items():
            assert value(text, "raftsched_task_failures_total", task=task) >= failures


@pytest.mark.integration
def test_one_leader_and_the_same_term_everywhere(cluster):
    def agreed() -> dict | None:
        texts = {nid: metrics_text(cluster, nid) for nid in cluster.ids}
        leaders = [nid for nid, t in texts.items() if value(t, "raftsched_raft_is_leader") == 1]
        named = {[labels for name, labels in samples(t) if name == "raftsched_raft_leader"][0]
                 for t in texts.values()
                 if any(name == "raftsched_raft_leader" for name, _ in samples(t))}
        terms = {value(t, "raftsched_raft_term") for t in texts.values()}
        ok = len(leaders) == 1 and named == {(("leader", leaders[0]),)} and len(terms) == 1
        return texts if ok else None
    texts = wait_until(agreed, 15, "one leader every node names, in one term")
    for text in texts.values():
        assert value(text, "raftsched_raft_applied_index") > 0
        assert value(text, "raftsched_raft_commit_index") > 0


@pytest.mark.integration
def test_fires_runs_and_lateness_move_and_no_label_names_a_job_or_run(cluster):
    before = {nid: metrics_text(cluster, nid) for nid in cluster.ids}

    def status(sink_call) -> int:
        return 500 if sink_call.path.endswith("/fail") else 200

    with Sink(status_for=status) as sink:
        ok = cluster.api("n1", "POST", "/v1/jobs", {
            "name": "metrics-ok", "schedule": {"every": "1s"},
            "target": {"type": "http", "url": sink.url + "/ok"}})
        bad = cluster.api("n2", "POST", "/v1/jobs", {
            "name": "metrics-bad", "run_at": soon(2),
            "target": {"type": "http", "url": sink.url + "/fail"},
            "retry": {"max_attempts": 2, "backoff": "exponential", "base_s": 0.2,
                      "max_s": 0.5}})
        assert ok.status == 201, ok
        assert bad.status == 201, bad

        def moved() -> dict | None:
            after = {nid: metrics_text(cluster, nid) for nid in cluster.ids}

            def grew(name: str, summed: bool = True, **labels: str) -> float:
                deltas = [value(after[n], name, **labels) - value(before[n], name, **labels)
                          for n in cluster.ids]
                return sum(deltas) if summed else max(deltas)
            enough = (grew("raftsched_fired_total") >= 3
                      and grew("raftsched_trigger_lateness_seconds_count") >= 3
                      and grew("raftsched_arming_lead_seconds_count") >= 3
                      # What apply did: every replica counts the cluster's runs.
                      and grew("raftsched_runs_ended_total", False, state="succeeded") >= 2
                      and grew("raftsched_runs_ended_total", False, state="failed") >= 1
                      and grew("raftsched_run_retries_total", False) >= 1
                      and grew("raftsched_dead_letters_total", False) >= 1
                      and grew("raftsched_snapshots_written_total") >= 1)
            return after if enough else None
        after = wait_until(moved, 30, "fires, runs, retries, dead letters and snapshots "
                                      "to show in /metrics")
        cluster.api("n1", "DELETE", f"/v1/jobs/{ok.body['job_id']}")
    job_ids = {ok.body["job_id"], bad.body["job_id"]}
    for text in after.values():
        assert not any(job_id in text for job_id in job_ids)
        for (name, labels), _ in samples(text).items():
            for label, label_value in labels:
                assert not re.fullmatch(JOB_ID_PATTERN, label_value), (name, label)
                assert not re.fullmatch(RUN_ID_PATTERN, label_value), (name, label)
                assert not re.fullmatch(r"exe_[0-9a-f]{32}", label_value), (name, label)
        written = value(text, "raftsched_snapshots_written_total")
        if written:
            assert value(text, "raftsched_snapshot_write_seconds_total") > 0
            assert value(text, "raftsched_snapshot_last_write_seconds") > 0


@pytest.mark.integration
def test_storage_used_bytes_are_measured_against_the_maximum(cluster):
    def measured() -> str | None:
        text = metrics_text(cluster, "n3")
        return text if value(text, "raftsched_storage_used_bytes") > 0 else None
    text = wait_until(measured, 15, "the first storage measurement")
    assert value(text, "raftsched_storage_used_bytes") < value(text, "raftsched_storage_max_bytes")
    assert value(text, "raftsched_storage_high_water_bytes") <= \
        value(text, "raftsched_storage_max_bytes")


# --- the Grafana dashboard --------------------------------------------------------------

METRIC_NAME = re.compile(r"\braftsched_[a-z0-9_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported_names() -> set[str]:
    """Every sample name a scrape can have (from the stand-in node, with each
    optional figure present)."""
    return {name for name, _ in samples(scrape(fake_node()))}


def test_the_dashboard_uses_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" in variables
    exprs = [target["expr"] for panel in dashboard["panels"]
             for target in panel.get("targets", [])]
    assert len(exprs) >= 10
    used = {name for expr in exprs for name in METRIC_NAME.findall(expr)}
    unknown = used - exported_names()
    assert not unknown, f"the dashboard queries metrics /metrics does not export: {unknown}"
    for panel in dashboard["panels"]:
        if panel.get("targets"):
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    quantiles = [e for e in exprs if "histogram_quantile" in e]
    assert any("raftsched_trigger_lateness_seconds_bucket" in e for e in quantiles)
    assert any("raftsched_arming_lead_seconds_bucket" in e for e in quantiles)


def test_the_collector_s_collections_are_timed_by_generation():
    times = GcTimes()
    gc.callbacks.append(times._callback)
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        gc.callbacks.remove(times._callback)
    assert times.collections[0] >= 1 and times.collections[2] >= 1
    assert times.seconds[2] > 0
    text = scrape(fake_node(gc_times=times))
    assert value(text, "raftsched_gc_collections_total", generation="2") == times.collections[2]
    assert value(text, "raftsched_gc_seconds_total", generation="2") == \
        pytest.approx(times.seconds[2])
    status = times.status()
    assert status["collections"] == times.collections and len(status["thresholds"]) == 3


def test_each_thread_s_cpu_is_a_counter_and_none_is_made_up_where_unmeasured():
    text = scrape(fake_node())
    assert value(text, "raftsched_thread_cpu_seconds_total", thread="raft") == 1.25
    assert value(text, "raftsched_thread_cpu_seconds_total", thread="event_loop") == 2.5
    unmeasured = scrape(fake_node(thread_cpu=SimpleNamespace(seconds=lambda: None)))
    assert "raftsched_thread_cpu_seconds" not in unmeasured


@pytest.mark.integration
def test_each_node_counts_the_cpu_of_its_event_loop_and_raft_threads(cluster):
    for nid in cluster.ids:
        def busy() -> dict | None:
            threads = cluster.api(nid, "GET", "/v1/node").body["threads_cpu_s"]
            assert set(threads) == {"event_loop", "raft", "journal", "digest", "other"}
            # A node serves HTTP and applies entries from its start: each
            # thread's CPU shows once it reaches the kernel's tick (10 ms).
            return threads if threads["event_loop"] > 0 and threads["raft"] > 0 else None
        threads = wait_until(busy, timeout_s=30, what=f"{nid}'s threads' CPU counted")
        text = metrics_text(cluster, nid)
        assert value(text, "raftsched_thread_cpu_seconds_total", thread="raft") \
            >= threads["raft"]
