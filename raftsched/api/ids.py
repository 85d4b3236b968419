"""Job ids in the order they are made.

A job id is "job_" and 20 hex digits: the milliseconds since the epoch when
the node took the create (11 digits, to the year 2527), a tag drawn at
random when the process starts (5 digits), and a count within the
millisecond (4 digits). Every table whose key starts with a job id (jobs, a
tenant's jobs, a job's runs: keys.run_id) then takes a batch's jobs side by
side at its end, where random ids wrote one B-tree page each, all over the
table: a create's and a run's LMDB writes touch a few pages, not one per
job, and a table grows with full pages (docs/benchmarks.md, "Job ids in
the order they are made").

An id is unique without coordination: within a process the ids only grow
(a clock that steps back keeps the last millisecond and counts on; a count
past 0xffff takes the next millisecond); between processes they differ by
the tag (a forked child draws its own), and two processes that drew the same tag (one chance in 2**20 for
a pair) collide only on the same millisecond and count. Apply refuses a
create whose id exists (409 `conflict`), so even then nothing is
overwritten.

The id says when the job was created, to the millisecond, to whoever may
read the job. It is no secret and no credential: every read of a job is
checked against the caller's tenant (api/auth.py).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Callable

_TAG_BITS, _COUNT_BITS = 20, 16
_COUNT_MAX = (1 << _COUNT_BITS) - 1


class JobIds:
    """A source of job ids that only grow (thread-safe: batchCreate checks
    its jobs on worker threads)."""

    def __init__(self, tag: int | None = None,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self._tag = secrets.randbits(_TAG_BITS) if tag is None else tag
        assert 0 <= self._tag < 1 << _TAG_BITS, tag
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._ms = self._count = -1

    def redraw(self) -> None:
        """A new tag (and lock): a forked child would otherwise make its
        parent's ids on the same milliseconds."""
        self._tag = secrets.randbits(_TAG_BITS)
        self._lock = threading.Lock()

    def next(self) -> str:
        return self.block(1)[0]

    def block(self, n: int) -> list[str]:
        """`n` ids that follow one another (1 <= n <= 65,536), drawn at once:
        a batch's jobs, checked while another batch's are (the event loop
        takes turns), would otherwise draw ids between each other's, and the
        tables keyed by job id would take the second batch in the middle of
        the first."""
        assert 1 <= n <= _COUNT_MAX + 1, n
        with self._lock:
            ms = self._clock_ms()
            if ms > self._ms:
                self._ms, first = ms, 0
            elif self._count + n <= _COUNT_MAX:
                first = self._count + 1
            else:   # the millisecond cannot hold them (or a clock stepped back): the next one
                self._ms, first = self._ms + 1, 0
            self._count = first + n - 1
            head = f"job_{self._ms:011x}{self._tag:05x}"
        return [f"{head}{count:04x}" for count in range(first, first + n)]


# One source per process: the ids of every node app in it grow together.
_IDS = JobIds()
os.register_at_fork(after_in_child=_IDS.redraw)


def new_job_id() -> str:
    return _IDS.next()


def new_job_ids(n: int) -> list[str]:
    """`n` ids that follow one another (JobIds.block)."""
    return _IDS.block(n)
