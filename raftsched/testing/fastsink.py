"""A fast HTTP target for benchmarks, in a process of its own.

    python -m raftsched.testing.fastsink      # prints "port N", serves until stdin closes

An aiohttp server on uvloop on 127.0.0.1 that answers every call at once with
200 and no body, keeps connections alive, and records for each call the job
id, scheduled-for and attempt headers and its arrival time (time.time()).
`GET /stats` counts the calls and the distinct jobs; `GET /records` hands the
records over as msgpack. Every other path is a call. It runs in its own
process so that the benchmark that reads it shares no GIL with it: a burst of
calls measures the scheduler, not the sink.

`FastSink` starts one and ends it on every way out: close() and the with-block
terminate it, and the sink exits by itself when its standard input closes,
which happens when the process that started it dies, however it dies.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import select
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

from aiohttp import web

from raftsched.core import codec

# Calls recorded at most (about 100 bytes each): ten times the largest burst
# the benchmark runs. Calls past it are answered and counted as dropped.
records_max_default = 2_500_000
# How long an idle keep-alive connection stays open: longer than any pause
# in a burst, so a dispatcher's connections are opened once.
keepalive_timeout_s = 300.0
# Connections waiting to be accepted: a burst opens hundreds at once, and a
# dropped SYN costs a second (the TCP retransmit) that is not the scheduler's.
listen_backlog = 4096
# How long FastSink waits for the process to say its port, and to exit.
start_timeout_s = 20.0
stop_timeout_s = 5.0


@dataclass(frozen=True)
class SinkRecord:
    job_id: str
    scheduled_for: str          # the X-Raftsched-Scheduled-For header as sent
    attempt: str
    received_s: float           # time.time() when the call arrived

    @property
    def scheduled_s(self) -> float:
        return dt.datetime.fromisoformat(self.scheduled_for.replace("Z", "+00:00")).timestamp()

    @property
    def lateness_s(self) -> float:
        return self.received_s - self.scheduled_s


# --- the sink process -------------------------------------------------------------------

class _Recorder:
    def __init__(self, records_max: int) -> None:
        self.records: list[tuple[str, str, str, float]] = []
        self.jobs: set[str] = set()
        self.records_max = records_max
        self.dropped = 0

    async def call(self, request: web.Request) -> web.Response:
        received_s = time.time()
        headers = request.headers
        if len(self.records) < self.records_max:
            job_id = headers.get("X-Raftsched-Job-Id", "")
            self.records.append((job_id, headers.get("X-Raftsched-Scheduled-For", ""),
                                 headers.get("X-Raftsched-Attempt", ""), received_s))
            self.jobs.add(job_id)
        else:
            self.dropped += 1
        return web.Response(status=200)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"calls": len(self.records), "jobs": len(self.jobs),
                                  "dropped": self.dropped})

    async def dump(self, request: web.Request) -> web.Response:
        return web.Response(body=codec.pack(self.records), content_type="application/msgpack")


async def _serve(records_max: int) -> None:
    recorder = _Recorder(records_max)
    app = web.Application()
    app.router.add_get("/stats", recorder.stats)
    app.router.add_get("/records", recorder.dump)
    app.router.add_route("*", "/{tail:.*}", recorder.call)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=keepalive_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=listen_backlog)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def watch_stdin() -> None:
        sys.stdin.buffer.read()    # returns at EOF: the parent closed it or died
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, name="fastsink-stdin", daemon=True).start()
    port = runner.addresses[0][1]
    print(f"port {port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    import uvloop

    parser = argparse.ArgumentParser(prog="python -m raftsched.testing.fastsink",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records-max", type=int, default=records_max_default)
    args = parser.parse_args(argv)
    uvloop.run(_serve(args.records_max))
    return 0


# --- the benchmark's side -----------------------------------------------------------------

class FastSink:
    """The sink process, seen from the benchmark."""

    kind = ("aiohttp on uvloop in its own process on 127.0.0.1, keep-alive, "
            "answers 200 with no body at once")

    def __init__(self, records_max: int = records_max_default) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "raftsched.testing.fastsink",
             "--records-max", str(records_max)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            self.port = self._read_port()
        except BaseException:
            self.close()
            raise

    def _read_port(self) -> int:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], start_timeout_s)
        line = self._proc.stdout.readline().decode() if ready else ""
        if not line.startswith("port "):
            raise RuntimeError(f"the fast sink did not start (said {line!r}, "
                               f"exit code {self._proc.poll()})")
        return int(line.split()[1])

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def _get(self, path: str, timeout_s: float) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                    timeout=timeout_s) as resp:
            return resp.read()

    def stats(self) -> dict:
        """{"calls": recorded, "jobs": distinct job ids, "dropped": past records_max}."""
        return json.loads(self._get("/stats", 10))

    def records(self) -> list[SinkRecord]:
        return [SinkRecord(*r) for r in codec.unpack(self._get("/records", 120))]

    def by_job(self) -> dict[str, list[SinkRecord]]:
        out: dict[str, list[SinkRecord]] = {}
        for record in self.records():
            out.setdefault(record.job_id, []).append(record)
        return out

    def close(self) -> None:
        """End the process: closing its stdin asks it to stop; SIGKILL if it has not."""
        proc = self._proc
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        try:
            proc.wait(stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(stop_timeout_s)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> "FastSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(main())
