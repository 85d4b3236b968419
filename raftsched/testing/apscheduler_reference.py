"""The in-memory reference for a burst: APScheduler 3.x in one Python process.

    python -m raftsched.testing.apscheduler_reference 10000    # prints one JSON object

N one-off date jobs due on the same second in APScheduler's BackgroundScheduler
with its defaults (MemoryJobStore; ThreadPoolExecutor of 10 threads), each
calling a function that records time.time(). No durability, no network, no
other process: what one Python process does with a burst at all. Trigger
lateness is call lateness here (the function is the target).

One job default is not kept: misfire_grace_time is None instead of 1 s, so a
run later than 1 s still runs and is counted, rather than skipped unseen.

This module is the one that imports apscheduler (the `dev` extra).
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import subprocess
import sys
import threading
import time

# Adding and starting cost APScheduler about 80 us a date job on a 2-core
# machine (7.8 s for 100,000); the due second is set this far ahead so that
# they are done before it, with room for a busy machine. Adds that end after
# it are reported.
lead_base_s = 2.0
lead_per_job_s = 1 / 4000
# How long the runs may take to all happen, past the due second.
finish_timeout_base_s = 60.0
finish_timeout_per_job_s = 1 / 500


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def measure(n: int, lead_s: float | None = None) -> dict:
    """Run the burst in this process; its figures (lateness in ms)."""
    import apscheduler
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.jobstores.memory import MemoryJobStore
    from apscheduler.schedulers.background import BackgroundScheduler

    called: list[float] = []
    lock = threading.Lock()
    all_called = threading.Event()

    def job() -> None:
        with lock:
            called.append(time.time())
            if len(called) >= n:
                all_called.set()

    scheduler = BackgroundScheduler()
    due_s = int(time.time() + (lead_s if lead_s is not None
                                else lead_base_s + n * lead_per_job_s)) + 1
    due = dt.datetime.fromtimestamp(due_s, dt.timezone.utc)
    started = time.monotonic()
    for _ in range(n):
        scheduler.add_job(job, "date", run_date=due, misfire_grace_time=None)
    scheduler.start()
    setup_s = time.monotonic() - started
    adds_finished_after_due = time.time() > due_s
    try:
        finished = all_called.wait(finish_timeout_base_s + n * finish_timeout_per_job_s
                                   + max(0.0, due_s - time.time()))
    finally:
        scheduler.shutdown(wait=True)
    late_ms = [(t - due_s) * 1000 for t in called]
    # The scheduler made its default executor and store when it started.
    pool_size = inspect.signature(ThreadPoolExecutor).parameters["max_workers"].default
    return {
        "jobs": n, "called": len(called), "all_called": finished,
        "apscheduler": apscheduler.__version__,
        "conditions": (f"APScheduler {apscheduler.__version__} BackgroundScheduler, defaults: "
                       f"{MemoryJobStore.__name__}, {ThreadPoolExecutor.__name__} of "
                       f"{pool_size} threads; misfire_grace_time None; "
                       f"one process, in memory, no network"),
        "setup_s": round(setup_s, 2), "adds_finished_after_due": adds_finished_after_due,
        "lateness_ms": {"count": len(late_ms),
                        "p50": round(_pct(late_ms, 50)) if late_ms else None,
                        "p99": round(_pct(late_ms, 99)) if late_ms else None,
                        "max": round(max(late_ms)) if late_ms else None},
    }


def measure_in_subprocess(n: int, lead_s: float | None = None) -> dict:
    """measure(n) in a fresh Python process, so that it shares no GIL (and no
    loaded state) with the caller; the process is killed if it overruns."""
    timeout_s = (2 * (lead_base_s + n * lead_per_job_s) + finish_timeout_base_s
                 + n * finish_timeout_per_job_s + (lead_s or 0) + 30)
    argv = [sys.executable, "-m", "raftsched.testing.apscheduler_reference", str(n)]
    if lead_s is not None:
        argv += ["--lead-s", str(lead_s)]
    # run() kills the child on a timeout and on any exception here.
    done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the APScheduler reference failed ({done.returncode}): "
                           f"{done.stderr.decode(errors='replace')[-2000:]}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m raftsched.testing.apscheduler_reference",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", type=int, help="one-off jobs due on the same second")
    parser.add_argument("--lead-s", type=float, default=None,
                        help="seconds from now to the due second (default: from N)")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.n, args.lead_s)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
