"""A node runs commands only as a user the operator named (--command-user NAME, switched to for real when the node is root) or, knowingly, as itself (--command-user=self): --allow-commands alone refuses to start, and a command run as an unprivileged user cannot read a 0600 file of the node's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftsched.cli import build_parser, command_identity
from raftsched.executors.base import Attempt, Outcome
from raftsched.executors.command import CommandExecutor, RunAs, resolve_command_user
from raftsched.runtime.dev import node_argv

NODE = ["node", "--id", "n1", "--http", "127.0.0.1:1", "--raft", "127.0.0.1:2", "--data", "d"]
ATTEMPT = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_1",
                  scheduled_ms=1_800_000_000_000, attempt=1, fencing_token=3)
FAR_MS = 4_000_000_000_000
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def identity(*flags: str):
    return command_identity(build_parser().parse_args([*NODE, *flags]))


def test_allow_commands_without_a_command_user_is_refused_naming_the_choice():
    run_as, error = identity("--allow-commands")
    assert run_as is None
    assert error is not None
    assert "--command-user NAME" in error
    assert "--command-user=self" in error
    assert "raftsched worker" in error
    assert identity("--allow-commands", "--command-user=self") == (None, None)
    assert identity() == (None, None)
    _, alone = identity("--command-user=self")
    assert alone is not None and "--allow-commands" in alone


def test_the_node_process_refuses_to_start_with_allow_commands_alone(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "node", "--id", "n1", "--http", "127.0.0.1:1",
         "--raft", "127.0.0.1:2", "--data", str(tmp_path / "d"), "--allow-commands"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--command-user" in result.stderr
    assert not (tmp_path / "d").exists()   # refused before it made anything


def test_a_command_user_must_exist_and_not_be_root():
    assert resolve_command_user("self") is None
    with pytest.raises(ValueError, match="no user"):
        resolve_command_user("no-such-user-here")
    with pytest.raises(ValueError, match="root"):
        resolve_command_user("root")


def test_dev_clusters_run_commands_knowingly_as_the_developer():
    argv = node_argv(0, 3, "/tmp/d", 8701, 9701, allow_commands=True)
    assert "--command-user=self" in argv
    assert "--command-user=self" not in node_argv(0, 3, "/tmp/d", 8701, 9701)


def _private_file(tmp_path: Path) -> Path:
    """A 0600 file of this (root) process in a folder anyone may enter: only
    the file's own mode keeps another user out."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(data, 0o755)
    secret = data / "admin-token"
    secret.write_text("the-node-secret\n")
    os.chmod(secret, 0o600)
    return secret


def _cat_as(run_as: RunAs | None, path: Path) -> Outcome:
    target = {"type": "command", "argv": [f"id -u; echo HOME=$HOME; pwd; cat {path}"],
              "env": {},
              "cwd": None, "timeout_s": 10.0, "queue": "default", "shell": True}
    return asyncio.run(CommandExecutor(run_as=run_as).run(ATTEMPT, target, FAR_MS))


@as_root
def test_a_command_run_as_an_unprivileged_user_cannot_read_the_nodes_files(tmp_path):
    secret = _private_file(tmp_path)
    nobody = resolve_command_user("nobody")
    assert nobody is not None
    own = _cat_as(None, secret)
    assert own.ok, own
    assert "the-node-secret" in own.output["stdout"]   # as the node: readable
    switched = _cat_as(nobody, secret)
    assert not switched.ok
    lines = switched.output["stdout"].splitlines()
    assert lines[0] == str(nobody.uid)
    assert lines[1] == f"HOME={nobody.home}"
    assert lines[2] == (nobody.home if os.path.isdir(nobody.home) else "/")
    assert "the-node-secret" not in switched.output["stdout"]
    assert "Permission denied" in switched.output["stderr"]


@as_root
@pytest.mark.integration
def test_a_node_runs_its_commands_as_the_command_user(tmp_path):
    from raftsched.testing.cluster import LocalCluster
    from raftsched.testing.http import wait_until
    with LocalCluster(tmp_path / "c", nodes=1, command_user="nobody") as cluster:
        cluster.wait_ready()
        state = cluster.base / "n1" / "state" / "data.mdb"
        job = {"name": "peek", "schedule": {"cron": "0 0 1 1 *"},
               "target": {"type": "command", "shell": True,
                          "argv": [f"id -u; cat {state} >/dev/null"]}}
        created = cluster.api("n1", "POST", "/v1/jobs", job)
        assert created.status == 201, created
        job_id = created.body["job_id"]
        assert cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger").status in (200, 201, 202)

        def finished() -> dict | None:
            runs = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs?consistent=true").body
            attempts = runs["runs"][0]["attempts"] if runs["runs"] else []
            return attempts[0] if attempts and attempts[0].get("finished_at") else None

        attempt = wait_until(finished, 30, "the command's first attempt to finish")
        run_id = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs").body["runs"][0]["run_id"]
        logs = cluster.api("n1", "GET", f"/v1/runs/{run_id}/logs").body["attempts"][0]
    assert logs["stdout"].splitlines()[0] == "65534"   # nobody
    assert "Permission denied" in logs["stderr"]
    assert "exit code 1" in attempt["error"]


def test_a_worker_refuses_a_command_user_it_cannot_be(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "worker", "--cluster", "http://127.0.0.1:9",
         "--queue", "batch", "--command-user", "no-such-user-here"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--command-user" in result.stderr
    assert "no user 'no-such-user-here'" in result.stderr
