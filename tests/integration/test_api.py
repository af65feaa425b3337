"""The HTTP API on the real stack, served by uvicorn on loopback and called over HTTP: every
route, tenant-scoped keys (another tenant's user is 403 and touches nothing), bounded bodies,
problem details, OpenAPI."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from memstream.api.app import create_app
from memstream.api.keys import ApiKeys

from .conftest import served, wait_until

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def api(settings, dsn, tmp_path):
    from memstream.embedding import default_embedder

    keys = ApiKeys(tmp_path / "api-keys.json")
    made = {"acme": keys.create("acme app", tenant="acme"), "globex": keys.create("globex app", tenant="globex"),
            "ops": keys.create("ops")}
    app = create_app(settings, keys=keys, dsn=dsn, max_body_bytes=4096, embedder=default_embedder())
    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client, made


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


async def test_every_route_for_a_tenants_user_and_nothing_for_another_tenants(api, settings, conn, workers):
    client, keys = api
    w = workers()
    await w.wait_assigned()
    acme = auth(keys["acme"])

    said = await client.post("/v1/users/acme:ana/turns", headers=acme, json={
        "conversation_id": "c1", "user_message": "I live in Porto and I like green tea.", "assistant_message": "Noted."})
    assert said.status_code == 202, said.text
    position = said.json()["position"]
    ctx = await client.post("/v1/users/acme:ana/context", headers=acme, json={
        "conversation_id": "c1", "message": "where do I live?", "after": position})
    assert ctx.status_code == 200 and ctx.json()["caught_up"], ctx.text
    assert any(f["value"] == "Porto" for f in ctx.json()["facts"])

    found = (await client.post("/v1/users/acme:ana/search", headers=acme, json={"query": "tea", "kinds": ["facts"]})).json()
    assert found["facts"] and not found["episodes"]
    page = (await client.get("/v1/users/acme:ana/memories", headers=acme, params={"kind": "facts"})).json()
    home = next(f for f in page["items"] if f["attribute"] == "home")
    versions = await client.get(f"/v1/users/acme:ana/facts/{home['fact_id']}/history", headers=acme)
    assert versions.status_code == 200 and versions.json()[0]["value"] == "Porto"
    first = versions.json()[0]  # why it is held: the decision, and the turn it came from
    assert first["decision_id"] and first["source_turn"]["user_message"].startswith("I live in Porto")

    assert (await client.get("/v1/me", headers=acme)).json() == {"name": "acme app", "tenant": "acme", "operator": False}
    listed = await client.get("/v1/users", headers=acme)
    assert listed.status_code == 200 and listed.json() == {"users": ["acme:ana"], "next_cursor": None}
    overview = (await client.get("/v1/users/acme:ana", headers=acme)).json()
    assert overview["profile"] and overview["stats"]["episodes"]["by_status"] == {"recorded": 1}
    drawn = (await client.get("/v1/users/acme:ana/graph", headers=acme)).json()
    assert drawn["edges"] and {n["id"] for n in drawn["nodes"]} >= {e["target_id"] for e in drawn["edges"]}
    before = (await client.get("/v1/users/acme:ana/graph", headers=acme,
                               params={"valid_time": "2000-01-01T00:00:00Z"})).json()
    assert before["edges"] == [] and before["nodes"] == drawn["nodes"]  # the same places, nothing held then
    waited = await client.post("/v1/caught-up", headers=acme, json={"position": position, "timeout": 1})
    assert waited.status_code == 200 and waited.json() == {"caught_up": True}
    elsewhere = await client.post("/v1/caught-up", headers=acme, json={"position": {**position, "topic": "x"}})
    assert elsewhere.status_code == 400
    for bad in ({"prefix": "acme:\x00"}, {"cursor": "acme:\x00"}, {"limit": 0}):
        refused = await client.get("/v1/users", headers=acme, params=bad)
        assert refused.status_code == 400 and refused.json()["title"] == "Invalid argument", (bad, refused.text)
    paged = await client.get("/v1/users", headers=auth(keys["ops"]), params={"limit": 1})
    assert paged.json()["users"] and (await client.get("/v1/users", headers=auth(keys["ops"]), params={
        "limit": 1, "cursor": paged.json()["users"][0]})).status_code == 200

    corrected = await client.post(f"/v1/users/acme:ana/facts/{home['fact_id']}/correct", headers=acme,
                                  json={"value": "Faro", "reason": "moved"})
    assert corrected.status_code == 202, corrected.text
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 1 FROM memory_facts WHERE user_id = 'acme:ana' "
                                           "AND attribute = 'home' AND value = 'Faro' AND status = 'current'"),
                     what="the correction applied")
    tea = next(f for f in page["items"] if f["attribute"] != "home")
    going = await client.get(f"/v1/users/acme:ana/facts/{tea['fact_id']}/episodes", headers=acme)
    assert going.status_code == 200 and len(going.json()) == 1  # the turn it was read from, named first
    forgot = await client.post("/v1/users/acme:ana/forget", headers=acme,
                               json={"fact_id": tea["fact_id"], "keep_episodes": True})  # the turn stays
    assert forgot.status_code == 202
    await wait_until(lambda: conn.fetchval("SELECT status <> 'current' FROM memory_facts WHERE fact_id = $1",
                                           __import__("uuid").UUID(tea["fact_id"])), what="the fact forgotten")
    reminder = await client.post("/v1/users/acme:ana/events", headers=acme, json={
        "type": "ReminderScheduled", "reminder_id": "0190f2a4-0000-7000-8000-000000000001", "text": "call mum",
        "due_at": "2026-01-01T09:00:00Z", "occurred_at": "2025-12-01T09:00:00Z"})
    assert reminder.status_code == 202, reminder.text
    given = reminder.json()["reminder_id"]  # the log's own id, not the caller's: no two users share one
    assert given != "0190f2a4-0000-7000-8000-000000000001"
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 1 FROM reminders WHERE reminder_id = $1 "
                                           "AND user_id = 'acme:ana'", __import__("uuid").UUID(given)),
                     what="the reminder")
    control = await client.post("/v1/users/acme:ana/events", headers=acme, json={
        "type": "FactForgotten", "fact_id": home["fact_id"], "attribute": "home", "value": "Porto",
        "actor": "host", "reason": "", "occurred_at": "2025-12-01T09:00:00Z"})
    assert control.status_code == 400 and "/forget" in control.json()["detail"]
    # A stranger's shapes: refused with what is wrong, never a 500.
    import base64

    forged = base64.urlsafe_b64encode(json.dumps(["facts", "0001-01-01T00:00:00+05:00",
                                                  "00000000-0000-0000-0000-000000000000"]).encode()).decode()
    for method, path, body, status in (
            ("post", "/v1/users/acme:ana/events", {"type": []}, 400),
            ("post", "/v1/users/acme:ana/context", {"conversation_id": "c", "message": "x",
                                                    "after": {"topic": "t", "partition": 10**30, "offset": 0}}, 422),
            ("post", "/v1/users/acme:ana/context", {"conversation_id": "c", "message": "x",
                                                    "after": {"topic": "elsewhere", "partition": 0, "offset": 0}}, 400),
            ("get", f"/v1/users/acme:ana/memories?cursor={forged}", None, 400),
            ("get", "/v1/users/acme:ana/memories?cursor=" + base64.urlsafe_b64encode(b"[" * 5000).decode(), None, 400)):
        got = await client.request(method, path, headers=acme, **({"json": body} if body is not None else {}))
        assert got.status_code == status, (path, body, got.text)
    import glob
    import tempfile

    left_before = set(glob.glob(f"{tempfile.gettempdir()}/memstream-export-*"))
    exported = await client.get("/v1/users/acme:ana/export", headers=acme)
    assert exported.status_code == 200 and json.loads(exported.text.splitlines()[0])["user_id"] == "acme:ana"
    assert exported.headers["cache-control"] == "no-store"  # a person's memory: no browser or proxy keeps it
    # A Range header the server refuses must not leave the opened archive on its disk (a forget
    # could not reach it there): the archive is off the disk before a byte is sent.
    ranged = await client.get("/v1/users/acme:ana/export", headers={**acme, "Range": "bytes=foo"})
    assert ranged.status_code == 200 and ranged.text.splitlines()[1:] == exported.text.splitlines()[1:]
    assert set(glob.glob(f"{tempfile.gettempdir()}/memstream-export-*")) == left_before

    # Another tenant's key, and no key: refused before anything is read or appended.
    globex = auth(keys["globex"])
    for method, path, body in (("post", "/v1/users/acme:ana/turns", {"conversation_id": "c", "user_message": "x",
                                                                      "assistant_message": "y"}),
                               ("post", "/v1/users/acme:ana/context", {"conversation_id": "c", "message": "home?"}),
                               ("post", "/v1/users/acme:ana/search", {"query": "home"}),
                               ("get", "/v1/users/acme:ana/memories", None),
                               ("post", "/v1/users/acme:ana/forget", {"fact_id": home["fact_id"]}),
                               ("delete", "/v1/users/acme:ana", None),
                               ("get", "/v1/users/acme:ana/export", None),
                               ("post", "/v1/users/acme:ana/events", {"type": "ReminderScheduled", "text": "x",
                                                                       "due_at": "2026-01-01T09:00:00Z",
                                                                       "occurred_at": "2025-12-01T09:00:00Z"}),
                               ("get", f"/v1/users/acme:ana/facts/{home['fact_id']}/history", None),
                               ("get", f"/v1/users/acme:ana/facts/{home['fact_id']}/episodes", None),
                               ("post", f"/v1/users/acme:ana/facts/{home['fact_id']}/correct", {"value": "Oslo"}),
                               ("get", "/v1/status", None),
                               ("get", "/v1/users/acme:ana", None),
                               ("get", "/v1/users/acme:ana/graph", None),
                               ("get", "/v1/users?prefix=acme:", None)):
        kw = {"json": body} if body is not None else {}
        refused = await client.request(method, path, headers=globex, **kw)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.headers["content-type"] == "application/problem+json" and refused.json()["status"] == 403
        assert (await client.request(method, path, **kw)).status_code == 401
    assert await conn.fetchval("SELECT count(*) FROM memory_facts WHERE user_id = 'acme:ana' AND status = 'current'") == 1
    assert await conn.fetchval("SELECT count(*) FROM reminders WHERE user_id = 'acme:ana'") == 1  # nothing appended
    theirs = await client.post(f"/v1/users/globex:bob/facts/{home['fact_id']}/correct", headers=globex,
                               json={"value": "Oslo"})  # their own user, another tenant's fact
    assert theirs.status_code == 404
    assert theirs.json()["detail"] == f"no fact {home['fact_id']}"  # not whether another tenant holds it
    status = await client.get("/v1/status", headers=auth(keys["ops"]))
    assert status.status_code == 200 and "positions" in status.json()
    assert (await client.get("/v1/users", headers=globex)).json()["users"] == []  # none of acme's
    everyone = (await client.get("/v1/users", headers=auth(keys["ops"]), params={"prefix": "acme"})).json()
    assert everyone["users"] == ["acme:ana"]

    # A user's forget stays plain on the log forever: a tenant names a kind of reason, never text.
    worded = await client.delete("/v1/users/acme:ana", headers=acme, params={"reason": "she is Ana Lima of Porto"})
    assert worded.status_code in (400, 422) and "user_request" in worded.text
    gone = await client.delete("/v1/users/acme:ana", headers=acme, params={"reason": "user_request"})
    assert gone.status_code == 202
    slashed = await client.delete("/v1/users/acme:team%2Fana", headers=acme)  # the log takes such ids: so must erasure
    assert slashed.status_code == 202
    assert (await client.delete("/v1/users/globex:team%2Fana", headers=acme)).status_code == 403
    odd = await client.get("/v1/users/acme:bob%2Fgraph", headers=acme)  # a user of that name, not acme:bob's graph
    assert odd.status_code == 200 and odd.json()["user_id"] == "acme:bob/graph", odd.text
    assert (await client.get("/v1/users/globex:bob%2Fgraph", headers=acme)).status_code == 403
    await wait_until(lambda: conn.fetchval("SELECT count(*) = 0 FROM episodes WHERE user_id = 'acme:ana'"),
                     what="the user forgotten")


async def test_bad_requests_get_typed_problems_and_big_bodies_are_refused(api):
    client, keys = api
    acme = auth(keys["acme"])
    huge = await client.post("/v1/users/acme:bo/turns", headers=acme, json={
        "conversation_id": "c", "user_message": "x" * 10_000, "assistant_message": "y"})
    assert huge.status_code == 413 and huge.json()["title"] == "Body too large"
    async def chunks():  # chunked: no content-length to trust
        for _ in range(8):
            yield b"x" * 1024

    streamed = await client.post("/v1/users/acme:bo/turns", headers={**acme, "content-type": "application/json"},
                                 content=chunks())
    assert streamed.status_code == 413
    missing = await client.post("/v1/users/acme:bo/turns", headers=acme, json={"conversation_id": "c"})
    assert missing.status_code == 422 and missing.headers["content-type"] == "application/problem+json"
    bad_k = await client.post("/v1/users/acme:bo/search", headers=acme, json={"query": "home", "k": 0})
    assert bad_k.status_code == 400 and "k must be" in bad_k.json()["detail"]
    forever = await client.post("/v1/users/acme:bo/context", headers=acme, json={
        "conversation_id": "c", "message": "home?", "wait_timeout": 1e9})
    assert forever.status_code == 422
    nul_user = await client.post("/v1/users/acme:b%00o/turns", headers=acme, json={
        "conversation_id": "c", "user_message": "x", "assistant_message": "y"})
    assert nul_user.status_code == 400 and "NUL" in nul_user.json()["detail"]
    lower = await client.get("/v1/users/acme:bo/memories", headers={"authorization": f"bearer {keys['acme']}"})
    assert lower.status_code == 200
    nul = await client.post("/v1/users/acme:bo/turns", headers=acme, json={
        "conversation_id": "c", "user_message": "a\u0000b", "assistant_message": "y"})
    assert nul.status_code == 400
    unknown = await client.post("/v1/users/acme:bo/forget", headers=acme,
                                json={"fact_id": "0190f2a4-0000-7000-8000-00000000dead"})
    assert unknown.status_code == 404
    both = await client.post("/v1/users/acme:bo/forget", headers=acme, json={})
    assert both.status_code == 400
    untyped = await client.post("/v1/users/acme:bo/events", headers=acme, json={
        "type": "UserForgotten", "actor": "host", "reason": "", "occurred_at": "2025-12-01T09:00:00Z"})
    assert untyped.status_code == 400 and "DELETE /v1/users" in untyped.json()["detail"]
    typo = await client.post("/v1/users/acme:bo/events", headers=acme, json={
        "type": "ReminderScheduled", "text": "call Ana", "due_at": "2026-12-01T09:00:00Z", "occurred_at": "2025-12-01T09:00:00Z",
        "metdata": {"x": 1}})
    assert typo.status_code == 400 and "'metdata'" in typo.json()["detail"]  # not appended without it
    not_a_number = await client.post("/v1/users/acme:bo/turns", headers={**acme, "content-type": "application/json"},
                                     content=b'{"conversation_id": "c", "user_message": "x", "assistant_message": "y", '
                                             b'"metadata": {"score": NaN}}')
    assert not_a_number.status_code in (400, 422)
    as_operator = await client.post("/v1/users/acme:bo/forget", headers=acme, json={
        "fact_id": "0190f2a4-0000-7000-8000-00000000dead", "actor": "operator"})
    assert as_operator.status_code == 403
    wrong_key = await client.get("/v1/users/acme:bo/memories", headers=auth("msk_not-a-key"))
    assert wrong_key.status_code == 401
    keyless = await client.post("/v1/users/acme:bo/turns", content=b"{", headers={"content-type": "application/json"})
    assert keyless.status_code == 401  # the key first: not a word about the body to a stranger
    spec = (await client.get("/openapi.json")).json()
    assert {"/v1/users/{user_id}/turns", "/v1/users/{user_id}/search", "/v1/status"} <= set(spec["paths"])
    page = await client.get("/docs")
    assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text
    assert (await client.get("/docs/assets/swagger-ui-bundle.js")).status_code == 200  # vendored, nothing fetched


async def test_a_tenant_runs_one_export_at_a_time_and_another_tenant_is_not_held_up(api, monkeypatch):
    from memstream import portability

    client, keys = api
    started, release = asyncio.Event(), asyncio.Event()

    async def held(settings, user_id, path, on_progress=None):  # an export that runs until released
        started.set()
        await release.wait()
        path.write_text("{}\n")
        return {}

    monkeypatch.setattr(portability, "export_user", held)
    first = asyncio.ensure_future(client.get("/v1/users/acme:ana/export", headers=auth(keys["acme"])))
    await asyncio.wait_for(started.wait(), 10)
    again = await client.get("/v1/users/acme:bo/export", headers=auth(keys["acme"]))
    assert again.status_code == 429 and again.json()["status"] == 429
    other = asyncio.ensure_future(client.get("/v1/users/globex:cy/export", headers=auth(keys["globex"])))
    await asyncio.sleep(0.2)
    release.set()
    assert (await first).status_code == 200 and (await other).status_code == 200
    assert (await client.get("/v1/users/acme:bo/export", headers=auth(keys["acme"]))).status_code == 200


async def test_readiness_needs_postgres_and_kafka_and_reports_redis(api, settings, dsn, tmp_path):
    client, _ = api
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {
        "ready": True, "checks": {"postgres": True, "redis": True, "kafka": True}}
    assert (await client.get("/healthz")).json() == {"ok": True}

    # Redis gone: reads go on without it, so the API stays ready and says what is missing.
    no_redis = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    app = create_app(no_redis, keys=ApiKeys(tmp_path / "k.json"), dsn=dsn)
    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=30) as other:
        got = await other.get("/readyz")
    assert got.status_code == 200 and got.json()["checks"] == {"postgres": True, "redis": False, "kafka": True}

    # No broker answering: not ready (the log's own check, as /readyz asks it).
    from memstream.streams.log.producer import TurnLog

    gone = TurnLog(settings.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"}))
    try:
        assert await gone.reachable(timeout_s=0.5) is False
    finally:
        await gone.stop()


async def test_a_host_reports_the_facts_it_used_but_cannot_write_a_sweeps_record(api, settings, conn, workers):
    client, keys = api
    w = workers()
    await w.wait_assigned()
    acme = auth(keys["acme"])
    fact = "00000000-0000-0000-0000-000000000001"
    used = await client.post("/v1/users/acme:uma/events", headers=acme, json={"type": "MemoriesUsed", "fact_ids": [fact],
                                                                                   "occurred_at": "2026-05-01T12:00:00Z"})
    assert used.status_code == 202, used.text
    assert await wait_until(lambda: conn.fetchval("SELECT uses FROM fact_uses WHERE user_id = 'acme:uma'"),
                            what="the use counted") == 1
    swept = await client.post("/v1/users/acme:uma/events", headers=acme, json={
        "type": "DecaySwept", "occurred_at": "2026-05-01T12:00:00Z", "actor": "operator", "sweep_id": fact,
        "policy": "decay-v1",
        "facts": [{"fact_id": fact, "strength": 0.0, "observations": 1, "uses": 0, "idle_days": 999, "rate": 0.01}]})
    assert swept.status_code == 400 and "memstream sweep decay" in swept.json()["detail"], swept.text


async def test_a_stalled_topic_lookup_holds_a_request_two_seconds_at_most_and_never_queues_the_rest(
        api, settings, dsn, monkeypatch):
    """The log's topics are looked up through a Postgres that stops answering: the request that
    looks waits ``LIVE_LOG_LOOKUP_S``, the ones queued behind it are answered from what is held,
    and a topic the held ones do not name is a 503 (the log may have moved), not the caller's 400."""
    from memstream.api import app as api_app
    from memstream.streams.log import log_topics

    from .helpers import FreezingProxy

    client, keys = api
    acme = auth(keys["acme"])
    looked_up = log_topics.live_log_at
    proxy = FreezingProxy.of(dsn)

    async def through_proxy(s, _dsn):  # only the look-up goes through the proxy: the pools stay well
        return await looked_up(s.model_copy(update={"postgres_dsn": proxy.dsn}), proxy.dsn)

    async def ask(topic: str) -> tuple[int, float]:
        t = time.perf_counter()
        got = await client.post("/v1/caught-up", headers=acme, json={
            "position": {"topic": topic, "partition": 0, "offset": 0}, "timeout": 0})
        return got.status_code, time.perf_counter() - t

    monkeypatch.setattr(log_topics, "live_log_at", through_proxy)
    async with proxy:
        proxy.frozen.set()  # nothing held yet: nothing to serve
        status, took = await ask(settings.events_topic)
        assert status == 503 and api_app.LIVE_LOG_LOOKUP_S <= took < api_app.LIVE_LOG_LOOKUP_S + 3
        proxy.frozen.clear()
        assert (await ask(settings.events_topic))[0] == 200
        await asyncio.sleep(api_app.LIVE_LOG_AGAIN_S * 2)
        assert (await ask("elsewhere"))[0] == 400  # looked up again: truly not the log's

        # A wider window to look again in, so the requests queued behind the stalled look-up are
        # answered from the failure it holds however slowly this machine hands them the lock.
        monkeypatch.setattr(api_app, "LIVE_LOG_AGAIN_S", 0.5)
        proxy.frozen.set()
        await asyncio.sleep(0.6)
        t = time.perf_counter()
        first = asyncio.ensure_future(ask("elsewhere"))
        await asyncio.sleep(0.5)  # past the held topics' second: these look up too, and queue
        queued = await asyncio.gather(*(ask(topic) for topic in ["elsewhere"] * 4 + [settings.events_topic] * 4))
        status, took = await first
        assert status == 503 and api_app.LIVE_LOG_LOOKUP_S <= took < api_app.LIVE_LOG_LOOKUP_S + 3
        assert [s for s, _ in queued] == [503] * 4 + [200] * 4
        assert time.perf_counter() - t < 2 * api_app.LIVE_LOG_LOOKUP_S  # none waited a look-up of its own


async def test_a_store_down_is_a_503_logged_once_as_a_warning_and_a_bug_a_500_logged_once(api, caplog, monkeypatch):
    """Not a traceback at ERROR from the server for every request of an outage: the server's error
    middleware raises again what a handler for ``Exception`` answered."""
    import logging

    client, keys = api
    calls = {"n": 0}

    async def failing(*args, **kwargs):
        calls["n"] += 1
        raise ConnectionRefusedError("postgres went away") if calls["n"] == 1 else ValueError("a bug")

    from memstream.read_client.reader import MemoryReader

    caplog.set_level(logging.WARNING)
    monkeypatch.setattr(MemoryReader, "read", failing)
    body = {"conversation_id": "c1", "message": "where do I live?"}
    down = await client.post("/v1/users/acme:ana/context", headers=auth(keys["acme"]), json=body)
    bug = await client.post("/v1/users/acme:ana/context", headers=auth(keys["acme"]), json=body)
    assert (down.status_code, down.json()["title"]) == (503, "Unavailable")
    assert (bug.status_code, bug.json()["title"]) == (500, "Internal error")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in errors] == ["memstream.api"], [(r.name, r.getMessage()) for r in errors]
    assert any(r.levelno == logging.WARNING and "store is unavailable" in r.getMessage() for r in caplog.records)
