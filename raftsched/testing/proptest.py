"""Hypothesis example counts by test tier: `./scripts/test` runs the `full`
profile, `./scripts/test --fast` the `fast` one (pytest's
`--hypothesis-profile`). A property test states its count for the full tier
as `max_examples=examples(N)`; the fast tier runs a fifth of it, and never
fewer than EXAMPLES_MIN, so that a quick run still tries each property on
varied input while the full suite keeps every test's own count."""

from __future__ import annotations

from hypothesis import settings

# Hypothesis's own default, which the full tier keeps for tests that name no count.
FULL_EXAMPLES = 100
FAST_EXAMPLES = 20
EXAMPLES_MIN = 10

settings.register_profile("full", max_examples=FULL_EXAMPLES)
settings.register_profile("fast", max_examples=FAST_EXAMPLES)


def examples(full: int) -> int:
    """`full` examples under the full profile, proportionally fewer under the
    fast one (read when the test module is imported, after the profile is loaded)."""
    return max(EXAMPLES_MIN, full * settings.default.max_examples // FULL_EXAMPLES)
