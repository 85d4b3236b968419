"""The answers the views build have their declared shapes (api/answers.py): every member declared, of its declared type, the required ones present; the fast tier's check beside the schemathesis test's."""

from __future__ import annotations

import copy

from raftsched.api import answers, openapi
from raftsched.core import spec
from raftsched.testing.inprocess import ReplicaPort, api_client


def assert_shaped(answer: dict, shape: type) -> None:
    assert set(answer) <= spec.members(shape), set(answer) - spec.members(shape)
    spec.check_shape(answer, shape)   # raises naming the member that is not as declared


async def test_jobs_runs_and_problems_are_as_declared():
    async with api_client(ReplicaPort()) as client:
        shown = 0
        for example in openapi.JOB_EXAMPLES:
            created = await client.post("/v1/jobs", json=copy.deepcopy(example))
            if created.status == 403:   # command targets: not granted on this port
                continue
            job = await created.json()
            assert created.status == 201, job
            assert_shaped(job, answers.Job)
            paused = await client.post(f"/v1/jobs/{job['job_id']}:pause", json={"note": "n"})
            assert_shaped(await paused.json(), answers.Job)
            shown += 1
        assert shown >= 3
        triggered = await client.post(f"/v1/jobs/{job['job_id']}:trigger", json={})
        run = await triggered.json()
        assert triggered.status == 201, run
        assert_shaped(run, answers.Run)
        refused = await client.post("/v1/jobs", json={"colour": "blue"})
        assert refused.status == 400
        assert_shaped(await refused.json(content_type=None), answers.Problem)
