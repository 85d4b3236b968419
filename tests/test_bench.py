"""`raftsched bench burst N` runs end to end and its figures add up: every run is counted
once in the trigger-lateness histograms and called once at the sink."""

import json

from raftsched.cli import main


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
    assert "trigger lateness (every run" in capsys.readouterr().out


def test_footprint_reports_bytes_per_job_and_run_and_memory(tmp_path):
    out = tmp_path / "footprint.json"
    assert main(["bench", "footprint", "2000", "--runs", "200", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    # A job cannot take less than its id and spec, nor a run less than its record.
    assert 100 < figures["bytes_per_pending_job"] < 100_000
    assert 100 < figures["bytes_per_finished_one_off_job_and_run"] < 100_000
    assert set(figures["memory_at_pending_bytes"]) == {"n1", "n2", "n3"}
    assert all(m["RssAnon"] > 0 for m in figures["memory_at_pending_bytes"].values())


def test_creates_reports_single_and_batched_rates(tmp_path):
    out = tmp_path / "creates.json"
    assert main(["bench", "creates", "6", "--seconds", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["single_posts_per_s"] > 0 and figures["single_refused"] == 0
    assert figures["batch_jobs_per_s"] >= 1000 and figures["batch_requests_refused"] == 0
