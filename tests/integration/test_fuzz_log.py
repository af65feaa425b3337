"""Fuzzing the log's two doors on the real stack: random bytes and mutated valid records on the
events and ingress topics, among good turns. Each record is dead-lettered with its reason or
applied, exactly as the events' own decoder says it should be, and the worker keeps running (the
records stay below the dead-letter limit). A seed is printed first: ``MEMSTREAM_FUZZ_SEED`` repeats
a run, ``MEMSTREAM_FUZZ_RECORDS`` makes it larger (``make test`` runs a small one).

Before the codec refused JSON nested past Python's recursion limit, one such record (a
``user_message`` of ``[[[[...]]]]``) raised ``RecursionError`` out of the decoder and stopped the
worker on every restart; this test found it."""
from __future__ import annotations

import contextlib
import json
import os
import random
from datetime import datetime, timedelta, timezone

import pytest
from aiokafka import AIOKafkaProducer

from memstream.schemas import InvalidEvent, TurnRecorded, decode_event, encode
from memstream.schemas.codec import check_size
from memstream.schemas.events import EVENT_TYPES

from .conftest import wait_until
from .helpers import every_record

pytestmark = pytest.mark.asyncio
RECORDS = int(os.environ.get("MEMSTREAM_FUZZ_RECORDS", "48"))
# Few keys: each key's letters count toward the dead-letter limit (100 in any 1,000 records) at
# most 10 times, so 6 users and one stranger's key stay below it however many records are fuzzed.
USERS = [f"fz-{i}" for i in range(6)]
BASE = datetime(2026, 3, 1, tzinfo=timezone.utc)
JUNK = [None, 0, -1, 2 ** 70, 1.5, "", "x" * 7, [], {}, [1, [2]], {"a": None}, True, "\u0000", "\ud7ff\ue000",
        "2026-13-45T99:00:00Z", "not-a-uuid", "💥" * 3]
TYPES = [c.__struct_config__.tag for c in EVENT_TYPES] + ["NoSuchEvent"]


def good_turn(rnd: random.Random, n: int) -> TurnRecorded:
    return TurnRecorded.new(user_id=rnd.choice(USERS), conversation_id=f"c{n % 3}",
                            user_message=f"turn {n}: I live in Porto and my cat is Miso",
                            assistant_message="noted", occurred_at=BASE + timedelta(minutes=n))


def mutated(rnd: random.Random, n: int) -> tuple[bytes, bytes | None]:
    """One fuzzed record, ``(key, value)``: from a fresh turn (never sent whole, so whatever of it
    survives decoding is new), or from nothing."""
    t = good_turn(rnd, 10_000 + n)
    raw, key = json.loads(encode(t)), t.user_id.encode()
    kind = rnd.randrange(10)
    if kind == 0:
        return key, rnd.randbytes(rnd.randrange(0, 2000))
    if kind == 1:
        data = encode(t)
        return key, data[:rnd.randrange(len(data))]
    if kind == 2:
        data = bytearray(encode(t))
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        return key, bytes(data)
    if kind == 3:
        for _ in range(rnd.randint(1, 3)):
            field = rnd.choice([*raw, "extra"])
            if rnd.random() < 0.25:
                raw.pop(field, None)
            else:
                raw[field] = rnd.choice(JUNK)
        return key, json.dumps(raw, ensure_ascii=False).encode()
    if kind == 4:
        depth = rnd.choice([64, 2_000, 20_000])
        body = json.dumps(raw, ensure_ascii=False)
        field = rnd.choice(["user_message", "metadata", "nowhere"])
        return key, body[:-1].encode() + f', "{field}": '.encode() + b"[" * depth + b"]" * depth + b"}"
    if kind == 5:
        return rnd.choice([b"someone-else", rnd.choice(USERS).encode()]), encode(t)
    if kind == 6:
        raw["type"], raw["schema_version"] = rnd.choice(TYPES), rnd.choice([0, 1, 2, 3, 99, -1])
        return key, json.dumps(raw, ensure_ascii=False).encode()
    if kind == 7:
        return key, rnd.choice([b"null", b"[]", b"42", b'"TurnRecorded"', b"{}", b"\xff\xfe\x00", b" "])
    if kind == 8:
        raw["user_message"] = "ü" * rnd.choice([99_999, 100_001, 150_000])
        return key, json.dumps(raw, ensure_ascii=False).encode()
    raw["metadata"] = {rnd.choice(["a", "ключ", "\u0000"]): rnd.choice(JUNK) for _ in range(rnd.randint(0, 4))}
    return key, json.dumps(raw, ensure_ascii=False).encode()


def expected(key: bytes, value: bytes, ingress: bool):
    """What the worker must do with the record: ``None`` (dead-letter it) or the event it applies."""
    try:
        event = decode_event(value)
        if ingress:
            check_size(encode(event))
    except InvalidEvent:
        return None
    return event if key == event.user_id.encode() else None


async def test_fuzzed_records_on_both_topics_are_dead_lettered_with_a_reason_or_applied_and_the_worker_goes_on(
        settings, conn, workers):
    seed = int(os.environ.get("MEMSTREAM_FUZZ_SEED", random.SystemRandom().randrange(2 ** 32)))
    print(f"MEMSTREAM_FUZZ_SEED={seed}")
    rnd = random.Random(seed)
    w = workers()
    await w.wait_assigned()
    sent, letters, applied = [], [], []
    for n in range(RECORDS):
        ingress = rnd.random() < 0.5
        topic = settings.ingress_topic if ingress else settings.events_topic
        if n % 4 == 0:
            t = good_turn(rnd, n)
            key, value = t.user_id.encode(), encode(t)
        else:
            key, value = mutated(rnd, n)
        sent.append((topic, key, value))
        event = expected(key, value, ingress)
        (letters if event is None else applied).append(value if event is None else event)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True,
                                max_request_size=2 ** 20)
    await producer.start()
    try:
        for topic, key, value in sent:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()

    turns = {e.event_id for e in applied if isinstance(e, TurnRecorded)}

    async def every_turn_applied():
        assert w.proc.poll() is None, f"the worker stopped (seed {seed}):\n{w.log()[-3000:]}"
        rows = await conn.fetch("SELECT source_event_id FROM episodes")
        return {r[0] for r in rows} == turns

    try:
        await wait_until(every_turn_applied, timeout=120, what=f"the {len(turns)} turns to apply (seed {seed})")
    except AssertionError:
        have = {r[0] for r in await conn.fetch("SELECT source_event_id FROM episodes")}
        missing = [e for e in applied if isinstance(e, TurnRecorded) and e.event_id not in have]
        raise AssertionError(f"seed {seed}: {len(missing)} turns not applied, {len(have - turns)} applied unexpectedly: "
                             f"{[(e.user_id, e.user_message[:40], len(e.user_message), e.metadata) for e in missing]}"
                             f"\n{w.log()[-4000:]}") from None
    async def every_letter_sent():
        return len(await every_record(settings, settings.dead_letter_topic)) >= len(letters)

    with contextlib.suppress(AssertionError):  # compared below, whatever came
        await wait_until(every_letter_sent, timeout=60, interval=0.5, what="the dead letters")
    got = await every_record(settings, settings.dead_letter_topic)
    assert sorted(m.value for m in got) == sorted(letters), (
        f"seed {seed}: {len(got)} records dead-lettered, {len(letters)} should have been")
    for m in got:
        headers = dict(m.headers)
        assert headers["memstream.reason"] and headers["memstream.stage"] in (b"formation", b"sealing"), (seed, headers)
    assert w.proc.poll() is None, f"the worker stopped (seed {seed}):\n{w.log()[-3000:]}"
    assert await conn.fetchval("SELECT count(*) FROM episodes") == len(turns)  # none twice

