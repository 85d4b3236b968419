"""The node refuses an unauthenticated Raft port; the CLI parses as documented; the job, run, token and status commands work against a live cluster with tables, JSON and exit codes 0/1/2."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raftsched.cli import build_parser, main
from raftsched.testing.cluster import free_ports
from raftsched.testing.http import ADMIN_TOKEN, wait_until


def test_node_with_peers_and_no_secret_refuses_to_start(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "node", "--id", "n1", "--http", "127.0.0.1:0",
         "--raft", "127.0.0.1:1", "--peers", "127.0.0.1:2,127.0.0.1:3", "--data", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2
    assert "no Raft secret" in result.stderr
    assert not any(tmp_path.iterdir())   # it wrote nothing


def test_a_node_refuses_a_state_of_an_earlier_schema_in_one_line(tmp_path):
    """A data folder whose state an earlier release wrote (schema 1: run ids
    of another shape) stops the node at start: exit 70, one CRITICAL line
    saying what to do, no traceback."""
    import lmdb
    env = lmdb.open(str(tmp_path / "state"), max_dbs=4, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"schema_version", (1).to_bytes(8, "big"), db=env.open_db(b"meta", txn=txn))
    env.close()
    http, raft, peer = free_ports(3)
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "node", "--id", "n1", "--http", f"127.0.0.1:{http}",
         "--raft", f"127.0.0.1:{raft}", "--peers", f"127.0.0.1:{peer}", "--insecure",
         "--insecure-no-auth", "--data", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 70, result.stderr
    assert "CRITICAL" in result.stderr and "schema version 1, this build reads 2 and 3" in result.stderr
    assert "empty --data folder" in result.stderr and "Traceback" not in result.stderr


def test_cli_contract_parses():
    args = build_parser().parse_args(
        ["node", "--id", "n2", "--http", "127.0.0.1:8702", "--raft", "127.0.0.1:9702",
         "--peers", "127.0.0.1:9701,127.0.0.1:9703", "--data", "/tmp/x"])
    assert args.http == ("127.0.0.1", 8702)
    assert args.peers == "127.0.0.1:9701,127.0.0.1:9703"
    dev = build_parser().parse_args(["dev"])
    assert (dev.nodes, dev.http_port_base, dev.raft_port_base) == (3, 8701, 9701)


def test_the_documented_job_and_run_commands_parse():
    parser = build_parser()
    preview = parser.parse_args(["jobs", "preview", "0 2 * * *", "--tz", "Asia/Kolkata",
                                 "--count", "10"])
    assert (preview.schedule, preview.tz, preview.count) == ("0 2 * * *", "Asia/Kolkata", 10)
    listing = parser.parse_args(["jobs", "list", "--status", "paused", "--name-prefix", "n",
                                 "--label", "a:1", "--label", "b:2", "--output", "json"])
    assert (listing.label, listing.output, listing.limit) == (["a:1", "b:2"], "json", 50)
    runs = parser.parse_args(["runs", "list", "--job", "job_1", "--state", "failed",
                              "--url", "http://127.0.0.1:9", "--token", "t"])
    assert (runs.job_id, runs.state, runs.url, runs.token) == \
        ("job_1", "failed", "http://127.0.0.1:9", "t")
    logs = parser.parse_args(["runs", "logs", "run_1", "--follow"])
    assert logs.follow
    token = parser.parse_args(["tokens", "create", "--tenant", "t1", "--role", "writer"])
    assert (token.token_tenant, token.act_for) == ("t1", None)


# --- the job, run and status commands against a live cluster -------------------------------

def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `raftsched ARGV` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:   # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv: str):
    code, out, err = cli(capsys, *argv, "--output", "json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture
def env(shared_cluster, monkeypatch):
    """RAFTSCHED_URL and RAFTSCHED_TOKEN as an operator's shell has them; wide
    enough a terminal that no table cell wraps."""
    monkeypatch.setenv("RAFTSCHED_URL", shared_cluster.url("n2"))
    monkeypatch.setenv("RAFTSCHED_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("COLUMNS", "250")
    return shared_cluster


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.mark.integration
def test_job_commands_from_a_yaml_file_to_delete(env, sink, capsys, tmp_path):
    job_file = write(tmp_path / "job.yaml", f"""\
        name: cli-hourly
        schedule: {{every: 1h}}
        target: {{type: http, url: "{sink.url}/hook"}}
        labels: {{team: cli}}
        """)
    job = cli_json(capsys, "jobs", "create", "-f", job_file)
    job_id = job["job_id"]
    code, out, _ = cli(capsys, "jobs", "list", "--label", "team:cli")
    assert code == 0
    [row] = [line for line in out.splitlines() if job_id in line]
    assert "cli-hourly" in row and "every 1h" in row
    listed = cli_json(capsys, "jobs", "list", "--name-prefix", "cli-hourly", "--status", "active")
    assert [j["job_id"] for j in listed["jobs"]] == [job_id]
    code, out, _ = cli(capsys, "jobs", "get", job_id)
    assert code == 0 and "cli-hourly" in out
    patch = write(tmp_path / "patch.json", '{"name": "cli-renamed"}')
    assert cli_json(capsys, "jobs", "update", job_id, "-f", patch)["name"] == "cli-renamed"
    paused = cli_json(capsys, "jobs", "pause", job_id, "--note", "maintenance")
    assert (paused["status"], paused["pause_note"]) == ("paused", "maintenance")
    assert cli_json(capsys, "jobs", "resume", job_id)["status"] == "active"
    run = cli_json(capsys, "jobs", "trigger", job_id)
    assert run["job_id"] == job_id
    wait_until(lambda: cli_json(capsys, "runs", "list", "--job", job_id,
                                "--state", "succeeded")["runs"], 30, "the triggered run")
    code, out, _ = cli(capsys, "jobs", "list", "--label", "team:cli")
    assert "succeeded" in next(line for line in out.splitlines() if job_id in line)
    code, out, _ = cli(capsys, "runs", "logs", run["run_id"], "--follow")
    assert code == 0 and "attempt 1" in out and "HTTP 200" in out
    logs = cli_json(capsys, "runs", "logs", run["run_id"])
    assert (logs["run_id"], [a["http_status"] for a in logs["attempts"]]) == \
        (run["run_id"], [200])
    code, out, _ = cli(capsys, "runs", "get", run["run_id"])
    assert code == 0 and "succeeded" in out
    assert cli_json(capsys, "jobs", "delete", job_id) == {"job_id": job_id, "deleted": True}
    code, out, err = cli(capsys, "jobs", "get", job_id, "--output", "json")
    assert code == 1
    assert "404" in err
    assert json.loads(out)["field"] == "job_id"


@pytest.mark.integration
def test_failed_runs_are_listed_and_redriven(env, capsys, tmp_path):
    from raftsched.testing.sink import Sink
    with Sink(status_for=lambda call: 500) as failing:
        job_file = write(tmp_path / "once.json", json.dumps({
            "run_at": "2026-01-01T00:00:00Z", "misfire": "fire_once",
            "target": {"type": "http", "url": failing.url}, "retry": {"max_attempts": 1}}))
        job_id = cli_json(capsys, "jobs", "create", "-f", job_file)["job_id"]
        [dead] = wait_until(lambda: cli_json(capsys, "runs", "list", "--job", job_id,
                                             "--state", "failed")["runs"], 30, "a failed run")
        code, out, _ = cli(capsys, "runs", "list", "--state", "failed", "--job", job_id)
        assert code == 0 and dead["run_id"] in out and "HTTP 500" in out
        redriven = cli_json(capsys, "runs", "retry", dead["run_id"])
        assert (redriven["run_id"], redriven["trigger"]) == (dead["run_id"], "retry")
        code, out, _ = cli(capsys, "runs", "logs", dead["run_id"], "--follow",
                           "--output", "json")
        attempts = [json.loads(line) for line in out.splitlines()]
        assert [a["attempt"] for a in attempts] == [1, 2]


@pytest.mark.integration
def test_preview_prints_the_fire_times_in_the_zone(env, capsys):
    code, out, _ = cli(capsys, "jobs", "preview", "0 2 * * *", "--tz", "Asia/Kolkata",
                       "--count", "10")
    assert code == 0
    assert len([line for line in out.splitlines() if "T02:00:00+05:30" in line]) == 10
    answer = cli_json(capsys, "jobs", "preview", "30m", "--count", "3")
    assert len(answer["fire_times"]) == 3


@pytest.mark.integration
def test_backfill_follows_its_progress_to_the_end(env, sink, capsys, tmp_path):
    job_file = write(tmp_path / "every.json", json.dumps({
        "name": "cli-backfill", "schedule": {"every": "1m"},
        "target": {"type": "http", "url": sink.url}}))
    job_id = cli_json(capsys, "jobs", "create", "-f", job_file)["job_id"]
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    start, end = (now - dt.timedelta(minutes=5)).isoformat(), now.isoformat()
    code, out, err = cli(capsys, "jobs", "backfill", job_id, "--start", start, "--end", end)
    assert code == 0, err
    assert "succeeded" in out
    assert "backfill bf_" in out   # the progress bar's label
    view = cli_json(capsys, "jobs", "backfill", job_id, "--start", start, "--end", end)
    assert view["state"] == "succeeded"
    assert view["existing"] == view["total"] >= 4   # the first backfill ran them all


@pytest.mark.integration
def test_status_shows_every_node(env, capsys):
    code, out, _ = cli(capsys, "status")
    assert code == 0
    assert "leader n" in out
    for nid in ("n1", "n2", "n3"):
        assert any(line.split()[:1] == [nid] for line in out.splitlines()), out
    cluster = cli_json(capsys, "status")
    assert set(cluster["nodes"]) == {"n1", "n2", "n3"}
    assert all(node["threads_cpu_s"]["raft"] >= 0 for node in cluster["nodes"].values())


@pytest.mark.integration
def test_status_cpu_shows_each_nodes_threads_over_the_interval(env, capsys):
    code, out, _ = cli(capsys, "status", "--cpu", "0.5")
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("NODE"))
    assert "LOOP %" in header and "RAFT %" in header and "REST %" in header
    cluster = cli_json(capsys, "status", "--cpu", "0.5")
    for node in cluster["nodes"].values():
        split = node["cpu_percent"]
        assert set(split) == {"event_loop", "raft", "journal", "digest", "other"}
        # A share of one core each; a node's threads together under both cores.
        assert all(0 <= pct <= 200 for pct in split.values()), split
    code, _, err = cli(capsys, "status", "--cpu", "0")
    assert code == 1 and "from 0.1 to 60" in err   # a user error, named


@pytest.mark.integration
def test_tokens_are_created_listed_and_revoked(env, capsys):
    created = cli_json(capsys, "tokens", "create", "--tenant", "cli-t", "--role", "reader",
                       "--name", "ci")
    assert created["tenant"] == "cli-t" and created["token"]
    code, out, _ = cli(capsys, "tokens", "list", "--tenant", "cli-t")
    assert code == 0 and created["token_id"] in out
    assert cli(capsys, "tokens", "revoke", created["token_id"])[0] == 0


@pytest.mark.integration
def test_user_errors_exit_1(env, capsys, tmp_path):
    broken = write(tmp_path / "broken.yaml", "name: [unclosed\n")
    code, _, err = cli(capsys, "jobs", "create", "-f", broken)
    assert code == 1 and "broken.yaml" in err
    assert cli(capsys, "jobs", "create", "-f", str(tmp_path / "absent.json"))[0] == 1
    bad_cron = write(tmp_path / "bad.json", json.dumps({
        "schedule": {"cron": "61 * * * *"}, "target": {"type": "http",
                                                        "url": "https://x.example"}}))
    code, _, err = cli(capsys, "jobs", "create", "-f", bad_cron)
    assert code == 1 and "schedule" in err
    assert cli(capsys, "jobs", "get", "job_" + "0" * 20)[0] == 1
    assert cli(capsys, "jobs", "get")[0] == 1   # a usage error
    assert cli(capsys, "status", "--output", "yaml")[0] == 1
    assert cli(capsys, "status", "--token", "not-a-token")[0] == 1


def test_no_node_at_the_url_exits_2(capsys):
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    code, _, err = cli(capsys, "jobs", "list", "--url", url, "--token", "x")
    assert code == 2
    assert "cannot reach" in err
    result = subprocess.run([sys.executable, "-m", "raftsched", "status", "--url", url],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr


@pytest.mark.integration
def test_a_file_with_a_list_of_jobs_is_one_batch(env, sink, capsys, tmp_path):
    jobs = write(tmp_path / "jobs.json", json.dumps([
        {"name": f"cli-batch-{i}", "schedule": {"every": "1h"},
         "target": {"type": "http", "url": sink.url}} for i in range(2)]))
    answer = cli_json(capsys, "jobs", "create", "-f", jobs)
    assert [r["created"] for r in answer["results"]] == [True, True]
    names = [j["name"] for j in cli_json(capsys, "jobs", "list", "--name-prefix",
                                         "cli-batch-")["jobs"]]
    assert sorted(names) == ["cli-batch-0", "cli-batch-1"]
