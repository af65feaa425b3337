"""The complete read path on the real stack: gate, profile, identities, due reminders, budgets,
and degradation when Redis is gone or Postgres statements fail mid-read."""
from __future__ import annotations

import asyncio
import logging
import socket
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest
import redis.asyncio as aioredis

from memstream.embedding import default_embedder
from memstream.projections.compare import diff_counts
from memstream.projections.db import create_pool, drop_schema
from memstream.projections import redis_client
from memstream.projections.profile.core import profile_key
from memstream.projections.session_cache import tier0_key
from memstream.read_client import Budgets, MemoryReader, render_prompt
from memstream.read_settings import FACT_WEIGHTS
from memstream.schemas import (SYSTEM_USER, LogPosition, ExpertIdentityDeleted, ExpertIdentityUpserted, PersonIdentitySet,
                               ReminderResolved, ReminderScheduled)
from memstream.schemas.events import new_event_id
from memstream.stack.launcher import Redis as RedisServer
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import replay

from .conftest import wait_until
from .helpers import FreezingProxy
from .test_formation import append_and_wait, turn

pytestmark = pytest.mark.asyncio
NOW = datetime.now(timezone.utc)


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


class CountingEmbedder:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.model_id, self.dim = inner.model_id, inner.dim

    def embed(self, texts):
        self.calls += 1
        return self.inner.embed(texts)


async def make_reader(dsn, settings, embedder, *, redis_port=None, **kw):
    url = settings.redis_url if redis_port is None else f"redis://127.0.0.1:{redis_port}/0"
    timeout = kw.pop("timeout", None)
    pools = [await create_pool(dsn, settings.postgres_schema, statement_timeout_ms=timeout, generic_plans=generic,
                               prepare=MemoryReader.prepare_text_lane if generic else None)
             for generic in (False, True)]  # as MemoryReader.connect makes them
    return MemoryReader(pool=pools[0], text_pool=pools[1],
                        redis=redis_client.connect(url, timeout_s=0.5),
                        embedder=embedder, schema=settings.postgres_schema, **kw)


async def commands(settings, events):
    async with TurnLog(settings) as log:
        return await log.append_many(events)


async def wait_commands(conn, settings, positions):
    last = {}
    for p in positions:
        last[p.partition] = max(last.get(p.partition, -1), p.offset)

    async def done():
        rows = {r["partition"]: r["next_offset"] for r in await conn.fetch(
            "SELECT partition, next_offset FROM projection_positions WHERE projection = 'commands'")}
        return all(rows.get(p, 0) > o for p, o in last.items())

    await wait_until(done, what="commands projected")


async def test_due_reminders_are_returned_whatever_the_message_until_resolved(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    due = ReminderScheduled.new(user_id="nia", text="Call the dentist", due_at=NOW - timedelta(hours=1))
    later = ReminderScheduled.new(user_id="nia", text="Renew passport", due_at=NOW + timedelta(days=30))
    await wait_commands(conn, settings, await commands(settings, [due, later]))
    counting = CountingEmbedder(embedder)
    reader = await make_reader(dsn, settings, counting)
    try:
        ctx = await reader.read("nia", "c1", "thanks!")
        assert ctx.gated and counting.calls == 0 and ctx.facts == ctx.episodes == ctx.edges == []
        assert [r.text for r in ctx.due_reminders] == ["Call the dentist"]
        assert [r.text for r in (await reader.read("nia", "c1", "ok", now=NOW + timedelta(days=31))).due_reminders] == [
            "Call the dentist", "Renew passport"]
        resolved = ReminderResolved(event_id=new_event_id(), user_id="nia", occurred_at=NOW, reminder_id=due.reminder_id,
                                    status="done")
        await wait_commands(conn, settings, await commands(settings, [resolved]))
        assert (await reader.read("nia", "c1", "what's new?")).due_reminders == []
        assert not (await reader.read("nia", "c1", "what's new?")).gated and counting.calls >= 1
    finally:
        await reader.close()


async def test_person_and_expert_identities_are_combined_on_the_context(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    ev = dict(event_id=None, occurred_at=NOW)
    events = [
        PersonIdentitySet(**{**ev, "event_id": new_event_id()}, user_id="oz", attributes={"tone": "informal", "language": "pt"}),
        ExpertIdentityUpserted(**{**ev, "event_id": new_event_id()}, user_id=SYSTEM_USER, identity_id="email-writer",
                               name="Expert email writer", instructions="Write short, warm emails."),
        ExpertIdentityUpserted(**{**ev, "event_id": new_event_id()}, user_id=SYSTEM_USER, identity_id="temp",
                               name="Temp", instructions="x"),
        ExpertIdentityDeleted(**{**ev, "event_id": new_event_id()}, user_id=SYSTEM_USER, identity_id="temp"),
        PersonIdentitySet(**{**ev, "event_id": new_event_id()}, user_id="oz", attributes={"tone": "formal", "language": "pt"}),
    ]
    await wait_commands(conn, settings, await commands(settings, events))
    reader = await make_reader(dsn, settings, embedder)
    try:
        ctx = await reader.read("oz", "c1", "draft a note to my landlord", identity_id="email-writer")
        assert ctx.person_identity == {"tone": "formal", "language": "pt"}
        assert ctx.expert_identity["name"] == "Expert email writer"
        prompt = render_prompt(ctx, "draft a note to my landlord")
        assert "Persona: Expert email writer" in prompt and "tone: formal" in prompt
        assert (await reader.read("oz", "c1", "hi", identity_id="temp")).expert_identity is None
        assert (await reader.read("oz", "c1", "hi")).expert_identity is None
    finally:
        await reader.close()
    target = settings.postgres_schema + "_cmd"
    try:
        await replay(settings, dsn, target, ["commands"])
        for table in ("reminders", "person_identities", "expert_identities"):
            assert await diff_counts(conn, settings.postgres_schema, target, table) == (0, 0)
    finally:
        await drop_schema(dsn, target)


async def test_the_profile_is_always_injected_from_redis_or_postgres(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("pat", "Hi, my name is Pat. I live in Oslo and I'm allergic to shellfish.", 0),
                                           turn("pat", "I moved to Bergen last month.", 60)])
    await wait_until(lambda: _profile_home(conn, "pat", "Bergen"), what="profile rebuilt")
    for port in (None, 1):  # the real Redis, then an unreachable one
        reader = await make_reader(dsn, settings, embedder, redis_port=port)
        try:
            ctx = await reader.read("pat", "c1", "ok")
            assert ctx.gated and ctx.profile == {"name": "Pat", "home": "Bergen", "allergies": ["shellfish"]}
            assert ctx.degraded == []
        finally:
            await reader.close()


@pytest.fixture
def own_redis(settings, tmp_path):
    """A redis-server of this test's own (free port, data under tmp_path), so it can be stopped
    mid-test without touching the shared stack; the workers started afterwards write to it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = RedisServer(tmp_path, port)
    try:
        server.up()
        settings.redis_url = server.address  # the workers fixture reads settings when a worker starts
        yield server
    finally:
        server.down()  # SIGTERM, then waits for the pid to go: no redis-server outlives the test


async def test_stopping_redis_mid_session_falls_back_to_postgres_with_the_same_context(
        settings, conn, dsn, own_redis, workers, embedder, caplog):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("pat", "Hi, my name is Pat. I live in Oslo and I'm allergic to shellfish.", 0),
                                           turn("pat", "I moved to Bergen last month.", 60)])
    schema = settings.postgres_schema
    epochs = {r["projection"]: r["epoch"] for r in await conn.fetch("SELECT projection, epoch FROM projection_epochs")}
    t0, t1 = tier0_key(schema, epochs["episodes"], "pat", "c1"), profile_key(schema, epochs["profile"], "pat")
    probe = aioredis.from_url(own_redis.address)
    shared = aioredis.from_url(RedisServer(settings.home).address)
    try:
        async def cached():  # both tiers in OUR Redis, profile at its final state
            return await probe.zcard(t0) == 2 and b'"Bergen"' in (await probe.get(t1) or b"")

        await wait_until(cached, what="tier 0 and tier 1 cached in the test's Redis")
        assert not await shared.exists(t0, t1)  # the workers really wrote to the test's Redis
        reader = await make_reader(dsn, settings, embedder)
        try:
            up = await reader.read("pat", "c1", "ok")
            assert up.profile == {"name": "Pat", "home": "Bergen", "allergies": ["shellfish"]} and up.degraded == []
            assert [t.user_message for t in up.recent_turns] == ["Hi, my name is Pat. I live in Oslo and I'm allergic to shellfish.",
                                                                 "I moved to Bergen last month."]

            own_redis.down()
            assert not own_redis.status().answers
            caplog.clear()
            started = time.monotonic()
            down = await reader.read("pat", "c1", "ok")  # same reader: its pooled connection is now dead
            assert time.monotonic() - started < 3
            assert down.profile == up.profile and down.recent_turns == up.recent_turns
            assert down.degraded == []  # the reader falls back inside both channels; nothing is lost
            fallbacks = {r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR}
            assert {"tier 0 cache unavailable; reading recent turns from Postgres",
                    "tier 1 cache unavailable; reading the profile from Postgres"} <= fallbacks  # not a stale cache hit

            own_redis.up()  # same port, empty: the caches start cold
            caplog.clear()
            again = await reader.read("pat", "c1", "ok")
            assert again.profile == up.profile and again.recent_turns == up.recent_turns and again.degraded == []
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            async with aioredis.from_url(own_redis.address) as fresh:  # probe's pooled connection died with the server
                assert await fresh.get(t1) is not None  # the reader reconnected: a profile miss is written back

                # The next turn finds its conversation's key gone with the restart: the worker seeds
                # it from Postgres first, so Tier 0 holds the conversation's turns, not only this one.
                await append_and_wait(settings, conn, [turn("pat", "My sister visits in May.", 120)])
                await wait_until(lambda: _holds(fresh, t0, 3), what="tier 0 seeded and the new turn added")
            later = await reader.read("pat", "c1", "ok")
            assert [t.user_message for t in later.recent_turns] == [t.user_message for t in up.recent_turns] + [
                "My sister visits in May."]

            own_redis.down()  # restarted between two reads: the reader's pooled connection is dead
            own_redis.up()
            caplog.clear()
            after_restart = await reader.read("pat", "c1", "ok")
            assert after_restart.recent_turns == later.recent_turns and after_restart.degraded == []
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # a new connection, no fallback
        finally:
            await reader.close()
    finally:
        await probe.aclose()
        await shared.aclose()


async def _holds(redis, key: str, n: int) -> bool:
    return await redis.zcard(key) == n


async def test_turns_a_failed_tier0_push_missed_are_seeded_again_once_redis_answers(settings, dsn, caplog):
    """Redis unreachable for one batch while the conversation's key stays: the next push of its
    partition that succeeds, even of another conversation, gives that key the turns it missed."""
    from memstream.projections.session_cache import recent_turns
    from memstream.schemas import EpisodeRecorded, encode
    from memstream.streams.worker.projecting import EpisodesProjection
    from memstream.streams.log.records import Record

    from .test_delivery import UNIT, _decided

    class Letters:  # none expected
        async def send(self, letters):
            assert not letters

        def observe(self, n_ok):
            pass

    said = [EpisodeRecorded(**_decided(settings, i, "kim", "episode"), conversation_id=conv, user_message=text,
                            occurred_at=NOW + timedelta(minutes=i), assistant_message="ok", embedding=UNIT,
                            embedding_model="test")
            for i, (conv, text) in enumerate([("c1", "first"), ("c1", "second"), ("c2", "elsewhere"), ("c3", "later")])]
    # "elsewhere" on another decisions partition: a push of that partition leaves c1 to its owner
    # (once a rebalance moved c1's partition away, another worker may be forgetting it).
    records = [Record(settings.decisions_topic, p, o, b"kim", encode(d), (), 1_700_000_000_000)
               for (p, o), d in zip([(0, 0), (0, 1), (1, 0), (0, 2)], said)]
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    up, down = aioredis.from_url(settings.redis_url), aioredis.from_url("redis://127.0.0.1:9", socket_connect_timeout=1)
    schema = settings.postgres_schema
    try:
        projection = EpisodesProjection(pool=pool, redis=up, schema=schema, dead_letters=Letters(), tier0_turns=20)
        await projection.process(records[:1])
        epoch = projection._cache.value
        projection._redis = down  # this batch's push fails, as when Redis times out
        await projection.process(records[1:2])
        assert "tier 0 cache update failed for 1 turns" in caplog.text
        assert [t["user_message"] for t in await recent_turns(up, schema, epoch, "kim", "c1", 20)] == ["first"]
        projection._redis = up
        await projection.process(records[2:3])
        assert [t["user_message"] for t in await recent_turns(up, schema, epoch, "kim", "c2", 20)] == ["elsewhere"]
        assert [t["user_message"] for t in await recent_turns(up, schema, epoch, "kim", "c1", 20)] == ["first"]
        await projection.process(records[3:])
        assert [t["user_message"] for t in await recent_turns(up, schema, epoch, "kim", "c1", 20)] == ["first", "second"]
        assert [t["user_message"] for t in await recent_turns(up, schema, epoch, "kim", "c3", 20)] == ["later"]
    finally:
        await up.aclose()
        await down.aclose()
        await pool.close()


async def test_tier0_keys_expire_after_their_last_turn_and_come_back_whole(settings, dsn):
    """A conversation's key lives ``tier0_ttl_s`` past its last push (seeded or added to); once
    it expired, as when flushed, the next turn seeds it from the store with what it held."""
    from memstream.projections.session_cache import recent_turns, tier0_key
    from memstream.schemas import EpisodeRecorded, encode
    from memstream.streams.worker.projecting import EpisodesProjection
    from memstream.streams.log.records import Record

    from .test_delivery import UNIT, _decided

    class Letters:
        async def send(self, letters):
            assert not letters

        def observe(self, n_ok):
            pass

    said = [EpisodeRecorded(**_decided(settings, i, "ivy", "episode"), conversation_id="c1", user_message=f"turn {i}",
                            occurred_at=NOW + timedelta(minutes=i), assistant_message="ok", embedding=UNIT,
                            embedding_model="test") for i in range(3)]
    records = [Record(settings.decisions_topic, 0, i, b"ivy", encode(d), (), 1_700_000_000_000) for i, d in enumerate(said)]
    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    redis = aioredis.from_url(settings.redis_url)
    try:
        projection = EpisodesProjection(pool=pool, redis=redis, schema=settings.postgres_schema, dead_letters=Letters(),
                                        tier0_turns=20, tier0_ttl_s=120)
        await projection.process(records[:1])  # seeds the key
        key = tier0_key(settings.postgres_schema, projection._cache.value, "ivy", "c1")
        assert 0 < await redis.ttl(key) <= 120
        await redis.expire(key, 5)
        await projection.process(records[1:2])  # adds to it: its life starts again
        assert 5 < await redis.ttl(key) <= 120
        await redis.pexpire(key, 1)  # Redis expires it
        await wait_until(lambda: _gone(redis, key), what="the key expired")
        await projection.process(records[2:])
        held = await recent_turns(redis, settings.postgres_schema, projection._cache.value, "ivy", "c1", 20)
        assert [t["user_message"] for t in held] == ["turn 0", "turn 1", "turn 2"] and 0 < await redis.ttl(key) <= 120
    finally:
        await redis.aclose()
        await pool.close()


async def _gone(redis, key: str) -> bool:
    return not await redis.exists(key)


async def test_budgets_bound_each_section_in_real_tokens(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("quin", f"I really enjoy {h} on weekends.", i)
                                           for i, h in enumerate(["hiking", "chess", "jazz", "sailing", "baking"])])
    reader = await make_reader(dsn, settings, embedder)
    try:
        roomy = await reader.read("quin", "c1", "what do I enjoy doing?")
        tight = await reader.read("quin", "c1", "what do I enjoy doing?", budgets=Budgets(facts=8, episodes=20, edges=0))
    finally:
        await reader.close()
    assert len(roomy.facts) == 5 and len(tight.facts) < len(roomy.facts)
    assert tight.tokens["facts"] <= 8 and tight.tokens["episodes"] <= 20 and tight.edges == []
    assert [f.fact_id for f in tight.facts] == [f.fact_id for f in roomy.facts][:len(tight.facts)]


async def test_the_turn_after_a_matched_one_comes_back_with_it(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    chat = [("Guess which dance style I love most?", "Salsa?"), ("No! Contemporary, it is so expressive.", "Lovely."),
            ("I need to renew my passport soon.", "Noted."), ("The weather in Porto was grey today.", "Oh no."),
            ("My sister bought a new bike.", "Nice!"), ("Work was long, lots of meetings.", "Rest well.")]
    await append_and_wait(settings, conn, [turn("sol", q, i, answer=a) for i, (q, a) in enumerate(chat)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        ctx = await reader.read("sol", "c2", "which dance style do I love most?", k=2)
    finally:
        await reader.close()
    # The matched turn ends on a question ("Salsa?"), so its reply inherits all of its relevance
    # and, newer, ranks first.
    ranked = sorted(ctx.episodes, key=lambda e: e.rank)
    assert [e.user_message for e in ranked] == [chat[1][0], chat[0][0]]
    assert "neighbour" in ranked[0].channels and "episode_neighbours" not in ctx.degraded
    assert [e.user_message for e in ctx.episodes] == [chat[0][0], chat[1][0]]  # the section reads in time order


async def test_a_postgres_statement_failing_mid_read_empties_only_its_sections(settings, conn, dsn, workers, embedder, caplog):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("ray", "I live in Lisbon and I love surfing.", 0)])
    reader = await make_reader(dsn, settings, embedder, redis_port=1, timeout=300)
    locker = await asyncpg.connect(dsn, server_settings={"search_path": f"{settings.postgres_schema},public"})
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE episodes IN ACCESS EXCLUSIVE MODE")  # every episodes statement now waits
        ctx = await reader.read("ray", "c1", "where do I live?")
        await tx.rollback()
    finally:
        await locker.close()
        await reader.close()
    assert set(ctx.degraded) == {"episodes_vector", "episodes_keyword", "recent_turns"}
    assert ctx.episodes == [] and ctx.recent_turns == []
    assert any(f.text == "Lives in Lisbon" for f in ctx.facts) and ctx.profile["home"] == "Lisbon"
    assert any("canceling statement due to statement timeout" in (r.exc_text or "") for r in caplog.records)


async def test_no_connection_for_the_text_lane_empties_its_channels_and_the_rest_is_read(settings, conn, dsn, workers,
                                                                                          embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("kai", "I live in Oslo and I play chess.", 0)])
    reader = await make_reader(dsn, settings, embedder)
    await reader._text_pool.close()  # every text-lane statement now fails to get a connection
    try:
        # Bounded: the episodes lane waits for the keyword channel, which must be released even
        # when its lane never got a connection.
        ctx = await asyncio.wait_for(reader.read("kai", "c1", "where do I live?"), 10)
    finally:
        await reader.close()
    assert set(ctx.degraded) == {"facts_keyword", "episodes_keyword", "person_identity", "due_reminders",
                                 "episode_neighbours", "profile"}
    assert any(f.text == "Lives in Oslo" and f.channels == ["vector"] for f in ctx.facts)
    assert [e.user_message for e in ctx.episodes] == ["I live in Oslo and I play chess."]
    assert [t.user_message for t in ctx.recent_turns] == ["I live in Oslo and I play chess."]


async def test_a_postgres_that_stops_answering_degrades_a_read_by_its_deadline_and_never_hangs_it(settings, dsn,
                                                                                                   embedder):
    from memstream.read_client.pools import connect_pools

    proxy = FreezingProxy.of(dsn)
    async with proxy:
        # Pools bounded far past the reader's deadline: only that deadline can end the read in time.
        pool, text_pool = await connect_pools(proxy.dsn, settings.postgres_schema, deadline_s=10.0)
        reader = MemoryReader(pool=pool, text_pool=text_pool, redis=None, embedder=embedder,
                              schema=settings.postgres_schema, deadline_s=1.0)
        assert (await reader.read("ona", "c1", "where do I live?")).degraded == []
        proxy.frozen.set()
        t = time.perf_counter()
        ctx = await asyncio.wait_for(reader.read("ona", "c1", "where do I live now?"), 10)
        took = time.perf_counter() - t
        t = time.perf_counter()  # read-your-writes: the wait ends when it says, then the read's deadline
        waited = await asyncio.wait_for(reader.read("ona", "c1", "and now?", wait_timeout=0.3,
                                                    after=LogPosition(settings.events_topic, 0, 0)), 10)
        took_waiting = time.perf_counter() - t
    for p in (pool, text_pool):  # their connections went with the proxy
        p.terminate()
    # At its deadline, then what is left to do: cancelling, ranking what came (a slower CPU takes longer).
    assert 1.0 <= took < 3.5 and {"facts_vector", "episodes_keyword", "profile", "recent_turns"} <= set(ctx.degraded)
    assert not waited.caught_up and 1.3 <= took_waiting < 3.8 and waited.degraded


async def test_connect_takes_weights_budgets_and_keyword_mode_from_settings(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("liv", "I live in Oslo and I play chess.", 0)])
    tuned = settings.model_copy(update={
        "read_budgets": Budgets(edges=0), "read_keyword_mode": "names",
        "read_fact_weights": replace(FACT_WEIGHTS, relevance=1.0, recency=0.0, importance=0.0, type=0.0)})
    reader = await MemoryReader.connect(tuned, dsn, embedder=embedder)
    try:
        ctx = await reader.read("liv", "c1", "where do I live?")
    finally:
        await reader.close()
    assert ctx.edges == [] and ctx.tokens["edges"] == 0 and ctx.degraded == []
    lives = [f for f in ctx.facts if f.text == "Lives in Oslo"]
    assert lives and lives[0].channels == ["vector"]  # names mode: the message names nothing to look up
    assert lives[0].score == lives[0].relevance  # relevance alone counts


async def _profile_home(conn, user, home):
    value = await conn.fetchval("SELECT profile->>'home' FROM profiles WHERE user_id = $1", user)
    return value == home


async def test_a_closed_reader_refuses_to_read_instead_of_degrading_every_section(settings, dsn, embedder):
    reader = await MemoryReader.connect(settings, dsn, embedder=embedder)
    await reader.close()
    with pytest.raises(RuntimeError, match="closed"):
        await reader.read("liv", "c1", "where do I live?")


async def test_after_waits_until_the_turns_facts_and_edges_are_applied_not_only_its_episode(settings, conn, dsn,
                                                                                             workers, embedder, caplog):
    w = workers()
    await w.wait_assigned()
    reader = await make_reader(dsn, settings, embedder)
    blocker = await asyncpg.connect(dsn, server_settings={"search_path": f"{settings.postgres_schema},public"})
    try:
        # The graph projection applies a batch after the facts: with its table locked, the turn's
        # fact lands while its edge cannot. (Not the episode: it is the turn's last decision, and
        # may come in the batch after the edge's, whose graph step waits for the lock.)
        held = blocker.transaction()
        await held.start()
        await blocker.execute("LOCK TABLE memory_edges IN EXCLUSIVE MODE")
        async with TurnLog(settings) as log:
            pos = await log.append(turn("rya", "I work at Acme.", 0))
        await wait_until(lambda: conn.fetchval("SELECT count(*) FROM memory_facts WHERE user_id = 'rya'"), what="the fact")
        with caplog.at_level(logging.INFO, logger="memstream"):
            early = await reader.read("rya", "c1", "where do I work?", after=pos, wait_timeout=1.0)
            assert not early.caught_up and _warned(caplog, "timed out")
            caplog.clear()
            # Asked, not read: the caller is told, and polling it must not warn each time.
            assert not await reader.caught_up(pos, timeout=0.3) and not _warned(caplog, "timed out")
        await held.rollback()
        ctx = await reader.read("rya", "c1", "where do I work?", after=pos, wait_timeout=30)
        assert ctx.caught_up
        assert any("Acme" in e.fact_sentence for e in ctx.edges) and any("Acme" in f.text for f in ctx.facts)
    finally:
        await blocker.close()
        await reader.close()


async def test_after_on_a_command_waits_for_the_commands_projection(settings, conn, dsn, workers, embedder):
    w = workers()
    await w.wait_assigned()
    reader = await make_reader(dsn, settings, embedder)
    try:
        [pos] = await commands(settings, [ReminderScheduled.new(user_id="cmd", text="call the dentist",
                                                                due_at=NOW - timedelta(minutes=1))])
        ctx = await reader.read("cmd", "c1", "hello there", after=pos, wait_timeout=30)
        assert ctx.caught_up and [r.text for r in ctx.due_reminders] == ["call the dentist"]
    finally:
        await reader.close()


async def test_a_read_whose_channels_straddle_a_supersession_holds_one_home_not_two(settings, conn, dsn, workers,
                                                                                     embedder, monkeypatch):
    from memstream.projections.facts import query as facts_q

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("two", "I live in Porto.", 0)])
    before_the_move = await facts_q.keyword(conn, "two", "Where do I live in Porto?", 20)
    assert [r["value"] for r in before_the_move] == ["Porto"]
    await append_and_wait(settings, conn, [turn("two", "I moved to Lisbon.", 1)])

    async def keyword_statement_that_ran_before_the_commit(conn, user_id, text, k):
        return before_the_move

    monkeypatch.setattr(facts_q, "keyword", keyword_statement_that_ran_before_the_commit)
    reader = await make_reader(dsn, settings, embedder)
    try:
        ctx = await reader.read("two", "c1", "Where do I live?")
    finally:
        await reader.close()
    assert [f.value for f in ctx.facts if f.attribute == "home"] == ["Lisbon"]


async def test_memories_pages_through_facts_episodes_and_edges_and_stats_counts_them(settings, conn, dsn, workers,
                                                                                     embedder):
    from memstream.schemas.errors import InvalidArgument

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("mem", "I live in Porto.", 0), turn("mem", "I work at Acme.", 1),
                                           turn("mem", "I like jazz.", 2), turn("mem", "I moved to Lisbon.", 3),
                                           turn("other", "I live in Oslo.", 4)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        first = await reader.memories("mem", "facts", limit=2)
        rest = await reader.memories("mem", "facts", limit=2, cursor=first.next_cursor)
        assert rest.next_cursor is None
        current = first.items + rest.items
        assert sorted(f.text for f in current) == ["Likes jazz", "Lives in Lisbon", "Works at Acme"]
        history = (await reader.memories("mem", "facts", include_history=True)).items
        homes = sorted((f.version, f.value, f.status) for f in history if f.attribute == "home")
        assert homes == [(1, "Porto", "superseded"), (2, "Lisbon", "current")]
        episodes = (await reader.memories("mem", "episodes")).items
        assert [e.user_message for e in episodes][0] == "I live in Porto." and len(episodes) == 4
        edges = await reader.memories("mem", "edges", include_history=True)
        assert {(e.relation, e.target, e.valid_to is None) for e in edges.items} >= {("lives_in", "Porto", False),
                                                                                      ("lives_in", "Lisbon", True)}
        stats = await reader.stats("mem")
        assert stats.facts.by_status == {"current": 3, "superseded": 1} and stats.episodes.by_status == {"recorded": 4}
        assert stats.conversations == 1 and stats.entities >= 2 and stats.last_recorded is not None
        assert (await reader.stats("nobody")).facts.by_status == {}
        for bad in ({"kind": "secrets"}, {"limit": 0}, {"limit": 501}, {"cursor": "not-a-cursor"},
                    {"kind": "episodes", "cursor": first.next_cursor}):
            with pytest.raises(InvalidArgument):
                await reader.memories("mem", **bad)
        with pytest.raises(InvalidArgument, match="host-wide key"):
            await reader.stats("__memstream__")
    finally:
        await reader.close()


async def test_search_with_a_period_returns_more_of_one_topic_from_that_period_only(settings, conn, dsn, workers,
                                                                                      embedder):
    from .helpers import BASE

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("tess", f"Training log: I ran {km} km along the river today.", i * 60)
                                           for i, km in enumerate(range(3, 15))])
    reader = await make_reader(dsn, settings, embedder)
    try:
        since, until = BASE + timedelta(minutes=180), BASE + timedelta(minutes=420)
        found = await reader.search("tess", "how far did I run?", kinds=["episodes"], k=20, since=since, until=until)
        every = await reader.search("tess", "how far did I run?", kinds=["episodes"], k=20)
        with pytest.raises(ValueError):
            await reader.search("tess", "run", since=until, until=since)
    finally:
        await reader.close()
    assert len(every.episodes) == 12
    assert sorted(e.occurred_at for e in found.episodes) == [BASE + timedelta(minutes=m) for m in range(180, 420, 60)]


def _warned(caplog, text: str) -> bool:
    return any(r.levelno >= logging.WARNING and text in r.getMessage() for r in caplog.records)


async def test_a_connect_that_fails_after_its_pools_opened_closes_them(settings, dsn, conn, embedder, monkeypatch):
    """A host retrying a connect that fails (a tokenizer file missing, say) kept ten connections a try."""
    async def backends() -> int:
        return await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND backend_type = 'client backend'")

    async def settled() -> bool:  # a killed worker of an earlier test may still be leaving: fewer is fine
        return await backends() <= before

    before = await backends()

    def fails(self, **_):
        raise OSError("no tokenizer here")

    monkeypatch.setattr(MemoryReader, "__init__", fails)
    for _ in range(3):
        with pytest.raises(OSError, match="no tokenizer"):
            await MemoryReader.connect(settings, dsn, embedder=embedder)
    await wait_until(settled, timeout=10, what="the pools' connections closed")
