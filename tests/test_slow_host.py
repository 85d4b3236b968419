"""A host that answers slowly, called by a burst of one tenant's one-offs and a
few of another's: each job is called once (no attempt times out waiting for a
connection behind the others, to be called again), and the other tenant's runs
are called ahead of the burst's backlog.

The figures at a larger scale are a benchmark, scripts/bench_slow_host.py, in
docs/benchmarks.md."""

import pytest

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.sink import Sink
from raftsched.testing.slowhost import run_slow_host

pytestmark = pytest.mark.integration

A_JOBS = 1200
B_JOBS = 6
DELAY_S = 1.0


def test_a_slow_hosts_burst_calls_each_job_once_and_the_other_tenant_first(tmp_path):
    with Sink(delay_s=DELAY_S) as sink, \
            LocalCluster(tmp_path, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
        cluster.wait_ready()
        # Each node takes about 400 of a's runs at once (its tenant cap is 500)
        # and calls 100 at a time: the last wait about 3 s, the timeout.
        a, b = run_slow_host(cluster, sink, A_JOBS, B_JOBS, timeout_s=3 * DELAY_S,
                             b_after_s=DELAY_S, settle_s=4 * DELAY_S)
        assert (a.called, b.called) == (A_JOBS, B_JOBS)
        assert a.called_again == b.called_again == 0, (a.line("a"), b.line("b"))
        assert set(a.attempts) == set(b.attempts) == {"1"}, (a.line("a"), b.line("b"))
        # a's backlog drains at the host's pace; b's runs wait about one call.
        assert a.pct(99) - a.pct(1) > 2 * DELAY_S, a.line("a")
        assert max(b.lateness_s) < a.pct(50), (b.line("b"), a.line("a"))
        cluster.ensure_same(60)
