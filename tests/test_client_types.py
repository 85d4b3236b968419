"""The client's types are the server's shapes: its job bodies have the members of the Structs the API checks bodies against, and its answers the members the OpenAPI document gives."""

from __future__ import annotations

import typing

import pytest

from raftsched.api import openapi
from raftsched.client import types
from raftsched.core import spec

SCHEMAS = openapi.document()["components"]["schemas"]


def test_the_job_bodies_have_the_members_of_their_structs():
    assert set(typing.get_type_hints(types.JobBody)) == spec.members(spec.JobCreate)
    assert set(typing.get_type_hints(types.JobPatchBody)) == spec.members(spec.JobPatch)


@pytest.mark.parametrize("client, documented", [
    (types.Problem, "Problem"), (types.Job, "Job"), (types.Run, "Run"),
    (types.Backfill, "Backfill"), (types.Token, "TokenCreated"),
])
def test_the_answers_have_the_documented_members(client, documented):
    assert set(typing.get_type_hints(client)) == set(SCHEMAS[documented]["properties"])
