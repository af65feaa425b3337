"""Operating it on the real stack: a worker that finds partitions added under it stops, saying
what happened and what to do, rather than project users whose records now straddle partitions."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

pytestmark = pytest.mark.asyncio


async def test_a_worker_stops_with_a_clear_error_when_partitions_are_added_under_it(settings, workers):
    w = workers()
    await w.wait_assigned()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:  # what `kafka-topics --alter --partitions 6` does
        await admin.create_partitions({settings.events_topic: NewPartitions(total_count=settings.partitions + 2)})
    finally:
        await admin.close()
    code = await asyncio.to_thread(w.proc.wait, 60)
    assert code == 78, w.log()[-3000:]
    assert "the partition count changed under this worker" in w.log()
    assert "Operations" in w.log()  # where to read what to do


async def test_a_rebuilt_schema_is_switched_in_under_read_load_and_the_workers_continue_on_it(
        settings, conn, dsn, workers):
    """Rebuild into a side schema while the live one serves, stop the workers, switch: readers
    reading all along never fail nor see a half-built schema, and see the new one at once (its
    rows carry a mark the old ones lack); the workers, started again, project onto it."""
    from memstream.embedding import default_embedder
    from memstream.projections.db import drop_schema
    from memstream.read_client import MemoryReader
    from memstream.streams.producer import TurnLog
    from memstream.streams.rebuild import SwitchRefused, switch
    from memstream.streams.replay import replay

    from .conftest import wait_until
    from .helpers import schemas_named, turns

    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        await log.append_many(turns(40, users=2, prefix="bg"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 40 FROM episodes"), what="40 episodes")
    side = settings.postgres_schema + "_next"
    await replay(settings, dsn, side, ["episodes", "facts", "graph", "commands"])
    with pytest.raises(SwitchRefused, match="workers are running"):
        await switch(settings, dsn, side)
    async with TurnLog(settings) as log:  # decided after the rebuild: the switch catches the side schema up
        await log.append_many(turns(4, users=2, prefix="bg2"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 44 FROM episodes"), what="44 episodes")
    w.stop()
    await conn.execute(f'UPDATE "{side}".episodes SET assistant_message = assistant_message || \' [next]\'')

    reader = await MemoryReader.connect(settings, dsn, embedder=default_embedder())
    seen, stop = [], asyncio.Event()

    async def read_all_along():
        while not stop.is_set():
            ctx = await reader.read("bg-user-0", "conv-0-0", "tell me about my cat Miso", k=5)
            assert not ctx.degraded, ctx.degraded
            seen.append(all(e.assistant_message.endswith("[next]") for e in ctx.episodes) and bool(ctx.episodes))

    load = asyncio.ensure_future(read_all_along())
    try:
        await asyncio.sleep(1)
        with pytest.raises(SwitchRefused, match="differs"):  # the mark: not what a replay of the log writes
            await switch(settings, dsn, side)
        done = await switch(settings, dsn, side, force=True)
        await asyncio.sleep(1)
    finally:
        stop.set()
        await load
        await reader.close()
    assert done["old"] == f"{settings.postgres_schema}_old_1"
    carried = "SELECT projection, topic, partition, next_offset FROM {}.projection_positions " \
              "WHERE projection IN ('formation', 'sealing') ORDER BY 1, 2, 3"
    assert await conn.fetch(carried.format(settings.postgres_schema)) == await conn.fetch(carried.format(done["old"]))
    assert await conn.fetchval("SELECT count(*) FROM episodes") == 44  # the 4 decided after the rebuild, caught up
    flips = [a for a, b in zip(seen, seen[1:]) if a != b]
    assert seen[0] is False and seen[-1] is True and len(flips) == 1  # old, then new, never back
    assert await schemas_named(dsn, side) == set()  # the side schema is the live one now
    try:
        workers()
        async with TurnLog(settings) as log:
            await log.append(turns(1, users=1, prefix="bg3")[0])
        await wait_until(lambda: conn.fetchval("SELECT count(*) = 45 FROM episodes"), timeout=60,
                         what="a new turn, postings and all")
        assert await conn.fetchval("SELECT count(*) FROM episodes_terms WHERE user_id = 'bg3-user-0'") > 0
    finally:
        await drop_schema(dsn, done["old"])


async def test_memstream_rebuild_builds_beside_the_live_schema_and_switches_only_once_the_workers_are_stopped(
        settings, conn, dsn, workers):
    import json
    import subprocess
    import sys

    from memstream.projections.db import drop_schema
    from memstream.stack.worker_process import worker_env
    from memstream.streams.producer import TurnLog

    from .conftest import HOME, ROOT, wait_until
    from .helpers import schemas_named, turns

    env = worker_env(settings.model_copy(update={"home": HOME}))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "memstream.cli", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    w = workers()
    await w.wait_assigned()
    async with TurnLog(settings) as log:
        await log.append_many(turns(20, users=2, prefix="rb"))
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 20 FROM episodes"), what="20 episodes")
    built = settings.postgres_schema + "_rebuild"
    try:
        refused = cli("rebuild")
        assert refused.returncode == 1 and "not switched" in refused.stderr and "workers are running" in refused.stderr
        assert await schemas_named(dsn, built) == {built}  # built beside the live one, which kept serving
        w.stop()
        await drop_schema(dsn, built)
        done = cli("rebuild", "--drop-old", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["live"] == settings.postgres_schema
        assert await conn.fetchval("SELECT count(*) FROM episodes") == 20
        assert await schemas_named(dsn, built) == set() and await schemas_named(dsn, f"{settings.postgres_schema}_old") == set()
    finally:
        await drop_schema(dsn, built)
