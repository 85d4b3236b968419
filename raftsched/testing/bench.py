"""The benchmark of a local cluster (`scripts/bench.py`, `raftsched bench`).

Scenario `creates C`: creates a second, single POSTs from C keep-alive
clients, then batchCreate of 1000 jobs.

Scenario `footprint N`: bytes of state per pending one-off and per one-off
fired and finished, and each node's private and mapped memory at N pending.

Scenario `burst N`: N one-off jobs, created with batchCreate, all due on the
same second, HTTP targets at one sink. It prints its conditions and:

- trigger lateness of every run, from each node's histogram of its own fires
  (applied on the node that proposed the fire, by that node's clock, minus
  the scheduled time: runtime/lateness.py), as the difference of the
  histograms before and after;
- call lateness of every call, at the sink (arrival minus scheduled time);
- runs seen, duplicates (an attempt called twice) and redeliveries (a later
  attempt of a run whose lease was lost);
- in the same run, the reference: a bare aiohttp client loop calling the same
  sink N times with as many connections as the dispatchers use, for the rate
  this machine can call targets at all.

The figures are written as JSON too (`--json`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import os
import sys
import tempfile
import time

import aiohttp

from raftsched import limits
from raftsched.runtime.lateness import difference, merged_percentile
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import auth_headers, call, wait_until
from raftsched.testing.sink import Sink

BATCH = 1000
REFERENCE_CONNECTIONS = 64


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def _histograms(cluster: LocalCluster) -> list[dict]:
    return [call("GET", cluster.url(n) + "/v1/node").body["trigger_lateness"]
            for n in cluster.ids]


def _create(cluster: LocalCluster, n: int, run_at: str, url: str) -> list[str]:
    body = {"run_at": run_at, "target": {"type": "http", "url": url, "timeout_s": 30}}
    urls = [cluster.url(nid) for nid in cluster.ids]

    def batch(i: int) -> list[str]:
        size = min(BATCH, n - i * BATCH)
        answer = call("POST", urls[i % len(urls)] + "/v1/jobs:batchCreate",
                      {"jobs": [body] * size}, timeout_s=120)
        assert answer.status == 200, answer
        return [r["job_id"] for r in answer.body["results"]]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return [j for ids in pool.map(batch, range(-(-n // BATCH))) for j in ids]


async def _reference(url: str, n: int) -> float:
    """Calls a second of a bare aiohttp client loop makes against `url`."""
    connector = aiohttp.TCPConnector(limit=REFERENCE_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                queue.pop()
                async with session.post(url, data=b"{}") as response:
                    await response.read()

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(REFERENCE_CONNECTIONS)))
        return n / (time.monotonic() - started)


def burst(n: int, nodes: int = 3, lead_s: float | None = None) -> dict:
    conditions = {"scenario": "burst", "jobs": n, "nodes": nodes, "cores": os.cpu_count(),
                  "python": sys.version.split()[0],
                  "sink": "threaded HTTP server on 127.0.0.1, answers at once",
                  "shared": "client, sink and nodes share the machine"}
    print("conditions: " + ", ".join(f"{k} {v}" for k, v in conditions.items()), flush=True)
    with tempfile.TemporaryDirectory() as tmp, Sink() as sink, \
            LocalCluster(tmp, nodes=nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) \
            as cluster:
        cluster.wait_ready()
        before = _histograms(cluster)
        due_s = int(time.time() + (lead_s if lead_s is not None else 8 + n / 2000)) + 1
        run_at = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
        started = time.monotonic()
        ids = _create(cluster, n, run_at, sink.url)
        create_s = time.monotonic() - started
        late_start = time.time() > due_s
        wanted = set(ids)
        wait_until(lambda: wanted <= set(sink.by_job()), 120 + n / 100,
                   "every job to call the sink", 0.2)

        def all_counted() -> list[dict] | None:
            after = _histograms(cluster)
            diffs = [difference(a, b) for a, b in zip(after, before)]
            return diffs if sum(d["count"] for d in diffs) >= n else None

        diffs = wait_until(all_counted, 30, "every fire counted in the histograms")
        calls = sink.by_job()
        firsts = [calls[j][0] for j in ids]
        attempts = {j: [c.headers.get("X-Raftsched-Attempt") for c in calls[j]] for j in ids}
        call_late = [c.lateness_s * 1000 for c in firsts]
        arrivals = sorted(c.received_s for c in firsts)
        call_rate = n / max(1e-3, arrivals[-1] - arrivals[0])
        sink_url = sink.url
        cluster.ensure_same(60)
    reference_rate = asyncio.run(_reference_with_sink(n))
    trigger_max = max(d["max_ms"] for d in diffs)
    figures = {
        **conditions, "create_s": round(create_s, 2), "creates_per_s": round(n / create_s),
        "creates_finished_after_due": late_start,
        # A percentile is its bucket's upper bound, and no more than the maximum.
        "trigger_lateness_ms": {"count": sum(d["count"] for d in diffs),
                                "p50": min(merged_percentile(diffs, 50), trigger_max),
                                "p99": min(merged_percentile(diffs, 99), trigger_max),
                                "max": trigger_max},
        "call_lateness_ms": {"count": len(call_late), "p50": round(_pct(call_late, 50)),
                             "p99": round(_pct(call_late, 99)), "max": round(max(call_late))},
        "runs_seen": len(firsts),
        "duplicates": sum(1 for a in attempts.values() if len(set(a)) < len(a)),
        "redeliveries": sum(1 for a in attempts.values() if len(set(a)) > 1),
        "call_rate_per_s": round(call_rate), "reference_aiohttp_calls_per_s": round(reference_rate),
        "call_rate_vs_reference": round(call_rate / reference_rate, 2), "sink": sink_url,
    }
    return figures


async def _reference_with_sink(n: int) -> float:
    with Sink() as sink:
        return await _reference(sink.url, n)


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


def _used(cluster: LocalCluster) -> list[int]:
    return [call("GET", cluster.url(n) + "/v1/node").body["storage"]["used_bytes"]
            for n in cluster.ids]


def _settled_used(cluster: LocalCluster, baseline: list[int]) -> list[int]:
    """Each node's pages in use once they have grown past `baseline` and two
    readings a storage check apart agree (a node measures every
    storage_check_period_s, so a reading may predate the last writes)."""
    readings: list[list[int]] = []

    def settled() -> list[int] | None:
        readings.append(_used(cluster))
        last = readings[-2:]
        grown = all(u > b for u, b in zip(readings[-1], baseline))
        return readings[-1] if grown and len(last) == 2 and last[0] == last[1] else None

    return wait_until(settled, 60, "the nodes' storage measured after the writes",
                      limits.storage_check_period_s * 1.5)


def footprint(n: int, runs: int, nodes: int = 3) -> dict:
    """Bytes of state per pending one-off (n of them, due in a day), and per
    one-off that fired and finished (`runs` of them, due in seconds: the job
    and its run), from LMDB's pages in use on each node; and each node's
    private and mapped memory with the n pending."""
    conditions = {"scenario": "footprint", "pending_jobs": n, "finished_runs": runs,
                  "nodes": nodes, "cores": os.cpu_count(), "python": sys.version.split()[0]}
    print("conditions: " + ", ".join(f"{k} {v}" for k, v in conditions.items()), flush=True)
    with tempfile.TemporaryDirectory() as tmp, Sink() as sink, \
            LocalCluster(tmp, nodes=nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) \
            as cluster:
        cluster.wait_ready()
        cluster.ensure_same(60)
        empty = _used(cluster)
        tomorrow = dt.datetime.fromtimestamp(time.time() + 86_400, dt.timezone.utc).isoformat()
        _create(cluster, n, tomorrow, sink.url)
        cluster.ensure_same(120)
        pending = _settled_used(cluster, empty)
        memory = {nid: _rss(cluster.procs[nid].pid) for nid in cluster.ids}
        due_s = int(time.time() + 5 + runs / 1000) + 1
        soon = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
        ids = set(_create(cluster, runs, soon, sink.url))
        wait_until(lambda: ids <= set(sink.by_job()), 120 + runs / 100, "every run called", 0.2)

        def succeeded(job_id: str) -> bool:
            answer = call("GET", cluster.url("n1") + f"/v1/jobs/{job_id}/runs?consistent=true")
            runs = answer.body.get("runs") if isinstance(answer.body, dict) else None
            return bool(runs) and runs[0]["state"] == "succeeded"   # else: not yet

        def all_finished() -> bool:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                return all(pool.map(succeeded, ids))

        wait_until(all_finished, 120, "every run's finish applied", 0.5)
        cluster.ensure_same(120)
        done = _settled_used(cluster, pending)
    per_pending = [(p - e) / n for p, e in zip(pending, empty)]
    per_run = [(d - p) / runs for d, p in zip(done, pending)]
    return {**conditions,
            "bytes_per_pending_job": round(max(per_pending)),
            "bytes_per_finished_one_off_job_and_run": round(max(per_run)),
            "memory_at_pending_bytes": memory}


async def _post_loop(url: str, body: bytes, clients: int, seconds: float) -> tuple[int, int]:
    """(answers 2xx, other answers) of `clients` keep-alive clients posting
    `body` to `url` for `seconds`."""
    headers = {"Content-Type": "application/json", **auth_headers()}
    ok = failed = 0
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def client() -> None:
            nonlocal ok, failed
            while time.monotonic() < stop_at:
                async with session.post(url, data=body) as response:
                    await response.read()
                    if response.status < 300:
                        ok += 1
                    else:
                        failed += 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok, failed


def creates(clients: int, seconds: float, nodes: int = 3) -> dict:
    """Creates a second: single POSTs from `clients` keep-alive clients spread
    over the nodes, then batchCreate of 1000 jobs from 4 clients."""
    conditions = {"scenario": "creates", "clients": clients, "seconds": seconds,
                  "nodes": nodes, "cores": os.cpu_count(), "python": sys.version.split()[0]}
    print("conditions: " + ", ".join(f"{k} {v}" for k, v in conditions.items()), flush=True)
    run_at = dt.datetime.fromtimestamp(time.time() + 86_400, dt.timezone.utc).isoformat()
    one = {"run_at": run_at, "target": {"type": "http", "url": "http://127.0.0.1:9/"}}
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(tmp, nodes=nodes, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) \
            as cluster:
        cluster.wait_ready()

        async def both() -> tuple:
            single = await asyncio.gather(*(
                _post_loop(cluster.url(nid) + "/v1/jobs", json.dumps(one).encode(),
                           max(1, clients // nodes), seconds) for nid in cluster.ids))
            batch_body = json.dumps({"jobs": [one] * BATCH}).encode()
            batched = await asyncio.gather(*(
                _post_loop(cluster.url(nid) + "/v1/jobs:batchCreate", batch_body, 2, seconds)
                for nid in cluster.ids))
            return single, batched

        single, batched = asyncio.run(both())
        cluster.ensure_same(120)
    single_ok, single_failed = sum(s[0] for s in single), sum(s[1] for s in single)
    batch_ok = sum(b[0] for b in batched)
    return {**conditions, "single_posts_per_s": round(single_ok / seconds),
            "single_refused": single_failed,
            "batch_jobs_per_s": round(batch_ok * BATCH / seconds),
            "batch_requests_refused": sum(b[1] for b in batched)}


def render(figures: dict) -> str:
    if figures["scenario"] == "creates":
        return (f"single POSTs: {figures['single_posts_per_s']}/s with {figures['clients']} "
                f"keep-alive clients ({figures['single_refused']} not 2xx); batchCreate of "
                f"{BATCH}: {figures['batch_jobs_per_s']} jobs/s with 6 clients "
                f"({figures['batch_requests_refused']} requests not 2xx)")
    if figures["scenario"] == "footprint":
        mem = figures["memory_at_pending_bytes"]
        return "\n".join([
            f"state per pending one-off: {figures['bytes_per_pending_job']} B (LMDB pages in "
            f"use, the largest of the nodes)",
            f"state per one-off fired and finished (its job and its run): "
            f"{figures['bytes_per_finished_one_off_job_and_run']} B",
            "memory at {:,} pending: ".format(figures["pending_jobs"]) + "; ".join(
                f"{nid} RssAnon {m['RssAnon'] / 2**20:.0f} MB, RssFile {m['RssFile'] / 2**20:.0f} MB"
                for nid, m in mem.items())])
    t, c = figures["trigger_lateness_ms"], figures["call_lateness_ms"]
    return "\n".join([
        f"creates: {figures['jobs']} in {figures['create_s']} s "
        f"({figures['creates_per_s']}/s, batchCreate of {BATCH})"
        + ("; WARNING: finished after the due time" if figures["creates_finished_after_due"]
           else ""),
        f"trigger lateness (every run, histogram bucket bounds): n={t['count']} p50<={t['p50']:g} ms "
        f"p99<={t['p99']:g} ms max={t['max']} ms",
        f"call lateness (every call, at the sink): n={c['count']} p50={c['p50']} ms "
        f"p99={c['p99']} ms max={c['max']} ms",
        f"runs seen {figures['runs_seen']}, duplicates {figures['duplicates']}, "
        f"redeliveries {figures['redeliveries']}",
        f"call rate {figures['call_rate_per_s']}/s; bare aiohttp loop against the same kind of "
        f"sink: {figures['reference_aiohttp_calls_per_s']}/s "
        f"(ratio {figures['call_rate_vs_reference']})",
    ])


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="raftsched bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=("burst", "footprint", "creates"))
    parser.add_argument("n", type=int,
                        help="jobs (footprint: pending one-offs; creates: clients)")
    parser.add_argument("--runs", type=int, default=2000,
                        help="footprint: one-offs fired and finished (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="creates: seconds each part runs (default %(default)s)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.scenario == "footprint":
        figures = footprint(args.n, args.runs, args.nodes)
    elif args.scenario == "creates":
        figures = creates(args.n, args.seconds, args.nodes)
    else:
        figures = burst(args.n, args.nodes)
    print(render(figures), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0
