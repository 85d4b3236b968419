"""The slow-host scenario, shared by tests/test_slow_host.py and
scripts/bench_slow_host.py: tenant `a` has many one-offs due at one second,
tenant `b` a handful due a little later, all calling one host that answers each
call in `delay_s` seconds, with a timeout a few times that. A node makes at most
http_connections_per_host_max calls to that host at once; how late is each
tenant's call, and is any job called more than once (with no fault, none may
be)?

Lateness is measured at the host (a threaded Sink, whose handler threads
sleep through the delay): arrival minus the scheduled time, every call.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import call, unless_busy, wait_until
from raftsched.testing.noisy import writer_token
from raftsched.testing.sink import Sink

BATCH = 1000


@dataclass
class HostFigures:
    jobs: int
    called: int
    called_again: int               # jobs the host saw more than one call of
    attempts: dict[str, int]        # calls the host saw, by X-Raftsched-Attempt
    lateness_s: list[float]         # each job's first call

    def pct(self, p: float) -> float:
        ordered = sorted(self.lateness_s)
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]

    def line(self, name: str) -> str:
        return (f"tenant {name}: {self.jobs} jobs, {self.called} called, {self.called_again} "
                f"called more than once, calls by attempt {self.attempts}; first call "
                f"lateness p50 {self.pct(50) * 1000:.0f} ms, max {max(self.lateness_s) * 1000:.0f} ms")


def run_slow_host(cluster: LocalCluster, sink: Sink, a_jobs: int, b_jobs: int, *,
                  timeout_s: float, b_after_s: float,
                  settle_s: float) -> tuple[HostFigures, HostFigures]:
    """Create the jobs, wait for every call and then `settle_s` more (for any
    retry a timed-out attempt would bring); (a's figures, b's)."""
    tokens = {t: writer_token(cluster, t) for t in ("a", "b")}
    urls = [cluster.url(n) for n in cluster.ids]
    due_s = int(time.time() + 8 + a_jobs / 2000) + 1

    def body(at_s: float) -> dict:
        run_at = dt.datetime.fromtimestamp(at_s, dt.timezone.utc).isoformat()
        return {"run_at": run_at, "target": {"type": "http", "url": sink.url,
                                             "timeout_s": timeout_s}}

    a_ids: list[str] = []
    for i in range(0, a_jobs, BATCH):
        jobs = [body(due_s)] * min(BATCH, a_jobs - i)
        answer = unless_busy(lambda: call("POST", urls[i // BATCH % len(urls)]
                                          + "/v1/jobs:batchCreate", {"jobs": jobs},
                                          token=tokens["a"], timeout_s=60))
        assert answer.status == 200, answer
        a_ids += [r["job_id"] for r in answer.body["results"]]
    b_ids = []
    for i in range(b_jobs):
        answer = unless_busy(lambda: call("POST", urls[i % len(urls)] + "/v1/jobs",
                                          body(due_s + b_after_s), token=tokens["b"]))
        assert answer.status == 201, answer
        b_ids.append(answer.body["job_id"])
    assert time.time() < due_s, "the creates took past the due time"
    wanted = set(a_ids) | set(b_ids)
    wait_until(lambda: wanted <= set(sink.by_job()), 120 + a_jobs / 20,
               "every job of both tenants to call the host", 0.5)
    time.sleep(settle_s)
    calls = sink.by_job()

    def figures(ids: list[str]) -> HostFigures:
        attempts: dict[str, int] = {}
        for job_id in ids:
            for c in calls.get(job_id, []):
                number = c.headers.get("X-Raftsched-Attempt", "")
                attempts[number] = attempts.get(number, 0) + 1
        return HostFigures(jobs=len(ids), called=sum(1 for j in ids if calls.get(j)),
                           called_again=sum(1 for j in ids if len(calls.get(j, [])) > 1),
                           attempts=dict(sorted(attempts.items())),
                           lateness_s=[calls[j][0].lateness_s for j in ids if calls.get(j)])

    return figures(a_ids), figures(b_ids)
