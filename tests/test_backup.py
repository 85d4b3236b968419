"""A backup taken from a running node restores into a new cluster that serves its jobs, agrees on its state and takes new writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raftsched.replication.raft import write_backup
from raftsched.runtime.backup import backup, restore
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.integration

BODY = {"schedule": {"cron": "0 3 * * *", "timezone": "UTC"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"}}


def _create(cluster: LocalCluster, nid: str, name: str) -> str:
    # A 503 (a leader change on a busy machine) is retried: the key makes it one job.
    body = dict(BODY, name=name, idempotency_key=f"backup-{name}")
    answer = wait_until(lambda: (r := cluster.api(nid, "POST", "/v1/jobs", body)).status
                        in (200, 201) and r, 30, f"create {name}")
    return answer.body["job_id"]


def _job_names(cluster: LocalCluster, nid: str) -> set[str]:
    answer = cluster.api(nid, "GET", "/v1/jobs?consistent=true")
    assert answer.status == 200, answer
    return {job["name"] for job in answer.body["jobs"]}


def test_backup_of_a_running_node_restores_into_a_new_cluster(tmp_path):
    archive = tmp_path / "raftsched.backup"
    with LocalCluster(tmp_path / "old", nodes=1) as old:
        old.wait_ready()
        kept = {_create(old, "n1", f"kept-{i}") for i in range(5)}
        result = subprocess.run([sys.executable, "-m", "raftsched", "backup", "--data",
                                 str(old.base / "n1"), "--out", str(archive)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        _create(old, "n1", "after-the-backup")   # the node ran on: not in the backup

    new = LocalCluster(tmp_path / "new", nodes=3)
    for nid in new.ids:
        restore(str(archive), str(new.base / nid))
    with new:
        new.wait_ready(timeout_s=60)
        for nid in new.ids:
            assert _job_names(new, nid) == {f"kept-{i}" for i in range(5)}
            for job_id in kept:
                assert new.api(nid, "GET", f"/v1/jobs/{job_id}").status == 200
        # New entries follow the backup's index: were they numbered from 1 again,
        # every replica would skip them as already applied.
        fresh = _create(new, "n2", "after-the-restore")
        wait_until(lambda: all(new.api(n, "GET", f"/v1/jobs/{fresh}").status == 200
                               for n in new.ids), 20, "the new job on every node")
        new.ensure_same()


class _FakeState:
    applied_index = 7

    def copy_to(self, fd: int) -> None:
        os.write(fd, b"an LMDB image")

    def close(self) -> None:
        pass


def test_restore_refuses_a_folder_that_holds_a_node_and_files_that_are_no_backup(tmp_path):
    archive = tmp_path / "backup"
    write_backup(str(archive), _FakeState())
    assert restore(str(archive), str(tmp_path / "empty")) == 7
    assert (tmp_path / "empty" / "raft.snapshot").read_bytes() == archive.read_bytes()
    (tmp_path / "node" / "state").mkdir(parents=True)
    with pytest.raises(ValueError, match="already holds a node's data"):
        restore(str(archive), str(tmp_path / "node"))
    (tmp_path / "cut").write_bytes(archive.read_bytes()[:-1])
    with pytest.raises(ValueError, match="its header says"):
        restore(str(tmp_path / "cut"), str(tmp_path / "other"))
    with pytest.raises(FileNotFoundError):
        backup(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    with pytest.raises(FileExistsError):
        write_backup(str(archive), _FakeState())   # never over an existing file
    assert restore(str(archive), str(tmp_path / "again")) == 7   # and left it whole
