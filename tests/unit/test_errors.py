"""One root, three kinds: what a worker does with a failure is carried by the error's type."""
import asyncio

import asyncpg
import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from memstream.llm.protocols import MalformedOutput
from memstream.projections.commands.core import UnknownReminder
from memstream.projections.facts.core import MissingTarget
from memstream.projections.graph.core import MissingGraphTarget
from memstream.schemas.errors import InvalidEvent, MemstreamError, Refused, Retryable, UnknownEventType
from memstream.streams.log.dead_letter import TooManyDeadLetters
from memstream.streams.log.errors import BrokerUnavailable, Transient, as_retryable, as_retryable_call
from memstream.streams.worker.formation.barrier import ProjectionLagging


def test_each_public_error_has_its_kind_and_still_is_what_it_was():
    for refused, old in ((InvalidEvent, ValueError), (UnknownEventType, ValueError), (MissingTarget, LookupError),
                         (MissingGraphTarget, LookupError), (UnknownReminder, LookupError)):
        assert issubclass(refused, Refused) and issubclass(refused, old)
    for retryable, old in ((BrokerUnavailable, ConnectionError), (MalformedOutput, ValueError),
                           (ProjectionLagging, TimeoutError)):
        assert issubclass(retryable, Retryable) and issubclass(retryable, old)
    assert issubclass(TooManyDeadLetters, MemstreamError) and not issubclass(TooManyDeadLetters, (Retryable, Refused))


@pytest.mark.parametrize("exc", [asyncpg.CannotConnectNowError("recovery"), asyncpg.DeadlockDetectedError("x"),
                                 KafkaConnectionError(), ConnectionResetError(), asyncio.TimeoutError()])
def test_another_librarys_passing_error_becomes_retryable(exc):
    assert isinstance(as_retryable(exc), Transient)


@pytest.mark.parametrize("exc", [KeyError("bug"), asyncpg.UndefinedTableError("schema gone"),
                                 TopicAuthorizationFailedError()])
def test_anything_else_stays_as_it_is_and_stops_the_worker(exc):
    assert as_retryable(exc) is exc


async def test_a_step_failing_on_a_passing_condition_raises_retryable_with_the_original_as_cause():
    class Step:
        name = "s"

        async def process(self, records):
            raise asyncpg.CannotConnectNowError("the database system is in recovery mode")

    with pytest.raises(Transient) as info:
        await as_retryable_call(lambda: Step().process([]))
    assert isinstance(info.value.__cause__, asyncpg.CannotConnectNowError)


def test_what_the_database_refused_is_told_without_the_row_it_quotes():
    from memstream.projections.redaction import refusal

    exc = asyncpg.CheckViolationError('new row for relation "episodes" violates check constraint "c"')
    exc.detail = "Failing row contains (ana, my test came back positive)."
    told = refusal(exc)
    assert "23514" in told and 'constraint "c"' in told and "positive" not in told
