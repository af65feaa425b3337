"""Formation's pipeline (``Formation.start``) on real Kafka and Postgres, with the offline model
held back for one user: a user's later batches are decided while an earlier batch waits on
another user; each partition's decisions are produced, and its position stored, in log order;
what is abandoned is never produced; a turn that fails half way is retried as if never begun; a
turn the model cannot answer is given up, its episode kept, without holding up its partition; a
worker its group dropped records nothing once another has recorded its partition."""
from __future__ import annotations

import asyncio
import collections
from datetime import datetime, timezone

import pytest

from memstream.llm.offline import OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.streams.ops.dead_letters import Letter, letters
from memstream.llm.protocols import MalformedOutput, Throttled
from memstream.projections import positions as pos
from memstream.projections.db import create_pool
from memstream.projections.positions import PositionMoved
from memstream.projections.facts.store import FactStore
from memstream.schemas import TurnRecorded, UserForgotten
from memstream.schemas.events import new_event_id
from memstream.schemas.codec import encode
from memstream.streams.log.screening import expected_partition
from memstream.streams.log.dead_letter import DeadLetters
from memstream.streams.worker.formation.pipeline import Formation
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.records import Record
from tests.unit.test_model_refusal import Unreadable
from tests.unit.test_turn_resolution import Scattered

from .conftest import wait_until
from .helpers import produced

pytestmark = pytest.mark.asyncio

AT = datetime(2026, 3, 1, tzinfo=timezone.utc)


class HeldBack(OfflineTurnExtractor):
    """The offline extraction, held until ``go`` is set for the users in ``held``."""

    def __init__(self):
        super().__init__()
        self.held, self.go, self.asked = set(), asyncio.Event(), []

    async def extract_turn(self, turn):
        self.asked.append(turn.user_message)
        if turn.user_id in self.held:
            await self.go.wait()
        return await super().extract_turn(turn)


class FailsOnce(OfflineResolver):
    """Throttled on the first single resolution it is asked for (a turn's second candidate)."""

    def __init__(self):
        self.failed = False

    async def resolve(self, candidate, neighbours):
        if not self.failed:
            self.failed = True
            raise Throttled("a quota, for the test")
        return await super().resolve(candidate, neighbours)


def user_on(partition: int, partitions: int, prefix: str) -> str:
    return next(u for u in (f"{prefix}{i}" for i in range(1000)) if expected_partition(u.encode(), partitions) == partition)


class Log:
    """Turns as records of the events topic, offsets counted per partition."""

    def __init__(self, topic: str):
        self.topic, self.next = topic, {}

    def __call__(self, user: str, said: str, partitions: int) -> Record:
        return self.record(TurnRecorded.new(user_id=user, conversation_id="c", user_message=said,
                                            assistant_message="Noted.", occurred_at=AT), partitions)

    def record(self, event, partitions: int) -> Record:
        p = expected_partition(event.user_id.encode(), partitions)
        offset = self.next[p] = self.next.get(p, -1) + 1
        return Record(self.topic, p, offset, event.user_id.encode(), encode(event), (), 1_700_000_000_000 + offset)


def formation_on(settings, producer, pool, *, embedder=None, resolver=None, **kw) -> Formation:
    """Formation on the test's topics, its turns extracted by one call (``turn_extractor``), no barrier."""
    return Formation(producer=producer, decisions_topic=settings.decisions_topic, embedder=embedder or Scattered(),
                     extractor=None, resolver=resolver or OfflineResolver(), pool=pool, barrier=None,
                     partitions=settings.partitions, dead_letters=DeadLetters(producer, settings.dead_letter_topic, 10),
                     **kw)


async def test_batches_are_decided_side_by_side_and_recorded_in_log_order(settings, dsn):
    n = settings.partitions
    slow, quick, other = user_on(0, n, "slow"), user_on(0, n, "quick"), user_on(1, n, "other")
    extract, resolver = HeldBack(), FailsOnce()
    extract.held.add(slow)
    pool = await create_pool(dsn, settings.postgres_schema, max_size=4)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    formation = formation_on(settings, producer, pool, resolver=resolver, turn_extractor=extract)
    turn = Log(settings.events_topic)
    try:
        # Partition 0: the slow user's turn, then the quick user's two, a batch each; partition 1 beside.
        await formation.start([turn(slow, "I live in Oslo.", n), turn(quick, "I live in Porto.", n)])
        await formation.start([turn(quick, "I live in Lisbon.", n)])
        await formation.start([turn(other, "I live in Rome.", n)])
        await wait_until(lambda: asyncio.sleep(0, "I live in Lisbon." in extract.asked), timeout=10,
                         what="the quick user's next batch decided while the slow user's is held")
        await wait_until(lambda: _stored(pool, settings, 1), timeout=20, what="partition 1 recorded beside")
        assert (await pos.load(pool, "formation", settings.events_topic)).get(0) is None
        assert 0 not in await produced(settings)  # nothing of partition 0 before its first batch

        extract.go.set()
        await formation.drain()
        assert (await pos.load(pool, "formation", settings.events_topic)) == {0: 3, 1: 1}
        zero = (await produced(settings))[0]
        assert [d.source.offset for d in zero] == sorted(d.source.offset for d in zero)
        homes = [d for d in zero if d.user_id == quick and type(d).__name__ in ("FactAdded", "FactUpdated")]
        # The second batch saw the first's decision, never produced before it was decided.
        assert [(type(d).__name__, d.value) for d in homes] == [("FactAdded", "Porto"), ("FactUpdated", "Lisbon")]
        assert homes[1].supersedes == homes[0].fact_id

        # Abandoned (partitions revoked) while held: nothing of it is produced or recorded.
        extract.go.clear()
        before = await produced(settings)
        await formation.start([turn(slow, "I live in Bergen.", n)])
        await asyncio.sleep(0.2)
        await formation.abandon()
        assert await produced(settings) == before
        assert (await pos.load(pool, "formation", settings.events_topic)) == {0: 3, 1: 1}

        # Failing half way (the second candidate's resolution throttled): retried from the start
        # of the turn, its first candidate decided once, as new.
        extract.held.clear()
        await formation.process([turn(other, "I live in Paris. I moved to Berlin.", n)])
        made = [d for d in (await produced(settings))[1] if d.source.offset == 1]
        assert resolver.failed
        assert [(type(d).__name__, getattr(d, "value", None)) for d in made if type(d).__name__.startswith("Fact")] \
            == [("FactAdded", "Paris"), ("FactUpdated", "Berlin")]
    finally:
        await producer.stop()
        await pool.close()


class Flaky(Scattered):
    """An embedder whose first call fails as a connection would (a passing error)."""

    failed = False

    def embed(self, texts):
        if not self.failed:
            self.failed = True
            raise ConnectionResetError("for the test")
        return super().embed(texts)


class Broken(OfflineTurnExtractor):
    async def extract_turn(self, turn):
        if "broken" in turn.user_message:
            raise RuntimeError("a bug, for the test")
        return await super().extract_turn(turn)


async def test_a_forgotten_user_starts_afresh_and_errors_are_retried_or_fatal(settings, dsn):
    n = settings.partitions
    user = user_on(0, n, "ana")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=4)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()

    def formation(embedder, extract=None) -> Formation:
        return formation_on(settings, producer, pool, embedder=embedder, turn_extractor=extract or OfflineTurnExtractor())

    turn = Log(settings.events_topic)
    try:
        # Their home, formed (the first embedding fails and is retried) and projected.
        flaky = Flaky()
        await formation(flaky).process([turn(user, "I live in Oslo.", n)])
        assert flaky.failed
        async with pool.acquire() as conn:
            await FactStore().apply_batch(conn, (await produced(settings))[0], {})
        # Forgotten, then the same said again in one batch: a new fact, not the forgotten one
        # observed again (the store still holds it until the projection applies the forget).
        forget = UserForgotten(event_id=new_event_id(), user_id=user, occurred_at=AT, actor="user")
        await formation(Scattered()).process([turn.record(forget, n), turn(user, "I live in Oslo.", n)])
        made = [d for d in (await produced(settings))[0] if d.source.offset == 2]
        assert [type(d).__name__ for d in made if type(d).__name__.startswith("Fact")] == ["FactAdded"]

        # Not Retryable: the batch is never recorded and ``drain`` raises, the other users' too.
        broken = formation(Scattered(), Broken())
        await broken.start([turn(user, "broken", n)])
        with pytest.raises(RuntimeError, match="a bug"):
            await broken.drain()
        assert (await pos.load(pool, "formation", settings.events_topic)) == {0: 3}
    finally:
        await producer.stop()
        await pool.close()


class GarbledResolution(OfflineResolver):
    """Answers that never fit for a candidate whose value is Madrid."""

    def __init__(self):
        self.asked = 0

    async def resolve_all(self, asked):
        if any(c.value == "Madrid" for c, _ in asked):
            self.asked += 1
            raise MalformedOutput("classify_facts input does not fit its schema, for the test")
        return await super().resolve_all(asked)


async def test_a_turn_the_model_cannot_answer_is_given_up_without_holding_up_its_partition(settings, dsn):
    n = settings.partitions
    stranger, neighbour = user_on(0, n, "stranger"), user_on(0, n, "neighbour")
    model, resolver = Unreadable(), GarbledResolution()
    pool = await create_pool(dsn, settings.postgres_schema, max_size=4)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    formation = formation_on(settings, producer, pool, resolver=resolver, turn_extractor=model, model_attempts=2)
    turn = Log(settings.events_topic)
    try:
        said = ["garbled: I live in Oslo.", "I live in Rome.", "filtered: I live in Bergen.", "I live in Paris.",
                "I moved to Madrid."]
        await asyncio.wait_for(formation.process([turn(stranger, said[0], n), turn(neighbour, said[1], n),
                                                  turn(stranger, said[2], n), turn(stranger, said[3], n),
                                                  turn(neighbour, said[4], n)]), 30)
        # A refusal is not asked again; the resolution of Madrid (against Rome) twice, the turn once.
        assert model.asked == {said[0]: 2, said[1]: 1, said[2]: 1, said[3]: 1, said[4]: 1} and resolver.asked == 2
        assert (await pos.load(pool, "formation", settings.events_topic)) == {0: 5}
        made = collections.defaultdict(list)
        for d in (await produced(settings))[0]:
            made[d.source.offset].append((type(d).__name__, getattr(d, "value", None)))
        # The given-up turns keep their episode (it needs no model); the stranger's next turn and
        # the neighbour's are formed as ever.
        assert made[0] == made[2] == made[4] == [("EpisodeRecorded", None)]
        assert made[1][0] == ("FactAdded", "Rome") and made[3][0] == ("FactAdded", "Paris")
        got = sorted((Letter.of(r) for r in await letters(settings)), key=lambda x: x.source)
        assert [(x.stage, x.source) for x in got] == [("formation", f"{settings.events_topic}/0/{o}") for o in (0, 2, 4)]
        assert "in 2 attempts" in got[0].reason and "content_filtered" in got[1].reason
        assert "in 2 attempts" in got[2].reason and "classify_facts" in got[2].reason
    finally:
        await producer.stop()
        await pool.close()


async def test_a_worker_dropped_from_its_group_records_nothing_once_the_next_owner_has(settings, dsn):
    """A pause past the session timeout: the group hands the partition on, and its next owner forms
    it again from the stored position while the dropped worker's turns are still with the model."""
    n = settings.partitions
    user = user_on(0, n, "ana")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=4)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    turn = Log(settings.events_topic)
    try:
        said = [turn(user, "I live in Oslo.", n), turn(user, "I work at Acme.", n)]
        slow = HeldBack()
        slow.held.add(user)
        dropped = formation_on(settings, producer, pool, turn_extractor=slow)
        await dropped.start(said)
        await formation_on(settings, producer, pool, turn_extractor=OfflineTurnExtractor()).process(said)
        before = await produced(settings)
        assert len(before[0]) > 2 and (await pos.load(pool, "formation", settings.events_topic)) == {0: 2}
        slow.go.set()  # the dropped worker's model answers, after the next owner recorded
        with pytest.raises(PositionMoved, match="at 2, past 0"):
            await dropped.drain()
        assert await produced(settings) == before

        # Both at once: the one whose claim comes second waits for the first's to end, then
        # finds the position moved (held here by a claim that records one turn, as an owner would).
        more = [turn(user, "I live in Rome.", n)]
        async with pool.acquire() as conn:
            async with conn.transaction():
                await pos.claim(conn, "formation", [(settings.events_topic, 0)])
                second = formation_on(settings, producer, pool, turn_extractor=OfflineTurnExtractor())
                late = asyncio.ensure_future(second.process(more))
                await asyncio.sleep(1.0)
                assert not late.done() and await produced(settings) == before
                await pos.save(conn, "formation", {(settings.events_topic, 0): 3})
            with pytest.raises(PositionMoved, match="at 3, past 2"):
                await asyncio.wait_for(late, 10)
        assert await produced(settings) == before
    finally:
        await producer.stop()
        await pool.close()


class Acknowledged:
    """A producer whose sends Kafka acknowledges ``after`` seconds late (a broker under load)."""

    def __init__(self, producer, after: float):
        self._producer, self._after = producer, after

    async def send(self, *args, **kwargs):
        sent = await self._producer.send(*args, **kwargs)

        async def late():
            await asyncio.sleep(self._after)
            return await sent
        return asyncio.ensure_future(late())


async def test_a_part_acknowledged_later_than_a_claims_idle_bound_is_recorded_once(settings, dsn, monkeypatch):
    """The bound ends a claim whose holder stopped answering, not one waiting on Kafka: else a
    slow broker would have every attempt's session ended, and the part produced again and again."""
    monkeypatch.setattr(pos, "CLAIM_IDLE_S", 1)
    n = settings.partitions
    pool = await create_pool(dsn, settings.postgres_schema, max_size=4)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    turn = Log(settings.events_topic)
    try:
        formation = formation_on(settings, Acknowledged(producer, 2.5), pool, turn_extractor=OfflineTurnExtractor())
        await asyncio.wait_for(formation.process([turn(user_on(0, n, "ana"), "I live in Oslo.", n)]), 30)
        assert (await pos.load(pool, "formation", settings.events_topic)) == {0: 1}
        made = [d.decision_id for d in (await produced(settings))[0]]
        assert len(made) == len(set(made)) > 1
    finally:
        await producer.stop()
        await pool.close()


async def _stored(pool, settings, partition: int) -> bool:
    return (await pos.load(pool, "formation", settings.events_topic)).get(partition) == 1
