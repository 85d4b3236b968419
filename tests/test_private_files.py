"""What a node creates is its own user's only, whatever the umask it was started with: data folders 0700, the state, output store, Raft journal and snapshots, and the admin-token and raft-secret files 0600."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from raftsched.runtime.dev import load_or_create_secret, load_or_create_token
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.output_store import OutputStore


@contextmanager
def umask(mask: int) -> Iterator[None]:
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def open_to_others(root: Path) -> list[str]:
    """Every path under `root` (itself excluded) that a group or other may use."""
    return [f"{p} {p.stat().st_mode & 0o777:o}" for p in root.rglob("*")
            if p.stat().st_mode & 0o077]


@pytest.mark.parametrize("mask", [0o000, 0o022])
def test_the_stores_and_secret_files_are_private_whatever_the_umask(tmp_path, mask):
    with umask(mask):
        store = LmdbStore(str(tmp_path / "state"))
        outputs = OutputStore(str(tmp_path / "output"))
        load_or_create_token(str(tmp_path / "dev" / "admin-token"))
        load_or_create_secret(str(tmp_path / "dev"))
    store.close()
    outputs.close()
    assert open_to_others(tmp_path) == []
    assert (tmp_path / "dev" / "raft-secret").stat().st_mode & 0o777 == 0o600


@pytest.mark.integration
def test_a_node_started_under_umask_0_keeps_its_data_folder_private(tmp_path):
    from raftsched.testing.cluster import LocalCluster
    from raftsched.testing.http import wait_until
    cluster = LocalCluster(tmp_path / "c", nodes=1, node_args=["--raft-snapshot-entries", "20"])
    try:
        with umask(0o000):
            cluster.start()
        cluster.wait_ready()
        data = cluster.base / "n1"
        # Renewals alone fill the log: a snapshot follows within seconds.
        wait_until(lambda: (data / "raft.snapshot").exists(), 60, "a Raft snapshot")
        wait_until(lambda: any(data.glob("raft.journal*")), 30, "the Raft journal")
        assert (data / "state").is_dir() and (data / "output").is_dir()
        assert data.stat().st_mode & 0o777 == 0o700
        assert open_to_others(data) == []
    finally:
        cluster.close()
