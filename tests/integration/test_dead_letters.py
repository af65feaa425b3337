"""``memstream dead-letters`` on the real stack: a plain client's broken turn is listed with why and
by which step, shown in full, and — fixed — appended again through the ingress topic, sealed and
projected like any turn."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from aiokafka import AIOKafkaProducer

from memstream.schemas.events import new_event_id
from memstream.stack.worker_process import worker_env

from .conftest import HOME, ROOT, wait_until

pytestmark = pytest.mark.asyncio


def cli(settings, *args: str) -> subprocess.CompletedProcess:
    env = worker_env(settings.model_copy(update={"home": HOME}))
    return subprocess.run([sys.executable, "-m", "memstream.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


async def test_a_broken_plain_turn_is_listed_shown_and_once_fixed_appended_again_and_projected(
        settings, conn, workers, tmp_path):
    w = workers()
    await w.wait_assigned()
    turn = {"type": "TurnRecorded", "event_id": str(new_event_id()), "user_id": "dl-user", "conversation_id": "c1",
            "occurred_at": "2026-11-30T09:00:00Z", "user_message": "I live in Braga.", "assistant_message": "ok"}
    broken = {k: v for k, v in turn.items() if k != "conversation_id"}
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(settings.ingress_topic, json.dumps(broken).encode(), key=b"dl-user")
    finally:
        await producer.stop()

    async def listed():
        done = cli(settings, "dead-letters", "list", "--json")
        return done.returncode == 0 and json.loads(done.stdout)

    [letter] = await wait_until(listed, timeout=60, what="the letter to be listed")
    assert letter["stage"] == "sealing" and letter["source"].startswith(f"{settings.ingress_topic}/")
    assert "conversation_id" in letter["reason"] and letter["key"] == "dl-user"
    shown = json.loads(cli(settings, "dead-letters", "show", letter["name"], "--json").stdout)
    assert json.loads(shown["value"]) == broken
    assert cli(settings, "dead-letters", "show", "0/999999").returncode == 1  # named, not a traceback

    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(turn))
    done = json.loads(cli(settings, "dead-letters", "retry", letter["name"], "--fixed", str(fixed), "--json").stdout)
    assert done["topic"] == settings.ingress_topic
    await wait_until(lambda: conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'dl-user'"),
                     what="the fixed turn to be projected")

    # Once its user is forgotten, the letter is not put back: it would bring back what they said.
    from memstream import control
    from memstream.streams.log.producer import TurnLog

    async with TurnLog(settings) as log:
        await control.forget_user(log, "dl-user")
    again = cli(settings, "dead-letters", "retry", letter["name"], "--fixed", str(fixed))
    assert again.returncode == 1 and "forgotten" in again.stderr, again.stderr


async def test_a_fixed_decision_is_sealed_under_its_letters_key_and_refused_once_that_key_is_destroyed(
        settings, dsn, tmp_path):
    """A decision formation wrote, lagging, after its user's forget was said, then dead-lettered:
    fixed and retried, it must not be sealed under the key of the user's next life, where no
    forget would reach it."""
    import time
    import uuid

    from memstream.projections.db import create_pool
    from memstream.schemas import FactReinforced, TurnRecorded
    from memstream.schemas.codec import encode
    from memstream.schemas.errors import InvalidArgument
    from memstream.streams.log.sealing import sealer_for
    from memstream.streams.ops.dead_letters import retry

    from .test_delivery import _decided

    pool = await create_pool(dsn, settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await sealer_for(settings, pool)
        decision = FactReinforced(**_decided(settings, 0, "dx", "fact:0"), extractor="test", resolver="test",
                                  reason="test", confidence=1.0, explicit=True, target=uuid.uuid4())
        first_life = await sealer.seal(decision)
        await sealer.destroy("dx", 1)  # their forget applied: that key is gone
        await sealer.seal(TurnRecorded.new(user_id="dx", conversation_id="c", user_message="I am back",
                                           assistant_message="ok"))  # a key of their next life
    finally:
        await pool.close()
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(settings.dead_letter_topic, first_life, key=b"dx", headers=[
            ("memstream.reason", b"refused, for the test"), ("memstream.stage", b"facts"),
            ("memstream.source", f"{settings.decisions_topic}/0/7".encode()),
            ("memstream.appended-at", str(int(time.time() * 1000)).encode())])
    finally:
        await producer.stop()
    fixed = tmp_path / "fixed.json"
    fixed.write_bytes(encode(decision))
    with pytest.raises(InvalidArgument, match="sealed under is destroyed"):
        await retry(settings, f"{meta.partition}/{meta.offset}", fixed)
