"""A write and a consistent read sent to survivors right after the leader is killed wait for the new leader and succeed (or, past leader_wait_s, are refused no_leader with Retry-After, having waited); the write is committed once. A client and the CLI given every node's URL, the dead one first, go on through the survivors."""

from __future__ import annotations

import concurrent.futures
import json
import time

import pytest

from raftsched import limits
from raftsched.cli import main
from raftsched.client import Client
from raftsched.testing.http import ADMIN_TOKEN, wait_until

pytestmark = pytest.mark.integration

JOB = {"name": "sent-during-the-election", "schedule": {"cron": "0 0 1 1 *"},
       "target": {"type": "http", "url": "http://127.0.0.1:9/never", "timeout_s": 5}}


def timed(send):
    started = time.monotonic()
    answer = send()
    return answer, time.monotonic() - started


def assert_waited_or_succeeded(answer, took_s: float, ok: int) -> None:
    if answer.status == ok:
        return
    # Refused only after waiting the whole bound for a leader.
    assert answer.status == 503, answer
    assert answer.body["reason"] == "no_leader", answer
    assert answer.headers["Retry-After"] == "1"
    assert took_s >= limits.leader_wait_s, (answer, took_s)


def test_a_write_and_a_read_sent_as_the_leader_dies_wait_for_the_next_one(fresh_cluster,
                                                                           capsys):
    cluster = fresh_cluster
    leader = cluster.leader()
    assert leader is not None
    writer, reader = [nid for nid in cluster.ids if nid != leader]
    cluster.kill(leader)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        write = pool.submit(timed, lambda: cluster.api(writer, "POST", "/v1/jobs", JOB))
        read = pool.submit(timed, lambda: cluster.api(reader, "GET",
                                                      "/v1/jobs?limit=10&consistent=true"))
        (created, create_s), (listed, list_s) = write.result(), read.result()
    print(f"create {created.status} after {create_s:.2f} s, "
          f"consistent read {listed.status} after {list_s:.2f} s")
    assert_waited_or_succeeded(created, create_s, 201)
    assert_waited_or_succeeded(listed, list_s, 200)

    cluster.wait_ready(among=[writer, reader])
    listing = wait_until(lambda: (r := cluster.api(reader, "GET", "/v1/jobs?limit=10&consistent=true"))
                         .status == 200 and r, 15, "a consistent list of the jobs")
    named = [job for job in listing.body["jobs"] if job["name"] == JOB["name"]]
    # Proposed once when it waited, not at all when refused.
    assert len(named) == (1 if created.status == 201 else 0), named

    # A client (and the CLI) given every node, the dead one first, goes on
    # through the survivors; its create carries a key, so it is made once.
    urls = ",".join(cluster.url(nid) for nid in (leader, writer, reader))
    made = Client(urls, token=ADMIN_TOKEN).create_job(dict(JOB, name="past-the-dead-node"))
    assert made["idempotency_key"].startswith("client-")

    def listed() -> list[str]:
        capsys.readouterr()
        assert main(["jobs", "list", "--url", urls, "--token", ADMIN_TOKEN,
                     "--name-prefix", "past-the-dead", "--output", "json"]) == 0
        return [job["job_id"] for job in json.loads(capsys.readouterr().out)["jobs"]]
    assert wait_until(listed, 15, "the job, listed by the CLI") == [made["job_id"]]
