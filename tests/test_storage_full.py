"""A cluster past its storage mark answers 507 naming max_data_bytes, keeps firing existing
jobs and stays up, and takes creates again once deletes and a purge have freed space."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from raftsched import limits
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

# Small enough to fill in seconds, large enough that its 10% headroom holds
# what a second of sequential creates adds before the next storage check.
MAX_DATA_BYTES = 6 * 1024 ** 2
# About 3.5 KB of metadata (under metadata_bytes_max): about a thousand jobs fill the map.
PAD = "x" * 3500
FILL_JOBS_MAX = 5000


@pytest.fixture
def small_cluster(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", node_args=[
        "--max-data-bytes", str(MAX_DATA_BYTES), "--finished-job-retention-s", "1",
        "--idempotency-ttl-s", "1"])
    with cluster:
        cluster.wait_ready()
        yield cluster
        for nid in cluster.ids:
            print(f"----- {nid} log (tail) -----")
            print(cluster.logs(nid))


def filler(i: int) -> dict:
    """A job that never fires during the test (1 January only) and holds some bytes."""
    return {"name": f"filler-{i}", "schedule": {"cron": "0 0 1 1 *"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/never"},
            "metadata": {"pad": PAD}}


def fill_until_refused(cluster: LocalCluster) -> tuple[list[str], object]:
    ids: list[str] = []
    for i in range(FILL_JOBS_MAX):
        answer = cluster.api(cluster.ids[i % 3], "POST", "/v1/jobs", filler(i))
        if answer.status == 507:
            return ids, answer
        assert answer.status == 201, answer
        ids.append(answer.body["job_id"])
    raise AssertionError(f"{FILL_JOBS_MAX} creates and no 507")


def test_full_storage_refuses_creates_keeps_firing_and_recovers(small_cluster, sink):
    cluster = small_cluster
    ticking = cluster.api("n1", "POST", "/v1/jobs", {
        "name": "ticking", "schedule": {"every": "1s"}, "history": {"max_runs": 3},
        "target": {"type": "http", "url": sink.url}})
    assert ticking.status == 201, ticking
    job_id = ticking.body["job_id"]

    ids, refused = fill_until_refused(cluster)
    assert refused.body["type"] == "/problems/insufficient-storage", refused
    assert refused.body["status"] == 507
    assert refused.body["limit"] == "max_data_bytes"
    assert "max_data_bytes" in refused.body["detail"]
    storage = [cluster.api(nid, "GET", "/v1/node").body["storage"] for nid in cluster.ids]
    assert any(s["full"] == "max_data_bytes" for s in storage), storage
    assert max(s["used_bytes"] for s in storage) \
        >= limits.data_bytes_high_water_ratio * MAX_DATA_BYTES
    # Every node refuses within a storage check or two: a node under its mark
    # hears from the peer past it.
    def refused_everywhere() -> bool:
        answers = [cluster.api(nid, "POST", "/v1/jobs", filler(-1)) for nid in cluster.ids]
        ids.extend(a.body["job_id"] for a in answers if a.status == 201)
        return all(a.status == 507 for a in answers)

    wait_until(refused_everywhere, 4 * limits.storage_check_period_s, "a 507 from every node",
               0.2)

    calls_at_full = len(sink.by_job().get(job_id, []))
    wait_until(lambda: len(sink.by_job().get(job_id, [])) >= calls_at_full + 3, 15,
               "three more calls of the existing job while storage is full")
    assert cluster.alive() == cluster.ids

    def delete(i: int) -> int:
        return cluster.api(cluster.ids[i % 3], "DELETE", f"/v1/jobs/{ids[i]}").status

    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(delete, range(len(ids)))) == {204}

    def created_again() -> bool:
        return cluster.api("n3", "POST", "/v1/jobs", filler(-2)).status == 201

    # Deletes alone free little (a deleted job is kept for the retention);
    # the purge of the deleted jobs is what brings the state under its mark.
    wait_until(created_again, 60, "a create accepted after the deletes and a purge", 0.5)
    purged = sum(cluster.api(nid, "GET", "/v1/node").body["purged"]["jobs_total"]
                 for nid in cluster.ids)
    assert purged > 0
    wait_until(lambda: cluster.api("n1", "GET", f"/v1/jobs/{ids[-1]}/runs").status == 404, 30,
               "the last deleted job removed")
    assert cluster.alive() == cluster.ids
    cluster.ensure_same()
