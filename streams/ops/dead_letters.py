"""``memstream dead-letters``: what the dead-letter topic holds, one letter in full, and putting a
letter (as it was, or fixed) back on the log.

A letter is named ``PARTITION/OFFSET`` of the dead-letter topic. Its headers say why it was
refused (``memstream.reason``), by which step (``memstream.stage``) and where it came from
(``memstream.source``: ``topic/partition/offset``). A retry appends the record again, keyed as
it was: a plain JSON event to the ingress topic (the worker seals it), a sealed one to the
events topic, a decision to the decisions topic on its partition (a fixed one, plain, sealed
here with its user's key) — each marked ``memstream.retried-from`` with the letter's name. A
letter whose user was forgotten after it first arrived is not put back. Letters live only as
long as the topic's plaintext window (``plaintext_retention_s``): fix them within it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from aiokafka import TopicPartition

from memstream.projections import db
from memstream.schemas import InvalidEvent, decode_decision
from memstream.schemas.errors import InvalidArgument
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.records import Record
from memstream.keys import Shredded
from memstream.streams.log.sealing import is_sealed, sealed_generation, sealer_for


@dataclass
class Letter:
    name: str  # PARTITION/OFFSET on the dead-letter topic
    at: str
    stage: str
    source: str
    reason: str
    key: str | None

    @classmethod
    def of(cls, r: Record) -> Letter:
        h = {k: v.decode(errors="replace") for k, v in r.headers}
        return cls(f"{r.partition}/{r.offset}", datetime.fromtimestamp(r.timestamp_ms / 1000, timezone.utc).isoformat(),
                   h.get("memstream.stage", ""), h.get("memstream.source", ""), h.get("memstream.reason", ""),
                   r.key.decode(errors="replace") if r.key is not None else None)

    def as_dict(self) -> dict:
        return asdict(self)


async def letters(settings, limit: int | None = None) -> list[Record]:
    """The letters still on the dead-letter topic, oldest first (at most the newest ``limit``)."""
    async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(settings.dead_letter_topic, p) for p in await partitions_of(c, settings.dead_letter_topic)]
        if not tps:
            return []
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        out: list[Record] = []

        async def keep(batch) -> None:
            out.extend(batch)

        await drain(c, tps, await c.end_offsets(tps), keep)
    out.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset))
    return out[-limit:] if limit else out


async def letter(settings, name: str) -> Record:
    try:
        partition, offset = (int(x) for x in name.split("/"))
    except ValueError:
        raise InvalidArgument(f"a letter is named PARTITION/OFFSET, not {name!r}") from None
    found = [r for r in await letters(settings) if (r.partition, r.offset) == (partition, offset)]
    if not found:
        raise InvalidArgument(f"no letter {name} on {settings.dead_letter_topic} (past its retention, or never there)")
    return found[0]


async def _log_names(settings, pool) -> tuple[set[str], set[str]]:
    """The events and decisions topics the log lives in now and those it moved out of."""
    from memstream.streams.log.log_topics import moves

    moved = [m for m in await moves(pool, settings) if m["state"] == "moved"]
    return ({settings.events_topic, *(m["from_events"] for m in moved)},
            {settings.decisions_topic, *(m["from_decisions"] for m in moved)})


async def retry(settings, name: str, fixed: Path | None = None) -> dict:
    """Append letter ``name`` again (its value, or the bytes of ``fixed``); returns where it went.
    Refused when its user was forgotten since it first arrived: it would bring back what they
    asked to forget."""
    r = await letter(settings, name)
    value = fixed.read_bytes() if fixed is not None else r.value or b""
    source = Letter.of(r).source.split("/")
    topic = source[0] if len(source) == 3 else ""
    # When it first came (kept on the letter; else the letter's own time): what a forget since
    # covers, it still covers (``streams.worker.ingress``).
    first = dict(r.headers).get("memstream.appended-at") or b""
    first = first if first.isdigit() else str(r.timestamp_ms).encode()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        events, decisions = await _log_names(settings, pool)
        sealer = await sealer_for(settings, pool)
        user = (r.key or b"").decode("utf-8", "replace")
        forgot = (await sealer.last_forgets({user})).get(user)
        if forgot is not None and forgot * 1000 >= int(first):
            raise InvalidArgument(f"letter {name}: its user was forgotten after it first arrived; retrying it "
                                  "would bring back what they asked to forget")
        if topic in decisions:
            # Its partition on the live topic: the one it came from, or its key's after a move.
            target, partition = settings.decisions_topic, int(source[1]) if topic == settings.decisions_topic else None
            if not is_sealed(value):  # a fixed one is plain JSON: sealed here, or no forget could reach it
                try:
                    decision = decode_decision(value)
                except InvalidEvent as exc:
                    raise InvalidArgument(f"letter {name}: the decision does not decode: {exc}") from None
                if decision.user_id != user:
                    raise InvalidArgument(f"letter {name} is keyed by {user!r}; the decision names {decision.user_id!r}")
                # Under the key the letter was sealed under, as formation seals a decision under its
                # turn's: a forget said before the decision was written ends it, not the user's next.
                try:
                    value = await sealer.seal(decision, sealed_generation(r.value))
                except Shredded:
                    raise InvalidArgument(f"letter {name}: the key it was sealed under is destroyed (its user was "
                                          "forgotten); retrying it would bring back what they asked to forget") from None
        elif topic in events or topic == settings.ingress_topic:
            target = settings.events_topic if is_sealed(value) else settings.ingress_topic
            partition = None  # by key: the user's partition
        else:
            raise InvalidArgument(f"letter {name} came from {Letter.of(r).source!r}, not a topic of these settings")
    finally:
        await pool.close()
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(target, value, key=r.key, partition=partition,
                                            headers=[("memstream.retried-from", name.encode()),
                                                     ("memstream.appended-at", first)])
    finally:
        await producer.stop()
    return {"letter": name, "topic": target, "partition": meta.partition, "offset": meta.offset}
