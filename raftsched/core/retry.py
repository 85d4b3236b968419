"""Retry policy: which failures are retried, and how long to wait first.

Pure: the random draw is passed in. The proposer of a failed attempt (the
node that received the report, or the reaper) draws the delay and carries it
in the command, so apply stays deterministic.

Exponential backoff uses full jitter: the delay before attempt k+1 is uniform
in [0, min(max_s, base_s * 2^k)], which spreads a crowd of runs that failed
together (one target down for everyone) instead of retrying them in lockstep.
Fixed backoff waits exactly base_s.
"""

from __future__ import annotations

from typing import Callable

DEFAULT_POLICY = {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0, "max_s": 60.0,
                  "non_retryable_exit_codes": []}


def policy_of(spec_retry: dict | None) -> dict:
    """The stored retry member with defaults filled in (older records lack some)."""
    return {**DEFAULT_POLICY, **(spec_retry or {})}


def delay_bound_ms(policy: dict, attempt: int) -> int:
    """The longest wait before attempt `attempt + 1` (attempt counts from 1)."""
    assert attempt >= 1
    if policy["backoff"] == "fixed":
        return int(policy["base_s"] * 1000)
    assert policy["backoff"] == "exponential", policy
    exponent = min(attempt, 1000)   # attempts are at most 100; 2.0 ** 1024 overflows
    return int(min(policy["max_s"], policy["base_s"] * 2.0 ** exponent) * 1000)


def draw_delay_ms(policy: dict, attempt: int, uniform: Callable[[], float]) -> int:
    """`uniform()` returns a float in [0, 1): random.random, or a fixed value in tests."""
    bound = delay_bound_ms(policy, attempt)
    if policy["backoff"] == "fixed":
        return bound
    return int(uniform() * (bound + 1)) if bound else 0


def http_status_retryable(status: int) -> bool:
    """4xx means the request itself is wrong, and will be wrong again, except
    408 (request timeout) and 429 (too many requests), which say "later"."""
    return not (400 <= status < 500) or status in (408, 429)
