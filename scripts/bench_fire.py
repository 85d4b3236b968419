#!/usr/bin/env python3
"""Burst benchmark: N one-off jobs all due in the same second on a local cluster.

Prints the conditions and the figures: create throughput and latency, and for
the burst, trigger lateness (run started_at - scheduled_for, from the run
records) and call lateness (arrival at the HTTP sink - scheduled_for).

    .venv/bin/python scripts/bench_fire.py --jobs 5000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import os
import statistics
import sys
import tempfile
import time

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, wait_until
from raftsched.testing.sink import Sink


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(name: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (f"{name:<28} n={len(ms):<6} p50={pct(ms, 50):7.1f} ms  p99={pct(ms, 99):7.1f} ms  "
            f"max={max(ms):7.1f} ms")


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16, help="concurrent create calls")
    args = parser.parse_args()

    print(f"conditions: {args.nodes} nodes on 127.0.0.1, {args.jobs} one-off jobs due in the "
          f"same second, {os.cpu_count()} cores, python {sys.version.split()[0]}; "
          "sink, client and nodes share the machine", flush=True)
    with tempfile.TemporaryDirectory() as tmp, Sink() as sink, \
            LocalCluster(tmp, nodes=args.nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) \
            as cluster:
        cluster.wait_ready()
        # Leave enough time for the creates (measured below) before the burst.
        due = time.time() + 10 + args.jobs / 500
        due_text = dt.datetime.fromtimestamp(int(due) + 1, dt.timezone.utc).isoformat()
        body = {"name": "burst", "run_at": due_text,
                "target": {"type": "http", "url": sink.url, "timeout_s": 30}}
        latencies: list[float] = []

        def create(i: int) -> str:
            started = time.monotonic()
            r = call("POST", cluster.url(cluster.ids[i % args.nodes]) + "/v1/jobs", body)
            latencies.append(time.monotonic() - started)
            assert r.status == 201, r
            return r.body["job_id"]

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            ids = list(pool.map(create, range(args.jobs)))
        elapsed = time.monotonic() - started
        print(f"creates: {args.jobs} in {elapsed:.1f} s = {args.jobs / elapsed:.0f}/s with "
              f"{args.clients} concurrent clients", flush=True)
        print(summary("create latency", latencies), flush=True)
        if time.time() > int(due) + 1:
            print("warning: creates finished after the due time; lateness includes that")

        wait_until(lambda: len(sink.by_job()) >= args.jobs, 120 + args.jobs / 100,
                   "every job to call the sink", 0.2)
        calls = sink.by_job()
        dupes = sum(1 for j in ids if len(calls.get(j, [])) > 1)
        call_late = [c.lateness_s for j in ids for c in calls[j][:1]]

        def started_late(job_id: str) -> float | None:
            runs = call("GET", cluster.url("n1") + f"/v1/jobs/{job_id}/runs?consistent=true")
            run = runs.body["runs"][0]
            if run["started_at"] is None:
                return None
            return parse_time(run["started_at"]) - parse_time(run["scheduled_for"])

        sample = ids[:: max(1, len(ids) // 500)]
        wait_until(lambda: all(started_late(j) is not None for j in sample[-5:]), 30,
                   "run records to show their start")
        trigger_late = [v for v in map(started_late, sample) if v is not None]
        print(summary("trigger lateness (sampled)", trigger_late))
        print(summary("call lateness (at sink)", call_late))
        print(f"duplicates: {dupes}; mean call lateness {statistics.mean(call_late) * 1000:.1f} ms")
        digests = cluster.ensure_same(60)
        print(f"digests equal on {len(digests)} nodes at applied_index "
              f"{next(iter(digests.values()))['applied_index']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
