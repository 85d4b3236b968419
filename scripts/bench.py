#!/usr/bin/env python3
"""The benchmark of a local cluster; the same as `raftsched bench`.

    .venv/bin/python scripts/bench.py burst 10000 --json burst.json

See raftsched/testing/bench.py for what each scenario measures."""

from raftsched.testing.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
