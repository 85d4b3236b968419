#!/usr/bin/env python3
"""Write docs/lifecycle.md from the run lifecycle table (raftsched/core/lifecycle.py).

    .venv/bin/python scripts/gen_lifecycle_doc.py

tests/test_runs.py fails when the page and the table disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raftsched.core import lifecycle  # noqa: E402


def render() -> str:
    rows = "\n".join(f"| `{state}` | `{event}` | `{target}` |"
                     for (state, event), target in lifecycle.TRANSITIONS.items())
    created = ", ".join(f"`{s}`" for s in lifecycle.STATES if s in lifecycle.CREATED_STATES)
    terminal = ", ".join(f"`{s}`" for s in lifecycle.STATES if s in lifecycle.TERMINAL)
    return f"""# Run lifecycle

Generated from `raftsched/core/lifecycle.py` by `scripts/gen_lifecycle_doc.py`; do not
edit by hand. What each state means and who moves a run along each edge is in
[execution.md](execution.md).

A run is created in one of {created}. It ends in one of {terminal}.
Any other (state, event) pair is refused with `InvalidTransition`; apply counts
such a report as stale (reports are delivered at least once).

**The lease is taken at fire.** A run a node executes (an HTTP call, a publish,
a command on the default queue) passes `queued -> running` (`start`) in the
very apply that creates or re-queues it (a fire, a retry's due entry, the
queue policy's promotion, a manual trigger, a re-drive, a DAG task's
release): its holder is the owner of its job's shard, its token that shard's
fencing token, and its attempt is open from then. No `start` entry is
proposed; the run is held while its holder holds the shard (its shard lease,
renewed with the node's liveness), however long it waits in the node's queue,
so `running` means "given to a node that will call it". When the shard moves,
its new owner takes the run over (`take_over`: `running -> queued`, and at
once `start` again under the new owner, as the next attempt, same run and
execution id); the old holder's report on the old attempt is refused. A run
created while its shard has no owner stays `queued`, held by nobody, until
the shard's first owner takes it. A run for a remote worker (a named queue)
stays `queued` until a worker claims it (`start`), and keeps its own lease
and heartbeats.

```mermaid
{lifecycle.diagram()}```

| from | event | to |
|---|---|---|
{rows}
"""


if __name__ == "__main__":
    (ROOT / "docs" / "lifecycle.md").write_text(render())
    print("wrote docs/lifecycle.md")
