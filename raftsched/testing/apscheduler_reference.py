"""The in-memory references for a burst: APScheduler 3.x in one Python process.

    python -m raftsched.testing.apscheduler_reference 10000    # prints one JSON object
    python -m raftsched.testing.apscheduler_reference 10000 --post http://127.0.0.1:PORT/hook

N one-off date jobs due on the same second, in memory (MemoryJobStore), in
one of two forms:

- no network (the default): APScheduler's BackgroundScheduler with its
  defaults (ThreadPoolExecutor of 10 threads), each job calling a function
  that records time.time(). No durability, no network, no other process: what
  one Python process does with a burst at all. Trigger lateness is call
  lateness here (the function is the target).
- POST to a sink (--post URL): the same work raftsched does for each run.
  AsyncIOScheduler on uvloop (as the nodes run), each job a coroutine that
  records when it started (its trigger lateness) and POSTs to URL through one
  aiohttp session of --connections keep-alive connections, with the job id,
  scheduled-for and attempt headers raftsched sends, so that the sink
  (testing/fastsink.py) measures its call lateness as it does raftsched's.

One job default is not kept: misfire_grace_time is None instead of 1 s, so a
run later than 1 s still runs and is counted, rather than skipped unseen.

This module is the one that imports apscheduler (the `dev` extra).
"""

from __future__ import annotations

import asyncio
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
        "lateness_ms": _figures(late_ms),
    }


# Keep-alive connections of the POSTing reference's session by default (the
# bare aiohttp loop's, in testing/bench.py).
post_connections_default = 64
# A POST slower than this counts as failed (the sink answers at once).
post_timeout_s = 30.0


async def _measure_post(n: int, url: str, connections: int, lead_s: float | None) -> dict:
    import aiohttp
    import apscheduler
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    started: list[float] = []
    outcome = {"ok": 0, "failed": 0}
    all_done = asyncio.Event()
    due_s = int(time.time() + (lead_s if lead_s is not None
                                else lead_base_s + n * lead_per_job_s)) + 1
    due = dt.datetime.fromtimestamp(due_s, dt.timezone.utc)
    scheduled_for = due.isoformat()
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=post_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def job(job_id: str) -> None:
            started.append(time.time())
            headers = {"X-Raftsched-Job-Id": job_id, "X-Raftsched-Scheduled-For": scheduled_for,
                       "X-Raftsched-Attempt": "1", "Content-Type": "application/json"}
            try:
                async with session.post(url, data=b"{}", headers=headers) as response:
                    await response.read()
                outcome["ok" if response.status == 200 else "failed"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                outcome["failed"] += 1
            if outcome["ok"] + outcome["failed"] >= n:
                all_done.set()

        scheduler = AsyncIOScheduler()
        setup_started = time.monotonic()
        for i in range(n):
            scheduler.add_job(job, "date", run_date=due, args=(f"aps-{i}",),
                              misfire_grace_time=None)
        scheduler.start()
        setup_s = time.monotonic() - setup_started
        adds_finished_after_due = time.time() > due_s
        try:
            await asyncio.wait_for(all_done.wait(), finish_timeout_base_s
                                   + n * finish_timeout_per_job_s
                                   + max(0.0, due_s - time.time()))
            finished = True
        except asyncio.TimeoutError:
            finished = False
        scheduler.shutdown(wait=False)
    late_ms = [(t - due_s) * 1000 for t in started]
    return {
        "jobs": n, "started": len(started), "posted": outcome["ok"],
        "failed": outcome["failed"], "all_called": finished,
        "apscheduler": apscheduler.__version__, "due_s": due_s,
        "conditions": (f"APScheduler {apscheduler.__version__} AsyncIOScheduler on uvloop, "
                       f"MemoryJobStore, AsyncIOExecutor; misfire_grace_time None; each job "
                       f"POSTs through one aiohttp session of {connections} connections; "
                       f"one process, in memory"),
        "setup_s": round(setup_s, 2), "adds_finished_after_due": adds_finished_after_due,
        "trigger_lateness_ms": _figures(late_ms),
    }


def _figures(late_ms: list[float]) -> dict:
    return {"count": len(late_ms),
            "p50": round(_pct(late_ms, 50)) if late_ms else None,
            "p99": round(_pct(late_ms, 99)) if late_ms else None,
            "max": round(max(late_ms)) if late_ms else None}


def measure_post(n: int, url: str, connections: int = post_connections_default,
                 lead_s: float | None = None) -> dict:
    """The burst with each job POSTing to `url`, in this process."""
    import uvloop
    return uvloop.run(_measure_post(n, url, connections, lead_s))


def measure_in_subprocess(n: int, lead_s: float | None = None, post_url: str | None = None,
                          connections: int = post_connections_default) -> dict:
    """measure(n), or measure_post(n, post_url) with a URL, in a fresh Python
    process, so that it shares no GIL (and no loaded state) with the caller;
    the process is killed if it overruns."""
    timeout_s = (2 * (lead_base_s + n * lead_per_job_s) + finish_timeout_base_s
                 + n * finish_timeout_per_job_s + (lead_s or 0) + 30)
    argv = [sys.executable, "-m", "raftsched.testing.apscheduler_reference", str(n)]
    if lead_s is not None:
        argv += ["--lead-s", str(lead_s)]
    if post_url is not None:
        argv += ["--post", post_url, "--connections", str(connections)]
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
    parser.add_argument("--post", default=None, metavar="URL",
                        help="each job POSTs to URL (AsyncIOScheduler, one aiohttp session) "
                             "instead of calling a function")
    parser.add_argument("--connections", type=int, default=post_connections_default,
                        help="with --post: the session's connections (default %(default)s)")
    args = parser.parse_args(argv)
    if args.post is not None:
        figures = measure_post(args.n, args.post, args.connections, args.lead_s)
    else:
        figures = measure(args.n, args.lead_s)
    print(json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
