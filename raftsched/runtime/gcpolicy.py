"""The cyclic garbage collector of a node process: timed, and tuned once the
node has started.

Reference counting frees almost everything a node makes (records, commands,
answers); the cyclic collector is for the rest (asyncio tasks and futures,
exceptions and their tracebacks). With CPython's defaults (a young
collection every 700 allocations, an older one every 10 of those) a node
spent about a quarter of its CPU in the collector during a burst of 20,000
runs, most of it in full collections of about 90 ms each, every one of them
scanning the modules, the HTTP application and everything else made at start,
which live as long as the process (docs/benchmarks.md, "The cyclic garbage
collector"). So once a node has started (`tune`):

- what exists then is frozen (`gc.freeze`): never scanned again, and never
  freed by the collector (it lives as long as the process anyway);
- the young generation is collected every `limits.gc_young_threshold`
  allocations: short-lived cycles die young, and far fewer objects reach the
  older generations, whose thresholds stay CPython's.

The collector runs in whichever thread allocates (the event loop or the Raft
thread) and holds the GIL meanwhile: `GcTimes` measures every collection, by
generation, for GET /v1/node (`gc`) and the metrics.
"""

from __future__ import annotations

import gc
import threading
import time

from raftsched import limits

GENERATIONS = 3


class GcTimes:
    """Collections and the CPU seconds they took, by generation, since installed."""

    def __init__(self) -> None:
        self.collections = [0] * GENERATIONS
        self.seconds = [0.0] * GENERATIONS
        self._started: dict[int, float] = {}

    def _callback(self, phase: str, info: dict) -> None:
        # Called by the collector itself, with the GIL held, in the thread it
        # runs in: per thread, a start and its stop are adjacent, and the
        # thread's CPU clock counts the collection's CPU alone (a wall clock
        # would count the time the process waited for a core too).
        now = time.thread_time()
        ident = threading.get_ident()
        if phase == "start":
            self._started[ident] = now
            return
        started = self._started.pop(ident, None)
        generation = info.get("generation", GENERATIONS - 1)
        if started is None or not 0 <= generation < GENERATIONS:
            return
        self.collections[generation] += 1
        self.seconds[generation] += now - started

    def status(self) -> dict:
        return {"collections": list(self.collections),
                "seconds": [round(s, 3) for s in self.seconds],
                "frozen_objects": _frozen,
                "thresholds": list(gc.get_threshold())}


_times: GcTimes | None = None
_lock = threading.Lock()
# Objects tune() froze: counted once there, since gc.get_freeze_count() walks
# every frozen object (half a millisecond for a node's 50,000), and GET
# /v1/node, which the peers ask every second or so, shows it.
_frozen = 0


def times() -> GcTimes:
    """This process's collection times (one measure per process, however
    many nodes it holds: the collector is the process's)."""
    global _times
    with _lock:
        if _times is None:
            _times = GcTimes()
            gc.callbacks.append(_times._callback)
        return _times


def tune(young_threshold: int = limits.gc_young_threshold) -> None:
    """Freeze what exists and collect the young generation less often: for a
    node process, once it has started (raftsched/server.py)."""
    global _frozen
    gc.collect()   # what start left as garbage goes, rather than being frozen
    gc.freeze()
    _frozen = gc.get_freeze_count()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, older, oldest)
