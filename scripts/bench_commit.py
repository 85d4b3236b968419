#!/usr/bin/env python3
"""Commit latency and throughput of the Raft adapter alone, with the node's settings.

    .venv/bin/python scripts/bench_commit.py [--sequential 300] [--pipelined 20000]

Three members of replication/raft.py's state machine in this process, on
127.0.0.1, ticking in their own threads with the timing in raftsched/limits.py
(no journal, no secret, applying nothing): first --sequential commands proposed
one after another on the leader, each after the last was applied there (p50 /
p99 commit latency); then --pipelined commands proposed at once (commits/s),
and the leader's CPU over the whole run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time

from pysyncobj import SyncObjConf

from raftsched import limits
from raftsched.replication.raft import _StateMachine
from raftsched.testing.cluster import free_ports
from raftsched.testing.http import wait_until


def _group() -> list[_StateMachine]:
    addrs = [f"127.0.0.1:{p}" for p in free_ports(3)]
    conf = dict(appendEntriesPeriod=limits.append_entries_period_s,
                autoTickPeriod=limits.auto_tick_period_s,
                raftMinTimeout=limits.election_timeout_min_s,
                raftMaxTimeout=limits.election_timeout_max_s,
                dynamicMembershipChange=False, useFork=False)
    return [_StateMachine(a, [b for b in addrs if b != a], SyncObjConf(**conf),
                          on_apply=lambda data, index: None, flush_before_commit=None,
                          on_created=lambda o: None, listen=True) for a in addrs]


def _sequential(leader: _StateMachine, n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        done = threading.Event()
        started = time.monotonic()
        leader.apply_command(b"x", callback=lambda result, error: done.set())
        if not done.wait(10):
            raise TimeoutError("a command was not committed within 10 s")
        latencies.append((time.monotonic() - started) * 1000)
    return latencies


def _pipelined(leader: _StateMachine, n: int) -> float:
    lock = threading.Lock()
    left = [n]
    all_done = threading.Event()

    def committed(result: object, error: int) -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                all_done.set()

    started = time.monotonic()
    for _ in range(n):
        leader.apply_command(b"x", callback=committed)
    if not all_done.wait(120):
        raise TimeoutError(f"{left[0]} of {n} commands not committed within 120 s")
    return n / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequential", type=int, default=300)
    parser.add_argument("--pipelined", type=int, default=20_000)
    args = parser.parse_args()
    print(f"conditions: 3 members in one process on 127.0.0.1, cores {os.cpu_count()}, python "
          f"{sys.version.split()[0]}, append_entries_period_s {limits.append_entries_period_s}, "
          f"auto_tick_period_s {limits.auto_tick_period_s}, heartbeat_period_s "
          f"{getattr(limits, 'heartbeat_period_s', '-')}", flush=True)
    members = _group()
    try:
        leader = wait_until(lambda: next((m for m in members if m._isLeader()), None), 20,
                            "a leader elected")
        _sequential(leader, 20)   # connections settled
        cpu_started = resource.getrusage(resource.RUSAGE_SELF)
        latencies = sorted(_sequential(leader, args.sequential))
        rate = _pipelined(leader, args.pipelined)
        cpu_ended = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for member in members:
            member.destroy()
    cpu_s = (cpu_ended.ru_utime - cpu_started.ru_utime) + (cpu_ended.ru_stime
                                                           - cpu_started.ru_stime)
    print(f"sequential commits: n={len(latencies)} p50={statistics.median(latencies):.1f} ms "
          f"p99={latencies[int(0.99 * (len(latencies) - 1))]:.1f} ms")
    print(f"pipelined: {args.pipelined} commands at {rate:.0f} commits/s; CPU of the three "
          f"members together {cpu_s:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
