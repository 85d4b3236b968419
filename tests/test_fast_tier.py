"""A test that starts node processes without the integration mark fails before any node starts, so the fast tier (`-m "not integration"`) starts none."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py").read_text()

INNER = '''
import pytest
from raftsched.testing.cluster import LocalCluster

def test_unmarked(tmp_path):
    cluster = LocalCluster(tmp_path)
    with cluster:
        pass
    assert cluster.procs == {}

@pytest.mark.integration
def test_marked_gets_past_the_guard(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda argv, **kw: started.append(argv))
    monkeypatch.setattr(LocalCluster, "close", lambda self: None)
    with LocalCluster(tmp_path, nodes=1):
        pass
    assert len(started) == 1
'''


def test_an_unmarked_test_starting_a_cluster_fails_and_a_marked_one_does_not(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
                     "markers =\n    integration: starts real node processes\n")
    pytester.makepyfile(test_inner=INNER)
    # In a process of its own: this test's own guard is in force in this one.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked starts raftsched node processes "
                                 "(LocalCluster.start) but is not marked integration*"])
