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
