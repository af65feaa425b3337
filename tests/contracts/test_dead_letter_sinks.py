"""The ``DeadLetterSink`` contract (``streams/log/dead_letter.py``) against the live sink,
``DeadLetters`` (the dead-letter topic, on the local stack's Kafka), and replay's,
``SkippedLetters`` (counted and logged: replay never sends a letter twice)."""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.streams.log.dead_letter import DeadLetters, DeadLetterSink, InputRefused, TooManyDeadLetters
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.records import Record
from memstream.streams.ops.replay import SkippedLetters


def letter(n: int, stage: str = "facts", reason: str = "database refused it: invalid byte sequence",
           value: bytes | None = b'{"type": "FactAdded"}', key: bytes = b"ana") -> tuple[Record, str, str]:
    rec = Record("contract.decisions", n % 2, n, key, value, (("traceparent", b"00-%d" % n),), 1_767_000_000_000 + n)
    return rec, stage, reason


def accounts(letters) -> Counter:
    return Counter((rec.where, stage, reason) for rec, stage, reason in letters)


class DeadLetterSinkContract:
    """The behaviour, once; a subclass makes sinks and reads back what they accounted for."""

    stops_past_limit: bool  # whether the sink has a rate limit (``TooManyDeadLetters``)

    async def sink(self, max_per_1000: int = 1000) -> DeadLetterSink:
        raise NotImplementedError

    async def accounted(self) -> Counter:
        """``(record.where, stage, reason)`` of every letter this test's sinks accounted for."""
        raise NotImplementedError

    async def test_sending_no_letters_accounts_for_nothing(self):
        sink = await self.sink()
        await sink.send([])
        assert await self.accounted() == Counter()

    async def test_every_letter_of_a_call_is_accounted_for_once(self):
        sent = [letter(0, "episodes", "undecodable decision: $.type: unknown"), letter(1, value=None),
                letter(2, "formation", "the turn's user_id is not its key — ünïcode and all")]
        sink = await self.sink()
        await sink.send(sent)
        assert await self.accounted() == accounts(sent)

    async def test_a_call_accounts_only_for_its_own_letters_and_a_record_sent_again_is_another_letter(self):
        first, second = [letter(0), letter(1)], [letter(1), letter(2, "graph")]
        sink = await self.sink()
        await sink.send(first)
        await sink.send(second)
        assert await self.accounted() == accounts(first + second)

    async def test_observed_records_are_no_letters(self):
        sink = await self.sink()
        sink.observe(500)
        await sink.send([letter(0)])
        sink.observe(7)
        assert await self.accounted() == accounts([letter(0)])

    async def test_a_send_past_the_rate_limit_accounts_for_its_letters_before_it_stops(self):
        sent = [letter(n, key=b"user-%d" % n) for n in range(3)]  # a bad deploy: everyone's records refused
        sink = await self.sink(max_per_1000=2)
        sink.observe(10)
        if self.stops_past_limit:
            with pytest.raises(TooManyDeadLetters):
                await sink.send(sent)
        else:
            await sink.send(sent)
        assert await self.accounted() == accounts(sent)

    async def test_one_users_letters_alone_never_stop_it(self):
        """However many of one key: their input, not a bad deploy (a stranger must not stop it)."""
        sent = [letter(n) for n in range(30)]
        sink = await self.sink(max_per_1000=20)
        await sink.send(sent)
        assert await self.accounted() == accounts(sent)

    async def test_letters_of_input_our_rules_refuse_never_stop_it(self):
        """However many: a user's commands naming what they do not have are theirs, not a bad deploy."""
        theirs = [letter(n, key=b"user-%d" % n, reason=InputRefused(f"reminder {n} was never scheduled for this user"))
                  for n in range(5)]
        sink = await self.sink(max_per_1000=2)
        await sink.send(theirs)
        assert await self.accounted() == accounts(theirs)


class TestDeadLetters(DeadLetterSinkContract):
    stops_past_limit = True

    @pytest.fixture(autouse=True)
    async def _topic(self, stack):
        self._bootstrap, self._topic = stack.kafka.address, f"contract.{uuid.uuid4().hex[:10]}.dead-letter"
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap, request_timeout_ms=15000)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self._topic, 1, 1)])
            # A new partition refuses produce requests until it has a leader.
            while not all(p["leader"] >= 0 for p in (await admin.describe_topics([self._topic]))[0]["partitions"]):
                await asyncio.sleep(0.05)
            self._producer = idempotent_producer(self._bootstrap)
            await self._producer.start()
            try:
                yield
            finally:
                await self._producer.stop()
                await admin.delete_topics([self._topic])
        finally:
            await admin.close()

    async def sink(self, max_per_1000=1000):
        return DeadLetters(self._producer, self._topic, max_per_1000)

    async def messages(self) -> list:
        # From the start by offset reset: a seek before the consumer has the new topic's metadata never fetches.
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(self._topic, 0)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]  # send returned: every letter is below it
            out: list = []
            async with asyncio.timeout(30):
                while len(out) < end:
                    out += (await consumer.getmany(tp, timeout_ms=1000)).get(tp, [])
            return out
        finally:
            await asyncio.sleep(0)  # see kafka_util.groupless_consumer: lets aiokafka's bookkeeping task start
            await consumer.stop()

    async def accounted(self):
        return Counter(tuple(dict(m.headers)[h].decode() for h in ("memstream.source", "memstream.stage",
                                                                     "memstream.reason"))
                       for m in await self.messages())

    async def test_a_letter_keeps_the_records_key_value_and_headers(self):
        rec, stage, reason = letter(4, value=b"\xff not json")
        await (await self.sink()).send([(rec, stage, reason)])
        (m,) = await self.messages()
        assert (m.key, m.value) == (rec.key, rec.value)
        assert list(m.headers)[:len(rec.headers)] == list(rec.headers)


class TestSkippedLetters(DeadLetterSinkContract):
    stops_past_limit = False  # replay skips whatever the live worker dead-lettered, however many

    @pytest.fixture(autouse=True)
    def _logged(self, caplog):
        caplog.set_level(logging.DEBUG, logger="memstream.replay")
        self._caplog, self._sinks = caplog, []

    async def sink(self, max_per_1000=1000):
        self._sinks.append(SkippedLetters())
        return self._sinks[-1]

    async def accounted(self):
        logged = Counter(tuple(r.args) for r in self._caplog.records if r.msg.startswith("why replay skipped"))
        warned = [r for r in self._caplog.records if r.msg.startswith("replay skipped")]
        assert sum(s.count for s in self._sinks) == logged.total() == len(warned)  # counted as often as logged
        assert all(r.levelno == logging.WARNING and len(r.args) == 2 for r in warned)  # the reason below it
        return logged
