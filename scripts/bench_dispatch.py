#!/usr/bin/env python3
"""What a node's event loop spends per call in its dispatcher, in one process.

    .venv/bin/python scripts/bench_dispatch.py [--runs 2000] [--repeat 5] [--sink]
                                               [--inflight 64]

N one-off jobs due on the same second, created and fired on one replica in
memory (raftsched/testing/replica.py) as a node's Raft thread would, every
shard owned by the node; then the node's dispatcher (runtime/dispatcher.py)
takes each run, reads what its call needs, calls it and reports its finish,
on uvloop as a node runs it. The process's CPU from the first take to the
last attempt settled, per call, is the figure (the least of --repeat, and
the median). The fires, the creates and the finishes' apply are not in it:
those are the Raft thread's (`raftsched bench cost`).

By default the target answers at once in the process (an executor that
awaits nothing else), and the reporter accepts each finish at once: the
figure is the dispatcher's own work. With --sink each call is a real HTTP
call (executors/http.py) to the fast sink (testing/fastsink.py) in a process
of its own: the dispatcher and the HTTP client together, as the node's loop
pays them. --inflight: calls at once (runs_inflight_max, 64 by default, as
the burst's bare loop makes); past http_connections_per_host_max (100) the
runs beyond wait for their host, as in a node's burst at one target. The collector is tuned as in a node (runtime/gcpolicy.py).

Prints the conditions first and the figures last.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ipaddress
import os
import statistics
import sys
import time
import types

import uvloop

from raftsched import limits
from raftsched.api.ids import JobIds
from raftsched.core import commands, jobspec, keys
from raftsched.executors.base import Outcome
from raftsched.executors.breaker import Breaker
from raftsched.executors.http import HttpExecutor
from raftsched.executors.netguard import AddressPolicy
from raftsched.runtime import gcpolicy
from raftsched.runtime.armed import ArmedRuns
from raftsched.runtime.coordinator import Coordinator
from raftsched.runtime.dispatcher import Calls, Dispatcher
from raftsched.runtime.lateness import LatenessHistogram
from raftsched.runtime.supervise import Supervisor
from raftsched.runtime.trigger import job_fire_item
from raftsched.storage.base import due_rows
from raftsched.testing.fastsink import FastSink
from raftsched.testing.replica import Replica

NODE = "n1"
SHARDS = 16
AT_MS = 1_800_000_000_000
CONNECTIONS = 64   # calls at once by default (runs_inflight_max), as the burst's bare loop makes


class _AtOnce:
    """A target that answers 200 at once."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, attempt: object, target: dict, deadline_ms: int) -> Outcome:
        self.calls += 1
        await asyncio.sleep(0)
        return Outcome(ok=True, http_status=200)


class _ToSink:
    """Every call a real HTTP call to the sink, whatever the job's URL."""

    def __init__(self, url: str) -> None:
        self.url, self.calls = url, 0
        self.http = HttpExecutor(AddressPolicy([ipaddress.ip_network("127.0.0.0/8")]))

    async def run(self, attempt: object, target: dict, deadline_ms: int) -> Outcome:
        outcome = await self.http.run(attempt, dict(target, url=self.url), deadline_ms)
        assert outcome.ok, outcome
        self.calls += 1
        return outcome


def _accepted(update: object, tenant: str = "", cost: int = 1,
              hold: bool = False) -> asyncio.Future:
    """The reporter's answer to a finish: applied."""
    future = asyncio.get_running_loop().create_future()
    future.set_result(True)
    return future


def _fired(replica: Replica, runs: int) -> None:
    """`runs` one-offs due at AT_MS, created and fired by NODE (their runs
    held, their RunQueued effects in replica.effects)."""
    run_at = dt.datetime.fromtimestamp(AT_MS / 1000, dt.timezone.utc).isoformat()
    spec = jobspec.validate_create({"run_at": run_at, "target": {
        "type": "http", "url": "http://127.0.0.1:9/hook"}})["spec"]
    ids = JobIds()
    for start in range(0, runs, limits.batch_entry_jobs_max):
        items = []
        for _ in range(start, min(runs, start + limits.batch_entry_jobs_max)):
            job_id = ids.next()
            items.append(commands.create_job_item(
                job_id=job_id, spec=spec, idempotency_key=None,
                shard=keys.shard_of(job_id, SHARDS), next_ms=AT_MS))
        replica.run(commands.create_jobs(tenant="default", at_ms=AT_MS - 5000, items=items,
                                         stored=True))
    at_ms = AT_MS + 5
    parts: dict[int, dict] = {}
    for shard in range(SHARDS):
        token = replica.store.get("shards", keys.shard_key(shard))["token"]
        for due_ms, _kind, job_id, _value in due_rows(replica.store, shard, at_ms, runs):
            item = job_fire_item(replica.store, job_id, due_ms, at_ms)[0]
            parts.setdefault(shard, {"shard": shard, "token": token, "upto_ms": at_ms,
                                     "items": [], "retries": []})["items"].append(item)
    result = replica.run(commands.fire_many(node=NODE, at_ms=at_ms, parts=list(parts.values())))
    assert result.get("fired") == runs, result


async def _per_call_us(runs: int, sink_url: str | None, inflight: int) -> float:
    limits.runs_inflight_max = inflight
    replica = Replica()
    clock = types.SimpleNamespace(ms=AT_MS - 20_000)
    monotonic = time.monotonic
    replicated = replica.replicated(node_id=NODE, now_ms=lambda: clock.ms)
    supervisor = Supervisor(f"node {NODE}", exit_hook=lambda code: None)
    lease = Coordinator(
        replicated, shard_count=SHARDS, spawn=supervisor.spawn, term=lambda: 1,
        peer_liveness=dict, clocks=types.SimpleNamespace(out_of_bound=set, draining=set),
        draining=lambda: False, monotonic=monotonic)
    executor = _AtOnce() if sink_url is None else _ToSink(sink_url)
    if isinstance(executor, _ToSink):
        await executor.http.start()
    dispatcher: Dispatcher

    def enqueue(run: dict) -> None:
        dispatcher.enqueue(run)

    armed = ArmedRuns(node_id=NODE, now_ms=lambda: clock.ms, synced=lambda: True, call=enqueue)
    dispatcher = Dispatcher(
        replicated,
        calls=Calls(http=executor, command=None,
                    breaker=Breaker(window=limits.breaker_window,
                                    failure_ratio=limits.breaker_failure_ratio,
                                    cooloff_s=limits.breaker_cooloff_s, clock=monotonic),
                    outputs=None, storage_past_mark=lambda: None,
                    lateness=LatenessHistogram(), horizon=None),
        lease=lease, armed=armed, report=_accepted, spawn=supervisor.spawn,
        quota_of=lambda tenant: {"weight": 1, "runs_concurrent_max": 1_000_000},
        cluster_applies=lambda: commands.APPLY_LEVEL, monotonic=monotonic)
    replica.run(commands.register_node(node=NODE, http="http://n1", raft="raft-n1",
                                       at_ms=clock.ms))
    replica.run(commands.assign_shards(assignments=[(s, NODE) for s in range(SHARDS)],
                                       at_ms=clock.ms))
    replica.run(commands.renew(node=NODE, at_ms=clock.ms, record=True))
    lease.extend_lease(monotonic())
    clock.ms = AT_MS + 5
    supervisor.start("dispatcher", dispatcher.run)
    await asyncio.sleep(0.2)   # its start (the runs it holds: none yet) is not measured
    replica.effects.clear()
    _fired(replica, runs)
    for effect in replica.effects:
        if type(effect).__name__ == "RunQueued" and effect.run["node"] == NODE:
            dispatcher.submit(effect.run)
    started = time.process_time()
    while executor.calls < runs or dispatcher._active:
        if any(supervisor.failures.values()):
            raise SystemExit(f"an attempt failed: {supervisor.failures}")
        await asyncio.sleep(0.001)
    cpu_s = time.process_time() - started
    await dispatcher.close()
    await supervisor.stop()
    if isinstance(executor, _ToSink):
        await executor.http.close()
    return cpu_s / runs * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--inflight", type=int, default=CONNECTIONS,
                        help=f"calls at once (runs_inflight_max; default {CONNECTIONS})")
    parser.add_argument("--sink", action="store_true",
                        help="a real HTTP call to the fast sink, in its own process")
    args = parser.parse_args(argv)
    print(f"conditions: {args.runs} one-offs held by one node, {args.inflight} calls at once "
          f"(at most {limits.http_connections_per_host_max} to one host), "
          f"{'HTTP to the fast sink in its own process' if args.sink else 'a target that answers at once in the process'}, "
          f"reporter accepting at once, cores {os.cpu_count()}, python {sys.version.split()[0]}")
    gcpolicy.tune()
    if args.sink:
        with FastSink() as sink:
            each = [uvloop.run(_per_call_us(args.runs, sink.url + "/hook", args.inflight))
                    for _ in range(args.repeat)]
    else:
        each = [uvloop.run(_per_call_us(args.runs, None, args.inflight)) for _ in range(args.repeat)]
    print(f"the node's CPU per call: least {min(each):.1f} us, median "
          f"{statistics.median(each):.1f} us (of {args.repeat})")


if __name__ == "__main__":
    main()
