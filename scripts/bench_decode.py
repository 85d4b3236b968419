"""What decoding and checking a create_jobs entry costs, per job, on a replica.

    .venv/bin/python scripts/bench_decode.py [--jobs 250] [--repeat 5]

Builds one entry of N cron jobs with HTTP targets (each spec as the API
validated it, core/jobspec.validate_create), as create_jobs, as
create_jobs_compact (level 5) and as create_jobs_stored (level 6: what a node
proposes once every node applies it), and one entry of N one-offs (each its
own `run_at`, one HTTP target) as create_jobs_stored; encodes each as a node
proposes it, and times core/commands.decode of it (what every replica does
before apply), best of --repeat, in microseconds per job. Prints the
conditions first (jobs, cores, python, msgspec) and the figures last.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

import msgspec

from raftsched.api.ids import JobIds
from raftsched.core import commands, jobspec, keys
from raftsched.core.schedule import next_fire_ms

SHARDS = 256


def entry(jobs: int, compact: bool = False, stored: bool = False,
          one_offs: bool = False) -> bytes:
    ids = JobIds()
    items = []
    for i in range(jobs):
        spec = jobspec.validate_create({
            "run_at": f"2030-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "target": {"type": "http", "url": "https://hooks.example.com/remind"}
        } if one_offs else {
            "name": f"report-{i}", "schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Paris"},
            "target": {"type": "http", "url": f"https://hooks.example.com/jobs/{i}"}})["spec"]
        job_id = ids.next()
        items.append(commands.create_job_item(
            job_id=job_id, spec=spec, idempotency_key=None, shard=keys.shard_of(job_id, SHARDS),
            next_ms=next_fire_ms(spec["schedule"], 1_796_000_000_000)))
    return commands.encode(commands.create_jobs(tenant="default", at_ms=1_796_000_000_000,
                                                items=items, compact=compact, stored=stored))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=250)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    entries = {"create_jobs": entry(args.jobs),
               "create_jobs_compact": entry(args.jobs, compact=True),
               "create_jobs_stored": entry(args.jobs, stored=True),
               "create_jobs_stored, one-offs": entry(args.jobs, stored=True, one_offs=True)}
    print(f"conditions: one entry of {args.jobs} cron jobs with HTTP targets, each of its "
          f"own URL, in three forms, and one of {args.jobs} one-offs (their own run_at, one "
          f"HTTP target); cores {os.cpu_count()}, python {sys.version.split()[0]}, "
          f"msgspec {msgspec.__version__}")
    for name, payload in entries.items():
        assert len(commands.decode(payload).items) == args.jobs
        number = 20
        best = min(timeit.repeat(lambda: commands.decode(payload), number=number,
                                 repeat=args.repeat))
        print(f"{name}: decode and shape check {best / number / args.jobs * 1e6:.2f} us "
              f"per job, {len(payload) / args.jobs:.0f} bytes per job (best of {args.repeat})")


if __name__ == "__main__":
    main()
