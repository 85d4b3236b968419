"""The CLI's tables fit the terminal: in 80 columns a list of runs shows
each run's id whole, its time and its state, and says on stderr which
columns it left out, where rich alone squeezed those columns to nothing."""

from __future__ import annotations

import io

from rich.console import Console

from raftsched.cli_render import Col, Renderer, _fitting

RUN = {"run_id": "run_1a2482a73a6ba55701f301a2482b0a70", "job_id": "job_1a2482a73a6ba55701f3",
       "scheduled_for": "2026-12-05T21:45:10Z", "state": "succeeded", "attempt": 1,
       "trigger": "schedule", "error": None}
FAILED = dict(RUN, run_id="run_1a2482a73a6ba55701f401a2482b0a70", state="failed",
              error="HTTP 500 from http://127.0.0.1:9000/settle after 3 attempts")


def rendered(width: int, draw) -> str:
    out = Renderer("table")
    out.console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=False,
                          markup=False)
    draw(out)
    return out.console.file.getvalue()


def test_a_narrow_terminal_leaves_out_the_least_needed_columns_first():
    columns = [Col("ID"), Col("A", drop=2), Col("B", drop=1), Col("NOTE", drop=3, fold=True)]
    rows = [("x" * 30, "a" * 20, "b" * 20, "n" * 200)]
    assert _fitting(columns, rows, 200) == [0, 1, 2, 3]     # a note folds in 16 columns
    assert _fitting(columns, rows, 30 + 3 + 20 + 3 + 20 + 3 + 16 - 1) == [0, 1, 2]
    assert _fitting(columns, rows, 60) == [0, 2]
    assert _fitting(columns, rows, 10) == [0]                # an id is never left out


def test_runs_in_80_columns_show_each_id_whole_its_time_and_its_state(capsys):
    text = rendered(80, lambda out: out.run_table({"runs": [RUN, RUN], "next_page_token": None}))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    row = next(line for line in lines if RUN["run_id"] in line)
    assert RUN["scheduled_for"] in row and RUN["state"] in row
    left_out = capsys.readouterr().err
    assert "left out for the terminal's width (80 columns): JOB ID, ATTEMPT, TRIGGER" in left_out


def test_failed_runs_in_80_columns_show_their_state_and_error_before_their_time(capsys):
    text = rendered(80, lambda out: out.run_table({"runs": [RUN, FAILED],
                                                   "next_page_token": None}))
    assert all(len(line) <= 80 for line in text.splitlines())
    row = next(line for line in text.splitlines() if FAILED["run_id"] in line)
    assert "failed" in row and "HTTP 500" in row
    assert any("http://127.0.0.1:9000/settle" in line for line in text.splitlines())
    assert "SCHEDULED FOR" in capsys.readouterr().err


def test_runs_in_a_wide_terminal_show_every_column_and_say_nothing(capsys):
    text = rendered(250, lambda out: out.run_table({"runs": [RUN], "next_page_token": None}))
    header = text.splitlines()[0]
    for name in ("RUN ID", "JOB ID", "SCHEDULED FOR", "STATE", "ATTEMPT", "TRIGGER", "ERROR"):
        assert name in header
    assert capsys.readouterr().err == ""


def test_the_cluster_view_in_60_columns_keeps_each_node_its_role_and_lag(capsys):
    cluster = {"leader": "n1", "shard_count": 256, "nodes": {
        nid: {"role": role, "term": 1, "applied_index": 914, "commit_index": 914,
              "shards_owned": 85, "clock_offset_ms": 0, "http": f"http://127.0.0.1:870{i}"}
        for i, (nid, role) in enumerate((("n1", "leader"), ("n2", "follower")), 1)}}
    text = rendered(60, lambda out: out.cluster(cluster))
    assert "leader" in text and "follower" in text and "LAG" in text
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "HTTP" in capsys.readouterr().err
