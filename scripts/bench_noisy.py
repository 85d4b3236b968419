#!/usr/bin/env python3
"""Noisy neighbour: tenant a has N one-offs due at second T, tenant b has 20 due
at T, on a local cluster. Prints both tenants' call lateness (arrival at the
sink minus scheduled time, every call) with the conditions.

    .venv/bin/python scripts/bench_noisy.py --a-jobs 20000 --b-jobs 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.noisy import run_noisy
from raftsched.testing.fastsink import FastSink


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a-jobs", type=int, default=20_000)
    parser.add_argument("--b-jobs", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    print(f"conditions: {args.nodes} nodes on 127.0.0.1, {os.cpu_count()} cores, python "
          f"{sys.version.split()[0]}; tenant a: {args.a_jobs} one-offs (batchCreate), tenant "
          f"b: {args.b_jobs} one-offs (single POSTs), all due on the same second, HTTP "
          f"target; equal weights; the sink (a process of its own), clients and nodes share "
          f"the machine", flush=True)
    with tempfile.TemporaryDirectory() as tmp, FastSink() as sink, \
            LocalCluster(tmp, nodes=args.nodes,
                         extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
        cluster.wait_ready()
        a, b, create_s = run_noisy(cluster, sink, args.a_jobs, args.b_jobs)
        print(f"creates: {a.jobs + b.jobs} in {create_s:.1f} s")
        print(a.line("a"))
        print(b.line("b"))
        goal = "met" if b.pct(99) <= 1.0 else "NOT met"
        print(f"goal (b's call lateness p99 <= 1 s while a's backlog drains): {goal}")
        cluster.ensure_same(60)
        print("digests equal on every node")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"nodes": args.nodes, "cores": os.cpu_count(),
                       "a": {"jobs": a.jobs, "called": a.called, "duplicates": a.duplicates,
                             "p50_s": a.pct(50), "p99_s": a.pct(99), "max_s": max(a.lateness_s)},
                       "b": {"jobs": b.jobs, "called": b.called, "duplicates": b.duplicates,
                             "p50_s": b.pct(50), "p99_s": b.pct(99),
                             "max_s": max(b.lateness_s)}}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
