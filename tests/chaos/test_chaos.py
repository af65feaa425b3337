"""Chaos at the scale of the claims (``make test-chaos``): turns of many users flow through a crew
of workers while workers are SIGKILLed at random moments, one is frozen past its session timeout,
the Kafka broker restarts, Postgres restarts (fast, then immediate shutdown), Redis is flushed and
stopped twice, corrections, forgets of facts and of whole users and poison records are mixed in,
and reads run throughout. Then the verifier: every turn's episode exactly once, each user's in log
order; every projection equal, row for row, to a clean replay; the forgotten users hold no row, no
Redis key and no readable byte on any Kafka segment; the dead letters are exactly the poison
records, each with its reason; no read failed outright (degraded sections are counted).

The seed is printed first (``MEMSTREAM_CHAOS_SEED`` repeats a run); the scale is
``MEMSTREAM_CHAOS_TURNS`` / ``_USERS`` / ``_KILLS`` / ``_WORKERS``. The figures are printed and
written to ``<home>/chaos-<seed>.json`` (docs/reliability.md)."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import re
import signal
import time
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from memstream import control
from memstream.embedding import default_embedder
from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import drop_schema
from memstream.projections.episodes.core import episode_id
from memstream.schemas import TurnRecorded
from memstream.schemas.errors import Retryable
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import PROJECTIONS, replay
from tests.integration.conftest import HOME, Worker, wait_until
from tests.integration.helpers import every_record
from tests.integration.test_control import _segments_holding, user_tables
from tests.integration.test_read_path import make_reader

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.chaos]

TURNS = int(os.environ.get("MEMSTREAM_CHAOS_TURNS", "100000"))
USERS = int(os.environ.get("MEMSTREAM_CHAOS_USERS", "1000"))
KILLS = int(os.environ.get("MEMSTREAM_CHAOS_KILLS", "50"))
CREW = int(os.environ.get("MEMSTREAM_CHAOS_WORKERS", "3"))
BATCH = 500
APPENDS_PER_S = float(os.environ.get("MEMSTREAM_CHAOS_APPEND_RATE", "110"))  # about formation's pace here
POISON = max(10, TURNS // 2000)
FORGOTTEN = max(2, USERS // 100)
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
PLACES = ["Porto", "Lisbon", "Braga", "Faro", "Oslo", "Bergen", "Turin", "Lyon"]
EMPLOYERS = ["Initech", "Globex", "Acme", "Umbrella", "Hooli", "Vandelay"]
NAMES = ["Ana", "Rui", "Ines", "Tom", "Eva", "Lars"]


def said(rng: random.Random, user: str, n: int) -> str:
    """What a user says: facts that change (homes, employers), people, and chit-chat; each turn
    holds the user's own marker word, looked for on Kafka's segments once they are forgotten."""
    marker = f"zq{user.replace('-', '')}q"
    return rng.choice([f"I live in {rng.choice(PLACES)} now.", f"I work at {rng.choice(EMPLOYERS)}.",
                       f"My sister {rng.choice(NAMES)} is visiting next week.", f"I like {rng.choice(PLACES)} a lot.",
                       "What a long day it was.", f"Turn {n}: nothing much to say."]) + f" ({marker})"


class Chaos:
    def __init__(self, settings, stack, tmp_path, seed: int):
        self.settings, self.stack, self.tmp, self.rng = settings, stack, tmp_path, random.Random(seed)
        self.crew: list[Worker] = []
        self.figures = collections.Counter()
        self.appended = 0
        self.done = asyncio.Event()

    def hire(self) -> Worker:
        w = Worker(self.settings, self.tmp / f"worker{len(self.crew)}.log")
        self.crew.append(w)
        return w

    def live(self) -> list[Worker]:
        return [w for w in self.crew if w.proc.poll() is None]

    async def watch(self) -> None:
        """An orchestrator's restart policy: a worker that exited on its own is replaced."""
        seen = set()
        while not self.done.is_set():
            for w in self.crew:
                if w.proc.poll() is not None and id(w) not in seen:
                    seen.add(id(w))
                    if not getattr(w, "killed", False):
                        self.figures["worker exits (replaced)"] += 1
                        self.hire()
                        await asyncio.sleep(5)  # a restart policy's back-off: a store down for a while
            await asyncio.sleep(1)

    async def kill(self) -> None:
        live = self.live()
        if live:
            w = self.rng.choice(live)
            w.killed = True
            w.kill()
            self.figures["SIGKILLs"] += 1
            await asyncio.sleep(self.rng.uniform(0, 2))
            self.hire()

    async def freeze(self) -> None:
        live = self.live()
        if not live:
            return
        w = self.rng.choice(live)
        os.killpg(w.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(15)  # past the 10 s session timeout: the group moves its partitions on
        os.killpg(w.proc.pid, signal.SIGCONT)
        self.figures["SIGSTOPs past the session timeout"] += 1

    async def restart_kafka(self) -> None:
        await asyncio.to_thread(self.stack.kafka.down)
        await asyncio.sleep(3)
        await asyncio.to_thread(self.stack.kafka.up)
        self.figures["Kafka broker restarts"] += 1

    async def restart_postgres(self, sig: int, name: str) -> None:
        info = self.stack.postgres._info()
        os.kill(info.pid, sig)  # SIGINT: fast shutdown; SIGQUIT: immediate (crash recovery on start)
        await wait_until(lambda: _true(not self.stack.postgres._answers()), timeout=60, what="postgres down")
        await asyncio.sleep(2)
        await asyncio.to_thread(self.stack.postgres.up)
        self.figures[f"Postgres restarts ({name})"] += 1

    async def flush_redis(self) -> None:
        r = aioredis.from_url(self.settings.redis_url)
        try:
            await r.flushall()
        finally:
            await r.aclose()
        await asyncio.to_thread(self.stack.redis.down)
        await asyncio.sleep(3)
        await asyncio.to_thread(self.stack.redis.up)
        self.figures["Redis flushed and stopped"] += 1

    async def schedule(self) -> None:
        """The faults, each at a share of the turns appended: kills spread over the run, the rest once or twice."""
        plan = [(self.rng.uniform(0.02, 0.97), "kill") for _ in range(KILLS)] + [
            (0.20, "freeze"), (0.30, "redis"), (0.40, "kafka"), (0.55, "postgres fast"), (0.70, "postgres immediate"),
            (0.80, "redis")]
        for at, what in sorted(plan):
            while self.appended < at * TURNS:
                await asyncio.sleep(0.2)
            print(f"chaos: {what} at {self.appended} turns appended", flush=True)
            if what == "kill":
                await self.kill()
            elif what == "freeze":
                await self.freeze()
            elif what == "kafka":
                await self.restart_kafka()
            elif what == "redis":
                await self.flush_redis()
            else:
                await self.restart_postgres(signal.SIGINT if what.endswith("fast") else signal.SIGQUIT, what)


async def _all_assigned(crew, settings, timeout: float) -> None:
    """Until the crew's formation roles hold every events partition and their projections roles
    every decisions partition. Not each worker both: an assignor may leave one without
    partitions (four among three, sticky) and that is a valid assignment."""
    want = {role: {f"{topic}/{p}" for p in range(settings.partitions)}
            for role, topic in (("formation", settings.events_topic), ("projections", settings.decisions_topic))}

    async def settled() -> bool:
        held = {role: set() for role in want}
        for w in crew:
            for role, parts in w.assigned_by_role().items():
                held.setdefault(role, set()).update(parts)
        return all(want[role] <= held[role] for role in want)

    await wait_until(settled, timeout=timeout, what="the crew to hold every partition")


async def _true(value: bool) -> bool:
    return value


CALL_S = 60  # any one client call, at most: one that never returns is counted, not waited on forever


async def _retried(what, figures: collections.Counter, fn):
    """``fn()`` until it succeeds, as a host retries an append the broker did not acknowledge."""
    while True:
        try:
            return await asyncio.wait_for(fn(), CALL_S)
        except (Retryable, KafkaError, OSError, asyncio.TimeoutError) as exc:
            figures[f"{what} retried ({type(exc).__name__})"] += 1
            await asyncio.sleep(1)


async def test_the_pipeline_loses_duplicates_and_reorders_nothing_under_kills_restarts_and_poison(
        settings, stack, dsn, tmp_path):
    seed = int(os.environ.get("MEMSTREAM_CHAOS_SEED", random.SystemRandom().randrange(2 ** 32)))
    print(f"MEMSTREAM_CHAOS_SEED={seed}: {TURNS} turns, {USERS} users, {KILLS} kills, {CREW} workers", flush=True)
    rng = random.Random(seed)
    started = time.monotonic()
    chaos = Chaos(settings, stack, tmp_path, seed)
    for _ in range(CREW):
        chaos.hire()
    await _all_assigned(chaos.crew, settings, timeout=120)
    users = [f"ch-{i}" for i in range(USERS)]
    doomed = set(rng.sample(users, FORGOTTEN))
    forget_at = {u: rng.randrange(BATCH, TURNS) for u in doomed}
    forgotten: set[str] = set()
    sent: dict[str, list] = collections.defaultdict(list)  # user -> their turns' event ids, in order
    poison: list[bytes] = []
    reads = collections.Counter()
    last = {}

    async def produce():
        raw = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True)
        await raw.start()
        try:
            async with TurnLog(settings) as log:
                n = i = 0  # turns appended; turns said (a forgotten user says no more)
                while n < TURNS:
                    batch = []
                    while len(batch) < min(BATCH, TURNS - n):
                        i += 1
                        user = users[i % USERS]
                        if user in forgotten:
                            continue
                        batch.append(TurnRecorded.new(user_id=user, conversation_id=f"c{i // (USERS * 20)}",
                                                      user_message=said(rng, user, i), assistant_message="I see.",
                                                      occurred_at=BASE + timedelta(seconds=i)))
                    positions = await _retried("append", chaos.figures, lambda: log.append_many(batch))
                    for t, p in zip(batch, positions):
                        sent[t.user_id].append(t.event_id)
                        last[p.partition] = max(last.get(p.partition, p), p, key=lambda q: q.offset)
                    n += len(batch)
                    chaos.appended = n
                    for user in [u for u in doomed - forgotten if forget_at[u] < n]:
                        await _retried("forget", chaos.figures, lambda: control.forget_user(log, user))
                        forgotten.add(user)
                    if rng.random() < POISON / (TURNS / BATCH) * 2 and len(poison) < POISON:
                        value = rng.randbytes(rng.randrange(1, 400))
                        await _retried("poison", chaos.figures,
                                       lambda: raw.send_and_wait(settings.events_topic, value, key=b"poison"))
                        poison.append(value)
                    await asyncio.sleep(BATCH / APPENDS_PER_S)
        finally:
            await raw.stop()

    appending = asyncio.Event()  # set once the last turn is appended: the host's requests end with its turns

    async def correct_or_forget(log, reader, user):
        facts = (await reader.memories(user, "facts", limit=20)).items
        if not facts:
            return
        fact = rng.choice(facts)
        if rng.random() < 0.6:
            await control.correct_fact(log, reader, user, fact.fact_id, rng.choice(PLACES + EMPLOYERS))
            chaos.figures["corrections"] += 1
        else:
            await control.forget_fact(log, reader, user, fact.fact_id)
            chaos.figures["facts forgotten"] += 1

    async def correct_and_forget_facts(reader):
        async with TurnLog(settings) as log:
            while not appending.is_set():
                await asyncio.sleep(rng.uniform(1, 4))
                user = rng.choice([u for u in users if u not in doomed])
                try:
                    await asyncio.wait_for(correct_or_forget(log, reader, user), CALL_S)
                except Exception as exc:  # a store or the broker down for a moment: the host tries later
                    chaos.figures[f"control requests not made ({type(exc).__name__})"] += 1

    async def read_throughout(reader):
        while not chaos.done.is_set():
            try:
                ctx = await asyncio.wait_for(reader.read(rng.choice(users), "c0", rng.choice(
                    ["where do I live?", "where do I work?", "who is visiting?"])), CALL_S)
                reads["degraded" if ctx.degraded else "whole"] += 1
            except Exception:  # noqa: BLE001 - counted: must stay 0
                reads["failed"] += 1
            await asyncio.sleep(0.05)

    reader = await make_reader(dsn, settings, default_embedder())
    watching = asyncio.ensure_future(chaos.watch())
    side = [asyncio.ensure_future(correct_and_forget_facts(reader)), asyncio.ensure_future(read_throughout(reader))]
    try:
        await asyncio.gather(produce(), chaos.schedule())
        appending.set()
        await side[0]
        appended_s = time.monotonic() - started
        expected = {e for u, ids in sent.items() if u not in forgotten for e in ids}
        # Connected after the restarts (a connection of before them died with its server).
        conn = await asyncpg.connect(dsn, server_settings={"search_path": f"{settings.postgres_schema},public"})

        async def formed():
            # A forgotten fact takes the turns it was read from with it (control.forget_fact).
            nonlocal expected
            gone = {r[0] for r in await conn.fetch("SELECT episode_id FROM forgotten_episodes")}
            expected = {e for e in expected if episode_id(e) not in gone}
            have = await conn.fetchval("SELECT count(*) FROM episodes")
            if time.monotonic() - shown[0] > 60:  # a wait that does not end says what it waits for
                shown[0] = time.monotonic()
                print(f"chaos: {have} episodes of {len(expected)}", flush=True)
            return have >= len(expected)  # more than expected: the checks below name them

        shown = [time.monotonic()]

        await wait_until(formed, timeout=1800, interval=5, what=f"every turn's episode (seed {seed})")
        for p in last.values():  # every projection has applied the log's end
            assert await reader.caught_up(p, timeout=60), (seed, p)
        chaos.done.set()
        await asyncio.gather(*side)
        gone = {r[0] for r in await conn.fetch("SELECT episode_id FROM forgotten_episodes")}
        expected = {e for e in expected if episode_id(e) not in gone}
    finally:
        chaos.done.set()
        watching.cancel()
        for w in chaos.crew:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGCONT)
        await reader.close()
    await asyncio.sleep(3)  # what a last worker still had to say
    for w in chaos.live():
        w.stop()
    settled_s = time.monotonic() - started

    # Every turn of a user not forgotten once, each user's in the order of the log.
    rows = await conn.fetch("SELECT user_id, source_event_id, source_offset, occurred_at FROM episodes")
    ids = [r["source_event_id"] for r in rows]
    lost, duplicated, unexpected = len(expected - set(ids)), len(ids) - len(set(ids)), len(set(ids) - expected)
    by_user = collections.defaultdict(list)
    for r in rows:
        by_user[r["user_id"]].append(r)
    reordered = sum(1 for mine in by_user.values()
                    if [r["occurred_at"] for r in sorted(mine, key=lambda r: r["source_offset"])]
                    != sorted(r["occurred_at"] for r in mine))

    # Every projection equal to a clean replay of the log.
    target = f"{settings.postgres_schema}_chaos"
    differences = {}
    try:
        await replay(settings, dsn, target, list(PROJECTIONS))
        for projection in TABLES:  # the profile is built in the facts projection's transactions
            for table in TABLES[projection]:
                differences[table] = await diff_counts(conn, settings.postgres_schema, target, table)
        replayed_s = time.monotonic() - started
    finally:
        await drop_schema(dsn, target)

    # The forgotten: no row, no Redis key, no readable byte on a Kafka segment.
    tables = await user_tables(conn)
    rows_left = {u: [t for t in tables if await conn.fetchval(f"SELECT count(*) FROM {t} WHERE user_id = $1", u)]
                 for u in forgotten}
    r = aioredis.from_url(settings.redis_url)
    try:
        keys = [k.decode() async for k in r.scan_iter(match=f"memstream:{settings.postgres_schema}:*")]
    finally:
        await r.aclose()
    keys_left = {u: [k for k in keys if f":{len(u)}:{u}:" in k + ":"] for u in forgotten}
    on_disk = _segments_holding(stack, {u: f"zq{u.replace('-', '')}q".encode() for u in forgotten})
    readable = await _readable_records(settings, dsn, forgotten)

    letters = await every_record(settings, settings.dead_letter_topic)
    await conn.close()
    # Besides the poison: a correction or forget of a fact that was no longer current when
    # formation came to it (the user moved on meanwhile) is refused, with its reason, as a host's bad request.
    refused = [m for m in letters if m.value not in set(poison)]
    refusals = collections.Counter(
        f"{_type(m.value)}: " + re.sub(r"[0-9a-f-]{36}", "<id>", dict(m.headers).get("memstream.reason", b"").decode())[:60]
        for m in refused)
    figures = {
        "seed": seed, "turns": sum(len(v) for v in sent.values()), "users": USERS, "forgotten users": len(forgotten),
        **chaos.figures, "poison records": len(poison), "control requests refused": dict(refusals),
        "reads": dict(reads),
        "forgotten users' records that still open": readable,
        "lost": lost, "duplicated": duplicated, "unexpected": unexpected, "users reordered": reordered,
        "replay differences": {t: d for t, d in differences.items() if d != (0, 0)},
        "wall time s": {"appending": round(appended_s), "settled": round(settled_s), "verified": round(replayed_s)}}
    print("chaos figures:", json.dumps(figures), flush=True)
    (HOME / f"chaos-{seed}.json").write_text(json.dumps(figures, indent=1))

    assert (lost, duplicated, unexpected, reordered) == (0, 0, 0, 0), figures
    assert figures["replay differences"] == {}, figures
    assert not any(rows_left.values()) and not any(keys_left.values()) and not on_disk, (rows_left, keys_left, on_disk)
    assert readable == 0, figures
    assert sorted(m.value for m in letters if m.value in set(poison)) == sorted(poison), (len(letters), len(poison))
    assert all(_type(m.value) in ("FactCorrected", "FactForgotten") for m in refused), refusals
    assert all(dict(m.headers).get("memstream.reason") for m in letters)
    assert reads["failed"] == 0, figures


async def _readable_records(settings, dsn, users: set[str]) -> int:
    """How many records of ``users`` on the events and decisions topics still open with the key
    store as it is: their turns, facts and vectors (a forget's own markers are plain by design)."""
    from aiokafka import TopicPartition

    from memstream.keys import data_keys
    from memstream.projections.db import create_pool
    from memstream.streams.log.kafka_util import drain, groupless_consumer
    from memstream.streams.log.sealing import RecordSealer

    markers = ("UserForgotten", "MemoryForgotten", "NothingDecided")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    readable = 0
    try:
        sealer = RecordSealer(await data_keys(settings, pool))
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
            for topic in (settings.events_topic, settings.decisions_topic):
                tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
                c.assign(tps)
                await c.seek_to_beginning(*tps)

                async def keep(batch):
                    nonlocal readable
                    theirs = [r for r in batch if (r.key or b"").decode(errors="replace") in users]
                    for r in await sealer.open(theirs):
                        if r.sealing is None and b'"sealed"' not in (r.value or b"") and _type(r.value) not in markers:
                            readable += 1

                await drain(c, tps, await c.end_offsets(tps), keep)
    finally:
        await pool.close()
    return readable


def _type(value: bytes) -> str:
    try:
        return json.loads(value).get("type", "?")
    except (ValueError, AttributeError):
        return "not JSON"
