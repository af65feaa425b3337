"""The producer edge: typed errors, nothing half-written, positions that point at the record."""
from __future__ import annotations

import time

import pytest
from aiokafka import TopicPartition

from memstream.config import Settings
from memstream.schemas import InvalidEvent, TurnRecorded, decode_event
from memstream.streams.log.errors import BrokerUnavailable
from memstream.streams.log.kafka_util import groupless_consumer
from memstream.streams.log.producer import TurnLog
from memstream.streams.log.records import Record

from .helpers import turns

pytestmark = pytest.mark.asyncio


async def end_offsets(settings):
    async with groupless_consumer(settings.kafka_bootstrap) as c:
        tps = [TopicPartition(settings.events_topic, p) for p in range(settings.partitions)]
        return await c.end_offsets(tps)


async def test_a_batch_with_one_invalid_turn_writes_nothing(settings):
    batch = turns(5)
    bad = TurnRecorded.new(user_id="", conversation_id="c", user_message="hi", assistant_message="")
    before = await end_offsets(settings)
    async with TurnLog(settings) as log:
        with pytest.raises(InvalidEvent) as info:
            await log.append_many(batch[:3] + [bad] + batch[3:])
    assert info.value.field == "$.user_id"
    assert await end_offsets(settings) == before


async def test_append_returns_the_position_of_the_acknowledged_record_keyed_by_user(settings):
    turn = turns(1)[0]
    async with TurnLog(settings) as log:
        pos = await log.append(turn)
        same_user = await log.append(TurnRecorded.new(user_id=turn.user_id, conversation_id="c2",
                                                      user_message="again", assistant_message=""))
    assert same_user.partition == pos.partition and same_user.offset == pos.offset + 1
    async with groupless_consumer(settings.kafka_bootstrap) as c:
        tp = TopicPartition(pos.topic, pos.partition)
        c.assign([tp])
        c.seek(tp, pos.offset)
        msg = (await c.getmany(tp, timeout_ms=5000, max_records=1))[tp][0]
    assert msg.key == turn.user_id.encode()
    assert turn.user_message.encode() not in msg.value  # sealed before it left the host
    async with TurnLog(settings) as log:
        [opened] = await log._sealer.open([Record(msg.topic, msg.partition, msg.offset, msg.key, msg.value, (), 0)])
    assert decode_event(opened.value) == turn


async def test_an_unreachable_broker_raises_broker_unavailable():
    settings = Settings(kafka_bootstrap="127.0.0.1:1")
    t = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="127.0.0.1:1"):
        async with TurnLog(settings) as log:
            await log.append(turns(1)[0])
    assert time.monotonic() - t < 30


async def test_a_key_store_that_does_not_answer_is_a_retryable_error_and_nothing_is_sent(settings):
    """The key store is Postgres: while it restarts, sealing cannot reach it. The host is told
    ``KeyStoreUnavailable`` (``Retryable``), not a driver's error, and nothing is appended."""
    from memstream.schemas.errors import Retryable
    from memstream.streams.log.errors import KeyStoreUnavailable

    async with TurnLog(settings) as log:
        await log.append(turns(1)[0])
        before = await end_offsets(settings)
        await log._pool.close()  # as Postgres shutting down leaves it: every connection refused
        with pytest.raises(KeyStoreUnavailable) as info:
            await log.append(TurnRecorded.new(user_id="new-user", conversation_id="c", user_message="hi",
                                              assistant_message=""))
    assert isinstance(info.value, Retryable)
    assert await end_offsets(settings) == before
