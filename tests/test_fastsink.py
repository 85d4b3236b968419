"""The benchmark's fast sink answers at once over kept-alive connections, records every call's
job, scheduled time, attempt and arrival, and its process ends however the benchmark ends."""

import http.client
import os
import subprocess
import sys
import time

from raftsched.testing.fastsink import FastSink
from raftsched.testing.http import wait_until


def _gone(pid: int) -> bool:
    """Exited (a zombie left to a parent that does not reap counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_calls_are_answered_on_one_connection_and_recorded():
    with FastSink() as sink:
        conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=5)
        before = time.time()
        sockets = []
        for i in range(3):
            conn.request("POST", "/hook", body=b"{}", headers={
                "X-Raftsched-Job-Id": f"job-{i}", "X-Raftsched-Attempt": str(i + 1),
                "X-Raftsched-Scheduled-For": "2026-01-01T00:00:00Z"})
            response = conn.getresponse()
            assert response.status == 200
            assert response.read() == b""
            sockets.append(conn.sock)
        after = time.time()
        conn.close()
        # Kept alive: the three calls went over the one connection.
        assert sockets[0] is not None
        assert sockets[0] is sockets[1] is sockets[2]
        assert sink.stats() == {"calls": 3, "jobs": 3, "dropped": 0}
        records = sink.records()
        assert [(r.job_id, r.attempt) for r in records] == [("job-0", "1"), ("job-1", "2"),
                                                            ("job-2", "3")]
        assert all(before <= r.received_s <= after for r in records)
        assert records[0].scheduled_s == 1767225600.0
        assert records[0].lateness_s == records[0].received_s - 1767225600.0
        pid = sink.pid
    assert _gone(pid)


def test_calls_past_the_bound_are_answered_and_counted_as_dropped():
    with FastSink(records_max=2) as sink:
        conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=5)
        for _ in range(3):
            conn.request("POST", "/hook", body=b"")
            response = conn.getresponse()
            assert response.status == 200
            response.read()
        conn.close()
        assert sink.stats()["dropped"] == 1
        assert len(sink.records()) == 2


def test_the_sink_ends_when_the_process_that_started_it_is_killed():
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import os, signal\n"
         "from raftsched.testing.fastsink import FastSink\n"
         "sink = FastSink()\n"
         "print(sink.pid, flush=True)\n"
         "os.kill(os.getpid(), signal.SIGKILL)\n"],
        stdout=subprocess.PIPE)
    out, _ = starter.communicate(timeout=30)
    assert starter.returncode == -9
    pid = int(out.split()[0])
    try:
        wait_until(lambda: _gone(pid), 10, "the orphaned sink to exit")
    finally:
        if not _gone(pid):
            os.kill(pid, 9)
