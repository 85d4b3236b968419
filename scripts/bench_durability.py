#!/usr/bin/env python3
"""Durability cost: creates/s with `--fsync periodic` (the default) and with
`--fsync always`, measured one after the other in one run on fresh clusters.

Each client is a keep-alive HTTP connection to one node (clients spread over
the nodes) sending single POST /v1/jobs one after another for the duration.
Prints the conditions, then per mode: creates/s, latency percentiles, errors,
and the journal flushes per second on each node.

    .venv/bin/python scripts/bench_durability.py --clients 32 --duration-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

import aiohttp

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import auth_headers

BODY = {"schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def client(url: str, stop_at: float, latencies: list[float], errors: list[int]) -> None:
    connector = aiohttp.TCPConnector(limit=1, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     headers=auth_headers()) as session:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            try:
                async with session.post(url + "/v1/jobs", json=BODY) as response:
                    await response.read()
                    ok = response.status == 201
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            if ok:
                latencies.append(time.monotonic() - started)
            else:
                errors.append(1)


async def load(urls: list[str], clients: int, duration_s: float) -> tuple[list[float], int]:
    latencies: list[float] = []
    errors: list[int] = []
    stop_at = time.monotonic() + duration_s
    await asyncio.gather(*(client(urls[i % len(urls)], stop_at, latencies, errors)
                           for i in range(clients)))
    return latencies, len(errors)


def flushes(cluster: LocalCluster) -> dict[str, int]:
    return {nid: cluster.api(nid, "GET", "/v1/node").body["journal_flushes_total"]
            for nid in cluster.ids}


def measure(mode: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(tmp, nodes=args.nodes, node_args=["--fsync", mode],
                         extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
        leader = cluster.wait_ready()
        urls = [cluster.url(nid) for nid in cluster.ids]
        asyncio.run(load(urls, args.clients, args.warmup_s))
        before = flushes(cluster)
        started = time.monotonic()
        latencies, errors = asyncio.run(load(urls, args.clients, args.duration_s))
        elapsed = time.monotonic() - started
        after = flushes(cluster)
        return {"mode": mode, "creates": len(latencies), "per_s": len(latencies) / elapsed,
                "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000,
                "errors": errors, "leader": leader,
                "flushes_per_s": {nid: (after[nid] - before[nid]) / elapsed for nid in after}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    args = parser.parse_args()
    print(f"conditions: {args.nodes} nodes on 127.0.0.1, {os.cpu_count()} cores, "
          f"{args.clients} keep-alive clients sending single POST /v1/jobs, "
          f"{args.duration_s:g} s per mode after {args.warmup_s:g} s of warm-up, "
          f"python {sys.version.split()[0]}; clients and nodes share the machine", flush=True)
    results = [measure(mode, args) for mode in ("periodic", "always")]
    for r in results:
        rates = ", ".join(f"{nid}{'*' if nid == r['leader'] else ''} {rate:.0f}/s"
                          for nid, rate in r["flushes_per_s"].items())
        print(f"--fsync {r['mode']:<8} {r['per_s']:7.0f} creates/s  p50 {r['p50_ms']:6.1f} ms  "
              f"p99 {r['p99_ms']:6.1f} ms  errors {r['errors']}  journal flushes: {rates}")
    base, strict = results
    print(f"--fsync always keeps {strict['per_s'] / base['per_s']:.0%} of the default's "
          "create rate (* marks the leader)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
