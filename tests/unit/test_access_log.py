"""The API server's logs keep routes, not the user ids in them: a log outlives every forget."""
import logging

import pytest

from memstream.api.app import RedactedAccessLog, route_of


@pytest.mark.parametrize("path, kept", [
    ("/v1/users/ana%40example.com/memories?cursor=abc", "/v1/users/{user_id}/memories"),
    ("/v1/users/acme:ana", "/v1/users/{user_id}"),
    ("/v1/users?prefix=acme:", "/v1/users"),
    ("/v1/status", "/v1/status"),
])
def test_a_path_is_logged_as_its_route(path, kept):
    assert route_of(path) == kept


def test_uvicorns_access_line_names_no_user():
    line = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", "DELETE", "/v1/users/maria?reason=asked", "1.1", 202), None)
    assert RedactedAccessLog().filter(line) and line.getMessage() == '127.0.0.1:5000 - "DELETE /v1/users/{user_id} HTTP/1.1" 202'


def test_a_user_id_with_a_slash_in_it_is_left_out_whole():
    assert route_of("/v1/users/team/alice@x.com/facts/1234/history") == "/v1/users/{user_id}/facts/1234/history"
    assert route_of("/v1/users/team/alice@x.com") == "/v1/users/{user_id}"
