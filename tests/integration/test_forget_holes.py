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
