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

```mermaid
{lifecycle.diagram()}```

| from | event | to |
|---|---|---|
{rows}
"""


if __name__ == "__main__":
    (ROOT / "docs" / "lifecycle.md").write_text(render())
    print("wrote docs/lifecycle.md")
