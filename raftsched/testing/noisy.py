"""The noisy-neighbour scenario, shared by tests/test_noisy_neighbour.py and
scripts/bench_noisy.py: tenant `a` has many one-offs due at one second, tenant
`b` a handful due at the same second; how late is each tenant's call?

Tenant a's jobs are created through batchCreate, b's one POST at a time, each
with a writer token of its own tenant. Lateness is measured at the sink:
arrival minus the scheduled time, for every call. The sink is a FastSink, a
process of its own that accepts every connection at once: a sink in the test's
own process (a thread per connection, sharing the GIL with the test) accepts
the connections of a burst seconds apart, and a call that came on a late
connection then reads as late as a's backlog whenever the node started it.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import time
from dataclasses import dataclass

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, unless_busy, wait_until
from raftsched.testing.fastsink import FastSink

BATCH = 1000


@dataclass
class TenantFigures:
    jobs: int
    called: int
    duplicates: int          # the same attempt called twice: a broken promise
    redeliveries: int        # a later attempt of a called run (its lease was lost)
    lateness_s: list[float]

    def pct(self, p: float) -> float:
        ordered = sorted(self.lateness_s)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    def line(self, name: str) -> str:
        ms = [v * 1000 for v in self.lateness_s]
        return (f"tenant {name}: {self.jobs} jobs, {self.called} called, {self.duplicates} "
                f"duplicates, {self.redeliveries} redeliveries; call lateness p50 {self.pct(50) * 1000:.0f} ms, p99 "
                f"{self.pct(99) * 1000:.0f} ms, max {max(ms):.0f} ms")


def writer_token(cluster: LocalCluster, tenant: str) -> str:
    answer = call("POST", cluster.url("n1") + "/v1/tokens",
                  {"tenant": tenant, "role": "writer", "name": f"noisy-{tenant}"})
    assert answer.status == 201, answer
    return answer.body["token"]


def run_noisy(cluster: LocalCluster, sink: FastSink, a_jobs: int, b_jobs: int,
              lead_s: float | None = None) -> tuple[TenantFigures, TenantFigures, float]:
    """Create the jobs, wait for every call; (a's figures, b's, create seconds)."""
    tokens = {t: writer_token(cluster, t) for t in ("a", "b")}
    urls = [cluster.url(n) for n in cluster.ids]
    lead_s = lead_s if lead_s is not None else 8 + a_jobs / 2000
    due_s = int(time.time() + lead_s) + 1
    run_at = dt.datetime.fromtimestamp(due_s, dt.timezone.utc).isoformat()
    body = {"run_at": run_at, "target": {"type": "http", "url": sink.url, "timeout_s": 30}}
    started = time.monotonic()

    def batch(i: int) -> list[str]:
        n = min(BATCH, a_jobs - i * BATCH)
        answer = unless_busy(lambda: call("POST", urls[i % len(urls)] + "/v1/jobs:batchCreate",
                                           {"jobs": [body] * n}, token=tokens["a"],
                                           timeout_s=60))
        assert answer.status == 200, answer
        assert all("job_id" in r for r in answer.body["results"]), answer.body["results"][:3]
        return [r["job_id"] for r in answer.body["results"]]

    def single(i: int) -> str:
        answer = unless_busy(lambda: call("POST", urls[i % len(urls)] + "/v1/jobs", body,
                                           token=tokens["b"]))
        assert answer.status == 201, answer
        return answer.body["job_id"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        a_ids = [j for ids in pool.map(batch, range(-(-a_jobs // BATCH))) for j in ids]
        b_ids = list(pool.map(single, range(b_jobs)))
    create_s = time.monotonic() - started
    assert time.time() < due_s, f"the creates took {create_s:.1f} s, past the due time"
    wanted = set(a_ids) | set(b_ids)
    # The sink is this run's alone: its count of distinct jobs is ours.
    wait_until(lambda: sink.stats()["jobs"] >= len(wanted), 120 + a_jobs / 100,
               "every job of both tenants to call the sink", 0.2)
    calls = sink.by_job()
    assert wanted <= set(calls), "the sink counted calls of jobs this run did not create"

    def figures(ids: list[str]) -> TenantFigures:
        def attempts(job_id: str) -> list[str]:
            return [c.attempt for c in calls.get(job_id, [])]

        return TenantFigures(jobs=len(ids), called=sum(1 for j in ids if calls.get(j)),
                             duplicates=sum(1 for j in ids
                                            if len(set(attempts(j))) < len(attempts(j))),
                             redeliveries=sum(1 for j in ids if len(set(attempts(j))) > 1),
                             lateness_s=[calls[j][0].lateness_s for j in ids if calls.get(j)])

    return figures(a_ids), figures(b_ids), create_s
