"""A node with a wrong wall clock fires nothing early or late; out of bound it owns no shards."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import re
import time

import pytest

from raftsched.testing.cluster import LocalCluster, shift_clock, shiftable_cluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

BOUND_MS = 500   # --max-clock-skew-ms, the default
JOBS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with shiftable_cluster(tmp_path_factory.mktemp("skew"), log_tail=6000) as local:
        yield local


@pytest.fixture
def calm(cluster):
    """Every clock true and every node owning shards, before and after the test."""
    wait_balanced(cluster)
    yield cluster
    for nid in cluster.ids:
        shift_clock(cluster, nid, 0)
    wait_balanced(cluster)


def shards_owned(cluster: LocalCluster, nid: str) -> int:
    return cluster.api(nid, "GET", "/v1/node", timeout_s=2).body["shards_owned"]


def wait_balanced(cluster: LocalCluster) -> None:
    wait_until(lambda: all(shards_owned(cluster, nid) > 0 for nid in cluster.ids), 15,
               "every node owning shards")


def placement(cluster: LocalCluster, nid: str) -> dict[int, tuple[str, int]]:
    shards = cluster.api(nid, "GET", "/v1/cluster/shards?consistent=true").body["shards"]
    return {s["shard"]: (s["owner"], s["token"]) for s in shards}


def create_one_offs(cluster: LocalCluster, sink, first_s: float, spread_s: float,
                    via: list[str] | None = None) -> dict:
    """JOBS one-offs due from first_s to first_s + spread_s from now, created
    round robin `via` these nodes (default all); job id -> shard."""
    start = time.time()
    via = via or cluster.ids

    def create(i: int) -> tuple[str, int]:
        when = dt.datetime.fromtimestamp(start + first_s + spread_s * i / JOBS, dt.timezone.utc)
        body = {"name": f"skew-{i}", "run_at": when.isoformat(timespec="milliseconds"),
                "target": {"type": "http", "url": sink.url, "timeout_s": 5}}
        answer = cluster.api(via[i % len(via)], "POST", "/v1/jobs", body)
        assert answer.status == 201, answer
        return answer.body["job_id"], answer.body["shard"]

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        jobs = dict(pool.map(create, range(JOBS)))
    assert time.time() < start + first_s, "the creates took longer than the lead"
    return jobs


def wait_all_called(sink, jobs: dict) -> dict:
    wait_until(lambda: all(j in sink.by_job() for j in jobs), 15, "every one-off called")
    calls = sink.by_job()
    for job_id in jobs:
        assert len(calls[job_id]) == 1, (job_id, calls[job_id])
    return {job_id: calls[job_id][0].lateness_s for job_id in jobs}


def log_size(cluster: LocalCluster, nid: str) -> int:
    return (cluster.base / f"{nid}.log").stat().st_size


def log_since(cluster: LocalCluster, nid: str, offset: int) -> str:
    with open(cluster.base / f"{nid}.log", "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


def offsets_seen(cluster: LocalCluster, nid: str) -> dict[str, int | None]:
    nodes = cluster.api(nid, "GET", "/v1/cluster", timeout_s=2).body["nodes"]
    return {other: rec["clock_offset_ms"] for other, rec in nodes.items()}


def check_skewed_node(cluster: LocalCluster, sink, victim: str, shift_ms: int) -> None:
    """Shift `victim`'s clock out of bound while one-offs are due soon, some in
    its shards: it loses its shards with new tokens, every one-off is called
    once, none before its time, all within 3 s of it; back in bound it gets
    shards again."""
    before = placement(cluster, victim)
    logged = log_size(cluster, victim)
    jobs = create_one_offs(cluster, sink, first_s=2.5, spread_s=1.5)
    victims_jobs = [j for j, shard in jobs.items() if before[shard][0] == victim]
    assert victims_jobs, "no one-off fell in the victim's shards"
    shifted_at = time.monotonic()
    shift_clock(cluster, victim, shift_ms)
    wait_until(lambda: shards_owned(cluster, victim) == 0, 5, f"{victim} owning no shards")
    lost_after_s = time.monotonic() - shifted_at

    after = placement(cluster, victim)
    for shard, (owner, token) in before.items():
        if owner == victim:
            assert after[shard][0] != victim
            assert after[shard][1] > token, (shard, before[shard], after[shard])
    # Every node, the victim included, measures the shift within 100 ms. The
    # shards move on the leader's judgement, which can come a probe round
    # before the victim's own view of itself, so each view is polled.
    measured: dict[str, int | None] = {}

    def measured_by_all() -> bool:
        measured.update({observer: offsets_seen(cluster, observer)[victim]
                         for observer in cluster.ids})
        return all(s is not None and abs(s - shift_ms) <= 100 for s in measured.values())
    wait_until(measured_by_all, 5, f"every node measuring {victim}'s shift of {shift_ms} ms")
    lateness = wait_all_called(sink, jobs)
    early = {j: late for j, late in lateness.items() if late < 0}
    assert not early, early
    assert max(lateness.values()) < 3.0, sorted(lateness.values())[-5:]
    # The victim says so itself once its own verdict turns, which may come a
    # probe round after its measurement (its error bound must shrink first).
    said_it = re.compile(r"ERROR raftsched\.clock: this node's wall clock is (49\d\d|50\d\d) "
                         r"ms " + ("ahead of" if shift_ms > 0 else "behind"))
    try:
        wait_until(lambda: said_it.search(log_since(cluster, victim, logged)), 20,
                   f"{victim} logging its own clock out of bound")
    except TimeoutError:
        said = [line for line in log_since(cluster, victim, logged).splitlines()
                if "raftsched.clock" in line]
        raise AssertionError(f"{victim} did not log its clock {shift_ms:+d} ms off; what it "
                             f"logged of clocks: {said[-10:]}") from None

    back_at = time.monotonic()
    shift_clock(cluster, victim, 0)
    wait_until(lambda: shards_owned(cluster, victim) > 0, 5, f"{victim} owning shards again")
    print(f"{victim} shifted {shift_ms:+d} ms: its offset as measured by each node {measured}, "
          f"shards lost after {lost_after_s:.2f} s, regained {time.monotonic() - back_at:.2f} s "
          f"after the fix; lateness of its {len(victims_jobs)} one-offs "
          f"{min(lateness[j] for j in victims_jobs):.3f}-"
          f"{max(lateness[j] for j in victims_jobs):.3f} s, of all "
          f"{min(lateness.values()):.3f}-{max(lateness.values()):.3f} s")


def follower(cluster: LocalCluster) -> str:
    leader = cluster.wait_ready()
    return next(nid for nid in cluster.ids if nid != leader)


def test_a_follower_ahead_by_5_s_loses_its_shards_and_fires_nothing_early(calm, sink):
    check_skewed_node(calm, sink, follower(calm), +5000)


def test_a_follower_behind_by_5_s_loses_its_shards_and_fires_nothing_late(calm, sink):
    check_skewed_node(calm, sink, follower(calm), -5000)


def test_a_leader_behind_by_5_s_loses_its_shards_and_fires_nothing_late(calm, sink):
    leader = calm.wait_ready()
    check_skewed_node(calm, sink, leader, -5000)
    assert calm.wait_ready() == leader   # judged by the majority, not voted out


def test_skew_within_the_bound_moves_nothing_and_fires_nothing_early(calm, sink):
    victim = follower(calm)
    before = placement(calm, victim)
    logs_at = {nid: log_size(calm, nid) for nid in calm.ids}
    shift_clock(calm, victim, BOUND_MS * 2 // 5)
    wait_until(lambda: abs((offsets_seen(calm, victim)[victim] or 0) - BOUND_MS * 2 // 5) <= 50,
               5, f"{victim} measuring its own shift")
    jobs = create_one_offs(calm, sink, first_s=1.5, spread_s=1.0)
    assert any(before[shard][0] == victim for shard in jobs.values())
    lateness = wait_all_called(sink, jobs)
    assert min(lateness.values()) >= 0.0, sorted(lateness.values())[:5]
    assert max(lateness.values()) < 1.0, sorted(lateness.values())[-5:]
    assert placement(calm, victim) == before   # no owner and no token changed
    # Nor was it judged out of bound, by itself or by another node. (Its log
    # may say that another node came back within the bound after an earlier
    # test: with a loaded machine's measurement error, that verdict can lag
    # the clock's reset.)
    assert "this node's wall clock is" not in log_since(calm, victim, logs_at[victim])
    for other in calm.ids:
        assert f"node {victim}'s wall clock is" not in log_since(calm, other, logs_at[other])


def test_a_cluster_restarted_with_a_clock_5_s_ahead_fires_nothing_early(calm, sink):
    # The node keeps its shards through the restart (the placement is
    # replicated), so until it has measured its peers' clocks it must not fire
    # by its own.
    victim = follower(calm)
    jobs = create_one_offs(calm, sink, first_s=5.0, spread_s=1.0)
    before = placement(calm, victim)
    assert any(before[shard][0] == victim for shard in jobs.values())
    calm.kill_all()
    shift_clock(calm, victim, +5000)
    calm.start()
    lateness = wait_all_called(sink, jobs)
    assert min(lateness.values()) >= 0.0, sorted(lateness.values())[:5]
    assert max(lateness.values()) < 3.0, sorted(lateness.values())[-5:]
    wait_until(lambda: shards_owned(calm, victim) == 0 and calm.api(
        victim, "GET", "/v1/node").body["clock"]["in_bound"] is False, 10,
        f"{victim} judged out of bound after the restart")
