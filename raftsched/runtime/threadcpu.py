"""CPU seconds of a node's threads by what each does: which of them is busy
when the node's process is.

A node is one process whose threads share one interpreter lock: the event
loop (HTTP, the dispatcher's calls, the trigger, the reporter), the Raft
thread (pysyncobj's ticks, and apply of every entry), the journal flusher
and the digest thread. A process at 100% of a core says nothing of which of
them to look at; this does (GET /v1/node `threads_cpu_s`, the metric
raftsched_thread_cpu_seconds_total, `raftsched bench burst` by phase).

Read from the kernel's accounting of each thread (/proc/self/task/TID/stat,
user and system time, in clock ticks), so a thread's figure is the CPU it
used and not the time it waited for a core or for the interpreter lock.
"other" is the process's CPU less the named threads': executor threads,
snapshot writers, and threads that have ended. Where /proc is not there
(not Linux), no figures are given.
"""

from __future__ import annotations

import os
import time
from typing import Callable

ROLES = ("event_loop", "raft", "journal", "digest")
OTHER = "other"

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu_s(native_id: int) -> float | None:
    """The CPU seconds (user and system) thread `native_id` of this process
    has used, or None if it has ended or the kernel does not say."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The fields after the command name (in parentheses, which may hold
    # spaces): state is the first, utime the 12th and stime the 13th.
    fields = text[text.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


class ThreadCpu:
    """`threads()` names the native thread id of each role (None: not
    started yet); `seconds()` reads them."""

    def __init__(self, threads: Callable[[], dict[str, int | None]]) -> None:
        self._threads = threads

    def seconds(self) -> dict[str, float] | None:
        """CPU seconds of each role and of the rest of the process, since the
        process started; None where the kernel does not account per thread."""
        if not os.path.isdir("/proc/self/task"):
            return None
        out: dict[str, float] = {}
        ids = self._threads()
        for role in ROLES:
            native_id = ids.get(role)
            used = thread_cpu_s(native_id) if native_id is not None else None
            out[role] = round(used or 0.0, 2)
        # The process's clock, read last and finer than the threads' ticks,
        # which the kernel rounds down: "other" is not below 0 for that.
        out[OTHER] = round(max(0.0, time.process_time() - sum(out.values())), 2)
        return out


def percent_between(before: dict[str, float], after: dict[str, float],
                    elapsed_s: float) -> dict[str, float]:
    """Each thread's CPU between two readings of `seconds()` taken `elapsed_s`
    apart, in % of one core. The kernel counts a thread's CPU in ticks (10
    ms): "other", the process less its named threads, may read a tick or two
    lower at the end of an idle interval than at its start; that is 0."""
    return {role: max(0.0, round(100 * (spent - before.get(role, 0.0)) / elapsed_s, 2))
            for role, spent in after.items()}


def rest_of(split: dict[str, float]) -> float:
    """What of `split` (by role) is neither the event loop nor the Raft thread:
    the journal, the digest thread and the rest of the process, as one figure."""
    return round(sum(value for role, value in split.items()
                     if role not in ("event_loop", "raft")), 2)
