"""The test sink: a closed sink answers nothing, not even on a connection a
caller kept alive, so that a later sink on the same port gets every call
meant for it."""

from __future__ import annotations

import http.client

import pytest

from raftsched.testing.sink import Sink


def test_a_closed_sink_closes_the_connections_kept_alive_to_it():
    sink = Sink(status_for=lambda call: 500)
    port = sink._server.server_address[1]
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        kept.request("POST", "/hook", body=b"{}")
        answer = kept.getresponse()
        answer.read()
        assert answer.status == 500
        sink.close()
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            kept.request("POST", "/hook", body=b"{}")
            kept.getresponse()
    finally:
        kept.close()
    assert len(sink.calls) == 1
