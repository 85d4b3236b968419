"""Fixtures: real local clusters (processes on loopback ports) and an HTTP sink."""

from __future__ import annotations

import pytest

from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.sink import Sink


def _dump_logs(cluster: LocalCluster) -> None:
    for nid in cluster.ids:
        print(f"----- {nid} log (tail) -----")
        print(cluster.logs(nid))


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory):
    """One 3-node cluster for a whole module of tests that do not break nodes."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    with cluster:
        cluster.wait_ready()
        yield cluster
        _dump_logs(cluster)


@pytest.fixture
def fresh_cluster(tmp_path):
    """A 3-node cluster of the test's own, for tests that kill nodes."""
    cluster = LocalCluster(tmp_path / "cluster")
    with cluster:
        cluster.wait_ready()
        yield cluster
        _dump_logs(cluster)


@pytest.fixture
def sink():
    with Sink() as s:
        yield s


@pytest.fixture(params=["memory", "lmdb"])
def store(request, tmp_path):
    """Each store of the contract in turn: a test using it runs once per store."""
    s = MemoryStore() if request.param == "memory" else LmdbStore(str(tmp_path / "db"),
                                                                  map_size=64 * 1024 ** 2)
    yield s
    s.close()
