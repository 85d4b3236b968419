"""Instructions one job costs a replica (create, fire, finish), counted by valgrind.

    .venv/bin/python scripts/bench_instructions.py [--jobs 500,1500] [--against REV]

Runs `raftsched bench cost` under valgrind's cachegrind at the two sizes and
prints the instructions per job (raftsched/testing/instructions.py); with
--against, the same for that git revision, from a worktree, first, and the
change. Prints the conditions first and the figures last. Needs valgrind
(apt-get install valgrind); a size of 500 takes about 15 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from raftsched.testing import instructions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", default="500,1500",
                        help="the two sizes of bench cost, smaller first (default 500,1500)")
    parser.add_argument("--against", help="a git revision to measure beside this tree")
    args = parser.parse_args(argv)
    small, large = (int(part) for part in args.jobs.split(","))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True,
                             check=False).stdout.strip() or "valgrind missing"
    print(f"conditions: bench cost {small} and {large} under {version} (cachegrind, no cache "
          f"simulation), one replica in one process, LMDB; cores {os.cpu_count()}, python "
          f"{sys.version.split()[0]}; instruction counts do not depend on the machine's load",
          flush=True)
    results = instructions.measure(small, large, args.against, here)
    labels = ([args.against] if args.against else []) + ["this tree"]
    print(instructions.render(results, labels))


if __name__ == "__main__":
    main()
