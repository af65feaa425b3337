"""The API server's logs keep routes, not the user ids in them: a log outlives every forget."""
import logging

import asyncpg
import pytest

from memstream.api.app import RedactedAccessLog
from memstream.api.middleware import route_of


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


def _refused_row(detail="Failing row contains (ana, my test came back positive)."):
    import asyncpg

    exc = asyncpg.CheckViolationError('new row for relation "episodes" violates check constraint "c"')
    exc.detail = detail
    return exc


@pytest.fixture
def redacting():
    from memstream.projections.redaction import redact_logs

    made = logging.getLogRecordFactory()
    redact_logs()
    redact_logs()  # once is enough, twice the same
    yield
    logging.setLogRecordFactory(made)


def test_a_traceback_logged_anywhere_leaves_out_the_row_the_database_quotes(redacting, caplog):
    refused = _refused_row()
    try:
        try:
            raise refused
        except Exception as exc:
            raise RuntimeError("the batch failed") from exc
    except RuntimeError:
        logging.getLogger("faust.agents").exception("agent crashed")  # a library's logger, too
    written = caplog.text
    assert 'violates check constraint "c"' in written and "the batch failed" in written
    assert "positive" not in written and "DETAIL" not in written
    assert refused.detail.endswith("positive).")  # the error itself is left as it was


def test_an_error_logged_as_an_argument_is_told_without_its_detail(redacting, caplog):
    logging.getLogger("memstream.test").warning("append refused: %s", _refused_row())
    logging.getLogger("memstream.test").warning("refused: %(e)s", {"e": _refused_row()})
    assert caplog.text.count("23514") == 2 and "positive" not in caplog.text


def test_a_retried_database_error_is_told_without_its_detail():
    from memstream.streams.log.errors import as_retryable

    passing = asyncpg.SerializationError("could not serialize access")  # retried, and each retry logged
    passing.detail = "Failing row contains (ana, my test came back positive)."
    assert "positive" not in str(as_retryable(passing))
