"""Growing the log from 4 to 8 partitions on the real stack while turns flow, from TurnLog and
from a plain client through the ingress topic: no turn lost, each user's records in order on
the new topics, the workers moved over by themselves, and a replay of the new topics equal to
the live schema."""
from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from datetime import timedelta

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

pytestmark = pytest.mark.asyncio

TURNLOG_USERS, INGRESS_USERS = 6, 2
# ~40 turns/s at most, and never more than AHEAD turns past what the workers have stored: at a
# fixed ~80, near what one worker here forms while the copy runs, a worker that fell behind once
# never caught up, and the move waited out its whole drain timeout before fencing. A slower CPU
# forms fewer, so the feed follows the workers (AHEAD turns stay well under the move's slack).
PAUSE_S, AHEAD = 0.2, 40


async def test_the_log_grows_from_4_to_8_partitions_while_turns_flow_keeping_each_users_order(
        settings, conn, dsn, workers, forbid_llm_and_embedder, monkeypatch, caplog):
    from memstream.projections.compare import TABLES, diff_counts
    from memstream.projections.db import create_pool, drop_schema
    import uuid

    from memstream.schemas import MemoriesUsed, PersonIdentitySet, TurnRecorded
    from memstream.schemas.events import new_event_id
    from memstream.keys import data_keys
    from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
    from memstream.streams.log.log_topics import live_log
    from memstream.streams.ops import partition_growth
    from memstream.streams.ops.partition_growth import grow_partitions
    from memstream.streams.log.producer import TurnLog
    from memstream.streams.ops.replay import replay
    from memstream.streams.log.sealing import RecordSealer

    from .conftest import wait_until
    from .helpers import BASE

    caplog.set_level("INFO", logger="memstream.streams")
    w = workers()
    await w.wait_assigned()
    sent: dict[str, list[int]] = defaultdict(list)  # user -> sequence numbers, in append order
    stop = asyncio.Event()
    used = uuid.uuid4()  # a fact the host says it used, before the move and after it
    stored = [0]  # episodes the workers have stored, looked at on a connection of its own

    async def watch_stored() -> None:
        watcher = await asyncpg.connect(dsn, server_settings={"search_path": settings.postgres_schema})
        try:
            while not stop.is_set():
                stored[0] = await watcher.fetchval("SELECT count(*) FROM episodes")
                await asyncio.sleep(0.1)
        finally:
            await watcher.close()

    async def paced() -> None:
        await asyncio.sleep(PAUSE_S)
        while sum(len(v) for v in sent.values()) - stored[0] > AHEAD and not stop.is_set():
            await asyncio.sleep(0.05)

    def turn(user: str, seq: int) -> TurnRecorded:
        return TurnRecorded.new(user_id=user, conversation_id=f"c-{user}", user_message=f"{user} says #{seq}",
                                assistant_message="ok", occurred_at=BASE + timedelta(seconds=seq))

    async def through_turnlog(log: TurnLog) -> None:
        seq = 0
        while not stop.is_set():
            batch = [turn(f"g-user-{u}", seq) for u in range(TURNLOG_USERS)]
            await log.append_many(batch)
            for u in range(TURNLOG_USERS):
                sent[f"g-user-{u}"].append(seq)
            seq += 1
            await paced()

    async def through_ingress() -> None:  # a host in another language: plain JSON, its own partitioner
        kcat = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
        await kcat.start()
        try:
            seq = 0
            while not stop.is_set():
                for u in range(INGRESS_USERS):
                    user = f"g-plain-{u}"
                    await kcat.send_and_wait(settings.ingress_topic, json.dumps({
                        "type": "TurnRecorded", "event_id": str(new_event_id()), "user_id": user,
                        "conversation_id": f"c-{user}", "occurred_at": (BASE + timedelta(seconds=seq)).isoformat(),
                        "user_message": f"{user} says #{seq}", "assistant_message": "ok"}).encode(), key=user.encode())
                    sent[user].append(seq)
                seq += 1
                await paced()
        finally:
            await kcat.stop()

    async with TurnLog(settings) as log:
        flows = [asyncio.ensure_future(f) for f in (through_turnlog(log), through_ingress(), watch_stored())]
        await asyncio.sleep(3)
        # Who g-user-0 is, stated late on the old partition; restated after the move, on the new one
        # (identity statements are ordered by their offset: the move maps them onto the new partition).
        await log.append(PersonIdentitySet(event_id=new_event_id(), user_id="g-user-0",
                                           attributes={"name": "Before"}, occurred_at=BASE))
        await log.append(MemoriesUsed(event_id=new_event_id(), user_id="g-user-0", fact_ids=[used], occurred_at=BASE))
        # A first run dies after writing a batch and before recording it: the second resumes.
        checkpoint, calls = partition_growth._Copy._checkpoint, [0]

        async def dies_on_the_third(self, pool, identities):
            calls[0] += 1
            if calls[0] == 3:
                raise ConnectionResetError("killed")
            await checkpoint(self, pool, identities)

        monkeypatch.setattr(partition_growth._Copy, "_checkpoint", dies_on_the_third)
        with pytest.raises(ConnectionResetError):
            await grow_partitions(settings, dsn, 8)
        monkeypatch.setattr(partition_growth._Copy, "_checkpoint", checkpoint)
        assert (await live_log(settings, conn)).events_topic == settings.events_topic  # still copying
        report = await grow_partitions(settings, dsn, 8, drain_timeout_s=120)
        await asyncio.sleep(2)
        await log.append(PersonIdentitySet(event_id=new_event_id(), user_id="g-user-0",
                                           attributes={"name": "After"}, occurred_at=BASE))
        # Counted, though its offset on the new partition is below the one the first use had on the old.
        await log.append(MemoriesUsed(event_id=new_event_id(), user_id="g-user-0", fact_ids=[used], occurred_at=BASE))
        await asyncio.sleep(1)
        stop.set()
        await asyncio.gather(*flows)

    live = await live_log(settings, conn)
    assert live.events_topic == f"{settings.events_topic}.p8" and report.partitions == 8
    assert report.copied[settings.events_topic] > 0 and report.copied[settings.decisions_topic] > 0
    assert "the log moved: appending to" in caplog.text  # the append that met the fence went on, on the new topic
    from aiokafka.admin import AIOKafkaAdminClient
    from memstream.streams.log.topics import dynamic_configs as _dynamic_configs

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:  # fenced, and still kept forever: the fence must not reset the topic's own configs
        for topic in (settings.events_topic, settings.decisions_topic):
            assert (await _dynamic_configs(admin, topic)) == {"retention.ms": "-1", "retention.bytes": "-1",
                                                              "max.message.bytes": "0"}, topic
    finally:
        await admin.close()
    total = sum(len(v) for v in sent.values())
    try:
        await wait_until(lambda: conn.fetchval("SELECT count(*) = $1 FROM episodes", total), timeout=120,
                         what=f"{total} episodes")
    except AssertionError:
        from memstream.streams.ops.status import pipeline_status

        report = await pipeline_status(live, dsn)
        raise AssertionError(f"{await conn.fetchval('SELECT count(*) FROM episodes')} of {total} episodes; lagging: "
                             f"{[p for p in report.positions if p.lag]}\n{w.log()[-4000:]}") from None
    assert "restarting on the new topics" in w.log()
    from aiokafka import AIOKafkaConsumer

    group = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=live.group_id)
    await group.start()
    try:  # the workers' group for the new topics started where the copy ended, not at offset 0
        assert live.group_id == f"{settings.group_id}.p8"
        ends = await group.end_offsets([TopicPartition(live.events_topic, p) for p in range(8)])
        for tp, end in ends.items():
            assert (await group.committed(tp) or 0) > 0 or not end, tp
    finally:
        await group.stop()
    # The restatement wins (its offset on the new partition is past the mapped one of the first).
    await wait_until(lambda: conn.fetchval("SELECT attributes->>'name' = 'After' FROM person_identities "
                                           "WHERE user_id = 'g-user-0'"), timeout=60, what="the restated identity")
    await wait_until(lambda: conn.fetchval("SELECT uses = 2 FROM fact_uses WHERE user_id = 'g-user-0' AND fact_id = $1",
                                           used), timeout=60, what="both uses counted")
    assert await conn.fetchval(f'SELECT count(*) FROM "{settings.keys_schema}".log_moved_offsets') == 0

    # Each user's turns on the new events topic: every one of them, in the order appended.
    pool = await create_pool(dsn, settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = RecordSealer(await data_keys(settings, pool))
        seen: dict[str, list[int]] = defaultdict(list)
        async with groupless_consumer(settings.kafka_bootstrap) as c:
            assert len(await partitions_of(c, live.events_topic)) == 8
            tps = [TopicPartition(live.events_topic, p) for p in range(8)]
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)

            async def note(batch) -> None:
                for r in await sealer.open(batch):
                    event = json.loads(r.value)
                    if event["type"] == "TurnRecorded":
                        assert r.key == event["user_id"].encode()
                        seen[event["user_id"]].append(int(re.search(r"#(\d+)", event["user_message"]).group(1)))

            await drain(c, tps, await c.end_offsets(tps), note)
    finally:
        await pool.close()
    for user, seqs in sent.items():
        got = seen[user]
        if user.startswith("g-user"):
            assert got == seqs, user  # TurnLog: once each, in order
        else:  # the ingress is at least once: records sealed again after the fence repeat ones before them,
            assert list(dict.fromkeys(got)) == seqs, user  # the same event ids, applied once each

    w.stop()
    forbid_llm_and_embedder()
    side = settings.postgres_schema + "_grown"
    try:
        await replay(live, dsn, side, ["episodes", "facts", "graph", "commands"])
        for tables in TABLES.values():
            for table in tables:
                if table != "profiles":
                    assert await diff_counts(conn, settings.postgres_schema, side, table) == (0, 0), table
    finally:
        await drop_schema(dsn, side)


async def test_the_log_does_not_grow_while_a_switch_is_under_way(settings, dsn):
    import asyncpg

    from memstream.streams.worker import switch_lock
    from memstream.streams.ops.partition_growth import GrowthError, grow_partitions

    held = await asyncpg.connect(dsn)
    try:
        await switch_lock.hold(held, settings.postgres_schema)  # as `memstream switch` holds it
        with pytest.raises(GrowthError, match="switch"):
            await grow_partitions(settings, dsn, 8)
    finally:
        await held.close()
