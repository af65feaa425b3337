"""Forgetting and tenancy against a careless host, a hostile tenant and a stolen disk (issue 42),
on the real stack."""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memstream.portability import export_user
from memstream.projections.db import create_pool
from memstream.keys import WrongKek, data_keys
from memstream.keys.kek import KekUnavailable, LocalKek
from memstream.schemas import UserForgotten
from memstream.schemas.events import new_event_id
from memstream.streams.log.producer import TurnLog

from .conftest import wait_until
from .test_formation import append_and_wait, turn

pytestmark = pytest.mark.asyncio


async def test_two_users_forgets_with_one_event_id_both_leave_their_logs_unreadable(settings, conn, workers, tmp_path):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("fa", "I live in Porto.", 0), turn("fb", "I live in Oslo.", 1)])
    async with TurnLog(settings) as log:  # fb was forgotten once: what he says next is under his second key
        await log.append(UserForgotten(event_id=new_event_id(), user_id="fb", occurred_at=datetime.now(timezone.utc),
                                       actor="user"))
    await append_and_wait(settings, conn, [turn("fb", "I live in Bergen now.", 2)])
    for user in ("fa", "fb"):
        assert (await export_user(settings, user, tmp_path / f"{user}.jsonl"))["events"] >= 1
    shared = new_event_id()  # a host that reuses event ids across users
    async with TurnLog(settings) as log:
        await log.append_many([UserForgotten(event_id=shared, user_id=u, occurred_at=datetime.now(timezone.utc),
                                             actor="host") for u in ("fa", "fb")])
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM episodes WHERE user_id IN ('fa', 'fb')"),
                     what="both forgets applied")

    async def shredded(user):
        header = await export_user(settings, user, tmp_path / f"{user}.jsonl")
        return header["events"] == 0 and header["left_out"]["forgotten"] >= 1

    for user in ("fa", "fb"):
        await wait_until(lambda: shredded(user), timeout=30, what=f"{user}'s log unreadable")
    w.stop()


async def test_api_keys_are_listed_revoked_and_expire_at_once_in_a_running_server(settings, dsn, tmp_path):
    import asyncio
    import json
    import subprocess
    import sys
    from datetime import timedelta

    import httpx

    from memstream.api.app import create_app
    from memstream.api.keys import ApiKeys
    from memstream.embedding import default_embedder
    from memstream.stack.worker_process import worker_env

    from .conftest import ROOT, served

    keys = ApiKeys(tmp_path / "api-keys.json")
    kept, revoked = keys.create("kept", tenant="acme"), keys.create("leaked", tenant="acme")
    app = create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())
    env = worker_env(settings.model_copy(update={"home": tmp_path}))

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "memstream.cli", "api-keys", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        async def status(key):
            return (await client.get("/v1/users/acme:ana/memories", headers={"Authorization": f"Bearer {key}"})).status_code

        # Made once the server runs (it reads the file again), with time to be used and listed first.
        expires = datetime.now(timezone.utc) + timedelta(seconds=5)
        brief = keys.create("brief", tenant="acme", expires_at=expires)
        assert [await status(k) for k in (kept, revoked, brief)] == [200, 200, 200]
        listed = json.loads(cli("list", "--json"))
        assert [k["name"] for k in listed] == ["kept", "leaked", "brief"] and all(k["active"] for k in listed)
        assert not any(k[len("msk_"):][:12] in json.dumps(listed) for k in (kept, revoked, brief))  # never the key
        leaked = next(k["id"] for k in listed if k["name"] == "leaked")
        assert "revoked" in cli("revoke", leaked)
        assert await status(revoked) == 401  # at once, in the running server
        await asyncio.sleep(max(0.0, (expires - datetime.now(timezone.utc)).total_seconds()) + 0.1)
        assert [await status(k) for k in (kept, revoked, brief)] == [200, 401, 401]
        ended = {k["name"]: k for k in json.loads(cli("list", "--json"))}
        assert ended["leaked"]["revoked_at"] and not ended["leaked"]["active"] and not ended["brief"]["active"]


async def test_one_tenants_waits_and_forgets_neither_stall_another_tenant_nor_the_projections(settings, dsn, conn,
                                                                                           workers, tmp_path):
    """300 waits for a position never reached and 300 forgets of invented users from tenant A: A is
    told 429 past its limits at once; B's reads are not stalled behind A's waits (none near a
    wait's 8 s), and the read projections apply what A was let through within seconds."""
    import asyncio
    import statistics
    import time

    import httpx

    from memstream.api.app import create_app
    from memstream.api.keys import ApiKeys
    from memstream.embedding import default_embedder

    from .conftest import served

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("globex:bo", "I live in Oslo and work at Initech.", 0)])
    keys = ApiKeys(tmp_path / "api-keys.json")
    a, b = (f"Bearer {keys.create(t, tenant=t)}" for t in ("acme", "globex"))
    app = create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())
    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=60,
                                                     limits=httpx.Limits(max_connections=400)) as client:
        async def b_reads(n=30) -> list[float]:
            took = []
            for _ in range(n):
                t = time.perf_counter()
                got = await client.post("/v1/users/globex:bo/context", headers={"Authorization": b},
                                        json={"conversation_id": "c1", "message": "where do I live?"})
                assert got.status_code == 200, got.text
                took.append(time.perf_counter() - t)
            return took

        await b_reads(5)  # warm
        unloaded = statistics.median(await b_reads())
        # Long enough to be in flight while B reads; short, since the server finishes them before it stops.
        never = {"position": {"topic": settings.events_topic, "partition": 0, "offset": 10**12}, "timeout": 8}
        waits = [asyncio.ensure_future(client.post("/v1/caught-up", headers={"Authorization": a}, json=never))
                 for _ in range(300)]
        # The burst answered (at once, each: a 429 is not queued), the ones let through waiting now.
        await wait_until(lambda: _true(sum(x.done() for x in waits) >= 300 - settings.api_limits.concurrent),
                         timeout=30, what="the refusals")
        await asyncio.sleep(0.5)
        assert sum(not x.done() for x in waits) == settings.api_limits.concurrent
        loaded = await b_reads()
        # Browsing reads the same pool: refused to A while its waits hold its share, B's answered.
        for path in ("/v1/users/acme:bo", "/v1/users/acme:bo/graph", "/v1/users?prefix=acme:"):
            busy = await client.get(path, headers={"Authorization": a})
            assert busy.status_code == 429 and "reading the stores at once" in busy.json()["detail"], busy.text
        assert (await client.get("/v1/users/globex:bo", headers={"Authorization": b})).status_code == 200
        refused = [r for r in await asyncio.gather(*[x for x in waits if x.done()])]
        assert len(refused) >= 300 - settings.api_limits.concurrent
        assert all(r.status_code == 429 and r.headers["retry-after"] for r in refused)
        # A stall is systematic: reads queued behind A's waits take their 8 s. Bounds far from
        # that and far from the unloaded figures, which a slower or busier CPU moves (a median
        # of 0.123 s against 0.059 s once here): the tail is one collector pause on shared cores.
        assert statistics.median(loaded) <= max(3 * unloaded, unloaded + 0.1), (loaded, unloaded)
        assert max(loaded) < 3.0, (loaded, unloaded)
        for x in waits:
            x.cancel()

        t0 = time.perf_counter()
        forgets = await asyncio.gather(*[client.delete(f"/v1/users/acme:ghost-{i}", headers={"Authorization": a})
                                         for i in range(300)])
        accepted = [r.json()["position"] for r in forgets if r.status_code == 202]
        assert 0 < len(accepted) <= settings.api_limits.forgets_per_minute + 5  # and a few refilled meanwhile
        assert all(r.status_code in (202, 429) for r in forgets)
        last = max(accepted, key=lambda p: p["offset"])
        sent = time.perf_counter()
        caught = await client.post("/v1/caught-up", headers={"Authorization": b},
                                   json={"position": last, "timeout": 30})
        assert caught.json()["caught_up"]
        lag = time.perf_counter() - sent
        print(f"forgets let through: {len(accepted)}, applied {lag:.3f} s after the last was appended")
        assert lag < 3.0, (lag, sent - t0)  # 60-odd forgets, each a transaction in every projection
    w.stop()


async def _true(value: bool) -> bool:
    return value


def _files_holding(root, needles: list[bytes]) -> list[str]:
    found = []
    # os.walk, not rglob: the server drops other tests' files while we look.
    for path in (Path(d) / f for d, _, files in os.walk(root) for f in files):
        try:
            data = path.read_bytes()
        except OSError:  # gone while we looked, or a socket
            continue
        if any(n in data for n in needles):
            found.append(str(path.relative_to(root)))
    return found


async def test_a_key_store_backup_from_before_a_forget_restored_after_a_rotation_opens_nothing_of_theirs(
        settings, dsn, conn, workers, stack, tmp_path):
    """The data key a forget destroyed lives on in a backup, a replica, an old WAL segment: a
    rotation leaves it wrapped under a KEK that no longer exists, and the database's own files
    hold no copy of it once the key store is vacuumed."""
    import subprocess
    import sys

    from memstream.stack.worker_process import worker_env

    from .conftest import ROOT

    s = settings.model_copy(update={"kek": f"file:{tmp_path / 'kek' / 'kek'}"})  # a KEK of its own, rotated here
    w = workers(settings=s)
    await w.wait_assigned()
    await append_and_wait(s, conn, [turn("kx", "I live in Faro.", 0), turn("ky", "I live in Braga.", 1)])
    pool = await create_pool(dsn, s.postgres_schema, min_size=0, max_size=2)
    try:
        keys = await data_keys(s, pool)
        k = f'"{s.keys_schema}"'
        backup = {t: [dict(r) for r in await conn.fetch(f"SELECT * FROM {k}.{t}")] for t in ("data_keys", "secrets")}
        theirs = [r for r in backup["data_keys"] if bytes(r["user_key"]) == keys.digest("kx")]
        assert theirs and all(r["wrapped"] for r in theirs)
        sealed = await keys.seal("kx", b"what the backup would open", "f")
        await conn.execute("CHECKPOINT")  # the scan below finds what is there to find
        assert _files_holding(stack.postgres.pgdata, [bytes(r["wrapped"]) for r in theirs])
        async with TurnLog(s) as log:
            await log.append(UserForgotten(event_id=new_event_id(), user_id="kx", occurred_at=datetime.now(timezone.utc),
                                           actor="user"))

        async def shredded():
            header = await export_user(s, "kx", tmp_path / "kx.jsonl")
            return header["events"] == 0 and header["left_out"]["forgotten"] >= 1

        await wait_until(shredded, timeout=30, what="kx's log unreadable")
        rotated = subprocess.run([sys.executable, "-m", "memstream.cli", "keys", "rotate", "--json"], cwd=ROOT,
                                 env=worker_env(s), capture_output=True, text=True, timeout=120)
        assert rotated.returncode == 0, rotated.stderr
        old_kek = theirs[0]["kek_id"]
        assert json.loads(rotated.stdout)["retired"] == [old_kek]
        # No file of the database, heap or WAL, holds kx's wrapped key any more.
        assert _files_holding(stack.postgres.pgdata, [bytes(r["wrapped"]) for r in theirs]) == []
        # ky's memory reads on, under the new KEK.
        assert (await export_user(s, "ky", tmp_path / "ky.jsonl"))["events"] >= 1
        # The backup, restored: every key in it is wrapped under a KEK that is gone.
        async with pool.acquire() as c, c.transaction():
            for table, rows in backup.items():
                await c.execute(f"DELETE FROM {k}.{table}")
                for r in rows:
                    await c.execute(f"INSERT INTO {k}.{table} ({', '.join(r)}) "
                                    f"VALUES ({', '.join(f'${i + 1}' for i in range(len(r)))})", *r.values())
        kek = LocalKek(tmp_path / "kek" / "kek")
        for r in theirs:
            with pytest.raises(KekUnavailable):
                kek.unwrap(bytes(r["wrapped"]), "digest:" + keys.digest("kx").hex(), r["kek_id"])
        with pytest.raises(WrongKek):
            await data_keys(s, pool)
        fresh_process = keys.__class__(kek, keys.store)
        with pytest.raises(WrongKek):
            await fresh_process.open("kx", sealed, "f")
    finally:
        await pool.close()
        w.stop()


async def test_a_schema_a_switch_kept_for_an_undo_takes_a_later_forget_too(settings, conn, workers):
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("kept", "I live in Faro.", 0), turn("neighbour", "I live in Tui.", 1),
                                           turn("ghost", "I live in Vigo.", 2)])
    old = f"{settings.postgres_schema}_old_1"  # as `memstream switch` keeps the schema that was live
    await conn.execute(f'CREATE SCHEMA "{old}"')
    try:
        for table in ("episodes", "memory_facts"):
            await conn.execute(f'CREATE TABLE "{old}".{table} AS SELECT * FROM {table}')
        # "ghost" has no episode in the live schema (every turn forgotten one by one since the
        # switch, or only commands ever): the kept schema still holds theirs.
        await conn.execute("DELETE FROM episodes WHERE user_id = 'ghost'")
        async with TurnLog(settings) as log:
            for user in ("kept", "ghost"):
                await log.append(UserForgotten(event_id=new_event_id(), user_id=user,
                                               occurred_at=datetime.now(timezone.utc), actor="user",
                                               reason="user_request"))
        await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM episodes WHERE user_id = 'kept'"),
                         what="the forget applied")
        await wait_until(lambda: conn.fetchval(f'SELECT count(*) = 0 FROM "{old}".episodes WHERE user_id = $1',
                                               "ghost"), what="the forget of a user with no live episode")
        for table in ("episodes", "memory_facts"):
            for user in ("kept", "ghost"):
                assert await conn.fetchval(f'SELECT count(*) FROM "{old}".{table} WHERE user_id = $1', user) == 0
            assert await conn.fetchval(f'SELECT count(*) FROM "{old}".{table} WHERE user_id = $1', "neighbour") > 0
    finally:
        await conn.execute(f'DROP SCHEMA "{old}" CASCADE')
        w.stop()


async def test_an_export_before_formation_ends_a_forgotten_users_key_takes_nothing_said_before_the_forget(
        settings, conn, workers, tmp_path):
    """The forget is on the log, its key not destroyed yet (formation is down): what the user
    said before it still opens, but is not theirs to take along; and the archive is dated before
    the log was read, so an import sees it older than any forget said meanwhile."""
    from memstream.portability import read_archive

    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("xf", "I live in Lisbon.", 0)])
    w.stop()
    said = datetime.now(timezone.utc)
    async with TurnLog(settings) as log:
        await log.append(UserForgotten(event_id=new_event_id(), user_id="xf", occurred_at=said, actor="user"))
        await log.append(turn("xf", "I am back, and I live in Faro.", 1))
    header = await export_user(settings, "xf", tmp_path / "xf.jsonl")
    _, events, decisions = read_archive(tmp_path / "xf.jsonl")
    assert [e["record"]["user_message"] for e in events] == ["I am back, and I live in Faro."]
    assert decisions == [] and "Lisbon" not in (tmp_path / "xf.jsonl").read_text()
    assert header["left_out"]["forgotten"] >= 3  # the turn, its decisions, the forget
    assert datetime.fromisoformat(header["exported_at"]) > said
