"""A node's CPU by thread (runtime/threadcpu.py): the kernel's accounting of
each named thread, and the rest of the process."""

from __future__ import annotations

import os
import threading
import time

import pytest

from raftsched.runtime.threadcpu import (OTHER, ROLES, ThreadCpu, percent_between, rest_of,
                                         thread_cpu_s)
from raftsched.testing.http import wait_until

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="per-thread CPU is read from /proc")


def _spin(cpu_s: float) -> None:
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_a_busy_thread_is_counted_and_a_sleeping_one_is_not():
    ids: dict[str, int | None] = {"event_loop": threading.get_native_id()}
    started, done = threading.Barrier(3), threading.Event()

    def busy() -> None:
        ids["raft"] = threading.get_native_id()
        started.wait()
        _spin(0.3)
        done.wait()

    def idle() -> None:
        ids["digest"] = threading.get_native_id()
        started.wait()
        done.wait()

    threads = [threading.Thread(target=busy), threading.Thread(target=idle)]
    for thread in threads:
        thread.start()
    started.wait()
    cpu = ThreadCpu(lambda: dict(ids))
    before = cpu.seconds()
    wait_until(lambda: cpu.seconds()["raft"] - before["raft"] >= 0.25, timeout_s=30,
               what="the busy thread's CPU counted")
    after = cpu.seconds()
    done.set()
    for thread in threads:
        thread.join()
    assert set(after) == {*ROLES, OTHER}
    assert after["digest"] - before["digest"] <= 0.05, (before, after)
    assert after["journal"] == 0.0   # no such thread: nothing counted
    assert all(spent >= 0.0 for spent in after.values()), after
    # The process's CPU is at least what its named threads used.
    assert time.process_time() >= sum(after[role] for role in ROLES) - 0.02


def test_an_ended_thread_reads_as_unknown():
    ids: list[int] = []
    thread = threading.Thread(target=lambda: ids.append(threading.get_native_id()))
    thread.start()
    thread.join()
    assert thread_cpu_s(threading.get_native_id()) is not None
    wait_until(lambda: thread_cpu_s(ids[0]) is None, timeout_s=10,
               what="the ended thread gone from /proc")


def test_each_threads_share_of_a_core_between_two_readings():
    before = {"event_loop": 2.0, "raft": 1.0, "other": 0.5}
    after = {"event_loop": 2.1, "raft": 1.3, "other": 0.49}
    # 0.3 s of the Raft thread over 10 s is 3% of a core; "other" a tick lower
    # at the end (the kernel's rounding) is 0, not below.
    assert percent_between(before, after, 10.0) == {"event_loop": 1.0, "raft": 3.0,
                                                     "other": 0.0}
    # What is neither the loop nor the Raft thread, as one figure.
    assert rest_of({"event_loop": 1.0, "raft": 3.0, "journal": 0.25, "digest": 0.0,
                    "other": 0.5}) == 0.75
