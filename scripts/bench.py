#!/usr/bin/env python3
"""The benchmark of a local cluster; the same as `raftsched bench`.

    .venv/bin/python scripts/bench.py burst 10000 --json burst.json
    .venv/bin/python scripts/bench.py creates 64 --seconds 10
    .venv/bin/python scripts/bench.py footprint 100000,1000000
    .venv/bin/python scripts/bench.py rejoin 1000000
    .venv/bin/python scripts/bench.py idle 60
    .venv/bin/python scripts/bench.py failover 3000

See raftsched/testing/bench.py for what each scenario measures."""

from raftsched.testing.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
