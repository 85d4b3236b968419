"""A test that starts node processes without the integration mark fails before any node starts, so the fast tier (`-m "not integration"`) starts none; a marked one gets past the guard."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from raftsched.testing.cluster import LocalCluster


def test_an_unmarked_test_starting_a_cluster_fails_before_a_node_starts(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kw: started.append(argv))
    cluster = LocalCluster(tmp_path)
    with pytest.raises(pytest.fail.Exception,
                       match=r"test_fast_tier.py::test_an_unmarked_test_starting_a_cluster_fails_"
                             r"before_a_node_starts starts raftsched node processes "
                             r"\(LocalCluster.start\) but is not marked integration"):
        with cluster:
            pass
    assert started == []
    assert cluster.procs == {}


@pytest.mark.integration
def test_a_marked_test_gets_past_the_guard(tmp_path, monkeypatch):
    started = []

    def popen(argv, **kw):
        started.append(argv)
        return SimpleNamespace(poll=lambda: 0, wait=lambda timeout=None: 0)   # exited at once

    monkeypatch.setattr(subprocess, "Popen", popen)
    with LocalCluster(tmp_path, nodes=1):
        pass
    assert len(started) == 1
