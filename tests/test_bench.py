"""Every `raftsched bench` scenario runs end to end and its figures add up: a burst counts
every run once and sets its references beside it, footprint measures each size, and a wiped
node rejoins from a snapshot; the per-run cost counts every phase."""

import json
import os

import pytest

from raftsched.cli import main
from raftsched.testing import bench
from raftsched.testing.apscheduler_reference import measure_in_subprocess
from raftsched.testing.fastsink import FastSink


@pytest.mark.integration
def test_a_small_burst_is_measured_whole(tmp_path, capsys):
    out = tmp_path / "burst.json"
    assert main(["bench", "burst", "300", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["jobs"] == figures["runs_seen"] == 300
    assert figures["trigger_lateness_ms"]["count"] == 300
    assert figures["call_lateness_ms"]["count"] == 300
    assert figures["duplicates"] == 0
    assert 0 <= figures["trigger_lateness_ms"]["p50"] <= figures["trigger_lateness_ms"]["p99"] \
        <= figures["trigger_lateness_ms"]["max"]
    assert figures["reference_aiohttp_calls_per_s"] > 0
    # The node CPU of the creates, and of the wait until the due second (the
    # arming the creates did not see), sum to that of both.
    cost = figures["cost"]
    assert abs(cost["create"]["nodes_cpu_us_per_run"] + cost["arm_and_wait"]["nodes_cpu_us_per_run"]
               - cost["create_and_arm"]["nodes_cpu_us_per_run"]) <= 1, cost
    assert cost["create"]["nodes_cpu_us_per_run"] > 0, cost
    assert figures["apscheduler_reference"]["called"] == 300
    post = figures["apscheduler_post_reference"]
    assert post["posted"] == post["runs_seen"] == post["call_lateness_ms"]["count"] == 300
    assert post["trigger_lateness_ms"]["count"] == 300
    printed = capsys.readouterr().out
    assert "trigger lateness (every run" in printed
    assert "with 64 connections" in printed
    assert "APScheduler reference, no network (APScheduler 3." in printed
    assert "APScheduler, POST to a sink" in printed   # the side-by-side table


@pytest.mark.integration
def test_footprint_reports_bytes_per_job_and_memory_at_each_size(tmp_path, capsys):
    out = tmp_path / "footprint.json"
    assert main(["bench", "footprint", "1000,2000", "--runs", "200", "--recurring-s", "4",
                 "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert [row["pending_jobs"] for row in figures["by_size"]] == [1000, 2000]
    # A job cannot take less than its id and spec, nor a run less than its record.
    for row in figures["by_size"]:
        assert 100 < row["bytes_per_pending_job"] < 100_000
        assert set(row["memory_bytes"]) == {"n1", "n2", "n3"}
        assert all(m["RssAnon"] > 0 and m["RssFile"] > 0 for m in row["memory_bytes"].values())
        # Each node's highest RssAnon, sampled every 5 s from the first create on.
        assert set(row["rss_anon_peak_bytes"]) == {"n1", "n2", "n3"}
        assert all(row["rss_anon_peak_bytes"][nid] > 0 for nid in row["memory_bytes"])
    assert figures["bytes_per_pending_job"] == figures["by_size"][-1]["bytes_per_pending_job"]
    assert 100 < figures["bytes_per_finished_one_off_job_and_run"] < 100_000
    # 50 every-second jobs ran 4 s: each ended at least a run more, and a run
    # cannot take less than its record's key.
    assert figures["recurring_jobs"] == 50 and figures["recurring_runs_ended"] >= 50
    assert 30 < figures["bytes_per_recurring_run"] < 100_000
    assert figures["memory_at_pending_bytes"] == figures["by_size"][-1]["memory_bytes"]
    printed = capsys.readouterr().out
    assert "memory at 1,000 pending" in printed
    assert "memory at 2,000 pending" in printed
    assert "since the first create" in printed
    assert "state per run of a recurring job" in printed


@pytest.mark.integration
def test_creates_reports_single_and_batched_rates(tmp_path):
    out = tmp_path / "creates.json"
    assert main(["bench", "creates", "6", "--seconds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    # Busy refusals (with Retry-After) are admission at work; nothing else fails.
    assert figures["single_posts_per_s"] > 0 and figures["single_failed"] == 0
    assert figures["batch_jobs_per_s"] >= 1000 and figures["batch_requests_failed"] == 0
    # The nodes' CPU per create: some, and far less than a second of it.
    for phase in ("single", "batch"):
        assert 0 < figures[f"{phase}_node_cpu_us"] < 100_000, figures
        # By thread: the event loops (the API) and the Raft threads (apply) both
        # worked, and together no more than the processes did (ticks round).
        threads = figures[f"{phase}_threads_us"]
        assert threads["event_loop"] > 0 and threads["raft"] > 0, threads
        assert threads["event_loop"] + threads["raft"] <= figures[f"{phase}_node_cpu_us"] * 1.2 \
            + 100, figures
    # The clients' CPU per create, and the rate the cores bound at the nodes'
    # and the clients' costs together.
    assert 0 < figures["single_client_cpu_us"] < 100_000, figures
    assert figures["single_cpu_bound_per_s"] == round(
        (os.cpu_count() or 1) * 1e6 / (figures["single_node_cpu_us"]
                                       + figures["single_client_cpu_us"])), figures


def test_the_apscheduler_reference_calls_every_job_of_a_burst():
    figures = measure_in_subprocess(200, lead_s=1.5)
    assert figures["all_called"]
    assert figures["called"] == figures["lateness_ms"]["count"] == 200
    assert 0 <= figures["lateness_ms"]["p50"] <= figures["lateness_ms"]["p99"] \
        <= figures["lateness_ms"]["max"] < 10_000
    assert "ThreadPoolExecutor of 10 threads" in figures["conditions"]


def test_the_posting_apscheduler_reference_calls_the_sink_once_for_every_job():
    with FastSink() as sink:
        figures = measure_in_subprocess(200, lead_s=1.5, post_url=sink.url, connections=8)
        calls = sink.by_job()
    assert figures["all_called"]
    assert figures["posted"] == figures["trigger_lateness_ms"]["count"] == 200
    assert figures["failed"] == 0
    assert sorted(calls) == sorted(f"aps-{i}" for i in range(200))
    assert all(len(c) == 1 for c in calls.values())
    # The sink measures its call lateness from the headers raftsched sends.
    assert all(c[0].scheduled_s == figures["due_s"] for c in calls.values())
    assert "AsyncIOScheduler" in figures["conditions"]


@pytest.mark.integration
def test_idle_reports_each_nodes_cpu(tmp_path, capsys):
    out = tmp_path / "idle.json"
    assert main(["bench", "idle", "2", "--settle-s", "0", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures["cpu_percent_of_a_core"]) == {"n1", "n2", "n3"}
    assert all(0 <= pct < 200 for pct in figures["cpu_percent_of_a_core"].values())
    assert figures["leader"] in figures["cpu_percent_of_a_core"]
    # Each node's threads over the same interval, the event loop and the Raft
    # thread named (the arithmetic: tests/test_threadcpu.py).
    assert set(figures["cpu_percent_by_thread"]) == {"n1", "n2", "n3"}
    for split in figures["cpu_percent_by_thread"].values():
        assert {"event_loop", "raft", "other"} <= set(split)
    printed = capsys.readouterr().out
    assert "idle CPU over" in printed and "Raft thread" in printed


@pytest.mark.integration
def test_failover_kills_the_leader_before_the_burst_and_counts_every_call(tmp_path, capsys):
    out = tmp_path / "failover.json"
    assert main(["bench", "failover", "200", "--lead-s", "4", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["leader_killed"] != figures["new_leader"]
    assert figures["all_called"] and figures["called"] == figures["runs_seen"] == 200
    assert figures["call_lateness_ms"]["count"] == 200
    assert figures["early_calls"] == 0 and figures["duplicates"] == 0
    assert "SIGKILLed 1 s before 200 one-offs were due" in capsys.readouterr().out


@pytest.mark.integration
def test_a_wiped_follower_rejoins_from_the_leaders_snapshot(tmp_path, capsys):
    out = tmp_path / "rejoin.json"
    assert main(["bench", "rejoin", "300", "--snapshot-entries", "100",
                 "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    snapshot, back = figures["snapshot"], figures["rejoin"]
    assert back["node"] != figures["leader"]
    # The snapshot the leader had in place holds every job created before it.
    assert snapshot["bytes"] > 300 * 100
    assert back["snapshot_installs_total"] >= 1
    assert back["log"]["installs_logged"] >= 1
    assert back["log"]["applied_index"] >= snapshot["applied_index"]
    assert 0 < back["caught_up_s"] <= back["digests_equal_s"]
    assert set(figures["terms_after"]) == {"n1", "n2", "n3"}
    assert "wiped " + back["node"] in capsys.readouterr().out


def test_cost_counts_every_phase_of_every_run():
    figures = bench.runcost.measure(300)
    rows = {row["phase"]: row for row in figures["phases"]}
    assert "start" not in rows   # the lease is taken at fire: no start entries
    for phase in ("create", "fire", "finish"):
        assert rows[phase]["items"] == 300, rows[phase]
        assert rows[phase]["lmdb_writes"] >= 2 and rows[phase]["cpu_us"] > 0, rows[phase]
    # A fire writes at least the run, its index entry and the job, and
    # deletes the due entry; the total adds the phases up.
    assert rows["fire"]["lmdb_writes"] >= 4
    total = rows["fire to finish (one replica)"]
    assert total["lmdb_writes"] == round(sum(rows[p]["lmdb_writes"]
                                             for p in ("fire", "finish")), 1)
    assert "fire to finish" in bench.render(figures)


def test_cost_repeated_reports_the_least_and_the_median_of_each_phase():
    figures = bench.runcost.measure_repeated(100, 3)
    assert figures["repeat"] == 3
    for row in figures["phases"]:
        runs = row["cpu_us_runs"]
        assert len(runs) == 3
        assert row["cpu_us"] == min(runs) and row["cpu_us_median"] == sorted(runs)[1]
    text = bench.render(figures)
    assert "3 times: cpu us the least, then the median" in text
    assert text.splitlines()[1].split()[-2:] == ["us", "median"]


def test_instructions_per_job_are_the_difference_of_two_counted_runs():
    from raftsched.testing import instructions
    report = "==5442== \n==5442== I   refs:      2,374,580,805\n"
    assert instructions.parse_instructions(report) == 2_374_580_805
    with pytest.raises(ValueError):
        instructions.parse_instructions("==1== ERROR SUMMARY: 0 errors")
    counted = {("a", 500): 2_000_000_000, ("a", 1500): 3_200_000_000,
               ("b", 500): 2_100_000_000, ("b", 1500): 3_150_000_000}
    runner = lambda root, jobs: counted[(root, jobs)]   # noqa: E731
    before = instructions.per_job("a", 500, 1500, runner)
    after = instructions.per_job("b", 500, 1500, runner)
    assert (before.instructions, after.instructions) == (1_200_000.0, 1_050_000.0)
    text = instructions.render([before, after], ["before", "after"])
    assert "1200.0K instructions per job" in text and "-12.50%" in text
    with pytest.raises(ValueError):
        instructions.per_job("a", 1500, 500, runner)
