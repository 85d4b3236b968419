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
# GET /v1/cluster of a leader and a follower.
CLUSTER = {"leader": "n1", "shard_count": 256, "nodes": {
    nid: {"role": role, "term": 1, "applied_index": 34, "commit_index": 34,
          "shards_owned": 86, "clock_offset_ms": 0, "breakers_open": i - 1,
          "http": f"http://127.0.0.1:870{i}"}
    for i, (nid, role) in enumerate((("n1", "leader"), ("n2", "follower")), 1)}}


def rendered(width: int, draw) -> str:
    out = Renderer("table")
    out.console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=False,
                          markup=False)
    draw(out)
    return out.console.file.getvalue()


def test_a_narrow_terminal_leaves_out_the_least_needed_columns_first():
    columns = [Col("ID"), Col("A", drop=2), Col("B", drop=1), Col("NOTE", drop=3, fold=True)]
    rows = [("x" * 30, "a" * 20, "b" * 20, "n" * 200)]
    assert _fitting(columns, rows, 200)[0] == [0, 1, 2, 3]     # a note folds in 16 columns
    assert _fitting(columns, rows, 30 + 3 + 20 + 3 + 20 + 3 + 16 - 1)[0] == [0, 1, 2]
    assert _fitting(columns, rows, 60)[0] == [0, 2]
    assert _fitting(columns, rows, 10)[0] == [0]                # an id is never left out


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
    cluster = CLUSTER
    text = rendered(60, lambda out: out.cluster(cluster))
    assert "leader" in text and "follower" in text and "LAG" in text
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "HTTP" in capsys.readouterr().err


DAG_TASKS = [
    {"id": "extract", "depends_on": [], "trigger_rule": "all_success",
     "target": {"type": "http", "url": "http://127.0.0.1:9000/extract", "method": "POST"}},
    {"id": "transform", "depends_on": ["extract"], "trigger_rule": "all_success",
     "target": {"type": "command", "argv": ["python", "t.py"], "queue": "etl"}},
    {"id": "notify", "depends_on": ["extract", "transform"], "trigger_rule": "all_done",
     "target": {"type": "publish", "topic": "done", "message": {}}}]


def test_a_dag_job_shows_its_tasks_as_a_table(capsys):
    job = {"job_id": "job_1a2482cd36fba5570000", "name": "etl", "status": "active",
           "schedule": {"every": "1m"}, "dag": {"tasks": DAG_TASKS}}
    text = rendered(100, lambda out: out.job(job))
    assert "a DAG of 3 tasks (below)" in text
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.split() and line.split()[0] in ("extract", "transform", "notify")}
    assert "POST http://127.0.0.1:9000/extract" in rows["extract"]
    assert "extract" in rows["transform"].split("│")[1]
    assert "command python t.py (queue etl)" in rows["transform"]
    assert "all_done" in rows["notify"] and "publish to done" in rows["notify"]


def test_a_dag_run_shows_each_task_state_and_error(capsys):
    run = dict(RUN, state="failed", tasks=[
        {"id": "extract", "state": "succeeded", "attempt": 1, "run_id": "run_8caf6143c1d126a2",
         "started_at": "2026-12-05T21:47:13.346Z", "finished_at": "2026-12-05T21:47:13.352Z"},
        {"id": "transform", "state": "failed", "attempt": 3, "error": "exit 2",
         "run_id": "run_404930e0e6df4e83"},
        {"id": "load", "state": "upstream_failed", "attempt": 0}])
    text = rendered(160, lambda out: out.run(run))
    rows = {line.split()[0]: line for line in text.splitlines()
            if line.split() and line.split()[0] in ("extract", "transform", "load")}
    assert "succeeded" in rows["extract"] and "run_8caf6143c1d126a2" in rows["extract"]
    assert "failed" in rows["transform"] and "exit 2" in rows["transform"]
    assert "upstream_failed" in rows["load"]


def test_a_run_s_attempts_in_80_columns_keep_their_times_on_one_line(capsys):
    attempt = {"attempt": 2, "holder": "n1", "started_at": "2026-12-05T21:49:46.130Z",
               "finished_at": "2026-12-05T21:49:46.130Z",
               "error": "ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default"}
    text = rendered(80, lambda out: out.run(dict(RUN, attempts=[attempt])))
    row = next(line for line in text.splitlines() if line.startswith("2 "))
    assert row.count("2026-12-05T21:49:46.130Z") == 2 and "ClientConnector" in row


def test_a_run_s_logs_are_printed_as_written_whatever_the_terminal(capsys):
    """Not wrapped at the terminal's width nor tabs expanded: `runs logs RUN >
    file` keeps the command's output as it was (a pipe is 80 columns to rich)."""
    output = "x" * 200 + "\n" + "a\tb  c\n" + "last line"
    text = rendered(80, lambda out: out.logs([{
        "attempt": 1, "output_node": "n1", "started_at": "2026-12-05T21:49:00.017Z",
        "finished_at": "2026-12-05T21:49:00.078Z", "exit_code": 0, "stdout": output}]))
    assert text == ("--- attempt 1 by n1 (2026-12-05T21:49:00.017Z .. 2026-12-05T21:49:00.078Z)"
                    ": exit 0\n[stdout]\n" + output + "\n")


def test_a_workers_attempt_names_the_worker_and_the_node_that_keeps_its_output(capsys):
    text = rendered(80, lambda out: out.logs([{
        "attempt": 2, "holder": "worker:vm-1", "output_node": "n3",
        "started_at": "2026-12-05T21:49:00.017Z", "finished_at": "2026-12-05T21:49:00.078Z",
        "exit_code": 3, "error": "exit code 3: oops", "stderr": "oops\n"}]))
    assert text.splitlines()[0] == (
        "--- attempt 2 by worker:vm-1, output kept on n3 (2026-12-05T21:49:00.017Z .. "
        "2026-12-05T21:49:00.078Z): exit code 3: oops")


def test_an_empty_list_says_so_instead_of_printing_headers_alone(capsys):
    assert rendered(80, lambda out: out.run_table({"runs": [], "next_page_token": None})) \
        == "no runs\n"
    assert rendered(80, lambda out: out.job_table([], {})) == "no jobs\n"
    assert rendered(80, lambda out: out.token_table([])) == "no tokens\n"


def test_a_list_s_results_end_with_a_count_of_each_outcome(capsys):
    results = [{"job_id": "job_a", "created": True}, {"job_id": "job_b", "created": False},
               {"error": {"status": 400, "detail": "bad cron"}},
               {"job_id": "job_c", "created": True}]
    text = rendered(80, lambda out: out.batch_results({"results": results}))
    assert text.splitlines()[-1] == "4 jobs: 2 created, 1 existed, 1 refused"


def test_the_cluster_view_in_80_columns_shows_no_url_split_across_lines(capsys):
    cluster = CLUSTER
    wide = rendered(120, lambda out: out.cluster(cluster))
    assert "http://127.0.0.1:8701" in wide and "http://127.0.0.1:8702" in wide
    narrow = rendered(80, lambda out: out.cluster(cluster))
    assert "http://" not in narrow and "leader" in narrow
    assert "BREAKERS" in narrow   # a node holding runs behind an open breaker shows it
    assert "HTTP" in capsys.readouterr().err
