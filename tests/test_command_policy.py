"""Commands are opt-in: without --allow-commands a command must name a worker queue (400 naming target.queue) and a node handed one anyway fails it unrun; and a command, on a node or on a worker, sees none of its parent's environment beyond the allowed names."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys

import pytest

from raftsched.cli import build_parser
from raftsched.executors.base import Attempt
from raftsched.executors.command import BASE_ENV_NAMES, CommandExecutor
from raftsched.runtime.dev import node_argv
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import ADMIN_TOKEN, wait_until

pytestmark = pytest.mark.integration

RUN_NAMES = {"RAFTSCHED_EXECUTION_ID", "RAFTSCHED_JOB_ID", "RAFTSCHED_RUN_ID",
             "RAFTSCHED_SCHEDULED_FOR", "RAFTSCHED_ATTEMPT", "RAFTSCHED_FENCING_TOKEN"}
# Set in the parent of every node and worker below, besides the secrets
# LocalCluster gives them (RAFTSCHED_RAFT_SECRET, RAFTSCHED_ADMIN_TOKEN,
# RAFTSCHED_TOKEN); no command may see any of them.
PARENT_ONLY = {"PARENT_ONLY_MARKER": "marker-" + os.urandom(6).hex(),
               "AWS_SECRET_ACCESS_KEY": "aws-" + os.urandom(6).hex()}
FAR = {"cron": "0 0 1 1 *"}   # fires only when triggered


def soon(seconds: float = 1.0) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def command_job(queue: str | None = None, *, run_at: str | None = None,
                **target: object) -> dict:
    body = {"type": "command", "argv": ["true"], **target}
    if queue is not None:
        body["queue"] = queue
    when = {"run_at": run_at} if run_at else {"schedule": FAR}
    return {"name": "cmd", **when, "target": body}


def finished_run(cluster: LocalCluster, job_id: str, timeout_s: float = 30) -> dict:
    def check() -> dict | None:
        runs = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs?consistent=true").body["runs"]
        return runs[0] if runs and runs[0]["state"] in ("succeeded", "failed") else None
    return wait_until(check, timeout_s, f"a finished run of {job_id}")


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory):
    """A node started without --allow-commands."""
    with LocalCluster(tmp_path_factory.mktemp("locked"), nodes=1,
                      allow_commands=False) as cluster:
        cluster.wait_ready()
        yield cluster


@pytest.mark.parametrize("queue", [None, "default"])
def test_a_command_for_the_nodes_is_refused_naming_target_queue(locked, queue):
    refused = locked.api("n1", "POST", "/v1/jobs", command_job(queue))
    assert refused.status == 400, refused
    assert refused.body["field"] == "target.queue"
    assert "--allow-commands" in refused.body["detail"]
    batch = locked.api("n1", "POST", "/v1/jobs:batchCreate",
                       {"jobs": [command_job(queue), command_job("batch")]})
    assert batch.status == 200, batch
    first, second = batch.body["results"]
    assert first["error"]["field"] == "target.queue"
    assert "job_id" in second, second


def test_a_command_with_a_worker_queue_is_accepted_and_cannot_be_moved_to_the_nodes(locked):
    created = locked.api("n1", "POST", "/v1/jobs", command_job("batch"))
    assert created.status == 201, created
    job = f"/v1/jobs/{created.body['job_id']}"
    moved = locked.api("n1", "PATCH", job, {"target": {"type": "command", "argv": ["true"]}})
    assert moved.status == 400, moved
    assert moved.body["field"] == "target.queue"
    renamed = locked.api("n1", "PATCH", job, {"name": "renamed"})
    assert renamed.status == 200, renamed
    publish = {"name": "pub", "schedule": FAR,
               "target": {"type": "publish", "topic": "t", "message": 1}}
    assert locked.api("n1", "POST", "/v1/jobs", publish).status == 201


def test_a_node_without_the_flag_fails_a_default_queue_run_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    with LocalCluster(tmp_path / "c", nodes=1) as cluster:   # --allow-commands
        cluster.wait_ready()
        created = cluster.api("n1", "POST", "/v1/jobs", command_job(
            argv=[f"touch {marker}"], shell=True))
        assert created.status == 201, created
        job_id = created.body["job_id"]
        assert cluster.stop("n1") == 0
        cluster.allow_commands = False
        cluster.start("n1")
        cluster.wait_ready()
        triggered = cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger")
        assert triggered.status in (200, 201, 202), triggered
        run = finished_run(cluster, job_id)
    assert run["state"] == "failed"
    assert len(run["attempts"]) == 1, "refusing to run a command is not retried"
    assert "--allow-commands" in run["attempts"][0]["error"]
    assert not marker.exists()


# --- the environment a command sees ----------------------------------------------------------

def names_seen(env_output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in env_output.splitlines() if "=" in line)


def assert_only_allowed(seen: dict[str, str], secrets: list[str]) -> None:
    allowed = set(BASE_ENV_NAMES) | RUN_NAMES | {"JOBVAR"}
    assert set(seen) <= allowed, f"unexpected variables: {sorted(set(seen) - allowed)}"
    assert seen["JOBVAR"] == "job-value"
    assert RUN_NAMES <= set(seen)
    for value in secrets:
        assert value not in "\n".join(f"{k}={v}" for k, v in seen.items())


async def test_the_executor_passes_only_the_allowed_names(monkeypatch):
    for name, value in PARENT_ONLY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAFTSCHED_RAFT_SECRET", "raft-secret-value")
    monkeypatch.setenv("RAFTSCHED_TOKEN", "token-value")
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    attempt = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_1",
                      scheduled_ms=1_800_000_000_000, attempt=1, fencing_token=3)
    target = {"type": "command", "argv": ["env"], "env": {"JOBVAR": "job-value"}, "cwd": None,
              "timeout_s": 10.0, "queue": "default", "shell": False}
    far_ms = 4_000_000_000_000
    outcome = await CommandExecutor().run(attempt, target, far_ms)
    assert outcome.ok, outcome
    seen = names_seen(outcome.output["stdout"])
    assert_only_allowed(seen, [*PARENT_ONLY.values(), "raft-secret-value", "token-value"])
    assert seen["TZ"] == "Asia/Kolkata"


def test_commands_on_a_node_and_on_a_worker_see_no_secret_of_their_parent(tmp_path):
    with LocalCluster(tmp_path, nodes=1, extra_env=PARENT_ONLY) as cluster:
        cluster.wait_ready()
        worker = start_worker(cluster, "envcheck")
        try:
            outputs = {}
            for queue in (None, "envcheck"):
                body = command_job(queue, run_at=soon(), argv=["env"],
                                   env={"JOBVAR": "job-value"})
                created = cluster.api("n1", "POST", "/v1/jobs", body)
                assert created.status == 201, created
                run = finished_run(cluster, created.body["job_id"])
                assert run["state"] == "succeeded", run
                logs = cluster.api("n1", "GET", f"/v1/runs/{run['run_id']}/logs")
                assert logs.status == 200, logs
                outputs[queue or "default"] = (run["attempts"][0]["holder"],
                                               logs.body["attempts"][0]["stdout"])
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
    assert outputs["default"][0] == "n1"
    assert outputs["envcheck"][0].startswith("worker:")
    secrets = [*PARENT_ONLY.values(), ADMIN_TOKEN, cluster.env["RAFTSCHED_RAFT_SECRET"]]
    for _holder, stdout in outputs.values():
        assert_only_allowed(names_seen(stdout), secrets)


def start_worker(cluster: LocalCluster, queue: str) -> subprocess.Popen:
    env = dict(cluster.env, RAFTSCHED_TOKEN=ADMIN_TOKEN)
    with open(cluster.base / "worker.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "raftsched", "worker", "--cluster", cluster.url("n1"),
             "--queue", queue, "--concurrency", "1", "--id", "envcheck"],
            stdout=log, stderr=subprocess.STDOUT, env=env)


def test_nodes_and_workers_keep_other_processes_of_their_user_out():
    """procguard: /proc/PID/environ and ptrace are closed to commands of the same user."""
    probe = ("from raftsched.runtime.procguard import deny_same_user_inspection, dumpable\n"
             "print(dumpable(), deny_same_user_inspection(), dumpable())")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split() == ["True", "True", "False"]


def test_dev_clusters_run_commands_only_when_asked():
    assert "--allow-commands" not in node_argv(0, 3, "/tmp/d", 8701, 9701)
    assert "--allow-commands" in node_argv(0, 3, "/tmp/d", 8701, 9701, allow_commands=True)
    assert build_parser().parse_args(["dev", "--allow-commands"]).allow_commands
    assert not build_parser().parse_args(["dev"]).allow_commands
    node = ["node", "--id", "n1", "--http", "127.0.0.1:1", "--raft", "127.0.0.1:2", "--data", "d"]
    assert not build_parser().parse_args(node).allow_commands
    assert build_parser().parse_args([*node, "--allow-commands"]).allow_commands
