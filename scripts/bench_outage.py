#!/usr/bin/env python3
"""An outage of the whole cluster, and how the runs fired ahead of it end.

An every-2 s cron job (`fire_once`, the default) on a local cluster; once it
has been called twice, every node is SIGKILLed and left down --down-s
seconds. Then every node starts again at once, or (--owner-late-s N) the
two nodes that do not own the job's shard start first and its owner N
seconds after its shard has moved to one of them. Prints, for the
occurrences due from the kill until every node was back, how many ended in
each state and each call's lateness at the sink and attempt, with the
conditions (docs/schedules.md, "After an outage").

    .venv/bin/python scripts/bench_outage.py --down-s 20
    .venv/bin/python scripts/bench_outage.py --down-s 20 --owner-late-s 8
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import sys
import tempfile
import time

from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until
from raftsched.testing.sink import Sink

ENDED = ("succeeded", "failed", "missed", "skipped", "cancelled")


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--down-s", type=float, default=20.0)
    parser.add_argument("--owner-late-s", type=float, default=None,
                        help="start the job's shard owner this long after its shard moved")
    args = parser.parse_args()
    print(f"conditions: 3 nodes on 127.0.0.1, {os.cpu_count()} cores, python "
          f"{sys.version.split()[0]}; an every-2 s cron job (fire_once) calling the test "
          f"sink; every node SIGKILLed for {args.down_s:g} s"
          + ("" if args.owner_late_s is None else
             f"; the job's shard owner started {args.owner_late_s:g} s after its shard moved"))
    with tempfile.TemporaryDirectory(prefix="raftsched-outage-") as tmp, Sink() as sink, \
            LocalCluster(tmp, extra_env={"RAFTSCHED_LOG_LEVEL": "WARNING"}) as cluster:
        cluster.wait_ready()
        created = cluster.api("n1", "POST", "/v1/jobs", {
            "name": "every-2s", "schedule": {"cron": "*/2 * * * * *"},
            "target": {"type": "http", "url": sink.url, "timeout_s": 5}})
        assert created.status == 201, created
        job_id, shard = created.body["job_id"], created.body["shard"]
        wait_until(lambda: len(sink.by_job().get(job_id, [])) >= 2, 15, "two calls")
        shards = cluster.api("n1", "GET", "/v1/cluster/shards").body["shards"]
        owner = next(s["owner"] for s in shards if s["shard"] == shard)
        others = [n for n in cluster.ids if n != owner]
        down = time.time()
        cluster.kill_all()
        time.sleep(args.down_s)
        if args.owner_late_s is None:
            cluster.start()
            moved_to = None
        else:
            for node_id in others:
                cluster.start(node_id)

            def moved() -> str | None:
                answer = cluster.api(others[0], "GET", "/v1/cluster/shards")
                if answer.status != 200:
                    return None
                now = next(s["owner"] for s in answer.body["shards"] if s["shard"] == shard)
                return now if now != owner else None
            moved_to = wait_until(moved, 60, "the job's shard to move", 0.1)
            time.sleep(args.owner_late_s)
            cluster.start(owner)
        back = time.time()
        cluster.wait_ready(timeout_s=30)

        def outage_runs() -> list[dict] | None:
            answer = cluster.api(others[0], "GET", f"/v1/jobs/{job_id}/runs?limit=200")
            if answer.status != 200:
                return None
            runs = [r for r in answer.body["runs"] if down < _ts(r["scheduled_for"]) < back]
            return runs if runs and all(r["state"] in ENDED for r in runs) else None
        runs = wait_until(outage_runs, 60, "the outage's runs to end", 0.2)
        time.sleep(2)   # calls on their way to the sink
        calls = [c for c in sink.by_job()[job_id] if down < c.scheduled_s < back]
    states = collections.Counter(r["state"] for r in runs)
    late = sorted((round(c.lateness_s, 1), int(c.headers.get("X-Raftsched-Attempt", "1")))
                  for c in calls)
    print(f"job shard owner {owner}" + (f", its shard moved to {moved_to}" if moved_to else "")
          + f"; {len(runs)} occurrences due from the kill until every node was back "
            f"({back - down:.0f} s): {dict(states)}")
    print(f"{len(calls)} calls of them at the sink, (lateness s, attempt): {late}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
