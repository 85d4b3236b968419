"""What one job costs a replica in CPU instructions, counted rather than timed.

`raftsched bench cost N` times apply on one replica; on a shared machine its
figures drift by a third between runs, which hides any change smaller than
that. valgrind's cachegrind counts the instructions a process executes, and
that count does not move with the machine's load. The bench runs at two
sizes, and the difference over the difference in jobs is what one more job
costs: created, fired and finished, with the bench's own per-job work (it
proposes as a trigger would) and without the process's start and fixed costs.
Each run has PYTHONHASHSEED 0, so string hashing, and with it the count, is
the same every time: two runs of one tree agree within 0.01%.

    .venv/bin/python scripts/bench_instructions.py [--jobs 500,1500] [--against REV]
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

_I_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")

Runner = Callable[[str, int], int]
"""runner(source_root, jobs) -> instructions of one `bench cost` process."""


def parse_instructions(report: str) -> int:
    """The instruction count ("I refs") in cachegrind's report."""
    found = _I_REFS.search(report)
    if found is None:
        raise ValueError("no instruction count (I refs) in valgrind's output: "
                         + report.strip()[-300:])
    return int(found.group(1).replace(",", ""))


def valgrind_runner(source_root: str, jobs: int) -> int:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    done = subprocess.run(
        [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, "-m", "raftsched", "bench", "cost", str(jobs)],
        cwd=source_root, env=dict(os.environ, PYTHONPATH=source_root, PYTHONHASHSEED="0"),
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench cost {jobs} under valgrind failed ({done.returncode}): "
                           f"{done.stderr.strip()[-500:]}")
    return parse_instructions(done.stderr)


@dataclass(frozen=True)
class PerJob:
    source: str
    small: int          # jobs of the first run
    large: int          # jobs of the second
    small_instructions: int
    large_instructions: int

    @property
    def instructions(self) -> float:
        """Instructions per job: what the larger run executed beyond the smaller."""
        return (self.large_instructions - self.small_instructions) / (self.large - self.small)


def per_job(source_root: str, small: int, large: int, runner: Runner = valgrind_runner) -> PerJob:
    if not 0 < small < large:
        raise ValueError(f"two sizes, the first smaller: {small}, {large}")
    return PerJob(source_root, small, large, runner(source_root, small),
                  runner(source_root, large))


def measure(small: int, large: int, against: str | None, here: str,
            runner: Runner = valgrind_runner) -> list[PerJob]:
    """This source tree's figure, and the revision `against`'s from a git
    worktree of it, in the same run."""
    results = []
    if against is not None:
        with tempfile.TemporaryDirectory() as tmp:
            tree = os.path.join(tmp, "against")
            subprocess.run(["git", "-C", here, "worktree", "add", "--detach", tree, against],
                           check=True, capture_output=True)
            try:
                results.append(per_job(tree, small, large, runner))
            finally:
                subprocess.run(["git", "-C", here, "worktree", "remove", "--force", tree],
                               check=False, capture_output=True)
    results.append(per_job(here, small, large, runner))
    return results


def render(results: list[PerJob], labels: list[str]) -> str:
    lines = []
    for label, result in zip(labels, results):
        lines.append(f"{label:<24} {result.instructions / 1000:10.1f}K instructions per job "
                     f"(bench cost {result.small}: {result.small_instructions:,}; "
                     f"{result.large}: {result.large_instructions:,})")
    if len(results) == 2:
        before, after = results[0].instructions, results[1].instructions
        lines.append(f"{'change':<24} {(after - before) / before * 100:+10.2f}%")
    return "\n".join(lines)
