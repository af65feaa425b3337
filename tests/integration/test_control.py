"""Control on the real stack: correct, forget a fact, an episode, an edge, a whole user — each a
command on the user's log, applied by the projections, named in history, equal after a replay,
and not undone by a replay or a reform."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
import json
from datetime import timedelta, timezone

import msgspec
import pytest
import redis.asyncio as aioredis

from memstream import control
from memstream.embedding import default_embedder
from memstream.projections.compare import TABLES, diff_counts
from memstream.projections.db import drop_schema
from memstream.projections.episodes import query as episodes_q
from memstream.schemas.errors import InvalidArgument
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.reform import reform
from memstream.streams.ops.replay import replay

from .helpers import BASE
from .test_formation import append_and_wait, turn
from .test_read_path import make_reader

pytestmark = pytest.mark.asyncio
ALL_TABLES = [t for tables in TABLES.values() for t in tables]


@pytest.fixture(scope="module")
def embedder():
    return default_embedder()


async def test_correct_and_forget_a_fact_an_episode_and_an_edge_then_replay_and_reform_agree(settings, conn, dsn,
                                                                                            workers, embedder):
    w = workers()
    await w.wait_assigned()
    # Rex's turn said at a local time: Tier 0 holds it as sent, Postgres gives it back in UTC.
    rex_said = msgspec.structs.replace(turn("cam", "My dog Rex is sick.", 2), occurred_at=(
        BASE + timedelta(minutes=2)).astimezone(timezone(timedelta(hours=2))))
    await append_and_wait(settings, conn, [turn("cam", "I live in Porto.", 0), turn("cam", "I like jazz.", 1),
                                           rex_said, turn("cam", "I work at Acme.", 3)])
    reader = await make_reader(dsn, settings, embedder)
    try:
        facts = {f.attribute: f for f in (await reader.memories("cam", "facts")).items}
        async with TurnLog(settings) as log:
            pos = await control.correct_fact(log, reader, "cam", facts["home"].fact_id, "Braga", reason="I misspoke")
            ctx = await reader.read("cam", "c1", "where do I live?", after=pos, wait_timeout=30)
            assert ctx.caught_up and [f.text for f in ctx.facts if f.attribute == "home"] == ["Lives in Braga"]
            history = await reader.fact_history("cam", facts["home"].fact_id)
            assert [(v.value, v.status) for v in history] == [("Porto", "superseded"), ("Braga", "current")]
            assert history[1].reason == "corrected by user: I misspoke" and history[1].explicit
            # Never true, not true until now: Braga holds from when Porto was said to, Porto not at all.
            assert history[1].valid_from == history[0].valid_from == history[0].valid_to

            pos = await control.forget_fact(log, reader, "cam", facts["likes"].fact_id, reason="private")
            ctx = await reader.read("cam", "c1", "what music do I like?", after=pos, wait_timeout=30)
            assert not any("jazz" in f.text for f in ctx.facts)
            [gone] = await reader.fact_history("cam", facts["likes"].fact_id)
            assert gone.status == "forgotten" and gone.end_reason == "forgotten by user: private"

            rex = next(e for e in (await reader.memories("cam", "episodes")).items if "Rex" in e.user_message)
            pos = await control.forget_episode(log, reader, "cam", rex.episode_id, actor="host")
            ctx = await reader.read("cam", "c1", "how is my dog Rex?", after=pos, wait_timeout=30)
            assert not any("Rex" in e.user_message for e in ctx.episodes + ctx.recent_turns)
            assert not await episodes_q.keyword(conn, "cam", "Rex", 20)  # out of the keyword postings too
            assert not any("Rex" in f.text for f in (await reader.memories("cam", "facts")).items)
            assert not any("Rex" in e.fact_sentence for e in (await reader.memories("cam", "edges", include_history=True)).items)
            # The same turn on the log again (a retried dead letter, a host's retry): still forgotten.
            await append_and_wait(settings, conn, [rex_said])
            ctx = await reader.read("cam", "c1", "how is my dog Rex?")
            assert not any("Rex" in e.user_message for e in ctx.episodes + ctx.recent_turns)
            assert not await episodes_q.keyword(conn, "cam", "Rex", 20)

            acme = next(e for e in (await reader.memories("cam", "edges")).items if e.target == "Acme")
            pos = await control.forget_edge(log, reader, "cam", acme.edge_id, actor="operator", reason="wrong person")
            ctx = await reader.read("cam", "c1", "where do I work?", after=pos, wait_timeout=30)
            assert not any("Acme" in e.fact_sentence for e in ctx.edges)
            then = await reader.read("cam", "c1", "where do I work?", as_of=acme.recorded_at + timedelta(seconds=1))
            assert not any("Acme" in e.fact_sentence for e in then.edges)  # not as of any date either

            # A later explicit statement may learn the forgotten fact again, as a new lineage.
            await append_and_wait(settings, conn, [turn("cam", "I like jazz.", 5)])
            again = [f for f in (await reader.memories("cam", "facts")).items if f.attribute == "likes"]
            assert [f.value for f in again] == ["jazz"] and again[0].lineage_id != facts["likes"].lineage_id

            with pytest.raises(control.NotFound, match="another user"):
                await control.forget_fact(log, reader, "someone-else", facts["home"].fact_id)
    finally:
        await reader.close()
    await append_and_wait(settings, conn, [turn("cam", "thanks", 6)])  # the last command is projected
    w.stop()
    live, rebuilt, reformed = settings.postgres_schema, settings.postgres_schema + "_re", settings.postgres_schema + "_rf"
    try:
        await replay(settings, dsn, rebuilt, ["episodes", "facts", "graph", "commands"])
        for table in ALL_TABLES:
            assert await diff_counts(conn, live, rebuilt, table) == (0, 0), table
        await reform(settings, extractor="offline", topic=settings.decisions_topic + ".v2")
        await replay(settings, dsn, reformed, ["episodes", "facts", "graph"], topic=settings.decisions_topic + ".v2")
        for table in TABLES["facts"] + TABLES["episodes"] + TABLES["graph"]:
            assert await diff_counts(conn, live, reformed, table) == (0, 0), table
    finally:
        await drop_schema(dsn, rebuilt)
        await drop_schema(dsn, reformed)


async def user_tables(conn) -> list[str]:
    """Every table of the schema with a user_id column, from the catalog (partitions as their parent)."""
    return [r["table_name"] for r in await conn.fetch(
        "SELECT c.table_name FROM information_schema.columns c JOIN pg_class k ON k.relname = c.table_name "
        "AND k.relnamespace = c.table_schema::regnamespace WHERE c.table_schema = current_schema() "
        "AND c.column_name = 'user_id' AND NOT k.relispartition ORDER BY 1")]


async def test_forgetting_a_user_leaves_no_row_or_key_of_theirs_survives_a_kill_and_spares_the_neighbour(
        settings, conn, dsn, workers, embedder):
    from memstream.schemas import PersonIdentitySet, ReminderScheduled
    from memstream.schemas.events import new_event_id
    from datetime import datetime, timedelta, timezone

    w = workers()
    await w.wait_assigned()
    for user in ("dee", "ned"):
        await append_and_wait(settings, conn, [turn(user, "I live in Porto and work at Acme.", 0),
                                               turn(user, "My sister Ana is a nurse.", 1)])
    async with TurnLog(settings) as log:
        await log.append_many([
            ReminderScheduled.new(user_id="dee", text="call Ana", due_at=datetime.now(timezone.utc) + timedelta(days=1)),
            PersonIdentitySet(event_id=new_event_id(), user_id="dee", occurred_at=datetime.now(timezone.utc),
                              attributes={"name": "Dee"})])
    tables = await user_tables(conn)
    assert {"episodes", "memory_facts", "entities", "memory_edges", "profiles", "reminders"} <= set(tables)

    async def rows_of(user):
        return {t: hashlib.md5(str(sorted(map(tuple, await conn.fetch(f"SELECT * FROM {t} WHERE user_id = $1", user))))
                               .encode()).hexdigest() for t in tables}

    neighbour = await rows_of("ned")
    redis = aioredis.from_url(settings.redis_url)
    # What a switch leaves of the old build (its epochs), and another user's key that merely
    # contains this one's: the first go with the forget, the second stays.
    schema, stranger = settings.postgres_schema, "x:t0:3:dee"
    left = {f"memstream:{schema}:e0:t0:3:dee:c1", f"memstream:{schema}:e0:t1:3:dee"}
    near = f"memstream:{schema}:e0:t0:{len(stranger)}:{stranger}:c1"
    for k in left | {near}:
        await redis.set(k, "what the old build held")
    async with TurnLog(settings) as log:
        pos = await control.forget_user(log, "dee", reason="user_request")
    w.kill()  # halfway: the forget is on the log, nothing applied it yet (or part of it)
    w2 = workers()
    await w2.wait_assigned()
    reader = await make_reader(dsn, settings, embedder)
    try:
        ctx = await reader.read("dee", "c1", "where do I live?", after=pos, wait_timeout=60)
        assert ctx.caught_up and not ctx.facts and not ctx.episodes and not ctx.edges and not ctx.recent_turns
        async with TurnLog(settings) as log:  # sent twice: the same end
            pos = await control.forget_user(log, "dee")
        await reader.read("dee", "c1", "hello", after=pos, wait_timeout=60)
    finally:
        await reader.close()
    for t in tables:
        assert await conn.fetchval(f"SELECT count(*) FROM {t} WHERE user_id = 'dee'") == 0, t
    try:
        assert [k async for k in redis.scan_iter(match=f"memstream:{schema}:*:dee*")] == [near.encode()]
        assert [k async for k in redis.scan_iter(match=f"memstream:{schema}:*:ned*")] != []
    finally:
        await redis.aclose()
    assert await rows_of("ned") == neighbour


async def test_the_cli_lists_corrects_forgets_and_names_what_is_wrong(settings, conn, workers, tmp_path):
    import json
    import subprocess
    import sys

    from memstream.stack.worker_process import worker_env

    from .conftest import HOME, ROOT

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("cli", "I live in Porto.", 0), turn("cli", "I like tea.", 1)])
    env = worker_env(settings.model_copy(update={"home": HOME}))

    def cli(*args, stdin: str | None = None):
        return subprocess.run([sys.executable, "-m", "memstream.cli", *args], cwd=ROOT, env=env, input=stdin,
                              capture_output=True, text=True, timeout=120)

    listed = cli("memories", "list", "cli", "--json")
    assert listed.returncode == 0, listed.stderr
    facts = {f["attribute"]: f for f in json.loads(listed.stdout)["items"]}
    assert cli("memories", "correct", "cli", facts["home"]["fact_id"], "Faro", "--json").returncode == 0
    # The turns a fact was read from are named before they go (and go with it).
    dry = cli("memories", "forget", "cli", "--fact", facts["likes"]["fact_id"], "--dry-run")
    assert dry.returncode == 0 and "would forget 1 turn(s)" in dry.stdout and "I like tea." in dry.stdout, dry.stderr
    forgot = cli("memories", "forget", "cli", "--fact", facts["likes"]["fact_id"], "--reason", "private", "--json")
    assert forgot.returncode == 0 and len(json.loads(forgot.stdout)["episodes"]) == 1
    await append_and_wait(settings, conn, [turn("cli", "ok", 2)])
    history = json.loads(cli("memories", "history", "cli", facts["likes"]["fact_id"], "--json").stdout)
    assert history[-1]["status"] == "forgotten" and "by operator: private" in history[-1]["end_reason"]
    assert [f["value"] for f in json.loads(cli("memories", "list", "cli", "--json").stdout)["items"]] == ["Faro"]

    unknown = cli("memories", "forget", "cli", "--fact", "00000000-0000-0000-0000-000000000001")
    assert unknown.returncode == 1 and "no fact 00000000-0000-0000-0000-000000000001" in unknown.stderr
    foreign = cli("memories", "forget", "someone", "--fact", facts["home"]["fact_id"])
    assert foreign.returncode == 1 and "belongs to another user" in foreign.stderr
    assert cli("memories", "forget", "cli", "--fact", "not-a-uuid").returncode == 2
    # An operator's slip is a message, not a traceback (which would print a database's DETAIL).
    for args, said in ((["--schema", "no_such_schema", "memories", "list", "cli"], "Postgres refused"),
                       (["replay", "facts", "--into", settings.postgres_schema], "refusing")):
        slip = cli(*args)
        assert slip.returncode == 1 and said in slip.stderr and "Traceback" not in slip.stderr, slip.stderr
    assert cli("forget-user", "cli", stdin="n\n").returncode == 1  # asked, and said no
    assert await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'cli'") == 2  # "I like tea." went
    assert cli("forget-user", "cli", "--yes", "--json").returncode == 0
    await append_and_wait(settings, conn, [turn("cli-other", "hello", 3)])
    from .conftest import wait_until
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM episodes WHERE user_id = 'cli'"), what="cli forgotten")


async def test_a_users_export_imported_into_a_fresh_deployment_projects_to_the_same_rows(settings, conn, dsn,
                                                                                         workers, tmp_path):
    """Ids are kept; only where the events landed differs (the episodes' source partition and
    offset, a person identity's source offset): the archive's positions are remapped."""
    import uuid as uuid_

    from memstream.config import Settings
    from memstream.portability import export_user, import_user, read_archive
    from memstream.projections.db import migrate
    from memstream.schemas import PersonIdentitySet, ReminderScheduled
    from memstream.schemas.events import new_event_id
    from memstream.streams.log.topics import ensure_topics
    from datetime import datetime, timezone

    from .conftest import HOME, Worker, wait_until

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("exp", "I live in Porto and work at Acme.", 0),
                                           turn("exp", "I like jazz.", 1), turn("other", "I live in Oslo.", 2)])
    reader = await make_reader(dsn, settings, default_embedder())
    try:
        likes = next(f for f in (await reader.memories("exp", "facts")).items if f.attribute == "likes")
        async with TurnLog(settings) as log:
            await log.append_many([
                ReminderScheduled.new(user_id="exp", text="call mum", due_at=datetime(2027, 1, 1, tzinfo=timezone.utc)),
                PersonIdentitySet(event_id=new_event_id(), user_id="exp", occurred_at=datetime.now(timezone.utc),
                                  attributes={"name": "Exp"})])
            await control.forget_fact(log, reader, "exp", likes.fact_id)
    finally:
        await reader.close()
    await append_and_wait(settings, conn, [turn("exp", "I moved to Faro.", 3)])
    from aiokafka import AIOKafkaProducer

    poison = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True)
    await poison.start()
    try:  # a plain client's bad record on exp's partition: dead-lettered there, left out of the export
        await poison.send_and_wait(settings.events_topic, b"not json", key=b"exp")
    finally:
        await poison.stop()
    archive = tmp_path / "exp.jsonl"
    header = await export_user(settings, "exp", archive)
    assert header["version"] == 1 and header["events"] == 6 and header["decisions"] > 6
    # The poison record, and formation's marker after it (it names no user): neither is theirs.
    assert header["left_out"]["not_theirs"] == 2 and archive.stat().st_mode & 0o777 == 0o600
    assert all(x["record"]["user_id"] == "exp" for x in read_archive(archive)[1])

    tag = uuid_.uuid4().hex[:8]
    target = Settings(home=HOME, events_topic=f"i{tag}.events", decisions_topic=f"i{tag}.decisions",
                      dead_letter_topic=f"i{tag}.dead-letter", ingress_topic=f"i{tag}.ingress", group_id=f"gi{tag}",
                      postgres_schema=f"i_{tag}", keys_schema=f"ik_{tag}", partitions=settings.partitions)  # new keys
    await ensure_topics(target)
    await migrate(dsn, target.postgres_schema)
    w2 = Worker(target, tmp_path / "target.log")
    try:
        await w2.wait_assigned()
        done = await import_user(target, archive)
        assert done == {"user_id": "exp", "events": 6, "decisions": header["decisions"], "dead_lettered": 0}
        remapped = {"episodes": "source_partition, source_offset", "person_identities": "source_offset"}

        async def same() -> bool:
            for table in ("episodes", "memory_facts", "entities", "memory_edges", "profiles", "reminders",
                          "person_identities"):
                cols = [r["column_name"] for r in await conn.fetch(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 "
                    "AND column_name NOT IN ('tsv') ORDER BY ordinal_position", settings.postgres_schema, table)
                    if r["column_name"] not in remapped.get(table, "")]
                q = "SELECT {} FROM {}.{} WHERE user_id = 'exp' EXCEPT ALL SELECT {} FROM {}.{} WHERE user_id = 'exp'"
                a, b = settings.postgres_schema, target.postgres_schema
                c = ", ".join(cols)
                if await conn.fetchval(f"SELECT count(*) FROM ({q.format(c, a, table, c, b, table)}) d") or \
                        await conn.fetchval(f"SELECT count(*) FROM ({q.format(c, b, table, c, a, table)}) d"):
                    return False
            return True

        await wait_until(same, timeout=60, what="the imported user's rows to equal the source's")
        assert await conn.fetchval(f"SELECT count(*) FROM {target.postgres_schema}.episodes WHERE user_id = 'other'") == 0

        # A crafted archive: mallory's own turn, and a decision about exp made "from" it. The
        # projections trust a decision's user, so it must not reach the log.
        lines = [json.loads(x) for x in archive.read_text().splitlines()]
        said = next(x for x in lines[1:] if x["log"] == "events" and x["record"]["type"] == "TurnRecorded")
        said["record"] = {**said["record"], "user_id": "mallory", "event_id": str(new_event_id())}
        planted = next(x for x in lines[1:] if x["log"] == "decisions" and x["record"]["type"] == "FactAdded")
        planted["record"] = {**planted["record"], "source_event_id": said["record"]["event_id"],
                             "source": {**planted["record"]["source"], "offset": said["offset"]}}
        crafted = tmp_path / "crafted.jsonl"
        crafted.write_text("\n".join(json.dumps(x) for x in (
            {**lines[0], "user_id": "mallory", "events": 1, "decisions": 1}, said, planted)) + "\n")
        assert await import_user(target, crafted) == {"user_id": "mallory", "events": 1, "decisions": 0,
                                                      "dead_lettered": 1}

        # Checked whole before anything is appended: a user the target remembers (unless they
        # are the same person), a record no topic takes, a forget of the whole user; a vector
        # no store can build is dead-lettered, not left to stop every user's projections.
        async def log_ends() -> int:
            from aiokafka import TopicPartition

            from memstream.streams.log.kafka_util import groupless_consumer, partitions_of

            async with groupless_consumer(target.kafka_bootstrap) as c:
                tps = [TopicPartition(t, p) for t in (target.events_topic, target.decisions_topic)
                       for p in await partitions_of(c, t)]
                return sum((await c.end_offsets(tps)).values())

        ends = await log_ends()
        with pytest.raises(InvalidArgument, match="already has memory here"):
            await import_user(target, archive)
        episode = next(x for x in lines[1:] if x["log"] == "decisions" and x["record"]["type"] == "EpisodeRecorded")
        trudy = {**said, "record": {**said["record"], "user_id": "trudy"}}
        for odd, why in ((dict(trudy, record={**trudy["record"], "user_message": "\U0001F600" * 100_000,
                                              "assistant_message": "\U0001F600" * 100_000}), "bytes as JSON"),
                         (dict(trudy, record={"type": "UserForgotten", "event_id": str(new_event_id()),
                                              "user_id": "trudy", "occurred_at": said["record"]["occurred_at"],
                                              "actor": "user"}), "forgets the whole user")):
            odd_file = tmp_path / "odd.jsonl"
            odd_file.write_text("\n".join(json.dumps(x) for x in (
                {**lines[0], "user_id": "trudy", "events": 2, "decisions": 0}, trudy, odd)) + "\n")
            with pytest.raises(InvalidArgument, match=why):
                await import_user(target, odd_file)
        assert await log_ends() == ends  # nothing appended
        bad_vector = dict(episode, record={**episode["record"], "user_id": "trudy", "embedding": "AAAA",  # 3 bytes
                                           "source_event_id": trudy["record"]["event_id"]})
        odd_file.write_text("\n".join(json.dumps(x) for x in (
            {**lines[0], "user_id": "trudy", "events": 1, "decisions": 1}, trudy, bad_vector)) + "\n")
        assert await import_user(target, odd_file) == {"user_id": "trudy", "events": 1, "decisions": 0,
                                                       "dead_lettered": 1}

        # Once exp is forgotten here, their older archive is not imported again by mistake.
        async with TurnLog(target) as log:
            await control.forget_user(log, "exp")
        with pytest.raises(InvalidArgument, match="forgotten here"):
            await import_user(target, archive)
    finally:
        w2.stop()
        await drop_schema(dsn, target.postgres_schema)
        await drop_schema(dsn, target.keys_schema)


def _segments_holding(stack, needles: dict[str, bytes]) -> dict[str, list[str]]:
    """Which of ``needles`` some Kafka log segment file on disk holds (every topic's), and where."""
    found: dict[str, list[str]] = {}
    # os.walk, not rglob: the broker deletes other tests' topic directories while we look.
    for path in (Path(d) / f for d, _, files in os.walk(stack.kafka.data) for f in files if ".log" in f):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # deleted while we looked
            continue
        for name, needle in needles.items():
            if needle in data:
                found.setdefault(name, []).append(str(path.relative_to(stack.kafka.data)))
    return found


async def test_a_forgotten_users_words_and_vectors_leave_every_kafka_segment_and_a_replay_counts_them_shredded(
        stack, settings, conn, dsn, embedder, tmp_path):
    """Three things eve said, each by another road: through ``TurnLog`` (sealed before it left
    the host), as plain JSON from a non-Python client on the ingress topic (with librdkafka's
    partitioner), and a mis-keyed plain record the ingress dead-letters. Once the plaintext
    window has passed after the forget, no segment file of any topic holds any of them, nor a
    piece of her vectors, and none of her records opens; ned is untouched."""
    from memstream.streams.log.topics import ensure_topics

    from .conftest import Worker

    # A window long enough to see the plaintext where it is first, shortened before the forget
    # (ensure_topics applies a window to existing topics, as a worker does when it starts).
    w = Worker(settings.model_copy(update={"plaintext_retention_s": 600}), tmp_path / "worker.log")
    try:
        await _forget_eve(stack, settings, conn, dsn, embedder, w,
                          shorten=lambda: ensure_topics(settings.model_copy(update={"plaintext_retention_s": 3})))
    finally:
        w.stop()


async def _forget_eve(stack, settings, conn, dsn, embedder, w, shorten):
    import json
    import uuid as uuid_mod
    import zlib

    import msgspec
    from aiokafka import AIOKafkaProducer, TopicPartition

    from memstream.projections.db import create_pool
    from memstream.schemas.events import new_event_id
    from memstream.keys import data_keys
    from memstream.streams.log.kafka_util import drain, groupless_consumer
    from memstream.streams.log.sealing import RecordSealer

    from .conftest import wait_until

    tag = uuid_mod.uuid4().hex[:8]
    said = {"turnlog": f"my locker code is {tag}-7731", "ingress": f"my nickname is Zebra{tag}",
            "dead letter": f"my bank pin is {tag}-0042"}
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("eve", said["turnlog"], 0), turn("ned", "I live in Faro.", 0)])

    def plain(user: str, text: str) -> bytes:
        return json.dumps({"type": "TurnRecorded", "event_id": str(new_event_id()), "user_id": user,
                           "conversation_id": "c1", "occurred_at": "2026-11-30T09:00:00Z", "user_message": text,
                           "assistant_message": "ok"}).encode()

    kcat = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap,
                            partitioner=lambda key, all_p, avail: all_p[zlib.crc32(key) % len(all_p)])
    await kcat.start()
    try:
        await kcat.send_and_wait(settings.ingress_topic, plain("eve", said["ingress"]), key=b"eve")
        await kcat.send_and_wait(settings.ingress_topic, plain("eve", said["dead letter"]), key=b"not-eve")
    finally:
        await kcat.stop()
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 2 FROM episodes WHERE user_id = 'eve'"),
                     what="eve's ingress turn, sealed and projected")

    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        keys = await data_keys(settings, pool)

        async def eves_records(sealer):
            async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
                out = []
                for topic in (settings.events_topic, settings.decisions_topic):
                    tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
                    c.assign(tps)
                    await c.seek_to_beginning(*tps)

                    async def keep(batch):
                        out.extend(await sealer.open([r for r in batch if r.key == b"eve"]))

                    await drain(c, tps, await c.end_offsets(tps), keep)
            return out

        opened = await eves_records(RecordSealer(keys))
        vectors = [msgspec.json.decode(r.value)["embedding"] for r in opened
                   if r.value and b'"EpisodeRecorded"' in r.value[:40]]
        assert len(vectors) == 2
        needles = {k: v.encode() for k, v in said.items()} | {
            f"vector {n}": v[100:140].encode() for n, v in enumerate(vectors)}  # base64 on the wire, as sealed inside
        before = _segments_holding(stack, needles)
        assert set(before) == {"ingress", "dead letter"}, before  # plain only where the window bounds it
        await shorten()

        async with TurnLog(settings) as log:
            pos = await control.forget_user(log, "eve", reason="user_request")
        reader = await make_reader(dsn, settings, embedder)
        try:
            assert (await reader.read("eve", "c1", "what is my nickname?", after=pos, wait_timeout=60)).caught_up
        finally:
            await reader.close()

        async def gone():
            return not _segments_holding(stack, needles)

        await wait_until(gone, timeout=90, interval=1, what="the plaintext window to pass on every segment")
        after = await eves_records(RecordSealer(await data_keys(settings, pool)))
        turns_and_decisions = [r for r in after if r.sealing is None and b'"sealed"' not in (r.value or b"")]
        assert all(json.loads(r.value)["type"] in ("UserForgotten", "MemoryForgotten", "NothingDecided")
                   for r in turns_and_decisions), turns_and_decisions
        assert sum(r.shredded for r in after) >= 4  # two turns, two episodes (and their facts)
    finally:
        await pool.close()

    await append_and_wait(settings, conn, [turn("ned", "thanks", 1)])  # the forget is behind every projection
    w.stop()
    rebuilt = settings.postgres_schema + "_re"
    try:
        report = await replay(settings, dsn, rebuilt, ["episodes", "facts", "graph", "commands"])
        assert report.shredded >= 4 and report.skipped == 0
        for table in ALL_TABLES:
            assert await diff_counts(conn, settings.postgres_schema, rebuilt, table) == (0, 0), table
        assert await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'ned'") == 2
    finally:
        await drop_schema(dsn, rebuilt)


async def test_a_forget_redis_cannot_erase_passes_on_a_new_cache_epoch_and_the_old_keys_go_when_redis_answers(
        settings, conn, dsn):
    """Redis down at a forget does not stall the projections (docs/failure-scenarios.md: Redis is reported, not
    required): the cache's epoch is abandoned, so no reader reads a key of before once the
    position passes the forget (Redis back from an outage would still hold them), and those keys
    are deleted when Redis answers."""
    from memstream.projections import cache_keys, positions
    from memstream.projections.db import create_pool
    from memstream.schemas import EpisodeRecorded, MemoryForgotten, encode
    from memstream.streams.worker.projecting import CacheEpoch, EpisodesProjection, FactsProjection
    from memstream.streams.log.records import Record

    from .test_delivery import UNIT, _decided

    class Letters:  # none expected
        async def send(self, letters):
            assert not letters

        def observe(self, n_ok):
            pass

    said = EpisodeRecorded(**_decided(settings, 0, "eve", "episode"), conversation_id="c", occurred_at=BASE,
                           user_message="my secret", assistant_message="ok", embedding=UNIT, embedding_model="test")
    ned = EpisodeRecorded(**_decided(settings, 2, "ned", "episode"), conversation_id="c", occurred_at=BASE,
                          user_message="ned's", assistant_message="ok", embedding=UNIT, embedding_model="test")
    forget = MemoryForgotten(**_decided(settings, 1, "eve", "forgotten"), kind="user", actor="user")
    records = [Record(settings.decisions_topic, 0, i, d.user_id.encode(), encode(d), (), 1_700_000_000_000)
               for i, d in enumerate([said, forget, ned])]
    schema = settings.postgres_schema
    pool = await create_pool(dsn, schema, max_size=2)
    up, down = aioredis.from_url(settings.redis_url), aioredis.from_url("redis://127.0.0.1:9", socket_connect_timeout=1)
    try:
        before = await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = 'episodes'")
        live = EpisodesProjection(pool=pool, redis=up, schema=schema, dead_letters=Letters(), tier0_turns=20)
        await live.process(records[:1])
        held = await up.keys(f"memstream:{schema}:*")
        assert held != []
        cut_off = EpisodesProjection(pool=pool, redis=down, schema=schema, dead_letters=Letters(), tier0_turns=20)
        await cut_off.process(records[1:2])  # passes: no retry loop
        assert (await positions.load(pool, "episodes", settings.decisions_topic)) == {0: 2}
        assert await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'eve'") == 0
        after = await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = 'episodes'")
        assert after == before + 1
        assert await up.keys(f"memstream:{schema}:*") == held  # Redis (back) still holds them: never read
        # The other worker, which still wrote under the old epoch, reads the new one at its next batch;
        # its purge deletes the abandoned keys once Redis answers.
        live._cache._tried = -CacheEpoch.PURGE_EVERY_S
        await live.process(records[2:])
        left = [k.decode() for k in await up.keys(f"memstream:{schema}:*")]
        assert left and all(cache_keys.parse(schema, k)[0] == after for k in left), left
        assert not any(":eve" in k for k in left)
        assert not await conn.fetchval("SELECT bool_or(purge_pending) FROM projection_epochs")
        # The profile cache (Tier 1) the same way.
        profile = await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = 'profile'")
        await FactsProjection(pool=pool, dead_letters=Letters(), redis=down, schema=schema).process(records[1:2])
        assert (await positions.load(pool, "facts", settings.decisions_topic)) == {0: 2}
        assert await conn.fetchval("SELECT epoch FROM projection_epochs WHERE projection = 'profile'") == profile + 1
    finally:
        await up.aclose()
        await down.aclose()
        await pool.close()


async def test_a_turn_still_on_ingress_when_its_user_is_forgotten_is_dropped_not_sealed_anew(settings, dsn):
    """A forget appended straight to the events topic (``control.forget_user``) while the user's
    turn waited on the ingress topic: the turn was said before the forget, so it is not sealed
    under the key the user gets afterwards (it would be memory again); what they say after is."""
    import time

    from aiokafka import TopicPartition

    from memstream.projections.db import create_pool
    from memstream.schemas import TurnRecorded, UserForgotten, decode_event, encode
    from memstream.schemas.events import new_event_id
    from memstream.keys import data_keys
    from memstream.streams.worker.ingress import IngressSealing
    from memstream.streams.log.kafka_util import drain, groupless_consumer
    from memstream.streams.log.producer import idempotent_producer
    from memstream.streams.log.records import Record
    from memstream.streams.log.sealing import RecordSealer

    class Letters:  # none expected
        async def send(self, letters):
            assert not letters

        def observe(self, n_ok):
            pass

    def said(text: str) -> TurnRecorded:
        return TurnRecorded.new(user_id="ivy", conversation_id="c", user_message=text, assistant_message="Ok.")

    def on_ingress(event, offset: int, at: float, headers=()) -> Record:
        return Record(settings.ingress_topic, 0, offset, b"ivy", encode(event), headers, int(at * 1000))

    pool = await create_pool(dsn, settings.postgres_schema, max_size=2)
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        sealer = RecordSealer(await data_keys(settings, pool))
        ingress = IngressSealing(producer=producer, settings=settings, sealer=sealer, dead_letters=Letters(), pool=pool)
        t0 = time.time() - 60  # records of a minute ago: this step lags behind them
        await sealer.stamp(UserForgotten(event_id=new_event_id(), user_id="ivy", occurred_at=BASE, actor="user"),
                           at=t0 + 1)
        # Before the forget; a letter of before it, retried since; after it.
        await ingress.process([on_ingress(said("I live in Oslo."), 0, t0),
                               on_ingress(said("My PIN is 1234."), 1, t0 + 2, (("memstream.appended-at",
                                                                                str(int(t0 * 1000)).encode()),)),
                               on_ingress(said("I am back."), 2, t0 + 3)])
        assert ingress.dropped == 2
        # Forgotten through ingress, and back a second later: the forget counts from when it was
        # said, not from when this lagging step sealed it.
        again = UserForgotten(event_id=new_event_id(), user_id="ivy", occurred_at=BASE, actor="user")
        await ingress.process([on_ingress(again, 3, t0 + 4), on_ingress(said("Hello again."), 4, t0 + 5)])
        assert ingress.dropped == 2
        got = []
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
            tps = [TopicPartition(settings.events_topic, p) for p in range(settings.partitions)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)

            async def keep(batch):
                got.extend(batch)

            await drain(c, tps, await c.end_offsets(tps), keep)
        assert len(got) == 3  # "I am back.", the forget, "Hello again."
        # Read in log order: what came before the forget and what came a second after it both
        # open — the forget retired the key it ends, so "Hello again." has a key of its own.
        opened = await RecordSealer(sealer.keys).open(got)
        assert [r.sealing for r in opened] == [None, None, None] and opened[0].generation < opened[2].generation
        assert [decode_event(opened[i].value).user_message for i in (0, 2)] == ["I am back.", "Hello again."]
    finally:
        await producer.stop()
        await pool.close()
