"""Fixtures: real local clusters (processes on loopback ports) and an HTTP sink; the
guard that keeps node processes out of the fast tier (./scripts/test --fast)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# Registers the hypothesis profiles `full` and `fast` (--hypothesis-profile).
import raftsched.testing.proptest  # noqa: F401
from raftsched.core import apply, compact, tx
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.memory_store import MemoryStore
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.sink import Sink


# The test being set up, run or torn down (a module's shared cluster starts in
# the setup of its first test).
_current: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current.append(item)
    try:
        return (yield)
    finally:
        _current.pop()


def refuse_unmarked_node_start() -> None:
    """Fail the current test if it starts node processes without the
    integration mark: the fast tier (`-m "not integration"`) must start none."""
    item = _current[-1] if _current else None
    if item is not None and item.get_closest_marker("integration") is None:
        pytest.fail(f"{item.nodeid} starts raftsched node processes (LocalCluster.start) "
                    "but is not marked integration: add @pytest.mark.integration (or "
                    "pytestmark) so that ./scripts/test --fast leaves it out", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _fired_jobs_checked() -> Iterator[None]:
    """Every job a fire writes as its state alone (Tx.put_fired_job) is
    checked, in every test that applies in this process, to have changed
    nothing else; and so is every spec written in the form it came in."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tx, "CHECK_FIRED_STATE_ONLY", True)
        # And every spec a create_jobs_stored carried, to read back from the
        # form it is written in as the spec apply used (core/compact.py).
        patch.setattr(compact, "CHECK_STORED_SPEC", True)
        patch.setattr(compact, "CHECK_HELD_RUN", True)
        patch.setattr(compact, "CHECK_SETTLED_STATE", True)
        patch.setattr(apply, "CHECK_FIRED_STATE", True)
        yield


@pytest.fixture(scope="session", autouse=True)
def _nodes_only_in_integration_tests() -> Iterator[None]:
    start = LocalCluster.start

    def guarded_start(self: LocalCluster, nid: str | None = None) -> None:
        refuse_unmarked_node_start()
        start(self, nid)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalCluster, "start", guarded_start)
        yield


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
        cluster.wait_placed()
        yield cluster
        _dump_logs(cluster)


@pytest.fixture
def fresh_cluster(tmp_path):
    """A 3-node cluster of the test's own, for tests that kill nodes."""
    cluster = LocalCluster(tmp_path / "cluster")
    with cluster:
        cluster.wait_ready()
        cluster.wait_placed()
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
