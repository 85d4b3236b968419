"""A node process freezes what it made at start and collects its young generation less often (runtime/gcpolicy.py); its collections are timed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raftsched import limits


def test_tune_freezes_what_exists_and_raises_the_young_threshold_alone():
    # In a process of its own: the collector is the process's.
    script = ("import gc, json\n"
              "before = gc.get_threshold()\n"
              "from raftsched.runtime import gcpolicy\n"
              "gcpolicy.tune()\n"
              "print(json.dumps([before, gc.get_threshold(), gc.get_freeze_count()]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    before, after, frozen = json.loads(out)
    assert after == [limits.gc_young_threshold, before[1], before[2]]
    assert frozen > 1000   # the modules and all they made


@pytest.mark.integration
def test_a_node_shows_its_collector_tuned_and_timed(shared_cluster):
    for nid in shared_cluster.ids:
        gc_status = shared_cluster.api(nid, "GET", "/v1/node").body["gc"]
        assert gc_status["thresholds"][0] == limits.gc_young_threshold
        assert gc_status["frozen_objects"] > 1000
        assert len(gc_status["collections"]) == len(gc_status["seconds"]) == 3
        # tune() collects once before freezing: a full collection, timed.
        assert gc_status["collections"][2] >= 1
