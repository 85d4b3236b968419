"""The chaos report keeps the figures of a fault run twice in one chaos run
apart (no node processes)."""

from __future__ import annotations

from raftsched.testing.chaos import Chaos, Report


def _chaos() -> Chaos:
    chaos = object.__new__(Chaos)   # no cluster: only the phase bookkeeping is used
    chaos.phases, chaos.log = [], lambda *args: None
    return chaos


def test_a_scenario_run_again_is_its_own_phase_in_the_report():
    chaos = _chaos()
    for name in ("kill-leader", "partition", "kill-leader", "kill-leader"):
        chaos._phase(name).ended_s = 1.0
    assert [p.label for p in chaos.phases] == ["kill-leader", "partition", "kill-leader#2",
                                               "kill-leader#3"]
    assert [p.name for p in chaos.phases] == ["kill-leader", "partition", "kill-leader",
                                              "kill-leader"]
    lateness = {p.label: {"trigger lateness": (0.01, 0.5, float(i + 1), 10)}
                for i, p in enumerate(chaos.phases)}
    report = Report(seed=1, phases=chaos.phases, acknowledged=0, lost_one_offs=[],
                    lost_occurrences=0, duplicates=0, redelivered=0, stale_accepted=0,
                    stale_refused=0, digests_equal=True, digest_problem="", lateness=lateness)
    text = report.render()
    # Each phase's own figures, under its own line: the first kill-leader's
    # max is 1 s, the second's 3 s, the third's 4 s.
    assert text.index("phase kill-leader ") < text.index("max=   1000 ms") \
        < text.index("phase kill-leader#2") < text.index("max=   3000 ms") \
        < text.index("phase kill-leader#3") < text.index("max=   4000 ms")
