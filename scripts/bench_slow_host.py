#!/usr/bin/env python3
"""Slow host: tenant a has N one-offs due at second T, tenant b has 10 due at
T + delay, all calling one host that answers each call in `delay` seconds
(timeout_s: 5 s), on a local cluster. Prints each tenant's first-call lateness
at the host, the calls it saw by attempt, and the jobs it saw called more than
once (with no fault, there must be none), with the conditions.

    .venv/bin/python scripts/bench_slow_host.py --a-jobs 3000 --delay-s 1.5
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from raftsched import limits
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.sink import Sink
from raftsched.testing.slowhost import run_slow_host


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a-jobs", type=int, default=3000)
    parser.add_argument("--b-jobs", type=int, default=10)
    parser.add_argument("--delay-s", type=float, default=1.5)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    print(f"conditions: {args.nodes} nodes on 127.0.0.1, {os.cpu_count()} cores, python "
          f"{sys.version.split()[0]}; tenant a: {args.a_jobs} one-offs due on one second, "
          f"tenant b: {args.b_jobs} due {args.delay_s:g} s later; one host answering each call "
          f"in {args.delay_s:g} s, timeout_s {args.timeout_s:g}; "
          f"http_connections_per_host_max {limits.http_connections_per_host_max} per node",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp, Sink(delay_s=args.delay_s) as sink, \
            LocalCluster(tmp, nodes=args.nodes,
                         extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
        cluster.wait_ready()
        a, b = run_slow_host(cluster, sink, args.a_jobs, args.b_jobs,
                             timeout_s=args.timeout_s, b_after_s=args.delay_s,
                             settle_s=2 * args.delay_s + args.timeout_s)
        print(a.line("a"))
        print(b.line("b"))
        cluster.ensure_same(60)
        print("digests equal on every node")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
