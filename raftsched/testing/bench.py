"""The benchmark of a local cluster (`scripts/bench.py`, `raftsched bench`).

    raftsched bench burst 10000 [--json burst.json]
    raftsched bench creates 64 [--seconds 10]
    raftsched bench footprint 100000,1000000 [--runs 2000]
    raftsched bench rejoin 1000000 [--snapshot-entries 2000]
    raftsched bench cost 20000 [--repeat 5]
    raftsched bench idle 60 [--settle-s 15] [--history 20000]
    raftsched bench failover 3000 [--kill-before-s 1]

Every scenario starts its own cluster of --nodes (default 3) processes on
127.0.0.1, prints its conditions (nodes, jobs, cores, python, sink) first and
its figures last, and writes the figures as JSON with --json.

Scenario `burst N`: N one-off jobs, created with batchCreate, all due on the
same second, HTTP targets at the fast sink (testing/fastsink.py: aiohttp on
uvloop in a process of its own, keep-alive, answers at once). It prints:

- trigger lateness of every run, from each node's histogram of its own
  first calls (the call's start, by the cluster's time, minus the due time:
  runtime/lateness.py), as the difference of the histograms before and after;
- call lateness of every call, at the sink (arrival minus scheduled time);
- runs seen, duplicates (an attempt called twice) and redeliveries (a later
  attempt of a run whose lease was lost);
- references in the same run, after the cluster has stopped: a bare aiohttp
  client loop calling a fresh fast sink N times over --reference-connections
  keep-alive connections (the rate this machine can call targets at all);
  and APScheduler 3.x with N one-offs due on one second, in memory in a
  process of its own (testing/apscheduler_reference.py), twice: jobs that
  call a function (no network), and jobs that do raftsched's work, each
  POSTing to a fresh fast sink (AsyncIOScheduler on uvloop, one aiohttp
  session of --reference-connections), whose trigger lateness (the job
  started) and call lateness (at the sink) are measured over every job as
  raftsched's are. --no-apscheduler leaves both out. The figures are printed
  side by side in one table;
- the CPU of every node process per run, against the bare client's per call,
  by phase: the creates, then the wait until half a second before the due
  second (the arming the creates did not overlap, and the nodes' idle work),
  the two together, and the calls with their finishes. The arming window
  (--arm-ahead-s, 30 s by default) opens during the creates unless --lead-s
  is past it and the creates' time.

Scenario `creates C`: creates a second, single POSTs from C keep-alive
clients, then batchCreate of 1000 jobs, and the CPU the node processes spent
per create in each (utime + stime from /proc/PID/stat, their idle work
included).

Scenario `footprint N[,N...]`: bytes of state per pending one-off and each
node's private and mapped memory at each N pending (created one after the
other on the same cluster, so that the sizes sit side by side), with each
node's highest private memory (RssAnon) sampled every 5 s since the first
create, its snapshots and its shard lease lapses; then per one-off fired and
finished (its job and its run), and per run of a recurring job (--runs /
--recurring-s every-second jobs, paused, measured, run --recurring-s seconds,
paused and measured again: the bytes their runs added, a run at a time).

Scenario `cost N`: what one run costs every replica from fire to finish, and
a job its create, in one process with no network and no Raft
(testing/runcost.py): Raft entries, LMDB writes, msgpack encodes and decodes,
bytes encoded and CPU microseconds per job or run, phase by phase. With
--repeat K it measures K times in one process and prints each phase's least
CPU and the median: what compares builds on a machine whose speed wanders.

Scenario `idle S`: a cluster with no jobs, left --settle-s seconds to settle
(elections, shard assignment, the clock's first samples), then each node's
CPU over S seconds from /proc/PID/stat (utime + stime, user and system
time of all its threads), printed as % of one core per node. With
--history H, H one-offs are created first and run to their end (HTTP
targets at the fast sink), so the cluster idles with H jobs and runs in
their retention window: what the leader's purger goes round (give a
--settle-s past H / purge_scan_jobs_max seconds, a round of its passes).

Scenario `failover N` (default use: 3000): N one-offs due on the same second,
HTTP targets at the fast sink; the Raft leader is SIGKILLed --kill-before-s
(default 1) seconds before that second and left dead. It prints whether every
one-off was called, how many calls came before their time (any attempt), the
call lateness of every run (its first call, at the sink) with the last run's,
duplicates and redeliveries, and the time from the kill to a new leader.

Scenario `rejoin N`: N pending one-offs on a cluster that snapshots every
--snapshot-entries Raft entries; once the leader's snapshot holds them all, a
follower is SIGKILLed, its data directory wiped and the node started again.
It prints the time until the node has applied the leader's commit index and
until its state digest equals the others', the snapshot's size and install
time (from the node's log), and the Raft term before and after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable

import aiohttp

from raftsched import limits
from raftsched.core import lifecycle
from raftsched.runtime.lateness import difference, merged_percentile
from raftsched.runtime.threadcpu import percent_between, rest_of
from raftsched.testing.apscheduler_reference import measure_in_subprocess
from raftsched.testing import runcost
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.fastsink import FastSink
from raftsched.testing.http import auth_headers, call, decode_body, is_busy, wait_until

BATCH = 1000
REFERENCE_CONNECTIONS = 64
# Raft entries between snapshots in the rejoin scenario: a few snapshots while
# a million jobs are created (a batch of 1000 is a handful of entries), and
# few enough entries to add afterwards for one that holds them all.
REJOIN_SNAPSHOT_ENTRIES = 2000
# Keep-alive clients that add Raft entries (pause and resume of their own job)
# until the leader's snapshot covers the created jobs.
PUMP_CLIENTS = 16
NOWHERE = "http://127.0.0.1:9/"
RESENDS_MAX = 10   # times a footprint bench sends again creates refused with 503   # the target of jobs that are never due in a scenario


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _announce(scenario: str, **fields: Any) -> dict:
    conditions = {"scenario": scenario, **fields, "cores": os.cpu_count(),
                  "python": sys.version.split()[0]}
    print("conditions: " + ", ".join(f"{k} {v}" for k, v in conditions.items()), flush=True)
    return conditions


def _quiet_cluster(tmp: str, nodes: int, **kw: Any) -> LocalCluster:
    return LocalCluster(tmp, nodes=nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}, **kw)


def _histograms(cluster: LocalCluster) -> list[dict]:
    return [call("GET", cluster.url(n) + "/v1/node").body["trigger_lateness"]
            for n in cluster.ids]


def _create(cluster: LocalCluster, n: int, run_at: str, url: str,
            resent: list[int] | None = None) -> list[str]:
    """Create `n` one-offs by batchCreate. A batch refused busy (before
    proposal) is sent again after its Retry-After. Any other refusal fails the
    bench, unless `resent` is given: then creates refused with 503 (an election, say) are
    sent again after a second, up to RESENDS_MAX times, and counted in
    resent[0] (each may have been committed after all: at most one extra job)."""
    body = {"run_at": run_at, "target": {"type": "http", "url": url, "timeout_s": 30}}
    urls = [cluster.url(nid) for nid in cluster.ids]

    def batch(i: int) -> list[str]:
        size, made, attempt, sent = min(BATCH, n - i * BATCH), [], 0, 0
        while attempt <= RESENDS_MAX:
            answer = call("POST", urls[(i + sent) % len(urls)] + "/v1/jobs:batchCreate",
                          {"jobs": [body] * size}, timeout_s=120)
            sent += 1
            if answer.busy:
                # Refused before proposal (nothing of it committed): sent again
                # after Retry-After, as a client honouring it does.
                time.sleep(answer.retry_after_s)
                continue
            attempt += 1
            if answer.status == 503 and resent is not None and attempt <= RESENDS_MAX:
                resent[0] += size   # refused whole (no leader to propose to)
                time.sleep(1.0)
                continue
            assert answer.status == 200, answer
            made += [r["job_id"] for r in answer.body["results"] if "job_id" in r]
            refused = [r["error"] for r in answer.body["results"] if "job_id" not in r]
            if not refused:
                return made
            if resent is None or any(e.get("status") != 503 for e in refused) \
                    or attempt > RESENDS_MAX:
                raise AssertionError(f"{len(refused)} creates refused, the first: {refused[0]}")
            resent[0] += len(refused)
            size = len(refused)
            time.sleep(1.0)
        return made

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return [j for ids in pool.map(batch, range(-(-n // BATCH))) for j in ids]


def _at(seconds_from_now: float) -> str:
    return dt.datetime.fromtimestamp(time.time() + seconds_from_now, dt.timezone.utc).isoformat()


# --- burst ------------------------------------------------------------------------------

async def _reference(url: str, n: int, connections: int) -> float:
    """Calls a second of a bare aiohttp client loop makes against `url`."""
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                queue.pop()
                async with session.post(url, data=b"{}") as response:
                    await response.read()

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return n / (time.monotonic() - started)


def _reference_rate(n: int, connections: int) -> tuple[float, float]:
    """(calls a second, client CPU us per call) of the bare loop on uvloop (as
    the nodes run) against a fresh fast sink, which must have seen every call."""
    import uvloop

    with FastSink() as sink:
        cpu = time.process_time()
        rate = uvloop.run(_reference(sink.url, n, connections))
        cpu_us = (time.process_time() - cpu) / n * 1e6
        calls = sink.stats()["calls"]
    assert calls == n, f"the reference's sink saw {calls} calls of {n}"
    return rate, cpu_us


def _cost_mark(cluster: LocalCluster) -> tuple[int, int, float, dict[str, float]]:
    """(CPU clock ticks of every node process, Raft entries applied on the
    first node, seconds every node process spent in its cyclic garbage
    collector: GET /v1/node `gc`, and CPU seconds of every node's threads by
    what each does, summed over the nodes: `threads_cpu_s`, empty where the
    nodes do not measure it)."""
    ticks = sum(_cpu_ticks(p.pid) for p in cluster.procs.values())
    status = [call("GET", cluster.url(nid) + "/v1/node").body for nid in cluster.ids]
    threads: dict[str, float] = {}
    for s in status:
        for role, spent in (s.get("threads_cpu_s") or {}).items():
            threads[role] = threads.get(role, 0.0) + spent
    return (ticks, status[0]["applied_index"], sum(sum(s["gc"]["seconds"]) for s in status),
            threads)


def _runs_ended(cluster: LocalCluster) -> int:
    text = call("GET", cluster.url(cluster.ids[0]) + "/metrics").body
    text = text if isinstance(text, str) else text.decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("raftsched_runs_ended_total{")))


def _cost_figures(marks: list[tuple[int, int, float, dict[str, float]]], n: int,
                  reference_cpu_us: float) -> dict:
    """CPU of all the node processes and Raft entries, per run: from before the
    creates to half a second before the due second (creates and arming), and
    from then to the last finish applied (the calls and their finishes). The
    first is also given in two: until the last create was answered, and from
    then to half a second before the due second (the arming that had not
    begun during the creates, and the nodes' idle work while they wait). With
    the default lead the arming window (--arm-ahead-s) opens during the
    creates; a --lead-s past it and the creates' time keeps the two apart.
    Each phase's CPU is also given by the nodes' threads (runtime/threadcpu.py):
    the event loops, the Raft threads (apply), and the rest."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, (a, b) in (("create", (marks[0], marks[1])),
                         ("arm_and_wait", (marks[1], marks[2])),
                         ("create_and_arm", (marks[0], marks[2])),
                         ("call_and_finish", (marks[2], marks[3]))):
        cpu_us = (b[0] - a[0]) / hz / n * 1e6
        out[name] = {"nodes_cpu_us_per_run": round(cpu_us), "entries_per_1000_runs":
                     round((b[1] - a[1]) / n * 1000, 1),
                     "gc_us_per_run": round((b[2] - a[2]) / n * 1e6),
                     "threads_us_per_run": {role: round((spent - a[3].get(role, 0.0)) / n * 1e6)
                                            for role, spent in b[3].items()}}
    whole = (marks[3][0] - marks[0][0]) / hz / n * 1e6
    out["nodes_cpu_us_per_run"] = round(whole)
    out["vs_bare_client_cpu_per_call"] = round(whole / max(reference_cpu_us, 1e-9), 1)
    return out


def _call_figures(sink: FastSink, ids: list[str]) -> dict:
    calls = sink.by_job()
    firsts = [calls[j][0] for j in ids]
    attempts = {j: [c.attempt for c in calls[j]] for j in ids}
    call_late = [c.lateness_s * 1000 for c in firsts]
    arrivals = sorted(c.received_s for c in firsts)
    return {
        "call_lateness_ms": {"count": len(call_late), "p50": round(_pct(call_late, 50)),
                             "p99": round(_pct(call_late, 99)), "max": round(max(call_late))},
        "runs_seen": len(firsts),
        "duplicates": sum(1 for a in attempts.values() if len(set(a)) < len(a)),
        "redeliveries": sum(1 for a in attempts.values() if len(set(a)) > 1),
        "call_rate_per_s": round(len(ids) / max(1e-3, arrivals[-1] - arrivals[0])),
    }


def _trigger_figures(diffs: list[dict]) -> dict:
    trigger_max = max(d["max_ms"] for d in diffs)
    # A percentile is its bucket's upper bound, and no more than the maximum.
    return {"count": sum(d["count"] for d in diffs),
            "p50": min(merged_percentile(diffs, 50), trigger_max),
            "p99": min(merged_percentile(diffs, 99), trigger_max),
            "max": trigger_max}


def burst(n: int, nodes: int = 3, lead_s: float | None = None,
          reference_connections: int = REFERENCE_CONNECTIONS, apscheduler: bool = True) -> dict:
    conditions = _announce(
        "burst", jobs=n, nodes=nodes, sink=FastSink.kind,
        shared="client, sink and nodes share the machine",
        references=f"bare aiohttp loop with {reference_connections} connections against a "
                   f"fresh fast sink" + ("; APScheduler 3.x in its own process, jobs calling "
                                         "a function, and jobs POSTing to a fresh fast sink"
                                         if apscheduler else "") + ", after the cluster")
    with tempfile.TemporaryDirectory() as tmp, FastSink() as sink, \
            _quiet_cluster(tmp, nodes) as cluster:
        cluster.wait_ready()
        before = _histograms(cluster)
        due_s = int(time.time() + (lead_s if lead_s is not None else 8 + n / 2000)) + 1
        run_at = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
        marks = [_cost_mark(cluster)]
        started = time.monotonic()
        ids = _create(cluster, n, run_at, sink.url)
        create_s = time.monotonic() - started
        marks.append(_cost_mark(cluster))   # every create answered
        late_start = time.time() > due_s
        time.sleep(max(0.0, due_s - 0.5 - time.time()))
        marks.append(_cost_mark(cluster))   # created and armed, half a second before due
        # Only this run's jobs call the sink, one distinct id each.
        wait_until(lambda: sink.stats()["jobs"] >= n, 120 + n / 100,
                   "every job to call the sink", 0.2)
        wait_until(lambda: _runs_ended(cluster) >= n, 60, "every run's finish applied", 0.2)
        marks.append(_cost_mark(cluster))

        counted: list[list[dict]] = []

        def all_counted() -> list[dict] | None:
            after = _histograms(cluster)
            counted[:] = [[difference(a, b) for a, b in zip(after, before)]]
            return counted[0] if sum(d["count"] for d in counted[0]) >= n else None

        try:
            diffs = wait_until(all_counted, 30, "every fire counted in the histograms")
        except TimeoutError:
            # A run whose first attempt was not the one called (taken over:
            # see redeliveries) is not in the histograms: say so, and report
            # what was counted.
            diffs = counted[0]
        lapses = _lease_lapses(cluster)
        calls = _call_figures(sink, ids)
        sink_url = sink.url
        cluster.ensure_same(60)
    reference_rate, reference_cpu_us = _reference_rate(n, reference_connections)
    figures = {
        **conditions, "create_s": round(create_s, 2), "creates_per_s": round(n / create_s),
        "creates_finished_after_due": late_start,
        "trigger_lateness_ms": _trigger_figures(diffs), **calls,
        "reference_connections": reference_connections,
        "reference_aiohttp_calls_per_s": round(reference_rate),
        "call_rate_vs_reference": round(calls["call_rate_per_s"] / reference_rate, 2),
        "reference_cpu_us_per_call": round(reference_cpu_us, 1),
        "cost": _cost_figures(marks, n, reference_cpu_us),
        "shard_lease_lapses": lapses,
        "sink_url": sink_url,
    }
    if apscheduler:
        figures["apscheduler_reference"] = measure_in_subprocess(n)
        figures["apscheduler_post_reference"] = _apscheduler_post(n, reference_connections)
    return figures


def _lease_lapses(cluster: LocalCluster) -> dict[str, int | None]:
    """Each node's shard lease lapses since it started (a renewal applied too
    late: the node called none of its runs until the next)."""
    return {nid: cluster.api(nid, "GET", "/v1/node").body.get("shard_lease_lapses_total")
            for nid in cluster.ids}


def _apscheduler_post(n: int, connections: int) -> dict:
    """APScheduler's jobs POSTing to a fresh fast sink; its own figures, and
    the sink's for its calls (every call, as for raftsched's)."""
    with FastSink() as sink:
        figures = measure_in_subprocess(n, post_url=sink.url, connections=connections)
        calls = _call_figures(sink, [f"aps-{i}" for i in range(n)]) \
            if sink.stats()["jobs"] >= n else None
    if calls is None:
        raise RuntimeError(f"the APScheduler reference's sink saw fewer than {n} jobs: "
                           f"{figures}")
    return {**figures, **calls}


# --- footprint --------------------------------------------------------------------------

def _rss(pid: int) -> dict[str, int]:
    """RssAnon (private memory) and RssFile (mapped files: LMDB's pages are page
    cache, counted as disk) of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile"):
                out[name] = int(value.split()[0]) * 1024
    return out


class _PeakAnon:
    """Each node's highest RssAnon, read from /proc every `period_s` on a
    thread of its own while creates go on: what a size's one reading misses
    (the log a node holds while a snapshot is written, say)."""

    def __init__(self, pids: dict[str, int], period_s: float = 5.0) -> None:
        self._pids, self._period_s = pids, period_s
        self.peak = {nid: 0 for nid in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-peak-anon", daemon=True)

    def _sample(self) -> None:
        for nid, pid in self._pids.items():
            try:
                self.peak[nid] = max(self.peak[nid], _rss(pid)["RssAnon"])
            except (OSError, KeyError):
                pass   # a node gone or not yet readable: the next sample counts

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self._sample()

    def __enter__(self) -> "_PeakAnon":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _used(cluster: LocalCluster) -> list[int]:
    return [call("GET", cluster.url(n) + "/v1/node").body["storage"]["used_bytes"]
            for n in cluster.ids]


def _settled_used(cluster: LocalCluster, baseline: list[int]) -> list[int]:
    """Each node's pages in use once they have grown past `baseline` and two
    readings a storage check apart agree (a node measures every
    storage_check_period_s while its state changes size, so a reading may
    predate the last writes)."""
    readings: list[list[int]] = []

    def settled() -> list[int] | None:
        readings.append(_used(cluster))
        last = readings[-2:]
        grown = all(u > b for u, b in zip(readings[-1], baseline))
        return readings[-1] if grown and len(last) == 2 and last[0] == last[1] else None

    return wait_until(settled, 60, "the nodes' storage measured after the writes",
                      limits.storage_check_period_s * 1.5)


def _pending_at_sizes(cluster: LocalCluster, sizes: list[int], url: str,
                      empty: list[int]) -> tuple[list[dict], list[int]]:
    """Create pending one-offs up to each of `sizes` in turn; at each, the
    bytes per pending job (all of them; and the ones added since the size
    before) and every node's memory. Returns those and the last used bytes."""
    rows: list[dict] = []
    created, used, resent = 0, empty, [0]
    started = time.monotonic()
    with _PeakAnon({nid: cluster.procs[nid].pid for nid in cluster.ids}) as peak:
        for size in sizes:
            _create(cluster, size - created, _at(86_400), url, resent)
            cluster.ensure_same(120 + size / 5000)
            now_used = _settled_used(cluster, used)
            rows.append({
                "pending_jobs": size,
                "bytes_per_pending_job": round(max((u - e) / size
                                                   for u, e in zip(now_used, empty))),
                "bytes_per_added_job": round(max((u - p) / (size - created)
                                                 for u, p in zip(now_used, used))),
                "memory_bytes": {nid: _rss(cluster.procs[nid].pid) for nid in cluster.ids},
                # The highest of the samples since the first create.
                "rss_anon_peak_bytes": dict(peak.peak),
                "creates_resent_after_503": resent[0], **_raft_load(cluster),
                "seconds_since_start": round(time.monotonic() - started)})
            print(f"at {size}: {json.dumps(rows[-1])}", flush=True)   # before the next size
            created, used = size, now_used
    return rows, used


def _finish_runs(cluster: LocalCluster, sink: FastSink, runs: int) -> None:
    """Create `runs` one-offs due in seconds and wait until each has called the
    sink and its run's success is applied."""
    ids = set(_create(cluster, runs, _at(5 + runs / 1000), sink.url))
    wait_until(lambda: sink.stats()["jobs"] >= runs, 120 + runs / 100, "every run called", 0.2)

    def succeeded(job_id: str) -> bool:
        answer = call("GET", cluster.url("n1") + f"/v1/jobs/{job_id}/runs?consistent=true")
        found = answer.body.get("runs") if isinstance(answer.body, dict) else None
        return bool(found) and found[0]["state"] == "succeeded"   # else: not yet

    def all_finished() -> bool:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return all(pool.map(succeeded, ids))

    wait_until(all_finished, 120, "every run's finish applied", 0.5)


RECURRING_S = 40   # seconds the footprint's every-second jobs run


def _recurring_runs(cluster: LocalCluster, sink: FastSink, runs: int, seconds: float) -> dict:
    """Bytes per finished run of recurring jobs: what a job's history costs.
    runs / seconds every-second jobs run until each has a run (the job's own
    records, its state among them, made), are paused and the nodes measured;
    then they run for `seconds` more, are paused again, and the bytes added
    are divided by the runs ended between."""
    url = cluster.url("n1")
    body = {"schedule": {"every": "1s"}, "target": {"type": "http", "url": sink.url}}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        created = list(pool.map(lambda _: call("POST", url + "/v1/jobs", body),
                                range(max(1, round(runs / seconds)))))
        assert all(a.status == 201 for a in created), created
        ids = [a.body["job_id"] for a in created]

        def states(job_id: str) -> list[str]:
            found = call("GET", url + f"/v1/jobs/{job_id}/runs?consistent=true"
                                    f"&limit={limits.list_limit_max}")
            assert len(found.body["runs"]) < limits.list_limit_max, "more runs than a page"
            return [r["state"] for r in found.body["runs"]]

        def ended() -> list[int] | None:
            """Runs per job, once every run of every job has ended."""
            counts = []
            for job_id in ids:
                found = states(job_id)
                if not lifecycle.TERMINAL.issuperset(found):
                    return None
                counts.append(len(found))
            return counts

        def to_all(action: str) -> None:
            answers = list(pool.map(lambda j: call("POST", url + f"/v1/jobs/{j}:{action}", {}),
                                    ids))
            assert all(a.status == 200 for a in answers), answers

        wait_until(lambda: all("succeeded" in states(j) for j in ids), 120,
                   "a run of every job ended", 0.5)
        to_all("pause")
        before = wait_until(ended, 120, "every run ended", 0.5)
        cluster.ensure_same(120)
        used = _settled_used(cluster, [0] * len(cluster.ids))
        to_all("resume")
        time.sleep(seconds)   # the jobs' runs, not a condition: the measure is of what they add
        to_all("pause")
        after = wait_until(ended, 120, "every run ended", 0.5)
        cluster.ensure_same(120)
        done = _settled_used(cluster, used)
    count = sum(after) - sum(before)
    return {"recurring_jobs": len(ids), "recurring_runs_ended": count,
            "bytes_per_recurring_run": round(max((d - u) / count for d, u in zip(done, used)))}


def footprint(sizes: list[int] | int, runs: int, nodes: int = 3,
              recurring_s: float = RECURRING_S) -> dict:
    """Bytes of state per pending one-off (due in a day) at each of `sizes`,
    and per one-off that fired and finished (`runs` of them, due in seconds:
    the job and its run), from LMDB's pages in use on each node; and each
    node's private and mapped memory at each size."""
    sizes = sorted({sizes} if isinstance(sizes, int) else set(sizes))
    # The jobs of every size and the runs, and room for creates sent again
    # after a 503 that were committed after all, under the tenant's quota
    # (tenant_jobs_max_default is 10M).
    jobs_max = max(limits.tenant_jobs_max_default, 2 * (sizes[-1] + runs))
    conditions = _announce("footprint", pending_jobs=sizes[-1], sizes=sizes,
                           finished_runs=runs, nodes=nodes, sink=FastSink.kind,
                           tenant_jobs_max=jobs_max)
    with tempfile.TemporaryDirectory() as tmp, FastSink() as sink, \
            _quiet_cluster(tmp, nodes, node_args=[f"--tenant-jobs-max={jobs_max}"]) as cluster:
        cluster.wait_ready()
        cluster.ensure_same(60)
        empty = _used(cluster)
        rows, pending = _pending_at_sizes(cluster, sizes, sink.url, empty)
        _finish_runs(cluster, sink, runs)
        cluster.ensure_same(120)
        done = _settled_used(cluster, pending)
        recurring = _recurring_runs(cluster, sink, runs, recurring_s)
    per_run = [(d - p) / runs for d, p in zip(done, pending)]
    return {**conditions,
            "bytes_per_pending_job": rows[-1]["bytes_per_pending_job"],
            "bytes_per_finished_one_off_job_and_run": round(max(per_run)), **recurring,
            "memory_at_pending_bytes": rows[-1]["memory_bytes"],
            "by_size": rows}


# --- creates ----------------------------------------------------------------------------

async def _post_loop(url: str, body: bytes, clients: int,
                     seconds: float) -> tuple[int, int, int]:
    """(answers 2xx, answers 503 busy, other answers) of `clients` keep-alive
    clients posting `body` to `url` for `seconds`. A client refused 503 waits
    its Retry-After before it sends again, as the Python client does."""
    headers = {"Content-Type": "application/json", **auth_headers()}
    ok = busy = failed = 0
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def client() -> None:
            nonlocal ok, busy, failed
            while time.monotonic() < stop_at:
                retry_after = None
                async with session.post(url, data=body) as response:
                    answer = await response.read()
                    if response.status < 300:
                        ok += 1
                    elif is_busy(response.status, decode_body(answer)):
                        busy += 1
                    else:
                        failed += 1
                    if response.status == 503:
                        retry_after = response.headers.get("Retry-After")
                if retry_after is not None:
                    await asyncio.sleep(min(float(retry_after),
                                            max(0.0, stop_at - time.monotonic())))

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok, busy, failed


BURST_CLIENTS = 32   # batchCreate requests of BATCH jobs sent at once (creates scenario)


def batch_burst(urls: list[str], clients: int = BURST_CLIENTS, jobs: int = BATCH,
                context: Any = None) -> dict:
    """`clients` batchCreate requests of `jobs` one-offs (due in a day), sent at
    once over the nodes at `urls`, each answered: how many were committed
    (2xx, every job created), refused busy before proposal (503 `busy` with
    Retry-After), or answered with an unknown outcome (503 otherwise, or a 2xx
    of which some jobs were not committed), or anything else; and the ids of
    the jobs the 2xx answers created."""
    one = {"run_at": _at(86_400), "target": {"type": "http", "url": NOWHERE}}
    start = threading.Barrier(clients)

    def send(i: int) -> Any:
        start.wait()
        return call("POST", urls[i % len(urls)] + "/v1/jobs:batchCreate",
                    {"jobs": [one] * jobs}, timeout_s=120, context=context)

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(send, range(clients)))
    tally = {"committed": 0, "busy": 0, "outcome_unknown": 0, "other": 0}
    job_ids: list[str] = []
    for answer in answers:
        tally[_burst_kind(answer)] += 1
        if answer.status < 300:
            job_ids += [r["job_id"] for r in answer.body["results"] if "job_id" in r]
    unknown = [_unknown_detail(a) for a in answers if _burst_kind(a) == "outcome_unknown"]
    return {**tally, "job_ids": job_ids, "unknown_details": unknown[:3],
            "others": [a for a in answers if _burst_kind(a) == "other"][:3]}


def _unknown_detail(answer: Any) -> str:
    if answer.status < 300:
        errors = [r["error"] for r in answer.body["results"] if "job_id" not in r]
        return f"2xx with {len(errors)} jobs not created, the first: {errors[0]}"
    return f"{answer.status}: {answer.body}"


def _burst_kind(answer: Any) -> str:
    if answer.status < 300:
        whole = all("job_id" in r for r in answer.body["results"])
        return "committed" if whole else "outcome_unknown"
    if answer.status == 503:
        busy = answer.body.get("type", "").endswith("/busy") and "Retry-After" in answer.headers
        return "busy" if busy else "outcome_unknown"
    return "other"


def creates(clients: int, seconds: float, nodes: int = 3) -> dict:
    """Creates a second: single POSTs from `clients` keep-alive clients spread
    over the nodes, then batchCreate of 1000 jobs from 2 clients per node, then
    BURST_CLIENTS batchCreates of 1000 one-offs at once (how each was answered)."""
    conditions = _announce("creates", clients=clients, seconds=seconds, nodes=nodes,
                           sink="none (the jobs are due in a day)")
    one = {"run_at": _at(86_400), "target": {"type": "http", "url": NOWHERE}}
    with tempfile.TemporaryDirectory() as tmp, _quiet_cluster(tmp, nodes) as cluster:
        cluster.wait_ready()

        # (CPU ticks, applied index, GC seconds, CPU by thread) at each
        # phase's ends: read between the phases, blocking the clients' loop
        # for those few requests only.
        marks: list[tuple[int, int, float, dict[str, float]]] = []
        client_cpu_s: list[float] = []   # this process's (the clients') over the singles

        async def both() -> tuple:
            marks.append(_cost_mark(cluster))
            client_cpu_s.append(time.process_time())
            single = await asyncio.gather(*(
                _post_loop(cluster.url(nid) + "/v1/jobs", json.dumps(one).encode(),
                           max(1, clients // nodes), seconds) for nid in cluster.ids))
            client_cpu_s.append(time.process_time())
            marks.append(_cost_mark(cluster))
            batch_body = json.dumps({"jobs": [one] * BATCH}).encode()
            batched = await asyncio.gather(*(
                _post_loop(cluster.url(nid) + "/v1/jobs:batchCreate", batch_body, 2, seconds)
                for nid in cluster.ids))
            marks.append(_cost_mark(cluster))
            return single, batched

        single, batched = asyncio.run(both())
        lapses = _lease_lapses(cluster)
        burst = batch_burst([cluster.url(nid) for nid in cluster.ids])
        cluster.ensure_same(120)
    singles = sum(s[0] for s in single)
    node_us = _per_create_us(marks[1][0] - marks[0][0], singles)
    client_us = round((client_cpu_s[1] - client_cpu_s[0]) / singles * 1e6) if singles else None
    return {**conditions, "single_posts_per_s": round(singles / seconds),
            # The clients' CPU per create (this process), and the most single
            # creates a second this machine's cores could take at the nodes'
            # and the clients' CPU per create: where the rate is bound by CPU.
            "single_client_cpu_us": client_us,
            "single_cpu_bound_per_s": round((os.cpu_count() or 1) * 1e6 / (node_us + client_us))
            if node_us and client_us else None,
            "single_refused_busy": sum(s[1] for s in single),
            "single_failed": sum(s[2] for s in single),
            "batch_jobs_per_s": round(sum(b[0] for b in batched) * BATCH / seconds),
            "batch_requests_refused_busy": sum(b[1] for b in batched),
            "batch_requests_failed": sum(b[2] for b in batched),
            # CPU of all the node processes (idle work included) per create
            # answered: what the rates cost, less moved by the machine's speed.
            "single_node_cpu_us": node_us,
            "batch_node_cpu_us": _per_create_us(marks[2][0] - marks[1][0],
                                                sum(b[0] for b in batched) * BATCH),
            # The same by the nodes' threads (runtime/threadcpu.py).
            "single_threads_us": _threads_per_create(marks[0][3], marks[1][3],
                                                     sum(s[0] for s in single)),
            # Raft entries committed per single create (group commit puts
            # several in one; renewals and the rest count too).
            "single_entries_per_create": round((marks[1][1] - marks[0][1]) / singles, 3)
            if singles else None,
            "batch_threads_us": _threads_per_create(marks[1][3], marks[2][3],
                                                    sum(b[0] for b in batched) * BATCH),
            "shard_lease_lapses": lapses,
            "burst": {k: v for k, v in burst.items() if k != "job_ids"}}


def _per_create_us(ticks: int, created: int) -> int | None:
    return round(ticks / os.sysconf("SC_CLK_TCK") / created * 1e6) if created else None


def _threads_per_create(before: dict[str, float], after: dict[str, float],
                        created: int) -> dict[str, int]:
    """The nodes' CPU by thread role (summed over the nodes) per create, in
    us; empty where the nodes do not measure it or nothing was created."""
    if not created:
        return {}
    return {role: round((spent - before.get(role, 0.0)) / created * 1e6)
            for role, spent in after.items()}


# --- failover ---------------------------------------------------------------------------

FAILOVER_KILL_BEFORE_S = 1.0


def _early_calls(sink: FastSink, ids: list[str]) -> int:
    """Calls of any attempt that reached the sink before their scheduled time."""
    calls = sink.by_job()
    return sum(1 for j in ids for c in calls.get(j, []) if c.lateness_s < 0)


def _kill_leader_at(cluster: LocalCluster, at_s: float) -> tuple[str, float]:
    """SIGKILL the leader (as the nodes agree on it then) at time.time() `at_s`."""
    time.sleep(max(0.0, at_s - 0.5 - time.time()))   # waiting for a wall-clock instant
    leader = cluster.wait_ready()
    time.sleep(max(0.0, at_s - time.time()))
    cluster.kill(leader)
    return leader, time.time()


def failover(n: int, nodes: int = 3, kill_before_s: float = FAILOVER_KILL_BEFORE_S,
             lead_s: float | None = None) -> dict:
    conditions = _announce("failover", jobs=n, nodes=nodes, kill_before_s=kill_before_s,
                           sink=FastSink.kind, fault="SIGKILL of the Raft leader, left dead")
    with tempfile.TemporaryDirectory() as tmp, FastSink() as sink, \
            _quiet_cluster(tmp, nodes) as cluster:
        cluster.wait_ready()
        due_s = int(time.time() + (lead_s if lead_s is not None else 6 + n / 1000)) + 1
        run_at = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
        ids = _create(cluster, n, run_at, sink.url)
        late_start = time.time() > due_s - kill_before_s
        victim, killed_at = _kill_leader_at(cluster, due_s - kill_before_s)
        survivors = [nid for nid in cluster.ids if nid != victim]
        new_leader = cluster.wait_ready(60, among=survivors)
        elected_s = time.time() - killed_at
        try:
            wait_until(lambda: sink.stats()["jobs"] >= n, 60 + n / 100,
                       "every one-off to call the sink", 0.2)
            all_called = True
        except TimeoutError:
            all_called = False
        calls = sink.by_job()
        seen = [j for j in ids if j in calls]
        figures = _call_figures(sink, seen) if seen else {}
        early = _early_calls(sink, ids)
        cluster.ensure_same(60, among=survivors)
    return {**conditions, "creates_finished_after_the_kill_time": late_start,
            "leader_killed": victim, "new_leader": new_leader,
            "new_leader_after_s": round(elected_s, 2),
            "all_called": all_called, "called": len(seen), "early_calls": early, **figures}


def _render_failover(figures: dict) -> str:
    late = figures.get("call_lateness_ms")
    return "\n".join([
        f"leader {figures['leader_killed']} SIGKILLed {figures['kill_before_s']:g} s before "
        f"{figures['jobs']} one-offs were due; {figures['new_leader']} led "
        f"{figures['new_leader_after_s']} s after the kill"
        + ("; WARNING: the creates ended after the kill time"
           if figures["creates_finished_after_the_kill_time"] else ""),
        f"all called: {'yes' if figures['all_called'] else 'NO'} ({figures['called']} of "
        f"{figures['jobs']}); early calls: {figures['early_calls']}",
        (f"call lateness (every run's first call, at the sink): n={late['count']} "
         f"p50={late['p50']} ms p99={late['p99']} ms; the last call {late['max']} ms late"
         if late else "no call reached the sink"),
        f"duplicates {figures.get('duplicates', 0)}, redeliveries "
        f"{figures.get('redeliveries', 0)}",
    ])


# --- idle -------------------------------------------------------------------------------

IDLE_SETTLE_S = 15.0


def _cpu_ticks(pid: int) -> int:
    """utime + stime of a process (all its threads), in clock ticks."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])   # fields 14 and 15 of proc(5)


def idle(seconds: float, nodes: int = 3, settle_s: float = IDLE_SETTLE_S,
         history: int = 0) -> dict:
    """Each node's CPU, in % of one core, over `seconds` of a cluster with
    nothing due: no jobs, or `history` one-offs that have run."""
    conditions = _announce("idle", nodes=nodes, jobs=history, seconds=seconds,
                           settle_s=settle_s,
                           history=f"{history} one-offs run to their end before the settle")
    with tempfile.TemporaryDirectory() as tmp, FastSink() as sink, \
            _quiet_cluster(tmp, nodes) as cluster:
        cluster.wait_ready()
        if history:
            due_s = int(time.time() + 8 + history / 2000) + 1
            run_at = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
            _create(cluster, history, run_at, sink.url)
            wait_until(lambda: _runs_ended(cluster) >= history, 120 + history / 100,
                       "every run's finish applied", 0.5)
        cluster.ensure_same(60)
        time.sleep(settle_s)   # a measurement's lead-in, not a synchronisation
        pids = {nid: cluster.procs[nid].pid for nid in cluster.ids}
        threads_before = _threads_cpu(cluster)
        before = {nid: _cpu_ticks(pid) for nid, pid in pids.items()}
        started = time.monotonic()
        time.sleep(seconds)    # the measured interval itself
        after = {nid: _cpu_ticks(pid) for nid, pid in pids.items()}
        elapsed_s = time.monotonic() - started
        threads_after = _threads_cpu(cluster)
        leader = cluster.leader()
    hz = os.sysconf("SC_CLK_TCK")
    percent = {nid: round(100 * (after[nid] - before[nid]) / hz / elapsed_s, 2) for nid in pids}
    # Each node's threads over the same interval (GET /v1/node threads_cpu_s,
    # read just outside it), where the nodes measure them.
    by_thread = {nid: percent_between(threads_before[nid], threads_after[nid], elapsed_s)
                 for nid in pids if threads_after.get(nid)}
    return {**conditions, "leader": leader, "measured_s": round(elapsed_s, 1),
            "cpu_percent_of_a_core": percent, "cpu_percent_by_thread": by_thread}


def _threads_cpu(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    """Each node's threads_cpu_s (GET /v1/node); {} for a node that gives none."""
    return {nid: call("GET", cluster.url(nid) + "/v1/node").body.get("threads_cpu_s") or {}
            for nid in cluster.ids}


def _render_idle(figures: dict) -> str:
    by_thread = figures.get("cpu_percent_by_thread", {})

    def threads(nid: str) -> str:
        split = by_thread.get(nid)
        if not split:
            return ""
        return (f" (event loop {split.get('event_loop', 0):g}, Raft thread "
                f"{split.get('raft', 0):g}, the rest {rest_of(split):g})")

    per_node = "; ".join(f"{nid}{' (leader)' if nid == figures['leader'] else ''} {pct:g}%"
                         f"{threads(nid)}"
                         for nid, pct in figures["cpu_percent_of_a_core"].items())
    return (f"idle CPU over {figures['measured_s']} s, % of one core (utime + stime): "
            f"{per_node}")


# --- rejoin -----------------------------------------------------------------------------

SNAPSHOT_WRITTEN = re.compile(r"snapshot written at applied_index (\d+) \(raft index (\d+)\) "
                              r"in ([\d.]+) s, (\d+) bytes")
SNAPSHOT_INSTALLING = re.compile(r"^(\S+ \S+) \S+ INFO \S+ installing a snapshot at "
                                 r"applied_index (\d+) \((\d+) bytes\)", re.M)
SNAPSHOT_INSTALLED = re.compile(r"installed the snapshot at applied_index (\d+) in ([\d.]+) s")
LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"


def _log_text(cluster: LocalCluster, nid: str, offset: int = 0) -> str:
    with open(cluster.base / f"{nid}.log", "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def _snapshot_covering(cluster: LocalCluster, nid: str, raft_index: int) -> dict | None:
    """The snapshot `nid` has in place if one at or past `raft_index` is
    written and renamed into place (the file's size is the one logged)."""
    found = [m for m in SNAPSHOT_WRITTEN.finditer(_log_text(cluster, nid))
             if int(m.group(2)) >= raft_index]
    if not found:
        return None
    applied, index, write_s, size = found[-1].groups()
    path = cluster.base / nid / "raft.snapshot"
    if not path.exists() or path.stat().st_size != int(size):
        return None
    return {"applied_index": int(applied), "raft_index": int(index),
            "write_s": float(write_s), "bytes": int(size)}


async def _pump_until(cluster: LocalCluster, job_ids: list[str],
                      done: Callable[[], Any], timeout_s: float) -> tuple[Any, int]:
    """Pause and resume each of `job_ids` in turn (a Raft entry each) until
    done() returns a value; that value and the entries added."""
    headers = {"Content-Type": "application/json", **auth_headers()}
    stop = asyncio.Event()
    ops = 0

    async def client(session: aiohttp.ClientSession, url: str, job_id: str) -> None:
        nonlocal ops
        paused = False
        while not stop.is_set():
            action = "resume" if paused else "pause"
            async with session.post(f"{url}/v1/jobs/{job_id}:{action}") as response:
                await response.read()
            if response.status == 200:
                ops += 1
            else:
                await asyncio.sleep(0.05)   # refused: not in the state expected; try the other
            paused = not paused

    async def watch() -> Any:
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                value = done()
                if value:
                    return value
                await asyncio.sleep(0.2)
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for a snapshot")
        finally:
            stop.set()

    async with aiohttp.ClientSession(headers=headers) as session:
        urls = [cluster.url(nid) for nid in cluster.ids]
        found, *_ = await asyncio.gather(
            watch(), *(client(session, urls[i % len(urls)], j) for i, j in enumerate(job_ids)))
    return found, ops


def _terms(cluster: LocalCluster) -> dict[str, int]:
    return {nid: cluster.api(nid, "GET", "/v1/node").body["term"] for nid in cluster.ids}


def _raft_load(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """What creating cost each node's Raft so far: its term, snapshots
    written, shard lease lapses (one GET /v1/node a node)."""
    status = {nid: cluster.api(nid, "GET", "/v1/node").body for nid in cluster.ids}
    return {"raft_terms": {n: s["term"] for n, s in status.items()},
            "snapshots_written": {n: s["snapshots_written_total"] for n, s in status.items()},
            "shard_lease_lapses": {n: s["shard_lease_lapses_total"] for n, s in status.items()}}


def _install_figures(log: str, started_wall_s: float) -> dict:
    """What the rejoining node's log says about the snapshots it installed."""
    installing = SNAPSHOT_INSTALLING.findall(log)
    installed = SNAPSHOT_INSTALLED.findall(log)
    figures: dict[str, Any] = {"installs_logged": len(installed)}
    if installing:
        stamp, _applied, size = installing[0]
        received = dt.datetime.strptime(stamp, LOG_TIME_FORMAT).timestamp()
        figures["received_after_start_s"] = round(received - started_wall_s, 2)
        figures["image_bytes"] = int(size)
    if installed:
        figures["install_s"] = float(installed[0][1])
        figures["applied_index"] = int(installed[0][0])
    return figures


def _restart_wiped(cluster: LocalCluster, victim: str, leader: str, n: int) -> dict:
    """SIGKILL `victim`, wipe its data directory, start it; the times until it
    has the leader's commit index applied and until the digests agree."""
    cluster.kill(victim)
    shutil.rmtree(cluster.base / victim)
    log_offset = (cluster.base / f"{victim}.log").stat().st_size
    started_wall_s, started = time.time(), time.monotonic()
    cluster.start(victim)
    timeout_s = 120 + n / 2000

    def caught_up() -> dict | None:
        target = cluster.api(leader, "GET", "/v1/node", timeout_s=5).body["commit_index"]
        mine = cluster.api(victim, "GET", "/v1/node", timeout_s=2).body
        return mine if mine["applied_index"] >= target else None

    status = wait_until(caught_up, timeout_s, f"{victim} to apply the leader's commit index",
                        0.1)
    caught_up_s = time.monotonic() - started
    cluster.ensure_same(timeout_s)
    same_s = time.monotonic() - started
    return {"node": victim, "caught_up_s": round(caught_up_s, 2),
            "digests_equal_s": round(same_s, 2),
            "snapshot_installs_total": status["snapshot_installs_total"],
            "log": _install_figures(_log_text(cluster, victim, log_offset), started_wall_s)}


def rejoin(n: int, nodes: int = 3, snapshot_entries: int = REJOIN_SNAPSHOT_ENTRIES) -> dict:
    conditions = _announce("rejoin", pending_jobs=n, nodes=nodes,
                           snapshot_entries=snapshot_entries,
                           sink="none (the jobs are due in a day)")
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(
            tmp, nodes=nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "INFO"},
            node_args=["--raft-snapshot-entries", str(snapshot_entries)]) as cluster:
        cluster.wait_ready()
        started = time.monotonic()
        _create(cluster, n, _at(86_400), NOWHERE)
        create_s = time.monotonic() - started
        cluster.ensure_same(120 + n / 5000)
        leader = cluster.wait_ready()
        commit = cluster.api(leader, "GET", "/v1/node").body["commit_index"]
        pumps = _create(cluster, PUMP_CLIENTS, _at(86_400), NOWHERE)
        started = time.monotonic()
        snapshot, pumped = asyncio.run(_pump_until(
            cluster, pumps, lambda: _snapshot_covering(cluster, leader, commit),
            120 + n / 5000))
        pump_s = time.monotonic() - started
        terms_before = _terms(cluster)
        victim = next(nid for nid in cluster.ids if nid != leader)
        rejoined = _restart_wiped(cluster, victim, leader, n)
        terms_after = _terms(cluster)
        leader_after = cluster.leader()
    return {**conditions, "create_s": round(create_s, 2),
            "entries_added_for_the_snapshot": pumped, "waited_for_the_snapshot_s": round(pump_s, 2),
            "leader": leader, "leader_after": leader_after, "snapshot": snapshot,
            "terms_before": terms_before, "terms_after": terms_after,
            "elections": max(terms_after.values()) != max(terms_before.values()),
            "rejoin": rejoined}


# --- output -----------------------------------------------------------------------------

def _render_creates(figures: dict) -> str:
    return (f"single POSTs: {figures['single_posts_per_s']}/s with {figures['clients']} "
            f"keep-alive clients ({figures['single_refused_busy']} refused busy, "
            f"{figures['single_failed']} other failures); batchCreate of "
            f"{BATCH}: {figures['batch_jobs_per_s']} jobs/s with 6 clients "
            f"({figures['batch_requests_refused_busy']} requests refused busy, "
            f"{figures['batch_requests_failed']} other failures); CPU of the "
            f"{figures['nodes']} nodes per create: {figures.get('single_node_cpu_us')} us "
            f"(single{_threads_part({'threads_us_per_run': figures.get('single_threads_us')})}"
            f"; Raft entries per create {figures.get('single_entries_per_create')}"
            f"), {figures.get('batch_node_cpu_us')} us (batch"
            f"{_threads_part({'threads_us_per_run': figures.get('batch_threads_us')})}"
            f"); the clients' CPU per single create: {figures.get('single_client_cpu_us')} us, "
            f"so {os.cpu_count()} cores take at most {figures.get('single_cpu_bound_per_s')} "
            f"single creates a second at these costs; shard lease lapses "
            f"while creating: {figures.get('shard_lease_lapses')}\n"
            f"{BURST_CLIENTS} batchCreates of {BATCH} one-offs at once: "
            f"{figures['burst']['committed']} committed, {figures['burst']['busy']} refused busy, "
            f"{figures['burst']['outcome_unknown']} outcome unknown, "
            f"{figures['burst']['other']} other"
            + "".join(f"\n  outcome unknown: {d}" for d in figures["burst"]["unknown_details"]))


def _render_footprint(figures: dict) -> str:
    lines = [f"state per pending one-off: {figures['bytes_per_pending_job']} B (LMDB pages in "
             f"use, the largest of the nodes)",
             f"state per one-off fired and finished (its job and its run): "
             f"{figures['bytes_per_finished_one_off_job_and_run']} B",
             f"state per run of a recurring job (its run alone; {figures['recurring_jobs']} "
             f"every-second jobs, {figures['recurring_runs_ended']} runs): "
             f"{figures['bytes_per_recurring_run']} B"]
    for i, row in enumerate(figures["by_size"]):
        added = f"; {row['bytes_per_added_job']} B a job added since the size before" if i else ""
        lines.append(
            f"memory at {row['pending_jobs']:,} pending ({row['bytes_per_pending_job']} B a job"
            f"{added}): "
            + "; ".join(f"{nid} RssAnon {m['RssAnon'] / 2**20:.0f} MB (at most "
                        f"{row['rss_anon_peak_bytes'][nid] / 2**20:.0f} MB since the first "
                        f"create), RssFile {m['RssFile'] / 2**20:.0f} MB"
                        for nid, m in row["memory_bytes"].items()))
    return "\n".join(lines)


def _render_apscheduler(figures: dict) -> str:
    aps, late = figures["apscheduler_reference"], figures["apscheduler_reference"]["lateness_ms"]
    lines = [f"APScheduler reference, no network ({aps['conditions']}): {aps['called']} of "
             f"{aps['jobs']} called, lateness n={late['count']} p50={late['p50']} ms "
             f"p99={late['p99']} ms max={late['max']} ms, set up in {aps['setup_s']} s"
             + ("; WARNING: set up after the due time" if aps["adds_finished_after_due"]
                else "")]
    post = figures.get("apscheduler_post_reference")
    if post is not None:
        lines.append(
            f"APScheduler reference, POST to a sink ({post['conditions']}): {post['posted']} of "
            f"{post['jobs']} answered 200 ({post['failed']} failed), duplicates "
            f"{post['duplicates']}, set up in {post['setup_s']} s"
            + ("; WARNING: set up after the due time" if post["adds_finished_after_due"]
               else ""))
    return "\n".join(lines)


def _lateness_cell(late: dict | None) -> str:
    if late is None:
        return "-"
    return f"{late['p50']:g} / {late['p99']:g} / {late['max']:g}"


def _render_burst_table(figures: dict) -> str:
    """raftsched and its references side by side: lateness p50 / p99 / max in
    ms over every run (raftsched's trigger lateness is histogram bucket bounds)."""
    rows = [(f"raftsched, {figures['nodes']} nodes", figures["trigger_lateness_ms"],
             figures["call_lateness_ms"], figures["call_rate_per_s"])]
    aps = figures.get("apscheduler_reference")
    if aps is not None:
        rows.append(("APScheduler, no network", aps["lateness_ms"], aps["lateness_ms"], None))
    post = figures.get("apscheduler_post_reference")
    if post is not None:
        rows.append(("APScheduler, POST to a sink", post["trigger_lateness_ms"],
                     post["call_lateness_ms"], post["call_rate_per_s"]))
    rows.append(("bare aiohttp loop", None, None, figures["reference_aiohttp_calls_per_s"]))
    head = (f"{'':30} {'trigger lateness ms':>24} {'call lateness ms':>24} {'calls/s':>9}\n"
            f"{'':30} {'p50 / p99 / max':>24} {'p50 / p99 / max':>24}")
    body = [f"{name:30} {_lateness_cell(trigger):>24} {_lateness_cell(called):>24} "
            f"{rate if rate is not None else '-':>9}"
            for name, trigger, called, rate in rows]
    lines = [head, *body]
    if post is not None:
        lines.append(f"raftsched call lateness p99 / APScheduler's (POST): "
                     f"{figures['call_lateness_ms']['p99'] / max(1, post['call_lateness_ms']['p99']):.2f}")
    return "\n".join(lines)


def _render_cost(figures: dict) -> str:
    cost = figures["cost"]
    parts = [f"{name.replace('_', ' ')}: {c['nodes_cpu_us_per_run']} us of node CPU "
             f"({c['gc_us_per_run']} us of it collecting garbage{_threads_part(c)}) and "
             f"{c['entries_per_1000_runs']} Raft entries per 1000 runs"
             for name, c in cost.items() if isinstance(c, dict)]
    return (f"cost, all {figures['nodes']} nodes: {cost['nodes_cpu_us_per_run']} us of CPU per run "
            f"({cost['vs_bare_client_cpu_per_call']}x the bare client's "
            f"{figures['reference_cpu_us_per_call']} us per call); " + "; ".join(parts))


def _threads_part(phase: dict) -> str:
    threads = phase.get("threads_us_per_run")
    if not threads:
        return ""
    return (f"; event loops {threads.get('event_loop', 0)}, Raft threads "
            f"{threads.get('raft', 0)}, the rest {rest_of(threads):g}")


def _render_burst(figures: dict) -> str:
    t, c = figures["trigger_lateness_ms"], figures["call_lateness_ms"]
    lines = [
        f"creates: {figures['jobs']} in {figures['create_s']} s "
        f"({figures['creates_per_s']}/s, batchCreate of {BATCH})"
        + ("; WARNING: finished after the due time" if figures["creates_finished_after_due"]
           else ""),
        f"trigger lateness (every run, histogram bucket bounds): n={t['count']} p50<={t['p50']:g} ms "
        f"p99<={t['p99']:g} ms max={t['max']} ms"
        + (f"; WARNING: {figures['jobs'] - t['count']} runs not counted (first attempt not "
           f"the one called)" if t["count"] < figures["jobs"] else ""),
        f"call lateness (every call, at the sink): n={c['count']} p50={c['p50']} ms "
        f"p99={c['p99']} ms max={c['max']} ms",
        f"runs seen {figures['runs_seen']}, duplicates {figures['duplicates']}, "
        f"redeliveries {figures['redeliveries']}; shard lease lapses "
        f"{figures.get('shard_lease_lapses')}",
        f"call rate {figures['call_rate_per_s']}/s; bare aiohttp loop against the same kind of "
        f"sink: {figures['reference_aiohttp_calls_per_s']}/s with "
        f"{figures['reference_connections']} connections "
        f"(ratio {figures['call_rate_vs_reference']})",
        _render_cost(figures),
    ]
    if "apscheduler_reference" in figures:
        lines.append(_render_apscheduler(figures))
    lines.append(_render_burst_table(figures))
    return "\n".join(lines)


def _render_rejoin(figures: dict) -> str:
    snap, back = figures["snapshot"], figures["rejoin"]
    log = back["log"]
    installed = (f"installed in {log['install_s']} s (its log), received "
                 f"{log.get('received_after_start_s', '?')} s after start"
                 if "install_s" in log else "no snapshot install in its log")
    return "\n".join([
        f"creates: {figures['pending_jobs']} in {figures['create_s']} s; the leader's snapshot "
        f"holding them all after {figures['entries_added_for_the_snapshot']} more entries "
        f"({figures['waited_for_the_snapshot_s']} s)",
        f"snapshot: {snap['bytes']:,} B at raft index {snap['raft_index']}, written in "
        f"{snap['write_s']} s by the leader {figures['leader']}",
        f"wiped {back['node']}: applied the leader's commit index {back['caught_up_s']} s after "
        f"its start, digests equal after {back['digests_equal_s']} s; snapshot {installed}; "
        f"installs {back['snapshot_installs_total']}",
        f"raft terms before {figures['terms_before']}, after {figures['terms_after']}; leader "
        f"{figures['leader']} -> {figures['leader_after']}"
        + ("; WARNING: an election happened" if figures["elections"] else "; no election"),
    ])


def render(figures: dict) -> str:
    return {"creates": _render_creates, "footprint": _render_footprint,
            "rejoin": _render_rejoin, "cost": runcost.render,
            "idle": _render_idle, "failover": _render_failover}.get(figures["scenario"],
                                                                  _render_burst)(figures)


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive integers: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="raftsched bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("burst", "footprint", "creates", "rejoin", "cost",
                                                     "idle", "failover"))
    parser.add_argument("n", type=str,
                        help="jobs (footprint: pending one-offs, one or several comma-separated "
                             "sizes; creates: clients; idle: seconds measured)")
    parser.add_argument("--recurring-s", type=float, default=RECURRING_S,
                        help="footprint: seconds its every-second jobs run (runs / this many "
                             "jobs); their runs give the bytes per run of a recurring job")
    parser.add_argument("--runs", type=int, default=2000,
                        help="footprint: one-offs fired and finished (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="creates: seconds each part runs (default %(default)s)")
    parser.add_argument("--reference-connections", type=int, default=REFERENCE_CONNECTIONS,
                        help="burst: connections of the bare aiohttp loop (default %(default)s)")
    parser.add_argument("--lead-s", type=float, default=None,
                        help="burst, failover: seconds from the start of the creates to the "
                             "due second (default 8 + N/2000; failover 6 + N/1000)")
    parser.add_argument("--no-apscheduler", action="store_true",
                        help="burst: leave out the APScheduler reference")
    parser.add_argument("--snapshot-entries", type=int, default=REJOIN_SNAPSHOT_ENTRIES,
                        help="rejoin: Raft entries between snapshots (default %(default)s)")
    parser.add_argument("--kill-before-s", type=float, default=FAILOVER_KILL_BEFORE_S,
                        help="failover: seconds before the due second the leader is killed "
                             "(default %(default)s)")
    parser.add_argument("--settle-s", type=float, default=IDLE_SETTLE_S,
                        help="idle: seconds between the cluster's first agreement and the "
                             "measurement (default %(default)s)")
    parser.add_argument("--history", type=int, default=0,
                        help="idle: one-offs run to their end before the settle "
                             "(default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="cost: measure this many times in one process; print each "
                             "phase's least CPU and the median (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        sizes = _sizes(args.n)
    except ValueError as exc:
        parser.error(str(exc))
    if args.scenario != "footprint" and len(sizes) != 1:
        parser.error(f"{args.scenario} takes one N")
    if args.scenario == "footprint":
        figures = footprint(sizes, args.runs, args.nodes, args.recurring_s)
    elif args.scenario == "creates":
        figures = creates(sizes[0], args.seconds, args.nodes)
    elif args.scenario == "rejoin":
        figures = rejoin(sizes[0], args.nodes, args.snapshot_entries)
    elif args.scenario == "failover":
        figures = failover(sizes[0], args.nodes, args.kill_before_s, args.lead_s)
    elif args.scenario == "idle":
        figures = idle(float(sizes[0]), args.nodes, args.settle_s, args.history)
    elif args.scenario == "cost":
        if args.repeat < 1:
            parser.error("--repeat must be at least 1")
        figures = runcost.measure_repeated(sizes[0], args.repeat)
    else:
        figures = burst(sizes[0], args.nodes, args.lead_s,
                        reference_connections=args.reference_connections,
                        apscheduler=not args.no_apscheduler)
    print(render(figures), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0
