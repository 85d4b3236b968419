"""A Python client for the raftsched HTTP API, blocking (Client) and asyncio
(AsyncClient), with one method per API operation (docs/client.md)."""

from raftsched.client.aio import AsyncClient
from raftsched.client.errors import (ApiError, BadRequest, CannotConnect, ClusterError, Conflict,
                                     Forbidden, NotFound, QuotaExceeded, RaftschedError,
                                     ServerError, Timeout, Unauthorized, Unavailable, UserError)
from raftsched.client.operations import OPERATIONS, Call
from raftsched.client.sync import Client
from raftsched.client.wire import DEFAULT_URL

__all__ = ["OPERATIONS", "DEFAULT_URL", "ApiError", "AsyncClient", "BadRequest", "Call",
           "CannotConnect", "Client", "ClusterError", "Conflict", "Forbidden", "NotFound",
           "QuotaExceeded", "RaftschedError", "ServerError", "Timeout", "Unauthorized",
           "Unavailable", "UserError"]
