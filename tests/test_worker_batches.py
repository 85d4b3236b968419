"""A worker's completion request always fits the node's body limit for completions, whatever output its results carry."""

from __future__ import annotations

import json

from raftsched import limits
from raftsched.runtime.remote_worker import completion_batch


def result(i: int, output_chars: int) -> dict:
    # U+FFFD is what undecodable output becomes; JSON spells it in 6 bytes.
    return {"run_id": f"run_{i:024x}", "attempt": 1, "ok": True, "exit_code": 0, "error": None,
            "retryable": True, "duration_ms": 5,
            "output": {"stdout": "\ufffd" * output_chars, "stderr": "\ufffd" * output_chars,
                       "truncated": {"stdout": 0, "stderr": 0}}}


def test_large_outputs_are_split_to_fit_the_body_limit():
    results = [result(i, limits.output_bytes_max) for i in range(limits.worker_claim_max)]
    batch = completion_batch(results)
    assert 1 <= len(batch) < len(results)
    assert batch == results[:len(batch)]
    assert len(json.dumps({"results": batch})) <= limits.worker_complete_body_bytes_max


def test_small_results_go_up_to_the_count_limit():
    results = [result(i, 10) for i in range(limits.worker_claim_max + 50)]
    assert completion_batch(results) == results[:limits.worker_claim_max]


def test_one_result_over_the_limit_still_goes_alone():
    huge = result(0, limits.worker_complete_body_bytes_max)
    assert completion_batch([huge, result(1, 10)]) == [huge]
