"""Forgetting and tenancy against a careless host, a hostile tenant and a stolen disk (issue 42),
on the real stack."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from memstream.portability import export_user
from memstream.schemas import UserForgotten
from memstream.schemas.events import new_event_id
from memstream.streams.producer import TurnLog

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
    brief = keys.create("brief", tenant="acme", expires_at=datetime.now(timezone.utc) + timedelta(seconds=2))
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

        assert [await status(k) for k in (kept, revoked, brief)] == [200, 200, 200]
        listed = json.loads(cli("list", "--json"))
        assert [k["name"] for k in listed] == ["kept", "leaked", "brief"] and all(k["active"] for k in listed)
        assert not any(k[len("msk_"):][:12] in json.dumps(listed) for k in (kept, revoked, brief))  # never the key
        leaked = next(k["id"] for k in listed if k["name"] == "leaked")
        assert "revoked" in cli("revoke", leaked)
        assert await status(revoked) == 401  # at once, in the running server
        await asyncio.sleep(2.1)
        assert [await status(k) for k in (kept, revoked, brief)] == [200, 401, 401]
        ended = {k["name"]: k for k in json.loads(cli("list", "--json"))}
        assert ended["leaked"]["revoked_at"] and not ended["leaked"]["active"] and not ended["brief"]["active"]
